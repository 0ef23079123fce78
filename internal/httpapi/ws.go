package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"net/http"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// wsConn is one WebSocket connection carrying one session.
//
// Requests are served concurrently (SPEC: one connection carries the
// concurrent work of a whole process): hello on the read goroutine, before
// anything read after it; every other request on a goroutine of its own,
// except that requests naming the same lock go through that lock's lane,
// one after another in the order they were read, so they take effect in the
// order they were sent. Replies go out as their requests complete, matched
// by id, through one writer (wswriter.go). Grants, losses and wait outcomes
// arrive from the event subscription and are pushed from the push loop.
type wsConn struct {
	h      *Handler
	c      *websocket.Conn
	w      *wsWriter
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	session  string
	client   string
	ttl      int64
	sub      *notify.Sub
	pending  map[string][]*pendingAcquire // lock (or multiKey) -> acquires waiting for their answer, in the order sent
	lanes    map[string][]*laneItem       // lock -> requests waiting for that lock's lane
	subReady chan struct{}
	id       auth.Identity // the connection's token as it was at the upgrade: its name owns the session
	auth     *wsAuth       // the token as it is now (wsauth.go); nil with auth off
	readOnly bool          // hello opened no session: a read token's connection (wsauth.go)

	work     sync.WaitGroup // request goroutines
	inflight chan struct{}  // bounds the requests in flight

	watches   map[uint64]*notify.Watch // by watch_id (under mu)
	nextWatch uint64

	// waits: lock (or multiKey) -> every deadline the session's current
	// wait there has had, in log order (its EvQueued events: the acquire
	// that queued it and each retry that joined it). Kept by the push
	// loop, under mu.
	waits map[string][]int64
}

// Watches per connection, and the changes buffered for each before it is
// flagged for a resync (a slow watcher never slows the leader).
const (
	maxWatchesPerConn = 1024
	watchBuffer       = 256
	// lockWatchBuffer: a watch of one lock needs fewer — its forwarder
	// drains the buffer as changes come, and one lock's changes cannot
	// outrun it for long — and thousands of them are what a member holds
	// most of (16 connections of 1024 lock watches cost 131 MiB with 256
	// each).
	lockWatchBuffer = 32
	// watchBacklog: with this many bytes queued for a client that does
	// not read, watches stop adding to them (changes are dropped and the
	// watcher is told to resync once the client has caught up), so a slow
	// watcher costs bounded memory and never ends its connection.
	defaultWatchBacklog = 1 << 20
)

// watchBacklog is defaultWatchBacklog; tests lower it.
var watchBacklog = defaultWatchBacklog

// maxInflight bounds the requests one connection may have in flight; the
// read loop waits for a slot beyond it (backpressure, not an error).
const maxInflight = 1024

// pendingAcquire is an acquire sent on this connection and not yet
// answered. deadline is the deadline its queued command gave the wait once
// that command has committed (0 before).
//
// The state machine keeps one wait per client and lock: an acquire sent
// while an earlier one waits joins that wait (it keeps its place) and moves
// its deadline to its own. Every acquire that joined a wait is answered by
// the wait's one outcome — the grant, the timeout at the last deadline it
// was given, the session's end — once each. Which acquires joined it is
// told by the log: the push loop records each deadline the wait was given
// (wsConn.waits), and the end of the wait answers the pending acquires
// whose deadline is among them. So an acquire that queued a new wait after
// an earlier one ended (a retry racing the timeout) is never answered by
// the end of the earlier one, which would tell a client "timed out" about a
// wait the log then grants.
type pendingAcquire struct {
	id       uint64
	deadline int64
	// grants collects a multi-acquire's grants: they commit in one step,
	// one event per lock, and are answered in one reply.
	grants map[string]locktable.Grant
	// ended holds the waits that ended before this acquire's own deadline
	// was known; queued settles them.
	ended []endedWait
}

// endedWait is a wait that ended without a grant: every deadline it had,
// and why it ended.
type endedWait struct {
	deadlines []int64
	reason    string
}

func (h *Handler) websocket(w http.ResponseWriter, r *http.Request) {
	// Read access somewhere is enough to connect: a read token's
	// connection serves watches (wsauth.go).
	id, ok := h.allow(w, r, auth.Read, "", true)
	if !ok {
		return
	}
	cw := &corkingWriter{ResponseWriter: w}
	c, err := websocket.Accept(cw, r, nil)
	if err != nil {
		return // Accept wrote the HTTP error
	}
	c.SetReadLimit(api.MaxBodyBytes + 1) // readFrame answers a frame over MaxBodyBytes before this limit closes the connection
	ctx, cancel := context.WithCancel(r.Context())
	wc := &wsConn{h: h, c: c, ctx: ctx, cancel: cancel, pending: map[string][]*pendingAcquire{}, waits: map[string][]int64{},
		lanes: map[string][]*laneItem{}, subReady: make(chan struct{}), id: id,
		inflight: make(chan struct{}, maxInflight)}
	if h.auth != nil {
		wc.auth = &wsAuth{store: h.auth, id: id, gen: h.auth.Generation()}
	}
	wc.w = newWSWriter(c, cw.cork, cancel)
	defer cancel()
	if !h.b.Ready() {
		leader := h.b.LeaderURL()
		self := h.b.Status()
		msg := api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeNotLeader, Message: "this member is not the leader"}, Leader: leader}
		if leader == "" || self.LeaderID == self.ID {
			msg.Error = &api.Error{Code: api.CodeNoLeader, Message: "no leader is available yet; retry shortly"}
			msg.Leader = ""
		}
		wc.send(msg)
		wc.w.close()
		c.Close(websocket.StatusTryAgainLater, "not the leader")
		return
	}
	h.obs.WebSocketConns(1)
	defer h.obs.WebSocketConns(-1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); wc.pushLoop() }()
	if wc.auth != nil {
		wg.Add(1)
		go func() { defer wg.Done(); wc.authLoop() }()
	}
	reason := wc.readLoop()
	cancel()
	wc.work.Wait()
	wg.Wait()
	wc.mu.Lock()
	if wc.sub != nil {
		wc.sub.Close()
	}
	for id, w := range wc.watches {
		wc.h.endWatch(w)
		delete(wc.watches, id)
	}
	wc.mu.Unlock()
	wc.w.close() // what the requests and pushes queued still goes out
	c.Close(websocket.StatusNormalClosure, reason)
}

func (wc *wsConn) send(m api.WSMessage) {
	b, _ := json.Marshal(m)
	wc.w.send(b)
}

func (wc *wsConn) replyErr(id uint64, err error) {
	code, msg := errorCode(err)
	m := api.WSMessage{ID: id, Type: api.TypeError, Error: &api.Error{Code: code, Message: msg}}
	var ae *apiError
	if errors.As(err, &ae) && ae.retryAfter > 0 {
		m.RetryAfterMs = ae.retryAfter.Milliseconds()
	}
	wc.send(m)
}

// readLoop handles requests until the connection ends; it returns a close
// reason.
func (wc *wsConn) readLoop() string {
	for {
		typ, b, err := readFrame(wc.ctx, wc.c)
		read := time.Now()
		if errors.Is(err, errFrameTooLarge) {
			wc.replyErr(0, &apiError{code: api.CodePayloadTooLarge, msg: fmt.Sprintf("a frame is over %d KiB; closing", api.MaxBodyBytes>>10)})
			wc.end()
			return "frame too large"
		}
		if err != nil {
			return "closed"
		}
		if typ != websocket.MessageText {
			wc.replyErr(0, invalid("frames must be text JSON"))
			continue
		}
		// Yield once per frame, to the back of the scheduler's global queue.
		// A connection whose frames are already buffered never blocks, and
		// the requests it spawns hand the processor to each other; while
		// client work keeps every processor's own queue full, the goroutines
		// the network poller wakes — Raft's heartbeat replies among them —
		// wait in the global queue, which a busy processor serves once per
		// 61 turns: a burst of 100k waits kept the heartbeat goroutine
		// runnable for up to 0.64 s, and the leader stepped down (execution
		// trace, docs/BENCHMARKS.md). Through the global queue client work
		// takes its turn behind what the network woke.
		runtime.Gosched()
		var req api.WSRequest
		if err := decodeJSON("frame", b, &req); err != nil {
			wc.replyErr(frameID(b), err)
			continue
		}
		if !wc.h.b.Ready() {
			wc.notLeader()
			wc.end()
			return "leadership lost"
		}
		if req.Op == api.OpHello {
			// Handled here, before anything read after it.
			herr := wc.hello(req)
			if herr != nil && wc.fail(req.ID, herr) {
				return "leadership lost"
			}
			wc.h.obs.WebSocketRequestDone(api.OpHello, time.Since(read))
			continue
		}
		if !wc.helloDone() {
			wc.replyErr(req.ID, invalid("the first request must be hello"))
			continue
		}
		select {
		case wc.inflight <- struct{}{}:
		case <-wc.ctx.Done():
			return "closed"
		}
		locks := requestLocks(req)
		if len(locks) == 0 {
			wc.work.Add(1)
			go func() {
				defer wc.work.Done()
				wc.serve(req, read)
			}()
			continue
		}
		// Requests naming one lock take effect in the order they were sent:
		// its lane serves them one at a time. A request naming several
		// (a multi-acquire) joins every one of their lanes and is served
		// once it heads them all; lanes are appended to in read order under
		// one lock, so two such requests meet in the same order everywhere.
		it := &laneItem{req: req, read: read, need: int32(len(locks)), done: make(chan struct{})}
		wc.mu.Lock()
		var idle []string
		for _, l := range locks {
			queued, busy := wc.lanes[l]
			wc.lanes[l] = append(queued, it)
			if !busy {
				idle = append(idle, l)
			}
		}
		wc.mu.Unlock()
		for _, l := range idle {
			wc.work.Add(1)
			go wc.runLane(l)
		}
	}
}

// laneItem is a request in the lanes of the locks it names.
type laneItem struct {
	req  api.WSRequest
	read time.Time     // when its frame was read
	need int32         // lanes still to reach it; the last one serves it
	done chan struct{} // closed once served
}

// requestLocks names the locks a request takes effect on, in name order
// (duplicates removed; validation happens when it is served).
func requestLocks(req api.WSRequest) []string {
	if req.Op == api.OpUnwatch || req.Op == api.OpKeepalive || req.Op == api.OpHello {
		return nil
	}
	if len(req.Locks) > 0 {
		if len(req.Locks) > api.MaxMultiLocks {
			return nil // refused when served; it orders with nothing
		}
		ls := slices.Clone(req.Locks)
		slices.Sort(ls)
		return slices.Compact(ls)
	}
	if req.Lock == "" {
		return nil
	}
	return []string{req.Lock}
}

// runLane serves the requests queued for one lock until none is left.
func (wc *wsConn) runLane(lock string) {
	defer wc.work.Done()
	for {
		wc.mu.Lock()
		q := wc.lanes[lock]
		if len(q) == 0 {
			delete(wc.lanes, lock)
			wc.mu.Unlock()
			return
		}
		it := q[0]
		wc.lanes[lock] = q[1:]
		last := false
		if it.need > 0 {
			it.need--
			last = it.need == 0
		}
		wc.mu.Unlock()
		if !last {
			// Another lane serves it: wait until it has, so nothing sent
			// after it on this lock overtakes it.
			select {
			case <-it.done:
			case <-wc.ctx.Done():
			}
			continue
		}
		wc.serve(it.req, it.read)
		close(it.done)
	}
}

// serve handles one request (not hello) read at read, and frees its
// in-flight slot.
func (wc *wsConn) serve(req api.WSRequest, read time.Time) {
	defer func() { <-wc.inflight }()
	if wc.ctx.Err() != nil {
		return
	}
	defer func() { wc.h.obs.WebSocketRequestDone(req.Op, time.Since(read)) }()
	runtime.Gosched() // behind what the network woke (see readLoop)
	defer wc.enter()()
	if err := wc.authorize(req); err != nil {
		wc.fail(req.ID, err)
		return
	}
	var herr error
	switch req.Op {
	case api.OpAcquire:
		herr = wc.acquire(req)
	case api.OpRelease:
		herr = wc.release(req)
	case api.OpRenew:
		herr = wc.renew(req)
	case api.OpKeepalive:
		herr = wc.keepalive(req)
	case api.OpValue:
		herr = wc.value(req)
	case api.OpCancel:
		herr = wc.cancelWait(req)
	case api.OpWatch:
		herr = wc.watch(req)
	case api.OpUnwatch:
		herr = wc.unwatch(req)
	default:
		herr = invalid("unknown op %q", req.Op)
	}
	if herr != nil {
		wc.fail(req.ID, herr)
	}
}

// fail answers a request with its error; when the error is that this member
// no longer leads, it tells the client where the leader is and ends the
// connection (reporting true).
func (wc *wsConn) fail(id uint64, err error) bool {
	wc.replyErr(id, err)
	if errors.Is(err, ErrNotLeader) {
		wc.notLeader()
		wc.end()
		return true
	}
	return false
}

// end ends the connection once what is queued for the client has been
// written (cancelling the read ends the connection at once).
func (wc *wsConn) end() {
	wc.w.flush()
	wc.cancel()
}

func (wc *wsConn) notLeader() {
	wc.send(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeNotLeader,
		Message: "this member is no longer the leader"}, Leader: wc.h.b.LeaderURL()})
}

func (wc *wsConn) sessionID() string {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.session
}

// helloDone reports whether hello was answered: a session, or none on a
// read-only connection.
func (wc *wsConn) helloDone() bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.session != "" || wc.readOnly
}

func (wc *wsConn) hello(req api.WSRequest) error {
	if wc.helloDone() {
		return invalid("hello was already sent on this connection")
	}
	defer wc.enter()()
	who, err := wc.identity()
	if err != nil {
		return err
	}
	if err := validClientID("client_id", req.ClientID); err != nil {
		return err
	}
	if err := checkRange("session_ttl_ms", req.SessionTTLms, api.MinSessionTTLms, api.MaxSessionTTLms); err != nil {
		return err
	}
	if err := validSessionID(req.SessionID); err != nil {
		return err
	}
	if who.Name != wc.id.Name && !who.IsAdmin() {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
			"the token of this connection became identity %q after it connected as %q; reconnect", who.Name, wc.id.Name)}
	}
	if wc.auth != nil && !who.AllowsAny(auth.Lock) {
		// A read token: no session to create or resume (sessions hold
		// locks); the connection serves watches.
		if req.SessionID != "" {
			return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
				"token %q has read access only: it cannot resume a session (its connection serves watches, without one)", who.Name)}
		}
		// Its subscription carries no event (no client id is that key), only
		// the end of this member's leadership, which ends the connection as
		// it ends a session's.
		sub := wc.h.b.Subscribe(readOnlySubscription)
		wc.mu.Lock()
		wc.readOnly, wc.client, wc.sub = true, req.ClientID, sub
		wc.mu.Unlock()
		close(wc.subReady)
		wc.send(api.WSMessage{ID: req.ID, Type: api.TypeHello, ReadOnly: true})
		return nil
	}
	id, ttl := req.SessionID, int64(api.DefaultSessionTTL)
	if req.SessionTTLms != nil {
		ttl = *req.SessionTTLms
	}
	// Subscribe before the session can be granted anything on this
	// connection, so no push is lost.
	sub := wc.h.b.Subscribe(req.ClientID)
	if id != "" {
		// Only the session's owner (or an admin) may resume it, and nothing
		// about a session reaches anyone else: not its lease, not whether it
		// exists (see sessions.go).
		if err := wc.h.sessionAccess(who, id); err != nil {
			sub.Close()
			return err
		}
		var s locktable.Session
		var ok bool
		wc.h.b.View(func(t *locktable.Table) { s, ok = t.Session(id) })
		if ok && s.ClientID != req.ClientID {
			sub.Close()
			return invalid("session %s belongs to another client_id", id)
		}
		if ok {
			var kerr error
			_, ok, kerr = wc.h.b.Keepalive(wc.ctx, id)
			if kerr != nil {
				sub.Close()
				return kerr
			}
		}
		if !ok {
			sub.Close()
			return &apiError{code: api.CodeSessionExpired, msg: "session " + id + " has expired; start a new one"}
		}
		ttl = s.TTLms
	} else {
		nid, err := wc.h.newSession(wc.ctx, wc.id.Name, req.ClientID, ttl)
		if err != nil {
			sub.Close()
			return err
		}
		id = nid
	}
	// The session's queued acquires tell which requests joined one wait
	// (see pendingAcquire); none was sent through it on this connection yet.
	sub.TellQueued(id)
	wc.mu.Lock()
	wc.session, wc.client, wc.ttl, wc.sub = id, req.ClientID, ttl, sub
	wc.mu.Unlock()
	close(wc.subReady)
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeHello, SessionID: id, SessionTTLms: ttl})
	return nil
}

func (wc *wsConn) acquire(req api.WSRequest) error {
	if len(req.Locks) > 0 {
		return wc.acquireMany(req)
	}
	cmd, err := wc.acquireCommand(req)
	if err != nil {
		return err
	}
	return wc.proposeAcquire(req.ID, cmd, nil)
}

// acquireCommand checks a one-lock acquire and makes its command.
func (wc *wsConn) acquireCommand(req api.WSRequest) (locktable.Command, error) {
	if why := ValidLockName(req.Lock); why != "" {
		return locktable.Command{}, invalid("%s", why)
	}
	if err := wc.allowLock(req.Lock); err != nil {
		return locktable.Command{}, err
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		return locktable.Command{}, err
	}
	if err := checkRange("wait_timeout_ms", req.WaitTimeoutMs, 0, api.MaxWaitTimeoutMs); err != nil {
		return locktable.Command{}, err
	}
	cmd, err := validKinds(req.Mode, req.Limit, req.LockDelayMs, req.Value)
	if err != nil {
		return locktable.Command{}, err
	}
	cmd.Op, cmd.Lock, cmd.ClientID, cmd.SessionID, cmd.Owner = locktable.OpAcquire, req.Lock, wc.client, wc.session, wc.id.Name
	if req.TTLms != nil {
		cmd.TTLms = *req.TTLms
	}
	if req.WaitTimeoutMs != nil {
		cmd.WaitMs = *req.WaitTimeoutMs
	}
	return cmd, nil
}

// proposeAcquire proposes a one-lock acquire answered under id. A
// hand-off's (cmd.Token set) release is answered by released, once the
// step committed, before anything of the acquire is answered here (a grant
// push may still overtake it).
func (wc *wsConn) proposeAcquire(id uint64, cmd locktable.Command, released func(locktable.Result, error)) error {
	// Record the request before proposing: the grant push may race the reply.
	p := &pendingAcquire{id: id}
	wc.mu.Lock()
	wc.pending[cmd.Lock] = append(wc.pending[cmd.Lock], p)
	wc.mu.Unlock()
	res, err := wc.h.propose(wc.ctx, cmd)
	if released != nil {
		released(res, err)
	}
	if err == nil && res.Code == locktable.OK {
		// Granted or queued: a grant reaches the client through pushLoop, the
		// one path for grants, so a fast hand-off cannot be lost or sent
		// twice.
		if res.Queued && cmd.WaitMs == 0 {
			// A try by a client already waiting (an earlier acquire on this
			// connection): the try cannot be granted now; the earlier wait
			// keeps its place and its own answer.
			if wc.unpend(cmd.Lock, p) {
				var holder string
				wc.h.b.View(func(t *locktable.Table) { holder = t.Get(cmd.Lock).ClientID })
				wc.refuseHeld(id, cmd.Lock, holder)
			}
			return nil // refused, or granted meanwhile and the push answered it
		}
		if res.Queued {
			wc.queued(cmd.Lock, p, res)
		}
		return nil
	}
	if !wc.unpend(cmd.Lock, p) {
		return nil // answered by a push meanwhile
	}
	if err != nil {
		return err
	}
	if res.Code == locktable.CodeLockHeld {
		wc.refuseHeld(id, cmd.Lock, res.Holder)
		return nil
	}
	return wc.h.refusal("acquire", resultError(res, cmd.Lock))
}

// refuseHeld answers an acquire that cannot be granted now (lock_held)
// naming the lock and its holder, as the HTTP 409 does: holder is always
// there, "" for a lock that is free but not for a newcomer.
func (wc *wsConn) refuseHeld(id uint64, lock, holder string) {
	code, msg := errorCode(stateError(locktable.CodeLockHeld, lock, holder))
	b, _ := json.Marshal(struct {
		ID     uint64     `json:"id"`
		Type   string     `json:"type"`
		Lock   string     `json:"lock"`
		Holder string     `json:"holder"`
		Error  *api.Error `json:"error"`
	}{id, api.TypeError, lock, holder, &api.Error{Code: code, Message: msg}})
	wc.w.send(b)
}

// multiKey is the pending key of a multi-acquire: its names in name order,
// joined by a byte no lock name holds, so it never equals a lock name.
func multiKey(names []string) string { return strings.Join(names, "\x00") }

// acquireMany is a multi-acquire over WebSocket (SPEC "Multi-lock"): its
// grants reach the client in one reply through pushLoop, as a single
// acquire's grant does.
func (wc *wsConn) acquireMany(req api.WSRequest) error {
	if req.Lock != "" {
		return invalid("an acquire names either lock or locks, not both")
	}
	names, err := validMultiAcquire(&api.MultiAcquireRequest{ClientID: wc.client, Locks: req.Locks,
		TTLms: req.TTLms, WaitTimeoutMs: req.WaitTimeoutMs})
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := wc.allowLock(n); err != nil {
			return err
		}
	}
	if req.Limit != nil && *req.Limit != 1 {
		return invalid("a multi-acquire takes ordinary locks (limit 1), not semaphores")
	}
	cmd, err := validKinds(req.Mode, nil, req.LockDelayMs, req.Value)
	if err != nil {
		return err
	}
	cmd.Op, cmd.Locks, cmd.ClientID, cmd.SessionID, cmd.Owner = locktable.OpAcquire, names, wc.client, wc.session, wc.id.Name
	if req.TTLms != nil {
		cmd.TTLms = *req.TTLms
	}
	if req.WaitTimeoutMs != nil {
		cmd.WaitMs = *req.WaitTimeoutMs
	}
	key := multiKey(names)
	p := &pendingAcquire{id: req.ID, grants: map[string]locktable.Grant{}}
	wc.mu.Lock()
	wc.pending[key] = append(wc.pending[key], p)
	wc.mu.Unlock()
	res, err := wc.h.propose(wc.ctx, cmd)
	if err == nil && res.Code == locktable.OK {
		if res.Queued && cmd.WaitMs == 0 {
			if wc.unpend(key, p) {
				wc.refuseHeld(req.ID, names[0], "")
			}
			return nil
		}
		if res.Queued {
			wc.queued(key, p, res)
		}
		return nil
	}
	if !wc.unpend(key, p) {
		return nil
	}
	if err != nil {
		return err
	}
	if res.Code == locktable.CodeLockHeld {
		wc.refuseHeld(req.ID, res.Lock, res.Holder)
		return nil
	}
	lock := res.Lock
	if lock == "" {
		lock = strings.Join(names, ", ")
	}
	return wc.h.refusal("acquire", resultError(res, lock))
}

// value is the holder setting its grant's value.
func (wc *wsConn) value(req api.WSRequest) error {
	if why := ValidLockName(req.Lock); why != "" {
		return invalid("%s", why)
	}
	if err := wc.allowLock(req.Lock); err != nil {
		return err
	}
	if req.Value == nil {
		return invalid("value is required")
	}
	if err := validValue(*req.Value); err != nil {
		return err
	}
	res, err := wc.h.propose(wc.ctx, locktable.Command{Op: locktable.OpSetValue, Lock: req.Lock,
		ClientID: wc.client, Token: req.FencingToken, Value: *req.Value, Owner: wc.id.Name})
	if err != nil {
		return err
	}
	if res.Code != locktable.OK {
		return resultError(res, req.Lock)
	}
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, Lock: req.Lock, FencingToken: res.Token})
	return nil
}

// unpend removes p from the acquires pending on lock; false when a push
// already answered (and removed) it.
func (wc *wsConn) unpend(lock string, p *pendingAcquire) bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	q := wc.pending[lock]
	i := slices.Index(q, p)
	if i < 0 {
		return false
	}
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(wc.pending, lock)
	} else {
		wc.pending[lock] = q
	}
	return true
}

// queued records the deadline of a committed wait, then settles the race
// with its end: if the wait already ended (its event went by while the
// deadline was unknown) and no grant took its place, it is answered as that
// end says. Events arrive in log order from the apply loop, so the end of
// this wait is either among those already seen or still to come.
func (wc *wsConn) queued(key string, p *pendingAcquire, res locktable.Result) {
	deadline := queuedDeadline(res, wc.client)
	wc.mu.Lock()
	if !slices.Contains(wc.pending[key], p) {
		wc.mu.Unlock()
		return // already answered (granted)
	}
	p.deadline = deadline
	var end *endedWait
	for i := range p.ended {
		if slices.Contains(p.ended[i].deadlines, deadline) {
			end = &p.ended[i]
			break
		}
	}
	p.ended = nil
	wc.mu.Unlock()
	if end != nil && wc.unpend(key, p) {
		wc.send(waitEndedReply(p.id, key, end.reason))
	}
}

// waitEndedReply answers acquire id, pending under key (a lock or a
// multiKey), whose wait ended ungranted for reason.
func waitEndedReply(id uint64, key, reason string) api.WSMessage {
	names := strings.Split(key, "\x00")
	what := "lock " + names[0]
	if len(names) > 1 {
		what = "locks " + strings.Join(names, ", ")
	}
	code, msg := api.CodeWaitTimeout, "timed out waiting for "+what
	switch reason {
	case locktable.ReasonSessionExpired:
		code, msg = api.CodeSessionExpired, "the session ended while waiting for "+what
	case locktable.ReasonCancelled:
		code, msg = api.CodeCancelled, "the wait for "+what+" was withdrawn (cancel)"
	}
	return api.WSMessage{ID: id, Type: api.TypeError, Lock: names[0], Error: &api.Error{Code: code, Message: msg}}
}

func (wc *wsConn) release(req api.WSRequest) error {
	if why := ValidLockName(req.Lock); why != "" {
		return invalid("%s", why)
	}
	if err := wc.allowLock(req.Lock); err != nil {
		return err
	}
	if req.Handoff != nil {
		return wc.handOff(req)
	}
	res, err := wc.h.propose(wc.ctx, locktable.Command{Op: locktable.OpRelease, Lock: req.Lock,
		ClientID: wc.client, Token: req.FencingToken, Owner: wc.id.Name})
	if err != nil {
		return err
	}
	if res.Code != locktable.OK {
		return stateError(res.Code, req.Lock, "")
	}
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, Lock: req.Lock, FencingToken: req.FencingToken})
	return nil
}

// handOff is a release that hands the lock on to another acquire of this
// client (req.Handoff) in the same committed step: the release answers
// under req.ID, the acquire under its own id. Both are checked before
// either is proposed: a bad acquire leaves the grant held.
func (wc *wsConn) handOff(req api.WSRequest) error {
	next := *req.Handoff
	switch {
	case next.ID == 0 || next.ID == req.ID:
		return invalid("handoff.id: the acquire needs an id of its own")
	case next.Op != "" && next.Op != api.OpAcquire:
		return invalid("handoff.op: a hand-off is an acquire")
	case next.Lock != "" && next.Lock != req.Lock:
		return invalid("handoff.lock: a hand-off acquires the lock it releases")
	case len(next.Locks) > 0 || next.Handoff != nil || next.Prefix != nil || next.WatchID != 0 || next.FencingToken != 0 ||
		next.ClientID != "" || next.SessionID != "" || next.SessionTTLms != nil:
		return invalid("handoff: only an acquire's fields (id, ttl_ms, wait_timeout_ms, mode, limit, lock_delay_ms, value)")
	}
	if req.FencingToken == 0 {
		return invalid("fencing_token is required")
	}
	next.Lock = req.Lock
	cmd, err := wc.acquireCommand(next)
	if err != nil {
		return err
	}
	cmd.Token = req.FencingToken
	var relErr error
	err = wc.proposeAcquire(next.ID, cmd, func(res locktable.Result, err error) {
		switch {
		case err != nil:
			relErr = err // the acquire's answer carries it too
		case res.Released:
			wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, Lock: req.Lock, FencingToken: req.FencingToken})
		case res.Code == locktable.OK || res.Code == locktable.CodeLockHeld || res.Code == locktable.CodeResourceExhausted ||
			res.Code == locktable.CodeLimitMismatch:
			wc.replyErr(req.ID, stateError(locktable.CodeNotHolder, req.Lock, ""))
		default:
			wc.replyErr(req.ID, resultError(res, req.Lock))
		}
	})
	if relErr != nil {
		wc.replyErr(req.ID, relErr)
	}
	if err != nil {
		wc.replyErr(next.ID, err)
		if errors.Is(err, ErrNotLeader) {
			wc.notLeader()
			wc.end()
		}
	}
	return nil
}

func (wc *wsConn) renew(req api.WSRequest) error {
	if why := ValidLockName(req.Lock); why != "" {
		return invalid("%s", why)
	}
	if err := wc.allowLock(req.Lock); err != nil {
		return err
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		return err
	}
	cmd := locktable.Command{Op: locktable.OpRenew, Lock: req.Lock, ClientID: wc.client, Token: req.FencingToken, Owner: wc.id.Name}
	if req.TTLms != nil {
		cmd.TTLms = *req.TTLms
	}
	res, err := wc.h.propose(wc.ctx, cmd)
	if err != nil {
		return err
	}
	if res.Code != locktable.OK {
		return stateError(res.Code, req.Lock, "")
	}
	// A fresh proof for the new expiry (see Handler.renew).
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, Lock: req.Lock, FencingToken: res.Token,
		ExpiresAt: api.FormatTime(res.ExpiresAt), FencingProof: wc.h.b.Sign(req.Lock, res.Token, res.Mode, res.ExpiresAt)})
	return nil
}

// cancelWait withdraws this connection's client's queued wait on a lock,
// or its multi-acquire's on Locks (SPEC 18). The withdrawn acquire is
// answered cancelled by its push, from the committed step; the reply says
// whether a wait was withdrawn. It runs on the lock's lane, after every
// earlier request naming the lock.
func (wc *wsConn) cancelWait(req api.WSRequest) error {
	cmd := locktable.Command{Op: locktable.OpCancel, ClientID: wc.client, Owner: wc.id.Name}
	if len(req.Locks) > 0 {
		if req.Lock != "" {
			return invalid("a cancel names either lock or locks, not both")
		}
		names, err := validLockSet(req.Locks)
		if err != nil {
			return err
		}
		cmd.Locks = names
	} else {
		if why := ValidLockName(req.Lock); why != "" {
			return invalid("%s", why)
		}
		cmd.Lock = req.Lock
	}
	for _, n := range requestLocks(req) {
		if err := wc.allowLock(n); err != nil {
			return err
		}
	}
	res, err := wc.h.propose(wc.ctx, cmd)
	if err != nil {
		return err
	}
	if res.Code != locktable.OK {
		return stateError(res.Code, req.Lock, "")
	}
	cancelled := res.Cancelled
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, Lock: req.Lock, Cancelled: &cancelled})
	return nil
}

func (wc *wsConn) keepalive(req api.WSRequest) error {
	ttl, ok, err := wc.h.b.Keepalive(wc.ctx, wc.session)
	if err != nil {
		return err
	}
	if !ok {
		return &apiError{code: api.CodeSessionExpired, msg: "session " + wc.session + " has expired"}
	}
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, SessionID: wc.session, SessionTTLms: ttl})
	return nil
}

// pushLoop turns committed events about this session into pushes.
func (wc *wsConn) pushLoop() {
	select {
	case <-wc.subReady:
	case <-wc.ctx.Done():
		return
	}
	wc.mu.Lock()
	sub, session := wc.sub, wc.session
	wc.mu.Unlock()
	for {
		select {
		case <-wc.ctx.Done():
			return
		case <-sub.Done():
			// What committed before the end is still told.
			for _, ev := range sub.Take() {
				if ev.SessionID == session {
					wc.push(ev)
				}
			}
			if errors.Is(sub.Err(), notify.ErrLeadershipLost) {
				wc.notLeader()
			} else if errors.Is(sub.Err(), notify.ErrOverflow) || errors.Is(sub.Err(), notify.ErrResync) {
				wc.send(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeInternal,
					Message: "event stream overflowed; reconnect and resume the session"}})
			}
			wc.end()
			return
		case <-sub.Ready():
			for _, ev := range sub.Take() {
				if ev.SessionID == session {
					wc.push(ev)
				}
			}
		}
	}
}

func (wc *wsConn) push(ev locktable.Event) {
	switch ev.Kind {
	case locktable.EvQueued:
		// A wait was queued, or joined by a retry that gave it its own
		// deadline: remember it as one of the wait's (see pendingAcquire).
		// A multi-acquire's step has one event per lock; count it once.
		key := ev.Lock
		if len(ev.Locks) > 0 {
			if ev.Lock != ev.Locks[0] {
				return
			}
			key = multiKey(ev.Locks)
		}
		wc.mu.Lock()
		// A try while queued gives no new deadline: the chain grows only
		// with retries that moved it, each of which has its own pending
		// acquire.
		if ds := wc.waits[key]; len(ds) == 0 || ds[len(ds)-1] != ev.Deadline {
			wc.waits[key] = append(ds, ev.Deadline)
		}
		wc.mu.Unlock()
	case locktable.EvGranted:
		if len(ev.Locks) > 0 {
			wc.pushMulti(ev)
			return
		}
		// Every acquire of this lock pending on this connection is answered
		// by the grant: they are one client's, and a grant is idempotent.
		wc.mu.Lock()
		ps := wc.pending[ev.Lock]
		delete(wc.pending, ev.Lock)
		delete(wc.waits, ev.Lock)
		wc.mu.Unlock()
		if len(ps) == 0 {
			return // nobody on this connection asked (a re-grant already answered)
		}
		proof := wc.h.b.Sign(ev.Lock, ev.Token, ev.Mode, ev.ExpiresAt)
		for _, p := range ps {
			wc.send(api.WSMessage{ID: p.id, Type: api.TypeGranted, Lock: ev.Lock, FencingToken: ev.Token,
				ExpiresAt: api.FormatTime(ev.ExpiresAt), FencingProof: proof, Mode: ev.Mode.String()})
		}
	case locktable.EvLost:
		reason := api.ReasonExpired
		switch ev.Reason {
		case locktable.ReasonSessionExpired:
			reason = api.ReasonSessionExpired
		case locktable.ReasonRevoked:
			reason = api.ReasonRevoked
		}
		wc.send(api.WSMessage{Type: api.TypeLost, Lock: ev.Lock, FencingToken: ev.Token, Reason: reason})
	case locktable.EvWaitEnded:
		// The end of a wait answers every acquire that joined it, and only
		// those; see pendingAcquire. (A multi-acquire's step has one event
		// per lock: the first takes the wait's deadlines, the others find
		// only their own, which answer nobody new.)
		key := ev.Lock
		if len(ev.Locks) > 0 {
			key = multiKey(ev.Locks)
		}
		var ended []*pendingAcquire
		wc.mu.Lock()
		end := endedWait{deadlines: append(wc.waits[key], ev.Deadline), reason: ev.Reason}
		delete(wc.waits, key)
		kept := wc.pending[key][:0]
		for _, p := range wc.pending[key] {
			switch {
			case p.deadline == 0:
				p.ended = append(p.ended, end) // queued decides once the deadline is known
				kept = append(kept, p)
			case slices.Contains(end.deadlines, p.deadline):
				ended = append(ended, p)
			default:
				kept = append(kept, p)
			}
		}
		if len(kept) == 0 {
			delete(wc.pending, key)
		} else {
			wc.pending[key] = kept
		}
		wc.mu.Unlock()
		for _, p := range ended {
			wc.send(waitEndedReply(p.id, key, ev.Reason))
		}
	case locktable.EvSessionEnded:
		wc.send(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeSessionExpired,
			Message: "session " + ev.SessionID + " ended (" + ev.Reason + ")"}})
		wc.end()
	}
}

// pushMulti collects a multi-acquire's grant events (one per lock, all from
// one committed step) and answers the pending request once all are in.
func (wc *wsConn) pushMulti(ev locktable.Event) {
	key := multiKey(ev.Locks)
	wc.mu.Lock()
	ps := wc.pending[key]
	var done []*pendingAcquire
	for _, p := range ps {
		p.grants[ev.Lock] = locktable.Grant{Lock: ev.Lock, Token: ev.Token, ExpiresAt: ev.ExpiresAt, Mode: ev.Mode}
		if len(p.grants) == len(ev.Locks) {
			done = append(done, p)
		}
	}
	if len(done) > 0 {
		delete(wc.pending, key) // they complete together: same client, same locks
	}
	delete(wc.waits, key)
	wc.mu.Unlock()
	for _, p := range done {
		gs := make([]locktable.Grant, len(ev.Locks))
		for i, n := range ev.Locks {
			gs[i] = p.grants[n]
		}
		r := wc.h.grantsReply(wc.client, gs)
		wc.send(api.WSMessage{ID: p.id, Type: api.TypeGranted, Grants: r.Grants, Mode: r.Mode})
	}
}

// watch starts a watch on one lock or on every lock under a prefix (SPEC
// "Watches"): the reply names it, then one changed frame per lock with
// state (for one lock: exactly one, free or not), then one per committed
// change in log order, and after the initial frames a synced frame naming
// the index they are as of (every later frame is above it). Requests are
// served on their lock's lane, so a watch of one lock is in place before
// anything sent after it on that lock takes effect.
func (wc *wsConn) watch(req api.WSRequest) error {
	if (req.Lock == "") == (req.Prefix == nil) {
		return invalid("watch names either lock or prefix")
	}
	if req.Prefix != nil {
		if len(*req.Prefix) > api.MaxLockName {
			return invalid("prefix is %d bytes, a lock name at most %d", len(*req.Prefix), api.MaxLockName)
		}
		if err := wc.allowRead(*req.Prefix, true); err != nil {
			return err
		}
	} else {
		if why := ValidLockName(req.Lock); why != "" {
			return invalid("%s", why)
		}
		if err := wc.allowRead(req.Lock, false); err != nil {
			return err
		}
	}
	var w *notify.Watch
	wc.mu.Lock()
	if len(wc.watches) >= maxWatchesPerConn {
		wc.mu.Unlock()
		return wc.h.refusal("watch", &apiError{code: api.CodeResourceExhausted,
			msg: fmt.Sprintf("this connection has %d watches, the limit", maxWatchesPerConn)})
	}
	// Watch before reading the initial state: a change committed meanwhile
	// is in the buffer, and dropped below if the state read reflects it.
	var err error
	if req.Prefix != nil {
		w, err = wc.h.startWatch(func() *notify.Watch { return wc.h.b.WatchPrefix(*req.Prefix, watchBuffer) })
	} else {
		w, err = wc.h.startWatch(func() *notify.Watch { return wc.h.b.WatchLock(req.Lock, lockWatchBuffer) })
	}
	if err != nil {
		wc.mu.Unlock()
		return err
	}
	wc.nextWatch++
	id := wc.nextWatch
	if wc.watches == nil {
		wc.watches = map[uint64]*notify.Watch{}
	}
	wc.watches[id] = w
	wc.mu.Unlock()
	// The initial state is a read like any other: linearizable, so a
	// leader that was paused and deposed meanwhile cannot show a watcher a
	// state older than what the new leader has committed (an observer
	// would see leaders go backwards). It confirms leadership with a quorum
	// first, or the watch fails with not_leader.
	if err := wc.h.readIndex(wc.ctx, "read"); err != nil {
		wc.mu.Lock()
		delete(wc.watches, id)
		wc.mu.Unlock()
		wc.h.endWatch(w)
		return err
	}
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, WatchID: id})
	pic := wc.initialState(id, req)
	synced := pic.oneIndex()
	if synced {
		wc.sendSynced(id, w, pic.index())
	} else {
		// Pages read at different indexes: the changes of earlier pages'
		// locks up to the last page's index are still to be sent (forward
		// does), and may still be on their way from the apply loop.
		w.SyncAt(pic.index())
	}
	wc.work.Add(1)
	go wc.forward(id, w, pic, synced)
	return nil
}

// watchPage is how many locks one read of a prefix watch's initial state
// takes (the table is read in pages, so a big prefix never holds up the
// apply loop for long); tests lower it.
var watchPage = api.DefaultListLimit

// picture is what a watch's initial frames showed: the watched locks read
// in pages of names, each page at the index of its own read (the table's
// LastChange then: every lock's state as of that index). A lock not listed
// had no state (was free) as of its page's index.
type picture struct {
	upTo []string // the last name of every page but the last, rising
	at   []uint64 // per page, the index it was read at (one more than upTo)
}

// indexOf is the index the picture showed lock name at: changes of it at
// or below are in the picture.
func (p *picture) indexOf(name string) uint64 {
	i, _ := slices.BinarySearch(p.upTo, name)
	return p.at[i]
}

// index is the index the whole picture is as of, once the changes of its
// earlier pages up to it were sent: the last page's (indexes only rise).
func (p *picture) index() uint64 { return slices.Max(p.at) }

// oneIndex reports whether every page was read at the same index.
func (p *picture) oneIndex() bool { return slices.Min(p.at) == p.index() }

// initialState sends the watched locks' current statuses and returns the
// picture they make.
func (wc *wsConn) initialState(id uint64, req api.WSRequest) *picture {
	pic := &picture{}
	send := func(li locktable.LockInfo) {
		// The picture must arrive whole, at the pace the client reads it:
		// past the watchers' share of the connection's queue, it waits
		// for the client instead of growing the queue (a prefix of a
		// hundred thousand locks would pass the connection's bound).
		for wc.w.backlog() >= watchBacklog && wc.ctx.Err() == nil {
			select {
			case <-wc.w.caughtUp():
			case <-wc.ctx.Done():
			}
		}
		status, _ := json.Marshal(statusOf(li))
		wc.w.sendParts(0, changedHead(id, li.Name, li.Index), status, closeBrace)
	}
	if req.Prefix == nil {
		var li locktable.LockInfo
		wc.h.b.View(func(t *locktable.Table) { li, pic.at = t.Get(req.Lock), []uint64{t.LastChange()} })
		send(li)
		return pic
	}
	after := ""
	for {
		var page []locktable.LockInfo
		var next string
		var at uint64
		wc.h.b.View(func(t *locktable.Table) {
			page, next = t.ListPage(*req.Prefix, after, watchPage)
			at = t.LastChange()
		})
		pic.at = append(pic.at, at)
		for _, li := range page {
			send(li)
		}
		if next == "" || wc.ctx.Err() != nil {
			return pic
		}
		pic.upTo = append(pic.upTo, next)
		after = next
	}
}

// sendSynced tells the client that watch id's initial frames are complete
// as of index, if the watch is still w (as sendIfWatching), and reports
// whether it was. index is always present, even 0 (a table nothing
// changed yet).
func (wc *wsConn) sendSynced(id uint64, w *notify.Watch, index uint64) bool {
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		WatchID uint64 `json:"watch_id"`
		Index   uint64 `json:"index"`
	}{api.TypeSynced, id, index})
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if wc.watches[id] != w {
		return false
	}
	wc.w.send(b)
	return true
}

// forward sends a watch's changes until it is unwatched or the connection
// ends: those above what the initial picture showed of their lock, so per
// lock indexes only rise, and nothing older than the picture comes after
// it. Until the synced frame is out (synced false), the changes of the
// picture's earlier pages up to its index complete it; synced goes out
// when the watch's Synced mark comes (every such change was handed over),
// or before the first change above the picture's index. A watch that
// dropped changes before it was synced is told to resync instead, and is
// never said to be synced.
func (wc *wsConn) forward(id uint64, w *notify.Watch, pic *picture, synced bool) {
	defer wc.work.Done()
	behind := false
	var caughtUp <-chan struct{} // set while behind
	for {
		select {
		case <-wc.ctx.Done():
			return
		case <-caughtUp:
			behind, caughtUp = false, nil
			wc.sendIfWatching(id, w, api.WSMessage{Type: api.TypeResync, WatchID: id})
		case ch, ok := <-w.C():
			if !ok {
				return
			}
			if ch.Synced {
				if !synced && !behind && !wc.sendSynced(id, w, pic.index()) {
					return
				}
				synced = true
				continue
			}
			if behind {
				continue
			}
			name := ch.Status.Name
			if ch.Status.Index != ch.Index {
				// The entry named the lock without changing it (a try by a
				// client already waiting): its status is one already shown.
				continue
			}
			if ch.Index <= pic.indexOf(name) {
				continue // the picture showed it, or a later state
			}
			if !synced {
				if ch.Index > pic.index() && !wc.sendSynced(id, w, pic.index()) {
					return
				}
				synced = ch.Index > pic.index()
			}
			sent, watching := wc.sendChangeIfWatching(id, w, ch)
			if !watching {
				return
			}
			if !sent {
				// Dropped: the client re-reads after the resync, sent once it
				// has read what is queued; a resync takes synced's place.
				behind, caughtUp, synced = true, wc.w.caughtUp(), true
			}
		case <-w.Resync():
			synced = true // a resync takes its place
			if !wc.sendIfWatching(id, w, api.WSMessage{Type: api.TypeResync, WatchID: id}) {
				return
			}
		}
	}
}

func (wc *wsConn) unwatch(req api.WSRequest) error {
	wc.mu.Lock()
	w, ok := wc.watches[req.WatchID]
	delete(wc.watches, req.WatchID)
	wc.mu.Unlock()
	if !ok {
		return &apiError{code: api.CodeNotFound, msg: fmt.Sprintf("no watch %d on this connection", req.WatchID)}
	}
	wc.h.endWatch(w)
	wc.send(api.WSMessage{ID: req.ID, Type: api.TypeOK, WatchID: req.WatchID})
	return nil
}
