// Package dashboard serves lockd's live web dashboard at /ui/ on every
// member: the members and their roles, the leader, the term, and the locks
// with holder, fencing token, time left and queue length.
//
// The page is plain HTML, CSS and JavaScript embedded with go:embed. It
// receives its data as Server-Sent Events from /ui/events: one JSON snapshot
// of what the page shows, pushed whenever it changes. One poller per handler
// reads the member's local state (every PollInterval while at least one
// stream is open, and never while none is) and fans the result out to every
// open stream, so N viewers cost one poll, not N.
//
// A follower serves its local replica, which may lag the leader slightly;
// the snapshot says which member served it and the page says so. When its
// stream breaks (the member died), the page reconnects with backoff to the
// other members it has learned, so a page opened on the leader follows the
// new one after a crash.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
)

//go:embed static
var staticFS embed.FS

// Source is what the dashboard reads from a member. *server.Server
// satisfies it.
type Source interface {
	// Cluster describes the Raft configuration as this member sees it.
	Cluster(ctx context.Context) (api.ClusterStatus, error)
	// Status is this member's own view (state, leader, term, indexes).
	Status() api.NodeStatus
	// View runs fn on the local replicated state under a read lock.
	View(fn func(t *locktable.Table))
}

// Defaults.
const (
	DefaultPollInterval = 400 * time.Millisecond
	DefaultHeartbeat    = 10 * time.Second
	DefaultMaxLocks     = 500
	DefaultMaxStreams   = 64
)

// config tunes a handler; tests shorten the intervals.
type config struct {
	pollInterval time.Duration // how often the local state is read while streams are open
	heartbeat    time.Duration // a ping event at least this often on an idle stream
	maxLocks     int           // locks listed per snapshot (first by name)
	maxStreams   int           // concurrent event streams; more get 503
	writeTimeout time.Duration // bound on one write to a stream
	now          func() time.Time
	auth         *auth.Store // nil: no authentication
}

// Option configures the dashboard.
type Option func(*config)

// WithAuth protects the dashboard's data (/ui/events, /ui/snapshot) with
// the client API's bearer tokens: a token needs read access to every lock
// (a "read" permission on the empty prefix, or more), since the page lists
// them all. A nil store leaves the dashboard open, as the API is then.
//
// The token comes in the Authorization header only: the page reads the
// event stream with fetch, which can send headers, where an EventSource
// cannot. A token in the URL (?access_token=) is refused, on every path;
// see refuseQueryToken. The page itself and its assets carry no data and
// need no token.
func WithAuth(s *auth.Store) Option { return func(c *config) { c.auth = s } }

func defaultConfig() config {
	return config{pollInterval: DefaultPollInterval, heartbeat: DefaultHeartbeat,
		maxLocks: DefaultMaxLocks, maxStreams: DefaultMaxStreams,
		writeTimeout: 10 * time.Second, now: time.Now}
}

// New returns the dashboard handler. Mount it on "/ui/" for every method;
// it serves /ui/ (the page and its assets), /ui/events (the live stream)
// and /ui/snapshot (one snapshot as JSON, for scripts and curl), answers
// the CORS preflight (OPTIONS) of /ui/events and /ui/snapshot, and refuses
// the rest itself. Mounted on "GET /ui/" only, the preflight never reaches
// it, and a page served by one member cannot send its token to another.
func New(src Source, logger *slog.Logger, opts ...Option) http.Handler {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return newHandler(src, logger, cfg)
}

type handler struct {
	cfg    config
	log    *slog.Logger
	hub    *hub
	assets http.Handler
	mux    *http.ServeMux
}

func newHandler(src Source, logger *slog.Logger, cfg config) *handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	h := &handler{cfg: cfg, log: logger, hub: newHub(src, cfg, logger),
		assets: http.StripPrefix("/ui/", http.FileServerFS(sub)), mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /ui/events", h.events)
	h.mux.HandleFunc("GET /ui/snapshot", h.snapshot)
	h.mux.HandleFunc("OPTIONS /ui/events", h.preflight)
	h.mux.HandleFunc("OPTIONS /ui/snapshot", h.preflight)
	h.mux.HandleFunc("GET /ui/{$}", h.static)
	h.mux.HandleFunc("GET /ui/app.js", h.static)
	h.mux.HandleFunc("GET /ui/net.js", h.static)
	h.mux.HandleFunc("GET /ui/style.css", h.static)
	h.mux.HandleFunc("GET /ui/favicon.svg", h.static)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, "no such dashboard resource: "+r.URL.Path)
	})
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if refuseQueryToken(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// queryTokenParam is where an earlier dashboard took the token, because a
// browser's EventSource cannot send headers.
const queryTokenParam = "access_token"

// refuseQueryToken answers 400 to a request with a token in its URL, on
// every dashboard path and whether or not authentication is on. A URL is
// written to proxy and server access logs and kept in browser history, so
// a token there leaks; refusing it loudly (rather than ignoring it, which
// would look like a wrong token) tells a script still sending it to move
// to the Authorization header. This is the only place the dashboard looks
// at a request's query (TestNoHandlerReadsTheQuery checks that).
func refuseQueryToken(w http.ResponseWriter, r *http.Request) bool {
	if !r.URL.Query().Has(queryTokenParam) {
		return false
	}
	w.Header().Set("Cache-Control", "no-store")
	writeError(w, http.StatusBadRequest, api.CodeInvalidArgument,
		"the dashboard does not take a token in the URL (?"+queryTokenParam+"=): URLs are kept in proxy and server logs "+
			"and in browser history. Send it in the Authorization header (Authorization: Bearer <token>), "+
			"and treat a token that was sent in a URL as exposed")
	return true
}

// contentSecurityPolicy allows the page only its own assets; connect-src
// admits the other members' event streams, at whatever address they publish.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self' http: https:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (h *handler) static(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", contentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-cache") // revalidate: a rolling upgrade changes the assets
	h.assets.ServeHTTP(w, r)
}

// codeUnavailable is the error code of a dashboard endpoint that cannot
// serve now (the dashboard is not part of the client API contract).
const codeUnavailable = "unavailable"

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorReply{Error: api.Error{Code: code, Message: msg}})
}

// authorize checks the bearer token of the Authorization header when
// authentication is on, answering 401 or 403 itself (with the CORS header,
// so that a page served by another member can read the answer and ask for
// a token).
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.auth == nil {
		return true
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	id, err := h.cfg.auth.Authenticate(strings.TrimSpace(bearer))
	if err != nil {
		h.allowOrigin(w, r)
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("WWW-Authenticate", `Bearer realm="lockd"`)
		writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated,
			"the dashboard needs a valid bearer token with read access to every lock (Authorization: Bearer <token>)")
		return false
	}
	if !id.Allows(auth.Read, "") {
		h.allowOrigin(w, r)
		w.Header().Set("Cache-Control", "no-store")
		writeError(w, http.StatusForbidden, api.CodePermissionDenied,
			fmt.Sprintf("token %q lacks read access to every lock (a read permission on the empty prefix), which the dashboard needs", id.Name))
		return false
	}
	return true
}

// snapshot answers one snapshot as JSON (GET /ui/snapshot).
func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) {
	if !h.authorize(w, r) {
		return
	}
	body := h.hub.build(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	h.allowOrigin(w, r)
	_, _ = w.Write(stamp(body, h.cfg.now()))
	_, _ = w.Write([]byte("\n"))
}

// events streams snapshots as Server-Sent Events (GET /ui/events).
//
// Frames: a default "message" event whose data is a snapshot, sent at once
// and then whenever the snapshot changes; a "ping" event {"now": ms} when
// nothing else was sent for a heartbeat interval, so the page notices a
// stream that went silent and the server notices a client that went away.
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	if !h.authorize(w, r) {
		return
	}
	rc := http.NewResponseController(w)
	if !h.hub.join() {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, codeUnavailable,
			fmt.Sprintf("too many dashboard streams open on this member (limit %d); retry later", h.cfg.maxStreams))
		return
	}
	defer h.hub.leave()

	ctx := r.Context()
	f, changed := h.hub.current()
	if f == nil { // the poller was just started: wait for its first read
		select {
		case <-changed:
			f, changed = h.hub.current()
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
			writeError(w, http.StatusServiceUnavailable, codeUnavailable, "the member did not produce a snapshot within 5s")
			return
		}
	}

	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // tell reverse proxies not to buffer the stream
	hd.Set("X-Content-Type-Options", "nosniff")
	h.allowOrigin(w, r)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}

	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(h.cfg.now().Add(h.cfg.writeTimeout)) // unsupported on some writers: fine
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	sendSnapshot := func(f *frame) bool {
		var buf bytes.Buffer
		buf.WriteString("id: ")
		buf.WriteString(strconv.FormatUint(f.seq, 10))
		buf.WriteString("\ndata: ")
		buf.Write(stamp(f.body, h.cfg.now()))
		buf.WriteString("\n\n")
		return write(buf.Bytes())
	}

	if !write([]byte("retry: 2000\n\n")) || !sendSnapshot(f) {
		return
	}
	hb := time.NewTimer(h.cfg.heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			f, changed = h.hub.current()
			if f != nil && !sendSnapshot(f) {
				return
			}
			hb.Reset(h.cfg.heartbeat)
		case <-hb.C:
			msg := fmt.Sprintf("event: ping\ndata: {\"now\":%d}\n\n", h.cfg.now().UnixMilli())
			if !write([]byte(msg)) {
				return
			}
			hb.Reset(h.cfg.heartbeat)
		}
	}
}

// preflight answers the CORS preflight a browser sends before a
// cross-origin request with an Authorization header: a page served by
// another member asks whether it may send its token here. It carries no
// token itself and is never authenticated; a page of an origin that is not
// a member's gets no CORS headers, so its browser sends nothing.
func (h *handler) preflight(w http.ResponseWriter, r *http.Request) {
	if h.allowOrigin(w, r) {
		hd := w.Header()
		hd.Set("Access-Control-Allow-Methods", "GET")
		hd.Set("Access-Control-Allow-Headers", "Authorization")
		hd.Set("Access-Control-Max-Age", "600")
	}
	w.WriteHeader(http.StatusNoContent)
}

// allowOrigin lets a page served by another member of this cluster read
// this member's stream (CORS): the page follows the cluster from member to
// member when one dies. Only the origins of the members' published HTTP
// addresses are allowed, so an unrelated web site open in the operator's
// browser cannot read the lock table. It reports whether it allowed the
// request's origin.
func (h *handler) allowOrigin(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	w.Header().Add("Vary", "Origin")
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	cs, err := h.hub.src.Cluster(ctx)
	if err != nil {
		return false
	}
	for _, m := range cs.Members {
		if o := originOf(m.HTTPAddr); o != "" && strings.EqualFold(o, origin) {
			w.Header().Set("Access-Control-Allow-Origin", origin)
			return true
		}
	}
	return false
}

// originOf returns scheme://host[:port] of an http(s) URL, or "".
func originOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// stamp inserts "now" (this member's clock, unix ms) as the first field of a
// snapshot object. The page computes time left as expires_at − now plus the
// time elapsed in the browser since, so its own clock's offset does not
// matter.
func stamp(body []byte, now time.Time) []byte {
	out := make([]byte, 0, len(body)+24)
	out = append(out, `{"now":`...)
	out = strconv.AppendInt(out, now.UnixMilli(), 10)
	out = append(out, ',')
	return append(out, body[1:]...) // body is a non-empty JSON object
}

// Snapshot is what the page shows. It is pushed whenever it changes.
type Snapshot struct {
	// Member is the member that served this snapshot.
	Member api.NodeStatus `json:"member"`
	// Stale is true when Member is not the leader: the lock table is its
	// local replica and may lag the leader slightly.
	Stale        bool              `json:"stale"`
	Cluster      api.ClusterStatus `json:"cluster"`
	ClusterError string            `json:"cluster_error,omitempty"`
	Locks        []Lock            `json:"locks"`
	// LocksTotal counts every lock in the table (held or with waiters);
	// Locks holds at most LocksLimit of them, the first by name.
	LocksTotal  int    `json:"locks_total"`
	LocksLimit  int    `json:"locks_limit"`
	Held        int    `json:"held"`
	Waiters     int    `json:"waiters"`
	Sessions    int    `json:"sessions"`
	LastToken   uint64 `json:"last_token"`
	HeartbeatMs int64  `json:"heartbeat_ms"`
}

// Lock is one row of the locks table.
type Lock struct {
	Name     string `json:"name"`
	Held     bool   `json:"held"`
	ClientID string `json:"client_id,omitempty"`
	// Session is set for a lock held through a session: the first
	// characters of its id, enough to tell sessions apart on the page (the
	// whole id would let a viewer act as the session).
	Session string `json:"session,omitempty"`
	Token   uint64 `json:"fencing_token,omitempty"`
	TTLms   int64  `json:"ttl_ms,omitempty"`
	// ExpiresAt is unix ms on the leader's clock; 0 for a lock with no TTL
	// of its own (it lives as long as its session).
	ExpiresAt int64 `json:"expires_at,omitempty"`
	Waiters   int   `json:"waiters"`
}

// frame is one published snapshot, encoded without "now".
type frame struct {
	seq  uint64
	body []byte
}

// hub runs one poller while streams are open and publishes a new frame when
// the snapshot changes. Streams wait on a channel that is closed and
// replaced at each publication.
type hub struct {
	src Source
	cfg config
	log *slog.Logger

	mu      sync.Mutex
	streams int
	running bool
	wake    chan struct{} // nudges the poller when the last stream leaves
	cur     *frame
	changed chan struct{}
	seq     uint64
}

func newHub(src Source, cfg config, log *slog.Logger) *hub {
	return &hub{src: src, cfg: cfg, log: log, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// join registers a stream, starting the poller if needed; false when the
// stream limit is reached.
func (h *hub) join() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams >= h.cfg.maxStreams {
		return false
	}
	h.streams++
	if !h.running {
		h.running = true
		h.cur = nil // a frame from an earlier run is stale
		go h.poll()
	}
	return true
}

// leave unregisters a stream; the poller stops when none is left.
func (h *hub) leave() {
	h.mu.Lock()
	h.streams--
	last := h.streams == 0
	h.mu.Unlock()
	if last {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// current returns the latest frame (nil before the first read) and the
// channel closed when the next one is published.
func (h *hub) current() (*frame, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.changed
}

// poll reads the state every pollInterval (longer when reading is slow, so
// the dashboard never takes more than ~5% of the state lock) and publishes
// changes, until no stream is left.
func (h *hub) poll() {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-h.wake:
		}
		h.mu.Lock()
		if h.streams == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		body := h.build(ctx)
		cancel()
		cost := time.Since(start)

		h.mu.Lock()
		if h.cur == nil || !bytes.Equal(body, h.cur.body) {
			h.seq++
			h.cur = &frame{seq: h.seq, body: body}
			close(h.changed)
			h.changed = make(chan struct{})
		}
		h.mu.Unlock()
		timer.Reset(max(h.cfg.pollInterval, 20*cost))
	}
}

// build reads the member's state into an encoded Snapshot.
func (h *hub) build(ctx context.Context) []byte {
	s := Snapshot{Member: h.src.Status(), LocksLimit: h.cfg.maxLocks, HeartbeatMs: h.cfg.heartbeat.Milliseconds(),
		Locks: []Lock{}}
	cs, err := h.src.Cluster(ctx)
	if err != nil {
		s.ClusterError = err.Error()
		cs = api.ClusterStatus{LeaderID: s.Member.LeaderID, Term: s.Member.Term}
	}
	if cs.Members == nil {
		cs.Members = []api.Member{}
	}
	s.Cluster = cs
	s.Stale = !strings.EqualFold(s.Member.State, "leader")

	var infos []locktable.LockInfo
	h.src.View(func(t *locktable.Table) {
		infos = t.List("", h.cfg.maxLocks)
		st := t.Stats()
		s.LocksTotal, s.Held, s.Waiters, s.Sessions, s.LastToken = st.Locks, st.Held, st.Waiters, st.Sessions, st.LastToken
	})
	for _, li := range infos {
		l := Lock{Name: li.Name, Held: li.Held, Waiters: li.Waiters}
		if li.Held {
			l.ClientID, l.Session, l.Token, l.TTLms, l.ExpiresAt = li.ClientID, shortID(li.SessionID), li.Token, li.TTLms, li.ExpiresAt
		}
		s.Locks = append(s.Locks, l)
	}
	body, err := json.Marshal(s)
	if err != nil { // cannot happen with these types
		h.log.Error("dashboard snapshot encoding failed", "err", err)
		return []byte(`{"cluster_error":` + strconv.Quote(err.Error()) + `}`)
	}
	return body
}

// shortID shortens a session id for display.
func shortID(id string) string {
	const n = 8
	if len(id) <= n {
		return id
	}
	return id[:n] + "…"
}
