// Package httpapi serves lockd's client API: the HTTP lock, session and
// cluster endpoints, the WebSocket session endpoint, health and metrics. It
// validates every request against the SPEC limits before anything is
// proposed, routes writes and linearizable reads to the leader (307), and
// maps state-machine outcomes to SPEC error codes.
//
// It depends only on the small Backend interface declared here, so it is
// tested with a fake and no Raft.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/admission"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// Backend errors the handlers understand. A backend wraps its own errors
// with these (errors.Is).
var (
	// ErrNotLeader: nothing was proposed; the client should go to the leader.
	ErrNotLeader = errors.New("not the leader")
	// ErrUnknownOutcome: the command may still commit; a retry is safe
	// because every write is idempotent.
	ErrUnknownOutcome = errors.New("outcome unknown")
)

// Backend is what the handlers need from a member.
type Backend interface {
	// Ready reports whether this member is the leader and has applied every
	// entry of earlier terms (its post-election barrier completed).
	Ready() bool
	// LeaderURL is the HTTP URL of the leader this member knows, or "".
	LeaderURL() string
	// Propose replicates a command (Now is stamped by the backend).
	Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error)
	// ReadIndex makes the next View linearizable.
	ReadIndex(ctx context.Context) error
	// View runs fn on the local state under a read lock.
	View(fn func(t *locktable.Table))
	// Keepalive resets a session's TTL on the leader; ok false when the
	// session is unknown or its expiry has been decided. It answers only
	// after this member confirmed its leadership with a quorum, after the
	// call began (SPEC semantics 10).
	Keepalive(ctx context.Context, sessionID string) (ttlMs int64, ok bool, err error)
	// Subscribe delivers committed events about a client.
	Subscribe(clientID string) *notify.Sub
	// WatchLock and WatchPrefix deliver the committed changes of one
	// lock's status, or of every lock under a prefix, buffering buf.
	WatchLock(name string, buf int) *notify.Watch
	WatchPrefix(prefix string, buf int) *notify.Watch
	// NewSessionID returns a fresh, unguessable session id.
	NewSessionID() string
	// Sign returns a fencing proof for a grant, or "" without a signing key.
	Sign(lock string, token uint64, mode locktable.Mode, expiresAt int64) string

	Cluster(ctx context.Context) (api.ClusterStatus, error)
	AddMember(ctx context.Context, req api.AddMemberRequest) error
	RemoveMember(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, to string) error
	Status() api.NodeStatus
	// Backup returns the encoded state (a linearizable read).
	Backup(ctx context.Context) ([]byte, error)
	// RestoreBackup replaces the state with a backup; without Force only an
	// empty cluster accepts it.
	RestoreBackup(ctx context.Context, data []byte, opt RestoreOptions) error
	// Readyz reports whether a leader is known and this member's state is
	// current, with a reason when not.
	Readyz() (bool, string)
}

// RestoreOptions qualify a restore.
type RestoreOptions struct {
	// Force replaces a cluster that holds state.
	Force bool
	// MinToken raises the token counter of the restored state to at least
	// this: restoring an old backup into a fresh cluster cannot know the
	// tokens the old cluster issued after the backup was taken.
	MinToken uint64
}

// Observer receives what the handlers measure (Prometheus in production).
type Observer interface {
	// AcquireDone records one acquire request's latency by outcome:
	// granted, granted_after_wait, lock_held, wait_timeout, session_expired,
	// no_leader, invalid, client_gone.
	AcquireDone(outcome string, d time.Duration)
	// WebSocketConns moves the open WebSocket connection gauge.
	WebSocketConns(delta int)
	// WebSocketRequestDone records one WebSocket request's time from its
	// frame read to its reply queued, by op.
	WebSocketRequestDone(op string, d time.Duration)
	// Refused counts a request refused for want of capacity before any
	// work: by admission control, over a quota, or past a per-connection
	// bound; code overloaded or resource_exhausted, op the command
	// (acquire, create_session, release, ...) or watch.
	Refused(code, op string)
}

type nopObserver struct{}

func (nopObserver) AcquireDone(string, time.Duration)          {}
func (nopObserver) WebSocketConns(int)                         {}
func (nopObserver) WebSocketRequestDone(string, time.Duration) {}
func (nopObserver) Refused(string, string)                     {}

// refusal tells the observer when err refuses a request (of kind op) for
// want of capacity, and returns err. It wraps the refusals the state
// machine decides (quotas) and per-connection bounds; admission control's
// are counted where it refuses (propose, readIndex).
func (h *Handler) refusal(op string, err error) error {
	if code, _ := errorCode(err); code == api.CodeResourceExhausted || code == api.CodeOverloaded {
		h.obs.Refused(code, op)
	}
	return err
}

// Config configures the handler.
type Config struct {
	Backend  Backend
	Observer Observer
	// Auth checks bearer tokens; nil turns authentication off.
	Auth *auth.Store
	// Admission refuses work this member cannot commit soon (SPEC 15);
	// nil admits everything.
	Admission *admission.Controller
	// MaxWatches bounds the watches of every client of this member:
	// WebSocket watches and parked blocking queries (0: no limit).
	MaxWatches int
	Logger     *slog.Logger
	Metrics    http.Handler // served at /metrics; nil serves 404
	// Extra routes (dashboard and the like) mounted on the same mux.
	Extra map[string]http.Handler
	// Pprof serves Go's profiler under /debug/pprof/ (admin access).
	Pprof bool
	// Hosts is the Host check every request passes first (SPEC 19; see
	// HostCheck). nil serves every Host: only for a handler no browser can
	// reach (tests).
	Hosts *HostCheck
	// MaxRestoreBytes bounds an uploaded backup (413 beyond); 0 means
	// DefaultMaxRestoreBytes. The whole backup is held in memory, decoded
	// and re-encoded while it is restored, so a member needs a few times
	// this much free memory; and every member installs the restored state
	// as a Raft snapshot, which raftnode bounds too: keep this below that.
	MaxRestoreBytes int64
}

// DefaultMaxRestoreBytes is the restore limit unless configured: far above
// the state of millions of locks and sessions, far below a member's memory.
const DefaultMaxRestoreBytes = 256 << 20

// Handler is the HTTP API of one member.
type Handler struct {
	b    Backend
	obs  Observer
	auth *auth.Store
	log  *slog.Logger
	mux  *http.ServeMux
	// routes holds the API (router.go); the mux the rest.
	routes router
	// maxRestore bounds an uploaded backup (Config.MaxRestoreBytes).
	maxRestore int64
	adm        *admission.Controller
	hosts      *HostCheck
	maxWatches int64
	watches    atomic.Int64 // WebSocket watches and blocking queries open
	// replyBudget bounds the bytes of read replies being encoded at once
	// (see replybytes.go).
	replyBudget *semaphore.Weighted
}

// New builds the handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.MaxRestoreBytes <= 0 {
		cfg.MaxRestoreBytes = DefaultMaxRestoreBytes
	}
	h := &Handler{b: cfg.Backend, obs: cfg.Observer, auth: cfg.Auth, log: cfg.Logger, mux: http.NewServeMux(),
		maxRestore: cfg.MaxRestoreBytes, adm: cfg.Admission, hosts: cfg.Hosts, maxWatches: int64(cfg.MaxWatches),
		replyBudget: newReplyBudget()}
	// API routes go on the router, not the mux (see router.go): wrong
	// methods are 405, lock names may span segments, empty names are 400.
	rt := &h.routes
	rt.handle("POST", "/api/v1/locks/{name}/acquire", h.acquire)
	rt.handle("POST", "/api/v1/locks/{name}/release", h.release)
	rt.handle("POST", "/api/v1/locks/{name}/renew", h.renew)
	rt.handle("POST", "/api/v1/locks/{name}/value", h.setValue) // SPEC "Values and elections"
	rt.handle("POST", "/api/v1/locks/{name}/cancel", h.cancel)  // SPEC 18
	rt.handle("GET", "/api/v1/locks/{name}", h.getLock)
	rt.handle("GET", "/api/v1/locks/{name}/holders", h.holders) // SPEC 16
	rt.handle("DELETE", "/api/v1/locks/{name}", h.revoke)       // SPEC "Revocation"
	rt.handle("GET", "/api/v1/locks", h.listLocks)
	rt.handle("POST", "/api/v1/acquire", h.acquireMany) // SPEC "Multi-lock"
	rt.handle("POST", "/api/v1/cancel", h.cancelMany)   // SPEC 18
	rt.handle("POST", "/api/v1/sessions", h.createSession)
	rt.handle("POST", "/api/v1/sessions/{id}/keepalive", h.keepalive)
	rt.handle("DELETE", "/api/v1/sessions/{id}", h.deleteSession)
	rt.handle("GET", "/api/v1/ws", h.websocket)
	rt.handle("GET", "/api/v1/cluster", h.cluster)
	rt.handle("POST", "/api/v1/cluster/members", h.addMember)
	rt.handle("DELETE", "/api/v1/cluster/members/{id}", h.removeMember)
	rt.handle("POST", "/api/v1/cluster/transfer-leadership", h.transfer)
	rt.handle("GET", "/api/v1/status", h.status)
	rt.handle("GET", "/api/v1/snapshot", h.backup)
	rt.handle("POST", "/api/v1/snapshot/restore", h.restore).ownBody = true
	rt.handle("GET", "/healthz", h.healthz)
	rt.handle("GET", "/readyz", h.readyz)
	rt.handle("GET", "/api/v1/openapi.json", h.openapiDocument) // api/openapi: the API reference
	if cfg.Metrics != nil {
		rt.handle("GET", "/metrics", cfg.Metrics.ServeHTTP)
	}
	m := h.mux
	for pattern, handler := range cfg.Extra {
		m.Handle(pattern, handler)
	}
	if cfg.Pprof {
		h.mountPprof()
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{code: api.CodeNotFound, msg: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.hosts.check(r.Host); err != nil {
		writeError(w, err)
		return
	}
	if !h.routes.serve(w, r) {
		h.mux.ServeHTTP(w, r)
	}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError renders any error as the SPEC error body.
func writeError(w http.ResponseWriter, err error) {
	code, msg := errorCode(err)
	if code == api.CodeNoLeader {
		w.Header().Set("Retry-After", "1")
	}
	var ae *apiError
	if errors.As(err, &ae) && ae.retryAfter > 0 {
		// Whole seconds, rounded up: a client never comes back early.
		w.Header().Set("Retry-After", strconv.FormatInt(int64((ae.retryAfter+time.Second-1)/time.Second), 10))
	}
	writeJSON(w, api.Status(code), api.ErrorReply{Error: api.Error{Code: code, Message: msg}})
}

// workClass is how admission control sees a command: a new promise
// (acquire, session) or one that keeps a promise (everything else,
// including a hand-off, whose release must not wait behind acquires).
func workClass(cmd locktable.Command) admission.Class {
	switch {
	case cmd.Op == locktable.OpAcquire && cmd.Token == 0, cmd.Op == locktable.OpCreateSession:
		return admission.Acquire
	default:
		return admission.Keep
	}
}

// propose admits cmd and replicates it. Work this member cannot commit
// soon is refused before it costs a log entry or a waiting goroutine:
// overloaded (503) or a client's or token's budget (429), each with the
// delay after which to retry.
func (h *Handler) propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	if h.adm != nil {
		t, ref := h.adm.Admit(workClass(cmd), cmd.ClientID, cmd.Owner)
		if ref != nil {
			h.obs.Refused(ref.Code, cmd.Op.String())
			return locktable.Result{}, &apiError{code: ref.Code, msg: ref.Message, retryAfter: ref.RetryAfter}
		}
		defer t.Done()
	}
	return h.b.Propose(ctx, cmd)
}

// readIndex admits a linearizable read and makes the next View one.
func (h *Handler) readIndex(ctx context.Context, op string) error {
	if h.adm != nil {
		t, ref := h.adm.Admit(admission.Read, "", "")
		if ref != nil {
			h.obs.Refused(ref.Code, op)
			return &apiError{code: ref.Code, msg: ref.Message, retryAfter: ref.RetryAfter}
		}
		defer t.Done()
	}
	return h.b.ReadIndex(ctx)
}

func errorCode(err error) (string, string) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.code, ae.msg
	case errors.Is(err, ErrNotLeader):
		return api.CodeNoLeader, "no leader available, retry: " + err.Error()
	case errors.Is(err, ErrUnknownOutcome):
		return api.CodeNoLeader, "leadership changed before the request committed; it may or may not have taken effect, and a retry is safe: " + err.Error()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return api.CodeNoLeader, "request timed out waiting for the cluster, retry: " + err.Error()
	default:
		return api.CodeInternal, err.Error()
	}
}

// routeToLeader answers a write or linearizable read on a member that is
// not a ready leader: 307 to the leader when one is known, else 503. It
// returns true when the request was answered.
func (h *Handler) routeToLeader(w http.ResponseWriter, r *http.Request) bool {
	if h.b.Ready() {
		return false
	}
	leader := h.b.LeaderURL()
	self := h.b.Status()
	if leader == "" || self.LeaderID == self.ID {
		// No leader, or this member leads but is still catching up.
		writeError(w, &apiError{code: api.CodeNoLeader, msg: "no leader is available yet; retry shortly"})
		return true
	}
	w.Header().Set(api.HeaderLeader, leader)
	w.Header().Set("Location", strings.TrimRight(leader, "/")+r.URL.RequestURI())
	writeJSON(w, http.StatusTemporaryRedirect, api.ErrorReply{
		Error:  api.Error{Code: api.CodeNotLeader, Message: "this member is a follower; the leader is " + leader},
		Leader: leader,
	})
	return true
}

// allow authorizes the request for access on name (a lock name or prefix;
// "" for cluster-wide operations). With anyPrefix, access on any prefix is
// enough (sessions, WebSocket: each lock they touch is checked later). It
// answers 401/403 itself and returns false when refused.
func (h *Handler) allow(w http.ResponseWriter, r *http.Request, access auth.Access, name string, anyPrefix bool) (auth.Identity, bool) {
	if h.auth == nil {
		return auth.Identity{}, true
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	id, err := h.auth.Authenticate(strings.TrimSpace(bearer))
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lockd"`)
		writeError(w, &apiError{code: api.CodeUnauthenticated, msg: "a valid bearer token is required (Authorization: Bearer <token>)"})
		return id, false
	}
	ok := id.Allows(access, name)
	if anyPrefix {
		ok = id.AllowsAny(access)
	}
	if !ok {
		what := "lock (or prefix) " + strconv.Quote(name)
		switch {
		case anyPrefix:
			what = "any lock"
		case name == "" && access == auth.Admin:
			what = "cluster operations (they need admin on the empty prefix)"
		case name == "":
			what = "every lock (the empty prefix)"
		}
		writeError(w, &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q lacks %s access to %s", id.Name, access, what)})
		return id, false
	}
	return id, true
}

// lockName reads and validates the {name} path value.
func lockName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if why := ValidLockName(name); why != "" {
		return "", invalid("%s", why)
	}
	return name, nil
}

func stateError(code locktable.Code, lock, holder string) error {
	switch code {
	case locktable.CodeLockHeld:
		if holder == "" {
			return &apiError{code: api.CodeLockHeld, msg: "lock " + lock + " is not free for a newcomer: earlier waiters or a lock-delay come first"}
		}
		return &apiError{code: api.CodeLockHeld, msg: "lock " + lock + " is held by " + holder}
	case locktable.CodeNotHolder:
		return &apiError{code: api.CodeNotHolder, msg: "the client does not hold lock " + lock + " with that fencing token"}
	case locktable.CodeSessionExpired:
		return &apiError{code: api.CodeSessionExpired, msg: "the session does not exist or has expired"}
	case locktable.CodeLimitMismatch:
		return &apiError{code: api.CodeLimitMismatch, msg: "lock " + lock + " is a lock of another kind: its limit (semaphore size) differs from the one asked for, or a shared grant was asked of a semaphore"}
	default:
		return invalid("the request was refused by the state machine as malformed")
	}
}

// queuedDeadline is the deadline of the wait a committed acquire queued
// for client (0 if it queued none). The deadline names the wait: the end of
// an earlier wait of the same client on the same lock must not answer it.
func queuedDeadline(res locktable.Result, client string) int64 {
	var d int64
	for _, ev := range res.Events {
		if ev.Kind == locktable.EvQueued && ev.ClientID == client {
			d = ev.Deadline
		}
	}
	return d
}

func (h *Handler) grantReply(lock, client string, token uint64, mode locktable.Mode, expiresAt int64) api.AcquireReply {
	return api.AcquireReply{Acquired: true, Lock: lock, ClientID: client, FencingToken: token,
		ExpiresAt: api.FormatTime(expiresAt), FencingProof: h.b.Sign(lock, token, mode, expiresAt),
		Mode: mode.String()}
}

// grantsReply is a multi-acquire's grant reply, one grant per lock in name
// order.
func (h *Handler) grantsReply(client string, grants []locktable.Grant) api.AcquireReply {
	out := api.AcquireReply{Acquired: true, ClientID: client, Grants: make([]api.Grant, len(grants))}
	for i, g := range grants {
		out.Grants[i] = api.Grant{Lock: g.Lock, FencingToken: g.Token, ExpiresAt: api.FormatTime(g.ExpiresAt),
			Mode: g.Mode.String(), FencingProof: h.b.Sign(g.Lock, g.Token, g.Mode, g.ExpiresAt)}
	}
	if len(grants) > 0 {
		out.Mode = grants[0].Mode.String()
	}
	return out
}

// holding returns client's grant of lock in the table, if it holds one.
func holding(t *locktable.Table, lock, client string) (locktable.Holder, bool) {
	return t.HolderOf(lock, client)
}

func (h *Handler) acquire(w http.ResponseWriter, r *http.Request) {
	// outcome stays "" for a request this member does not serve (refused
	// token, redirect to the leader): the member that serves it records it.
	start, outcome := time.Now(), ""
	defer func() {
		if outcome != "" {
			h.obs.AcquireDone(outcome, time.Since(start))
		}
	}()
	reject := func(err error) {
		outcome, _ = errorCode(err)
		writeError(w, err)
	}
	name, err := lockName(r)
	if err != nil {
		reject(err)
		return
	}
	who, ok := h.allow(w, r, auth.Lock, name, false)
	if !ok {
		return
	}
	var req api.AcquireRequest
	if err := decode(w, r, &req, false); err != nil {
		reject(err)
		return
	}
	if err := validClientID("client_id", req.ClientID); err != nil {
		reject(err)
		return
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		reject(err)
		return
	}
	if err := checkRange("wait_timeout_ms", req.WaitTimeoutMs, 0, api.MaxWaitTimeoutMs); err != nil {
		reject(err)
		return
	}
	if err := validSessionID(req.SessionID); err != nil {
		reject(err)
		return
	}
	kinds, err := validKinds(req.Mode, req.Limit, req.LockDelayMs, req.Value)
	if err != nil {
		reject(err)
		return
	}
	if !h.leaderWithSession(w, r, who, req.SessionID, reject) {
		return
	}
	ttl, wait := acquireTimes(req.TTLms, req.WaitTimeoutMs, req.SessionID)
	cmd := kinds
	cmd.Op, cmd.Lock, cmd.ClientID, cmd.SessionID = locktable.OpAcquire, name, req.ClientID, req.SessionID
	cmd.TTLms, cmd.WaitMs, cmd.Owner = ttl, wait, who.Name
	outcome = h.acquireLoop(w, r, cmd, []string{name}, acquireAnswers{
		granted: func(res locktable.Result) {
			writeJSON(w, 200, h.grantReply(name, req.ClientID, res.Token, res.Mode, res.ExpiresAt))
		},
		refused: func(res locktable.Result) string {
			e := h.refusal("acquire", resultError(res, name))
			if res.Code != locktable.CodeLockHeld {
				return writeErrorCode(w, e)
			}
			code, msg := errorCode(e)
			writeJSON(w, 409, lockHeldReply{Holder: res.Holder, Error: &api.Error{Code: code, Message: msg}})
			return code
		},
		// A try by a client whose earlier wait is queued on this lock: the
		// state machine keeps that wait's place and answers Queued. The try
		// cannot be granted now, so it is lock_held naming the holder, at
		// once; the earlier wait is untouched and answers for itself.
		// (Granted meanwhile, to this very wait: say so.)
		tryQueued: func() string {
			var li locktable.LockInfo
			var mine locktable.Holder
			var held bool
			h.b.View(func(t *locktable.Table) {
				li = t.Get(name)
				mine, held = holding(t, name, req.ClientID)
			})
			if held {
				writeJSON(w, 200, h.grantReply(name, req.ClientID, mine.Token, mine.Mode, mine.ExpiresAt))
				return "granted"
			}
			writeJSON(w, 409, lockHeldReply{Holder: li.ClientID,
				Error: &api.Error{Code: api.CodeLockHeld, Message: "lock " + name + " is held by " + li.ClientID +
					"; the earlier wait of this client keeps its place in the queue"}})
			return api.CodeLockHeld
		},
	})
}

func closeSub(s *notify.Sub) {
	if s != nil {
		s.Close()
	}
}

// awaitGrant waits for the outcome of a queued acquire of one lock, or of
// a multi-acquire of several (names in name order), and writes the reply.
// It returns true when the caller should re-propose instead, and the
// outcome for metrics.
func (h *Handler) awaitGrant(w http.ResponseWriter, r *http.Request, sub *notify.Sub, names []string, client string, deadline time.Time, waitDeadline int64) (bool, string) {
	multi := len(names) > 1
	what := "lock " + names[0]
	if multi {
		what = "locks " + strings.Join(names, ", ")
	}
	reply := func(grants []locktable.Grant) {
		if multi {
			writeJSON(w, 200, h.grantsReply(client, grants))
			return
		}
		g := grants[0]
		writeJSON(w, 200, h.grantReply(g.Lock, client, g.Token, g.Mode, g.ExpiresAt))
	}
	timedOut := func() (bool, string) {
		writeJSON(w, 409, api.AcquireReply{Acquired: false,
			Error: &api.Error{Code: api.CodeWaitTimeout, Message: "timed out waiting for " + what}})
		return false, api.CodeWaitTimeout
	}
	// A multi-acquire's grants commit in one step, one event per lock.
	got := make(map[string]locktable.Grant, len(names))
	// The leader's waiter timer ends the wait with a committed timeout; this
	// fallback only covers a timer that cannot commit (leadership trouble).
	fallback := time.NewTimer(time.Until(deadline) + 2*time.Second)
	defer fallback.Stop()
	// handle answers the request if ev ends its wait (done).
	handle := func(ev locktable.Event) (done bool, outcome string) {
		if ev.ClientID != client || !slices.Contains(names, ev.Lock) || (len(ev.Locks) > 0) != multi {
			return false, ""
		}
		switch ev.Kind {
		case locktable.EvGranted:
			if ev.Reason == locktable.ReasonRegrant {
				return false, ""
			}
			got[ev.Lock] = locktable.Grant{Lock: ev.Lock, Token: ev.Token, ExpiresAt: ev.ExpiresAt, Mode: ev.Mode}
			if len(got) < len(names) {
				return false, ""
			}
			grants := make([]locktable.Grant, len(names))
			for i, n := range names {
				grants[i] = got[n]
			}
			reply(grants)
			return true, "granted_after_wait"
		case locktable.EvWaitEnded:
			if ev.Deadline != waitDeadline {
				return false, "" // an earlier wait of this client on this lock
			}
			switch ev.Reason {
			case locktable.ReasonSessionExpired:
				writeError(w, &apiError{code: api.CodeSessionExpired, msg: "the session ended while waiting for " + what})
				return true, api.CodeSessionExpired
			case locktable.ReasonCancelled:
				writeJSON(w, 409, api.AcquireReply{Acquired: false,
					Error: &api.Error{Code: api.CodeCancelled, Message: "the wait for " + what + " was withdrawn (cancel)"}})
				return true, api.CodeCancelled
			}
			_, outcome := timedOut()
			return true, outcome
		}
		return false, ""
	}
	for {
		select {
		case <-sub.Ready():
			for _, ev := range sub.Take() {
				if done, outcome := handle(ev); done {
					return false, outcome
				}
			}
		case <-sub.Done():
			if errors.Is(sub.Err(), notify.ErrOverflow) || errors.Is(sub.Err(), notify.ErrResync) {
				return true, "" // re-propose the idempotent acquire to learn where it stands
			}
			writeError(w, &apiError{code: api.CodeNoLeader, msg: "leadership changed while waiting; retry on the new leader (the queue place is kept)"})
			return false, api.CodeNoLeader
		case <-fallback.C:
			// This member's table may be stale (the process was frozen past
			// the deadline, or deposed without knowing yet) while another
			// leader granted this very wait: only a linearizable read decides.
			if err := h.b.ReadIndex(r.Context()); err != nil {
				writeError(w, &apiError{code: api.CodeNoLeader, msg: "could not confirm the outcome of the wait; retry on the leader (the queue place is kept until the wait deadline)"})
				return false, api.CodeNoLeader
			}
			var grants []locktable.Grant
			queued := false
			h.b.View(func(t *locktable.Table) {
				for _, n := range names {
					if g, ok := holding(t, n, client); ok {
						grants = append(grants, locktable.Grant{Lock: n, Token: g.Token, ExpiresAt: g.ExpiresAt, Mode: g.Mode})
					}
					for _, wt := range t.Waiters(n) {
						queued = queued || wt.ClientID == client
					}
				}
			})
			if len(grants) == len(names) {
				reply(grants)
				return false, "granted_after_wait"
			}
			if queued { // the committed end of the wait has not come yet
				writeError(w, &apiError{code: api.CodeNoLeader, msg: "the end of the wait is not committed yet; retry on the leader (the queue place is kept until the wait deadline)"})
				return false, api.CodeNoLeader
			}
			// Neither holding nor queued, as of a linearizable read: this
			// wait can no longer be granted.
			return timedOut()
		case <-r.Context().Done():
			// The client left, or this member is stopping (Close cancels every
			// request). Never return without a reply: net/http would send an
			// empty 200, which reads as a grant. The queue place is kept until
			// the wait deadline, so a retry on the leader keeps it.
			writeError(w, &apiError{code: api.CodeNoLeader, msg: "this member stopped serving while the acquire waited; retry on the leader (the queue place is kept until the wait deadline)"})
			return false, "client_gone"
		}
	}
}

// holderRequest reads what every request of a lock's holder starts with
// (release, renew, value): the lock name, lock access to it, the body into
// body, and the holder's client_id and fencing_token as holder returns them
// once the body is read. It answers a refused request itself and then
// reports false.
func (h *Handler) holderRequest(w http.ResponseWriter, r *http.Request, body any, holder func() (string, uint64)) (string, auth.Identity, bool) {
	name, err := lockName(r)
	if err != nil {
		writeError(w, err)
		return "", auth.Identity{}, false
	}
	who, ok := h.allow(w, r, auth.Lock, name, false)
	if !ok {
		return "", auth.Identity{}, false
	}
	if err := decode(w, r, body, false); err != nil {
		writeError(w, err)
		return "", auth.Identity{}, false
	}
	client, token := holder()
	if err := validClientID("client_id", client); err != nil {
		writeError(w, err)
		return "", auth.Identity{}, false
	}
	if token == 0 {
		writeError(w, invalid("fencing_token is required"))
		return "", auth.Identity{}, false
	}
	return name, who, true
}

func (h *Handler) release(w http.ResponseWriter, r *http.Request) {
	var req api.ReleaseRequest
	name, who, ok := h.holderRequest(w, r, &req, func() (string, uint64) { return req.ClientID, req.FencingToken })
	if !ok {
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	res, err := h.propose(r.Context(), locktable.Command{Op: locktable.OpRelease, Lock: name,
		ClientID: req.ClientID, Token: req.FencingToken, Owner: who.Name})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, stateError(res.Code, name, ""))
		return
	}
	writeJSON(w, 200, api.ReleaseReply{Released: true})
}

func (h *Handler) renew(w http.ResponseWriter, r *http.Request) {
	var req api.RenewRequest
	name, who, ok := h.holderRequest(w, r, &req, func() (string, uint64) { return req.ClientID, req.FencingToken })
	if !ok {
		return
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	cmd := locktable.Command{Op: locktable.OpRenew, Lock: name, ClientID: req.ClientID, Token: req.FencingToken, Owner: who.Name}
	if req.TTLms != nil {
		cmd.TTLms = *req.TTLms
	}
	res, err := h.propose(r.Context(), cmd)
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, stateError(res.Code, name, ""))
		return
	}
	// A proof expires with the grant it was signed for: a renewal hands
	// out one for the new expiry, or the holder's fenced writes would be
	// refused while it still holds the lock.
	writeJSON(w, 200, api.RenewReply{Renewed: true, ExpiresAt: api.FormatTime(res.ExpiresAt),
		FencingProof: h.b.Sign(name, res.Token, res.Mode, res.ExpiresAt)})
}

func statusOf(li locktable.LockInfo) api.LockStatus {
	// No SessionID: a session id is a capability (see sessions.go).
	st := api.LockStatus{Lock: li.Name, Held: li.Held, ClientID: li.ClientID,
		FencingToken: li.Token, ExpiresAt: api.FormatTime(li.ExpiresAt), Waiters: li.Waiters,
		Mode: api.ModeNone, Limit: li.Limit, Value: li.Value, DelayedUntil: api.FormatTime(li.DelayedUntil),
		Index: li.Index}
	st.HoldersTotal = li.HoldersTotal
	if li.Held {
		st.Mode = li.Mode.String()
		st.Holders = make([]api.HolderStatus, len(li.Holders)) // at most 64: the lowest tokens
		for i, h := range li.Holders {
			st.Holders[i] = holderStatus(h)
		}
	}
	return st
}

// readable makes the request's read linearizable unless ?stale=true; it
// answers the request itself (redirect or error) and returns false when the
// read cannot be served here.
func (h *Handler) readable(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Query().Get("stale") == "true" {
		return true
	}
	if h.routeToLeader(w, r) {
		return false
	}
	if err := h.readIndex(r.Context(), "read"); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

func (h *Handler) getLock(w http.ResponseWriter, r *http.Request) {
	name, err := lockName(r)
	if err != nil {
		writeError(w, err)
		return
	}
	who, ok := h.allow(w, r, auth.Read, name, false)
	if !ok {
		return
	}
	index, wait, blocking, err := blockingParams(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !h.readable(w, r) {
		return
	}
	stale := r.URL.Query().Get("stale") == "true"
	if blocking {
		h.blockingGet(w, r, who, name, index, wait, stale)
		return
	}
	var li locktable.LockInfo
	h.b.View(func(t *locktable.Table) { li = t.Get(name) })
	st := statusOf(li)
	st.Stale = stale
	h.writeRead(w, r, statusBytes(st), st)
}

// blockingParams reads ?index=N&wait=D (SPEC "Watches"): blocking is true
// when index is given.
func blockingParams(r *http.Request) (index uint64, wait time.Duration, blocking bool, err error) {
	q := r.URL.Query()
	wait = api.DefaultWait
	if v := q.Get("wait"); v != "" || q.Has("wait") {
		d, perr := time.ParseDuration(v)
		if perr != nil || d < 0 {
			return 0, 0, false, invalid("wait must be a duration such as 500ms, 30s or 5m, got %q", v)
		}
		if d > api.MaxWait {
			return 0, 0, false, invalid("wait %s is above the limit of %s", d, api.MaxWait)
		}
		wait = d
	}
	if !q.Has("index") {
		return 0, wait, false, nil
	}
	index, perr := strconv.ParseUint(q.Get("index"), 10, 64)
	if perr != nil {
		return 0, 0, false, invalid("index must be a log index (an unsigned integer), got %q", q.Get("index"))
	}
	return index, wait, true, nil
}

// blockingGet answers when a change of the lock with an index above index
// commits, or when wait ends, with the status at that point. It answers
// early when it cannot tell (leadership changed, the state was replaced, or
// it fell behind): clients compare index and ask again. A parked query is a
// goroutine blocked on its watch's channel; nothing polls.
//
// A query parks for up to 10 minutes: its token is checked again before it
// answers (SPEC 20), so a token removed from the token file meanwhile, or
// one that lost read access to the lock, reads nothing more.
func (h *Handler) blockingGet(w http.ResponseWriter, r *http.Request, who auth.Identity, name string, index uint64, wait time.Duration, stale bool) {
	// Watch before reading, so no change slips between the read and the
	// wait.
	wt, err := h.startWatch(func() *notify.Watch { return h.b.WatchLock(name, 1) })
	if err != nil {
		writeError(w, err)
		return
	}
	defer h.endWatch(wt)
	var li locktable.LockInfo
	read := func() { h.b.View(func(t *locktable.Table) { li = t.Get(name) }) }
	read()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// The change that answers, when one does: its status as of that change,
	// encoded once for every query it wakes (a status of 64 holders with
	// 4 KiB values is 256 KiB: two hundred parked queries must not copy it
	// two hundred times).
	var answer *notify.Change
	for li.Index <= index && answer == nil {
		select {
		case ch := <-wt.C():
			if ch.Status.Index > index {
				answer = ch
			}
			continue
		case <-wt.Resync():
		case <-timer.C:
		case <-r.Context().Done():
		}
		read()
		break
	}
	if h.auth != nil {
		id, err := h.auth.Refresh(who)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="lockd"`)
			writeError(w, &apiError{code: api.CodeUnauthenticated, msg: "the token was removed from the member's token file while the query waited"})
			return
		}
		if !id.Allows(auth.Read, name) {
			writeError(w, &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q lost read access to %q while the query waited", id.Name, name)})
			return
		}
	}
	if answer != nil && !stale {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		_, _ = w.Write(answer.Encoded(encodeStatus))
		_, _ = w.Write(newline)
		return
	}
	if answer != nil {
		li = answer.Status
	}
	st := statusOf(li)
	st.Stale = stale
	h.writeRead(w, r, statusBytes(st), st)
}

var newline = []byte("\n")

func (h *Handler) listLocks(w http.ResponseWriter, r *http.Request) {
	prefix, after, limit, err := listParams(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	if _, ok := h.allow(w, r, auth.Read, prefix, false); !ok {
		return
	}
	if !h.readable(w, r) {
		return
	}
	out := api.LockList{Locks: []api.LockStatus{}}
	var page []locktable.LockInfo
	h.b.View(func(t *locktable.Table) { page, out.Next = t.ListPage(prefix, after, limit) })
	for _, li := range page {
		out.Locks = append(out.Locks, statusOf(li))
	}
	h.writeRead(w, r, cutList(&out), out)
}

func (h *Handler) createSession(w http.ResponseWriter, r *http.Request) {
	who, ok := h.allow(w, r, auth.Lock, "", true)
	if !ok {
		return
	}
	var req api.SessionRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := validClientID("client_id", req.ClientID); err != nil {
		writeError(w, err)
		return
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinSessionTTLms, api.MaxSessionTTLms); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	ttl := int64(api.DefaultSessionTTL)
	if req.TTLms != nil {
		ttl = *req.TTLms
	}
	id, err := h.newSession(r.Context(), who.Name, req.ClientID, ttl)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, api.SessionReply{SessionID: id, TTLms: ttl})
}

// newSession creates a session owned by the identity owner.
func (h *Handler) newSession(ctx context.Context, owner, client string, ttl int64) (string, error) {
	id := h.newSessionID(owner)
	res, err := h.propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: id, ClientID: client,
		TTLms: ttl, Owner: owner})
	if err != nil {
		return "", err
	}
	if res.Code != locktable.OK {
		return "", h.refusal("create_session", resultError(res, ""))
	}
	return id, nil
}

func (h *Handler) keepalive(w http.ResponseWriter, r *http.Request) {
	who, ok := h.allow(w, r, auth.Lock, "", true)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := validSessionID(id); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	if err := h.sessionAccess(who, id); err != nil {
		writeError(w, err)
		return
	}
	ttl, ok, err := h.b.Keepalive(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	if !ok {
		writeError(w, stateError(locktable.CodeSessionExpired, "", ""))
		return
	}
	writeJSON(w, 200, api.SessionReply{TTLms: ttl})
}

func (h *Handler) deleteSession(w http.ResponseWriter, r *http.Request) {
	who, ok := h.allow(w, r, auth.Lock, "", true)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := validSessionID(id); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	if err := h.sessionAccess(who, id); err != nil {
		writeError(w, err)
		return
	}
	res, err := h.propose(r.Context(), locktable.Command{Op: locktable.OpDeleteSession, SessionID: id})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, stateError(res.Code, "", ""))
		return
	}
	writeJSON(w, 200, map[string]bool{"deleted": true})
}

func (h *Handler) cluster(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Read, "", true); !ok {
		return
	}
	cs, err := h.b.Cluster(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, cs)
}

func (h *Handler) addMember(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	var req api.AddMemberRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := ValidateAddMember(req); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	if err := h.b.AddMember(r.Context(), req); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]bool{"added": true})
}

func (h *Handler) removeMember(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	id := r.PathValue("id")
	if err := validClientID("id", id); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	if err := h.b.RemoveMember(r.Context(), id); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]bool{"removed": true})
}

func (h *Handler) transfer(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	var req api.TransferRequest
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	if err := h.b.TransferLeadership(r.Context(), req.To); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]bool{"transferred": true})
}

func (h *Handler) backup(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	data, err := h.b.Backup(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="lockd.snap"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = w.Write(data)
}

func (h *Handler) restore(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	tooLarge := &apiError{code: api.CodePayloadTooLarge,
		msg: fmt.Sprintf("the backup is over this member's restore limit of %d MiB", h.maxRestore>>20)}
	if r.ContentLength > h.maxRestore {
		writeError(w, tooLarge)
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxRestore))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, tooLarge)
		} else {
			writeError(w, invalid("reading the backup: %v", err))
		}
		return
	}
	opt := RestoreOptions{Force: r.URL.Query().Get("force") == "true"}
	if v := r.URL.Query().Get("min_token"); v != "" {
		n, perr := strconv.ParseUint(v, 10, 64)
		if perr != nil {
			writeError(w, invalid("min_token must be a fencing token (an unsigned integer), got %q", v))
			return
		}
		opt.MinToken = n
	}
	if err := h.b.RestoreBackup(r.Context(), data, opt); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]bool{"restored": true})
}

func (h *Handler) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, h.b.Status())
}

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]string{"status": "ok"})
}

func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	ok, why := h.b.Readyz()
	if !ok {
		writeJSON(w, 503, map[string]string{"status": "not ready", "reason": why})
		return
	}
	writeJSON(w, 200, map[string]string{"status": "ready"})
}
