// Package dashboard serves lockd's live web dashboard at /ui/ on every
// member: the members and their roles, the leader, the term, and the locks
// with their kind (exclusive, shared, semaphore), every holder with its
// fencing token, time left and value, a running lock-delay and the queue
// length.
//
// The page is plain HTML, CSS and JavaScript embedded with go:embed. It
// receives its data as Server-Sent Events from /ui/events: one JSON snapshot
// of what the page shows, pushed whenever it changes.
//
// One hub per handler feeds every open stream, so N viewers cost what one
// does. While at least one stream is open it holds one watch on every lock
// (Source.WatchPrefix("")), which delivers each committed change of a lock's
// status; with none open it holds no watch and reads nothing. It does not
// poll the lock table: a change (or a resync the watch asks for, after it
// dropped changes or the state was replaced) makes it re-read the first
// maxLocks locks and the table's counts, and publish the result if it
// differs from the last. It re-reads rather than patching a view from the
// changes because a snapshot carries table-wide counts and the first locks
// by name, which a bounded view cannot maintain from changes alone.
//
// Re-reads are paced by readBudget: the first change after a quiet spell is
// read at once; a burst costs at most one read per coalesce interval
// (100 ms); on average the hub reads no more often than the 400 ms poll it
// replaced (it earns one read per 400 ms, saves up to 4, and starts with
// one, so that since a viewer arrived it has never read more often than the
// poll would have); and it never holds the state lock more than ~5% of the
// time (reads at least 20× their cost apart). While a read is pending,
// changes wait in the watch's buffer instead of waking the hub one by one;
// a change that a read already reflected (its index is at or below the
// table's LastChange then) costs nothing more. Note that while the watch is
// open the server records the status of every lock each entry changes (it
// does so only while someone watches).
//
// Facts that are not lock changes — members, roles, leader, term, this
// member's indexes, the session count — are refreshed on a slow timer
// (every 2 s) and at every resync (the server signals one when this
// member's leadership changes and when a snapshot replaces the state); the
// member's status (state, term, indexes) is also re-read with every read of
// the locks. /ui/snapshot reads everything afresh at each request.
//
// A snapshot lists at most maxLocks locks (the first by name), 16 holders
// per lock and 2000 in all (every listed lock keeps its first), and the
// first 200 bytes of each value: a semaphore may have 10 000 holders, a
// value 4 KiB, and every viewer receives the whole snapshot at each change.
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
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
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
	// WatchPrefix watches the committed changes of every lock under a
	// prefix, buffering up to buf of them (see notify.Watch).
	WatchPrefix(prefix string, buf int) *notify.Watch
}

// Defaults.
const (
	// DefaultCoalesce is the least time between two reads of the lock
	// table: a burst of changes costs at most one read per interval.
	DefaultCoalesce = 100 * time.Millisecond
	// DefaultReadInterval bounds the reads of the lock table on average:
	// no more than one per interval (the interval of the poll the watch
	// replaced), with up to DefaultReadBurst saved during a quiet spell.
	DefaultReadInterval = 400 * time.Millisecond
	DefaultReadBurst    = 4
	// DefaultClusterInterval is how often the facts that are not lock
	// changes (members, roles, leader, term, indexes, sessions) are
	// refreshed.
	DefaultClusterInterval = 2 * time.Second
	DefaultHeartbeat       = 10 * time.Second
	DefaultMaxLocks        = 500
	DefaultMaxStreams      = 64
	// DefaultWatchBuffer is the watch's buffer; should it fill, the watch
	// asks for a resync, which costs one read.
	DefaultWatchBuffer = 1024
)

// config tunes a handler; tests shorten the intervals.
type config struct {
	coalesce     time.Duration // least time between two reads of the lock table
	readEvery    time.Duration // on average at most one read of the lock table per readEvery
	readBurst    int           // reads saved during a quiet spell, for a burst
	clusterEvery time.Duration // refresh of the cluster facts while streams are open
	watchBuf     int           // the watch's buffer of changes
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
	return config{coalesce: DefaultCoalesce, readEvery: DefaultReadInterval, readBurst: DefaultReadBurst,
		clusterEvery: DefaultClusterInterval, watchBuf: DefaultWatchBuffer, heartbeat: DefaultHeartbeat,
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
// a token). It returns the token's identity (for a stream to check again
// after a reload: stillAllowed).
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) (auth.Identity, bool) {
	if h.cfg.auth == nil {
		return auth.Identity{}, true
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	id, err := h.cfg.auth.Authenticate(strings.TrimSpace(bearer))
	if err != nil {
		h.allowOrigin(w, r)
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("WWW-Authenticate", `Bearer realm="lockd"`)
		writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated,
			"the dashboard needs a valid bearer token with read access to every lock (Authorization: Bearer <token>)")
		return id, false
	}
	if !id.Allows(auth.Read, "") {
		h.allowOrigin(w, r)
		w.Header().Set("Cache-Control", "no-store")
		writeError(w, http.StatusForbidden, api.CodePermissionDenied,
			fmt.Sprintf("token %q lacks read access to every lock (a read permission on the empty prefix), which the dashboard needs", id.Name))
		return id, false
	}
	return id, true
}

// stillAllowed checks a stream's token again after the token file was
// reloaded (SPEC 20: a removed token, or one that lost read access to
// every lock, streams nothing more).
func (h *handler) stillAllowed(id auth.Identity) bool {
	if h.cfg.auth == nil {
		return true
	}
	cur, err := h.cfg.auth.Refresh(id)
	return err == nil && cur.Allows(auth.Read, "")
}

// authChanged is closed by the next reload of the token file (never with
// authentication off).
func (h *handler) authChanged() <-chan struct{} {
	if h.cfg.auth == nil {
		return nil
	}
	return h.cfg.auth.Changed()
}

// snapshot answers one snapshot as JSON (GET /ui/snapshot).
func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authorize(w, r); !ok {
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
//
// The stream ends when the token file is reloaded without its token, or
// with less than read access to every lock: the page reconnects and is
// told 401 or 403.
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	authChanged := h.authChanged() // before the check: a reload after it is seen
	id, ok := h.authorize(w, r)
	if !ok {
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
	if f == nil { // the watcher was just started: wait for its first read
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
		case <-authChanged:
			authChanged = h.authChanged()
			if !h.stillAllowed(id) {
				return
			}
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
