package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// The lock-kinds workload (SPEC "Lock kinds"), on locks named kindPrefix*
// that no other worker uses, so the linearizability model of the
// exclusive locks never sees a second holder (see kinds_checkers_test.go):
//
//   - read-write locks kind-<epoch>-rw<i>: shared and exclusive acquires,
//     and multi-acquires over two or three of them (shared or exclusive);
//   - semaphores kind-<epoch>-s3-<i> (limit 3) and kind-<epoch>-s1-0 (a
//     semaphore asked for with limit 1): every acquire names the limit of
//     the name; now and then a holder of an s3 lock has another client
//     ask for it with limit 2, and for it and a read-write lock in one
//     multi-acquire, each tagged mismatch:<its token> (limit_mismatch);
//   - delay rounds on kind-d<round>: a holder with lock_delay_ms 300–800
//     and a short TTL walks away (or is revoked, or releases), one waiter
//     queued behind it;
//   - a revoker that revokes a held grant of the workers now and then (the
//     whole lock or one token, sometimes a token already gone).
//
// Raw HTTP workers and raw WebSocket workers (one session per connection,
// not the Go client) do the same; a WebSocket holder that is pushed lost
// stops using the grant, and after a revocation it still sends its release,
// which must be refused not_holder.

// kindOpts are the lock-kind fields of an acquire.
type kindOpts struct {
	Mode    string // "", "exclusive" or "shared"
	Limit   int64  // 0: none given
	DelayMs int64
	Value   string // "": none given
}

func (ko kindOpts) request(cid string, ttlMs, waitMs *int64) api.AcquireRequest {
	req := api.AcquireRequest{ClientID: cid, TTLms: ttlMs, WaitTimeoutMs: waitMs, Mode: ko.Mode}
	if ko.Limit != 0 {
		req.Limit = &ko.Limit
	}
	if ko.DelayMs != 0 {
		req.LockDelayMs = &ko.DelayMs
	}
	if ko.Value != "" {
		v := ko.Value
		req.Value = &v
	}
	return req
}

// kindHeld is a grant the revoker may end.
type kindHeld struct {
	lock  string
	token uint64
	ws    bool // held over WebSocket: its holder must be pushed lost
}

// kindGrant is a grant a kinds worker holds.
type kindGrant struct {
	lock  string
	token uint64
	until int64 // ExpiryLB: the holder stops using it before this
	fence bool  // exclusive on a limit-1 lock: it may write the fencestore
	ws    bool  // held over WebSocket
	end   int64 // WebSocket: the grant surely ended by then if not renewed
}

func (w *Workload) kindEpoch() int { return int(time.Since(w.t0) / w.opts.Epoch) }

func (w *Workload) rwLock(rng *rand.Rand) string {
	return fmt.Sprintf("%s%d-rw%d", kindPrefix, w.kindEpoch(), rng.IntN(4))
}

func (w *Workload) semLock(rng *rand.Rand) string {
	e := w.kindEpoch()
	switch rng.IntN(5) {
	case 0:
		return fmt.Sprintf("%s%d-s1-0", kindPrefix, e)
	default:
		return fmt.Sprintf("%s%d-s3-%d", kindPrefix, e, rng.IntN(2))
	}
}

// multiLocks picks two or three read-write locks, in random order (the
// server takes them in name order).
func (w *Workload) multiLocks(rng *rand.Rand) []string {
	e := w.kindEpoch()
	idx := rng.Perm(4)[:2+rng.IntN(2)]
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = fmt.Sprintf("%s%d-rw%d", kindPrefix, e, j)
	}
	return out
}

func sortedNames(names []string) []string {
	out := append([]string(nil), names...)
	slices.Sort(out)
	return out
}

func (w *Workload) registerKind(gs []kindGrant) {
	w.kmu.Lock()
	defer w.kmu.Unlock()
	if w.kheld == nil {
		w.kheld = map[uint64]kindHeld{}
	}
	for _, g := range gs {
		w.kheld[g.token] = kindHeld{lock: g.lock, token: g.token, ws: g.ws}
	}
}

func (w *Workload) unregisterKind(gs []kindGrant) {
	w.kmu.Lock()
	defer w.kmu.Unlock()
	for _, g := range gs {
		delete(w.kheld, g.token)
		w.kgone = append(w.kgone, kindHeld{lock: g.lock, token: g.token})
	}
	if len(w.kgone) > 32 {
		w.kgone = w.kgone[len(w.kgone)-32:]
	}
}

// kindAcquireChain retries one kinds acquire until its outcome is definite
// or d passes.
func (w *Workload) kindAcquireChain(ctx context.Context, ep *endpoint, rng *rand.Rand, worker, lock, cid string,
	ttl, wait time.Duration, ko kindOpts, tag string, d time.Duration) Op {
	attempt := w.rec.NewAttempt()
	return retryChain(ctx, rng, d, func() Op {
		return w.acquireKind(ctx, ep, worker, lock, cid, attempt, ttl, wait, ko, tag, wait+2500*time.Millisecond)
	})
}

// multiAcquire sends one POST /api/v1/acquire and records it.
func (w *Workload) multiAcquire(ctx context.Context, ep *endpoint, worker string, locks []string, cid string, attempt int64,
	ttl, wait time.Duration, mode, tag string) Op {
	ttlMs, waitMs := ttl.Milliseconds(), wait.Milliseconds()
	op := Op{Worker: worker, Via: w.via, Kind: KindMulti, Locks: sortedNames(locks), ClientID: cid, Attempt: attempt,
		TTLms: ttlMs, WaitMs: waitMs, Mode: mode, Tag: tag, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodPost, "/api/v1/acquire", api.MultiAcquireRequest{ClientID: cid, Locks: locks, Mode: mode,
		TTLms: &ttlMs, WaitTimeoutMs: &waitMs}, wait+2500*time.Millisecond)
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome != Fail {
		op.ExpiryLB = expiryLB(op.Invoke, ttl)
	}
	var ar api.AcquireReply
	perr := json.Unmarshal(r.body, &ar)
	switch {
	case op.Outcome == Ok && (perr != nil || !ar.Acquired || len(ar.Grants) == 0):
		op.Outcome, op.Code = Unknown, "unexpected"
		op.Err = fmt.Sprintf("200 without grants: %q", r.body)
	case op.Outcome == Ok:
		for _, g := range ar.Grants {
			op.Grants = append(op.Grants, GrantRec{Lock: g.Lock, Token: g.FencingToken, ExpiresAt: w.wallTime(g.ExpiresAt), Mode: g.Mode})
		}
	case r.status == 409 && perr == nil:
		op.Lock, op.Holder = ar.Lock, ar.Holder
		if ar.Error != nil {
			op.Code = ar.Error.Code
		}
	}
	return w.rec.Add(op)
}

// multiChain retries one multi-acquire until its outcome is definite or d
// passes.
func (w *Workload) multiChain(ctx context.Context, ep *endpoint, rng *rand.Rand, worker string, locks []string, cid string,
	ttl, wait time.Duration, mode, tag string, d time.Duration) Op {
	attempt := w.rec.NewAttempt()
	return retryChain(ctx, rng, d, func() Op {
		return w.multiAcquire(ctx, ep, worker, locks, cid, attempt, ttl, wait, mode, tag)
	})
}

// revoke sends DELETE /api/v1/locks/{name} (of one grant when token is
// not 0) and records it.
func (w *Workload) revoke(ctx context.Context, ep *endpoint, worker, lock string, token uint64, tag string) Op {
	path := lockPath(lock, "")
	if token != 0 {
		path += "?fencing_token=" + strconv.FormatUint(token, 10)
	}
	op := Op{Worker: worker, Via: w.via, Kind: KindRevoke, Lock: lock, Token: token, Tag: tag, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodDelete, path, nil, 2500*time.Millisecond)
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome == Ok {
		var rr api.RevokeReply
		if json.Unmarshal(r.body, &rr) != nil || rr.Revoked == nil {
			op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("200 that is not a revoke reply: %q", r.body)
		} else {
			op.Revoked = rr.Revoked
		}
	}
	return w.rec.Add(op)
}

// kindsHTTPWorker takes shared and exclusive grants of read-write locks,
// permits of semaphores and multi-acquires over raw HTTP, holds them a
// little (renews, reads, fencestore writes for exclusive grants) and
// releases them or lets them expire.
func (w *Workload) kindsHTTPWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("kinds%d", id)
	ep := &endpoint{next: id}
	for seq := 0; ctx.Err() == nil; seq++ {
		cid := fmt.Sprintf("kh%d-%d", id, seq)
		ttl := jitter(rng, 800*time.Millisecond, 2500*time.Millisecond)
		var wait time.Duration
		if rng.IntN(2) == 0 {
			wait = jitter(rng, 200*time.Millisecond, 1500*time.Millisecond)
		}
		var held []kindGrant
		switch p := rng.IntN(100); {
		case p < 35:
			lock := w.rwLock(rng)
			ko := rwOpts(rng)
			g := w.kindAcquireChain(ctx, ep, rng, name, lock, cid, ttl, wait, ko, "", 8*time.Second)
			if g.Outcome == Ok {
				held = []kindGrant{{lock: lock, token: g.OutToken, until: g.ExpiryLB, fence: modeOf(g.GrantMode) == "exclusive"}}
			}
		case p < 65:
			lock := w.semLock(rng)
			lim := kindLimit(lock)
			g := w.kindAcquireChain(ctx, ep, rng, name, lock, cid, ttl, wait, kindOpts{Limit: lim}, "", 8*time.Second)
			if g.Outcome != Ok {
				break
			}
			held = []kindGrant{{lock: lock, token: g.OutToken, until: g.ExpiryLB, fence: lim == 1}}
			if lim > 1 && rng.IntN(4) == 0 {
				w.mismatchProbe(ctx, ep, rng, name, lock, cid, g.OutToken)
			}
		default:
			locks := w.multiLocks(rng)
			mode := multiMode(rng)
			g := w.multiChain(ctx, ep, rng, name, locks, cid, ttl, wait, mode, "", 8*time.Second)
			if g.Outcome == Ok {
				for _, x := range g.Grants {
					held = append(held, kindGrant{lock: x.Lock, token: x.Token, until: g.ExpiryLB, fence: modeOf(x.Mode) == "exclusive"})
				}
			}
		}
		if len(held) == 0 {
			sleep(ctx, jitter(rng, 0, 50*time.Millisecond))
			continue
		}
		w.kindHold(ctx, ep, rng, name, cid, held, ttl, wait > 0)
		sleep(ctx, jitter(rng, 0, 30*time.Millisecond))
	}
}

// rwOpts picks the kind of a single acquire of a read-write lock: shared
// three times in five, else exclusive (named or by default, sometimes with
// limit 1 given).
func rwOpts(rng *rand.Rand) kindOpts {
	switch rng.IntN(10) {
	case 0, 1, 2, 3, 4, 5:
		return kindOpts{Mode: api.ModeShared}
	case 6:
		return kindOpts{Mode: api.ModeExclusive, Limit: 1}
	case 7, 8:
		return kindOpts{Mode: api.ModeExclusive}
	default:
		return kindOpts{}
	}
}

func multiMode(rng *rand.Rand) string {
	switch rng.IntN(10) {
	case 0, 1, 2:
		return api.ModeShared
	case 3, 4, 5:
		return api.ModeExclusive
	default:
		return ""
	}
}

// mismatchProbe: while cid holds token of lock (a semaphore of N > 1),
// other clients ask for the lock with limit N-1, and for it and a
// read-write lock in one multi-acquire: both must be refused
// limit_mismatch. A grant that comes of it anyway is handed back.
func (w *Workload) mismatchProbe(ctx context.Context, ep *endpoint, rng *rand.Rand, name, lock, cid string, token uint64) {
	tag := fmt.Sprintf("mismatch:%d", token)
	ttl := time.Second
	op := w.acquireKind(ctx, ep, name, lock, cid+"-mm", w.rec.NewAttempt(), ttl, 0, kindOpts{Limit: kindLimit(lock) - 1}, tag, 2500*time.Millisecond)
	if op.Outcome == Ok {
		w.releaseChain(ctx, ep, rng, name, lock, op.ClientID, op.OutToken, "")
	}
	if rng.IntN(2) == 0 {
		m := w.multiAcquire(ctx, ep, name, []string{w.rwLock(rng), lock}, cid+"-mmm", w.rec.NewAttempt(), ttl, 0, "", tag)
		for _, g := range m.Grants {
			w.releaseChain(ctx, ep, rng, name, g.Lock, m.ClientID, g.Token, "")
		}
	}
}

// kindHold holds HTTP grants a moment, then releases each (or lets it
// expire). A release of a grant the revoker ended is refused not_holder.
func (w *Workload) kindHold(ctx context.Context, ep *endpoint, rng *rand.Rand, name, cid string, gs []kindGrant, ttl time.Duration, waited bool) {
	w.registerKind(gs)
	defer w.unregisterKind(gs)
	if waited {
		for i := range gs {
			if r := w.renew(ctx, ep, name, gs[i].lock, cid, gs[i].token, ttl, ""); r.Outcome == Ok {
				gs[i].until = r.ExpiryLB
			}
		}
	}
	for steps := rng.IntN(4); steps > 0 && ctx.Err() == nil; steps-- {
		g := &gs[rng.IntN(len(gs))]
		if w.rec.Now() > g.until-int64(150*time.Millisecond) {
			break
		}
		switch rng.IntN(4) {
		case 0, 1:
			if g.fence {
				w.fenceWrite(ctx, name, g.lock, cid, g.token)
			} else {
				w.read(ctx, ep, name, g.lock, "")
			}
		case 2:
			if r := w.renew(ctx, ep, name, g.lock, cid, g.token, ttl, ""); r.Outcome == Ok {
				g.until = max(g.until, r.ExpiryLB)
			}
		case 3:
			w.read(ctx, ep, name, g.lock, "")
		}
		sleep(ctx, jitter(rng, 10*time.Millisecond, 120*time.Millisecond))
	}
	for _, g := range gs {
		if rng.IntN(100) < 85 {
			w.releaseChain(ctx, ep, rng, name, g.lock, cid, g.token, "")
		}
	}
}

// delayRounds: a holder takes a fresh lock with lock_delay_ms 300–800 and
// a TTL of 0.4–0.9 s, a waiter queues behind it (its wait outlasts the
// TTL, the delay and the grace), and the holder walks away — or, one round
// in five, is revoked (the delay then runs from the revocation), or, one
// in ten, releases (no delay). No grant may come before the delay's end
// (lock-delay), and the waiter must get the lock soon after it
// (delay-waiter).
func (w *Workload) delayRounds(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	for round := 1; ctx.Err() == nil; round++ {
		lock := fmt.Sprintf("%sd%d", kindPrefix, round)
		tag := func(s string) string { return fmt.Sprintf("delay:%d:%s", round, s) }
		holder, waiter := lock+"-h", lock+"-w"
		delay := jitter(rng, 300*time.Millisecond, 800*time.Millisecond)
		ttl := jitter(rng, 400*time.Millisecond, 900*time.Millisecond)
		g := w.kindAcquireChain(ctx, ep, rng, "delay", lock, holder, ttl, 0, kindOpts{DelayMs: delay.Milliseconds()}, tag("holder"), 5*time.Second)
		if g.Outcome != Ok {
			continue
		}
		wait := ttl + delay + w.grace() + 3*time.Second
		waited := make(chan Op, 1)
		go func() {
			wrng := rand.New(rand.NewPCG(uint64(round), 11))
			waited <- w.kindAcquireChain(ctx, &endpoint{next: round}, wrng, "delay-w", lock, waiter, time.Second, wait, kindOpts{},
				tag("waiter"), wait+3*time.Second)
		}()
		w.awaitQueued(ctx, ep, "delay", lock, holder, 1, time.Second)
		switch v := rng.IntN(10); {
		case v < 2:
			sleep(ctx, jitter(rng, 0, ttl/2))
			tok := g.OutToken
			if v == 0 {
				tok = 0 // the whole lock
			}
			w.revoke(ctx, ep, "delay", lock, tok, tag("revoke"))
		case v < 3:
			w.releaseChain(ctx, ep, rng, "delay", lock, holder, g.OutToken, tag("release"))
		default:
			// Walk away; read the lock while the delay runs.
			if g.ExpiresAt != 0 && sleep(ctx, time.Duration(g.ExpiresAt+int64(150*time.Millisecond)-w.rec.Now())) {
				w.read(ctx, ep, "delay", lock, "")
			}
		}
		got := <-waited
		if got.Outcome == Ok {
			sleep(ctx, jitter(rng, 20*time.Millisecond, 50*time.Millisecond))
			w.releaseChain(ctx, ep, rng, "delay-w", lock, waiter, got.OutToken, "")
		}
		sleep(ctx, jitter(rng, 50*time.Millisecond, 300*time.Millisecond))
	}
}

// revoker revokes a grant a kinds worker holds every 1.5–4 s (half the
// time one held over WebSocket, when there is one): by its token, or one
// time in three the whole lock; one time in eight a token held lately,
// perhaps released already (not_holder); and when nothing is held, a
// read-write lock as it is (revoked [] when it is free).
func (w *Workload) revoker(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	for sleep(ctx, jitter(rng, 1500*time.Millisecond, 4*time.Second)) {
		w.kmu.Lock()
		var pick *kindHeld
		if rng.IntN(8) == 0 && len(w.kgone) > 0 {
			g := w.kgone[rng.IntN(len(w.kgone))]
			pick = &g
		} else if n := len(w.kheld); n > 0 {
			// Half the time a WebSocket holder's grant, when there is one:
			// it must be pushed lost.
			wsOnly := rng.IntN(2) == 0
			var cands []kindHeld
			for _, g := range w.kheld {
				if g.ws || !wsOnly {
					cands = append(cands, g)
				}
			}
			if len(cands) == 0 {
				for _, g := range w.kheld {
					cands = append(cands, g)
				}
			}
			slices.SortFunc(cands, func(a, b kindHeld) int { return cmp.Compare(a.token, b.token) })
			pick = &cands[rng.IntN(len(cands))]
		}
		w.kmu.Unlock()
		switch {
		case pick == nil:
			w.revoke(ctx, ep, "revoker", w.rwLock(rng), 0, "")
		case rng.IntN(3) == 0:
			w.revoke(ctx, ep, "revoker", pick.lock, 0, "")
		default:
			w.revoke(ctx, ep, "revoker", pick.lock, pick.token, "")
		}
	}
}

// kwsClient is a raw WebSocket connection to the leader carrying one
// session (one client id), for the kinds workload: it records the lost
// pushes it gets and when the connection ended. Any request whose outcome
// is unknown ends it: a new connection, session and client id start
// afresh, so no later acquire meets a grant of an earlier one.
type kwsClient struct {
	w      *Workload
	worker string
	cid    string
	ttl    time.Duration
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan api.WSMessage
	lost    map[uint64]string // token → reason of its lost push
	sessLB  int64             // the session does not expire before this (history time)
	// avoid: locks this client let expire, until they surely have (history
	// time): an acquire of one by its holder would get the old grant back
	// (SPEC idempotency), and a multi-acquire of locks it holds one by one
	// is taken for a retry.
	avoid  map[string]int64
	dead   chan struct{}
	closed bool
	loops  sync.WaitGroup

	// sid is the connection's session (from hello). onPush, when set, gets
	// every changed, synced and resync frame, in the order they were read.
	sid    string
	onPush func(m api.WSMessage, at int64)
}

const kwsSessionTTL = 10 * time.Second

func wsURL(base string) string {
	return "ws" + strings.TrimPrefix(base, "http") + "/api/v1/ws"
}

// dialKWS connects to the leader (following not_leader replies) and says
// hello, retrying until ctx ends (nil then).
func (w *Workload) dialKWS(ctx context.Context, worker, cid string, rng *rand.Rand) *kwsClient {
	return w.dialKWSWith(ctx, worker, cid, rng, kwsSessionTTL, nil, true)
}

// dialKWSWith is dialKWS with the session's TTL and a push hook; a
// tracked client is closed when the workers stop (closeKWS), the others
// by their owner.
func (w *Workload) dialKWSWith(ctx context.Context, worker, cid string, rng *rand.Rand, ttl time.Duration,
	onPush func(api.WSMessage, int64), track bool) *kwsClient {
	eps := w.opts.Endpoints
	base := ""
	for try := 0; ctx.Err() == nil; try++ {
		if base == "" {
			base = eps[rng.IntN(len(eps))]
		}
		c, leader := w.tryKWS(ctx, worker, cid, base, ttl, onPush)
		if c != nil {
			if track {
				w.kmu.Lock()
				w.kws = append(w.kws, c)
				w.kmu.Unlock()
			}
			return c
		}
		base = leader
		if leader == "" {
			sleep(ctx, jitter(rng, 100*time.Millisecond, 300*time.Millisecond))
		}
	}
	return nil
}

func (w *Workload) tryKWS(ctx context.Context, worker, cid, base string, ttl time.Duration, onPush func(api.WSMessage, int64)) (*kwsClient, string) {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, wsURL(base), nil)
	if err != nil {
		return nil, ""
	}
	conn.SetReadLimit(1 << 20) // a changed frame carries a whole status
	ttlMs := ttl.Milliseconds()
	hello, _ := json.Marshal(api.WSRequest{ID: 1, Op: api.OpHello, ClientID: cid, SessionTTLms: &ttlMs})
	inv := w.rec.Now()
	if err := conn.Write(dctx, websocket.MessageText, hello); err != nil {
		_ = conn.CloseNow()
		return nil, ""
	}
	_, b, err := conn.Read(dctx)
	var m api.WSMessage
	if err != nil || json.Unmarshal(b, &m) != nil || m.Type != api.TypeHello || m.SessionID == "" {
		_ = conn.CloseNow()
		return nil, m.Leader
	}
	cctx, ccancel := context.WithCancel(context.Background())
	c := &kwsClient{w: w, worker: worker, cid: cid, ttl: ttl, conn: conn, ctx: cctx, cancel: ccancel,
		next: 1, waiting: map[uint64]chan api.WSMessage{}, lost: map[uint64]string{}, avoid: map[string]int64{},
		sessLB: inv + int64(ttl) - int64(clockMargin(ttl)), dead: make(chan struct{}), sid: m.SessionID, onPush: onPush}
	c.loops.Add(2)
	go c.readLoop()
	go c.keepaliveLoop()
	return c, ""
}

// end closes the connection once, recording when.
func (c *kwsClient) end(why string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.dead)
	c.mu.Unlock()
	now := c.w.rec.Now()
	c.w.rec.Add(Op{Worker: c.worker, Via: "ws", Kind: KindWSClosed, ClientID: c.cid, Invoke: now, Return: now, Outcome: Ok, Err: why})
	c.cancel()
	_ = c.conn.CloseNow()
}

func (c *kwsClient) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

func (c *kwsClient) readLoop() {
	defer c.loops.Done()
	for {
		_, b, err := c.conn.Read(c.ctx)
		if err != nil {
			c.end("read: " + err.Error())
			return
		}
		var m api.WSMessage
		if err := json.Unmarshal(b, &m); err != nil {
			c.end("a frame that does not parse")
			return
		}
		switch {
		case m.ID != 0:
			c.mu.Lock()
			ch := c.waiting[m.ID]
			delete(c.waiting, m.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case m.Type == api.TypeChanged || m.Type == api.TypeResync || m.Type == api.TypeSynced:
			if c.onPush != nil {
				c.onPush(m, c.w.rec.Now())
			}
		case m.Type == api.TypeLost:
			now := c.w.rec.Now()
			c.w.rec.Add(Op{Worker: c.worker, Via: "ws", Kind: KindLost, Lock: m.Lock, ClientID: c.cid, Token: m.FencingToken,
				Invoke: now, Return: now, Outcome: Ok, Code: m.Reason})
			c.mu.Lock()
			c.lost[m.FencingToken] = m.Reason
			delete(c.avoid, m.Lock)
			c.mu.Unlock()
		case m.Type == api.TypeError:
			code := ""
			if m.Error != nil {
				code = m.Error.Code
			}
			c.end("pushed error " + code)
			return
		}
	}
}

// keepaliveLoop keeps the session alive; each acknowledged keepalive moves
// the moment before which the session cannot expire. It sends one every
// fifth of the TTL and gives up on the connection when less than three
// tenths of it are left (2 s and 3 s for the kinds workers' 10 s).
func (c *kwsClient) keepaliveLoop() {
	defer c.loops.Done()
	for {
		select {
		case <-c.dead:
			return
		case <-time.After(c.ttl / 5):
		}
		inv := c.w.rec.Now()
		m, oc, _, _ := c.request(c.ctx, api.WSRequest{Op: api.OpKeepalive}, c.ttl*3/10)
		switch {
		case oc == Ok:
			c.mu.Lock()
			c.sessLB = max(c.sessLB, inv+int64(c.ttl)-int64(clockMargin(c.ttl)))
			c.mu.Unlock()
		case m.Error != nil && m.Error.Code == api.CodeSessionExpired:
			c.end("session expired")
			return
		}
		c.mu.Lock()
		stale := c.w.rec.Now() > c.sessLB-int64(c.ttl*3/10)
		c.mu.Unlock()
		if stale {
			c.end("no keepalive acknowledged in time")
			return
		}
	}
}

func (c *kwsClient) sessionLB() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessLB
}

// mayHold reports whether the client may still hold one of locks.
func (c *kwsClient) mayHold(locks ...string) bool {
	now := c.w.rec.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range locks {
		if c.avoid[l] > now {
			return true
		}
	}
	return false
}

// walkAway notes a grant the client lets expire.
func (c *kwsClient) walkAway(lock string, until int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.avoid[lock] = max(c.avoid[lock], until)
}

func (c *kwsClient) lostReason(tok uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.lost[tok]
	return r, ok
}

// request sends req and waits up to timeout for its reply. The outcome:
// Ok for granted/ok; Fail with the code for a SPEC refusal, or without a
// code when the connection had ended before it was sent; Unknown for
// anything else (the connection ended, no reply in time: gaveUp).
func (c *kwsClient) request(ctx context.Context, req api.WSRequest, timeout time.Duration) (m api.WSMessage, oc Outcome, code string, gaveUp bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return m, Fail, "", false
	}
	c.next++
	req.ID = c.next
	ch := make(chan api.WSMessage, 1)
	c.waiting[req.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, req.ID)
		c.mu.Unlock()
	}()
	b, _ := json.Marshal(req)
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.conn.Write(tctx, websocket.MessageText, b); err != nil {
		c.end("write: " + err.Error())
		return m, Unknown, "", false
	}
	select {
	case m = <-ch:
	case <-c.dead:
		return m, Unknown, "", false
	case <-tctx.Done():
		return m, Unknown, "", ctx.Err() == nil
	}
	switch m.Type {
	case api.TypeGranted, api.TypeOK, api.TypeHello:
		return m, Ok, "", false
	case api.TypeError:
		if m.Error == nil {
			return m, Unknown, "unexpected", false
		}
		switch code := m.Error.Code; code {
		case api.CodeLockHeld, api.CodeWaitTimeout, api.CodeNotHolder, api.CodeLimitMismatch, api.CodeCancelled:
			return m, Fail, code, false
		default:
			return m, Unknown, code, false
		}
	}
	return m, Unknown, "unexpected", false
}

// acquire sends one acquire (a multi-acquire when locks is not empty) and
// records it.
func (c *kwsClient) acquire(run context.Context, lock string, locks []string, ttl, wait time.Duration, ko kindOpts) Op {
	return c.acquireTag(run, lock, locks, ttl, wait, ko, "")
}

// acquireTag is acquire with a tag on the recorded op.
func (c *kwsClient) acquireTag(run context.Context, lock string, locks []string, ttl, wait time.Duration, ko kindOpts, tag string) Op {
	ttlMs, waitMs := ttl.Milliseconds(), wait.Milliseconds()
	req := api.WSRequest{Op: api.OpAcquire, TTLms: &ttlMs, WaitTimeoutMs: &waitMs, Mode: ko.Mode}
	op := Op{Worker: c.worker, Via: "ws", Kind: KindAcquire, Lock: lock, ClientID: c.cid, Attempt: c.w.rec.NewAttempt(),
		TTLms: ttlMs, WaitMs: waitMs, Mode: ko.Mode, Limit: ko.Limit, DelayMs: ko.DelayMs, Tag: tag}
	if len(locks) > 0 {
		op.Kind, op.Lock, op.Locks, req.Locks = KindMulti, "", sortedNames(locks), locks
	} else {
		req.Lock = lock
		if ko.Limit != 0 {
			req.Limit = &ko.Limit
		}
		if ko.DelayMs != 0 {
			req.LockDelayMs = &ko.DelayMs
		}
	}
	op.Invoke = c.w.rec.Now()
	m, oc, code, gaveUp := c.request(run, req, wait+4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	if oc != Fail {
		op.ExpiryLB = min(expiryLB(op.Invoke, ttl), c.sessionLB())
	}
	switch {
	case oc == Ok && op.Kind == KindAcquire && m.FencingToken != 0:
		op.OutToken, op.ExpiresAt, op.GrantMode = m.FencingToken, c.w.wallTime(m.ExpiresAt), m.Mode
	case oc == Ok && op.Kind == KindMulti && len(m.Grants) > 0:
		for _, g := range m.Grants {
			op.Grants = append(op.Grants, GrantRec{Lock: g.Lock, Token: g.FencingToken, ExpiresAt: c.w.wallTime(g.ExpiresAt), Mode: g.Mode})
		}
	case oc == Ok:
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("a grant without a token: %+v", m)
	case oc == Fail && op.Kind == KindMulti && code == api.CodeLockHeld:
		op.Lock, op.Holder = m.Lock, m.Holder
	case oc == Fail:
		op.Holder = m.Holder
	}
	return c.w.rec.Add(op)
}

// release releases a grant over the connection and records it.
func (c *kwsClient) release(lock string, tok uint64) Op {
	op := Op{Worker: c.worker, Via: "ws", Kind: KindRelease, Lock: lock, ClientID: c.cid, Token: tok, Invoke: c.w.rec.Now()}
	m, oc, code, gaveUp := c.request(context.Background(), api.WSRequest{Op: api.OpRelease, Lock: lock, FencingToken: tok}, 4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	return c.w.rec.Add(op)
}

// renew renews a grant over the connection and records it.
func (c *kwsClient) renew(run context.Context, lock string, tok uint64, ttl time.Duration) Op {
	ttlMs := ttl.Milliseconds()
	op := Op{Worker: c.worker, Via: "ws", Kind: KindRenew, Lock: lock, ClientID: c.cid, Token: tok, TTLms: ttlMs, Invoke: c.w.rec.Now()}
	m, oc, code, gaveUp := c.request(run, api.WSRequest{Op: api.OpRenew, Lock: lock, FencingToken: tok, TTLms: &ttlMs}, 3*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	if oc != Fail {
		op.ExpiryLB = min(expiryLB(op.Invoke, ttl), c.sessionLB())
	}
	if oc == Ok {
		op.ExpiresAt = c.w.wallTime(m.ExpiresAt)
	}
	return c.w.rec.Add(op)
}

// closeKWS ends every raw WebSocket client (after the workers stopped).
func (w *Workload) closeKWS() {
	w.kmu.Lock()
	cs := w.kws
	w.kws = nil
	w.kmu.Unlock()
	for _, c := range cs {
		c.end("the run ended")
		c.loops.Wait()
	}
}

// kindsWSWorker does what kindsHTTPWorker does over raw WebSocket
// connections: single acquires (shared, exclusive, semaphore permits) and
// multi-acquires with "locks". Any outcome it cannot know ends the
// connection; the next round starts a new one.
func (w *Workload) kindsWSWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("kinds-ws%d", id)
	var c *kwsClient
	for gen := 0; ctx.Err() == nil; {
		if c == nil || c.isDead() {
			c = w.dialKWS(ctx, name, fmt.Sprintf("kw%d-%d", id, gen), rng)
			gen++
			if c == nil {
				return
			}
		}
		ttl := jitter(rng, time.Second, 3*time.Second)
		var wait time.Duration
		if rng.IntN(2) == 0 {
			wait = jitter(rng, 200*time.Millisecond, 1500*time.Millisecond)
		}
		var op Op
		var held []kindGrant
		p := rng.IntN(100)
		var locks []string
		switch {
		case p < 35:
			locks = []string{w.rwLock(rng)}
		case p < 60:
			locks = []string{w.semLock(rng)}
		default:
			locks = w.multiLocks(rng)
		}
		if c.mayHold(locks...) {
			sleep(ctx, jitter(rng, 0, 50*time.Millisecond))
			continue
		}
		switch {
		case p < 35:
			op = c.acquire(ctx, locks[0], nil, ttl, wait, rwOpts(rng))
			if op.Outcome == Ok {
				held = []kindGrant{{lock: locks[0], token: op.OutToken, until: op.ExpiryLB, fence: modeOf(op.GrantMode) == "exclusive", ws: true}}
			}
		case p < 60:
			op = c.acquire(ctx, locks[0], nil, ttl, wait, kindOpts{Limit: kindLimit(locks[0])})
			if op.Outcome == Ok {
				held = []kindGrant{{lock: locks[0], token: op.OutToken, until: op.ExpiryLB, fence: kindLimit(locks[0]) == 1, ws: true}}
			}
		default:
			op = c.acquire(ctx, "", locks, ttl, wait, kindOpts{Mode: multiMode(rng)})
			if op.Outcome == Ok {
				for _, g := range op.Grants {
					held = append(held, kindGrant{lock: g.Lock, token: g.Token, until: op.ExpiryLB, fence: modeOf(g.Mode) == "exclusive", ws: true})
				}
			}
		}
		for i := range held {
			// The latest the grant may end on its own: its expires_at
			// (or the TTL from now), the grace, and a second more.
			exp := op.ExpiresAt
			for _, g := range op.Grants {
				if g.Lock == held[i].lock {
					exp = g.ExpiresAt
				}
			}
			if exp == 0 {
				exp = w.rec.Now() + int64(ttl)
			}
			held[i].end = exp + int64(w.grace()+time.Second)
		}
		if op.Outcome == Unknown {
			c.end("an acquire of unknown outcome")
			continue
		}
		if len(held) == 0 {
			sleep(ctx, jitter(rng, 0, 50*time.Millisecond))
			continue
		}
		w.kwsHold(ctx, rng, c, held, ttl)
		sleep(ctx, jitter(rng, 0, 30*time.Millisecond))
	}
}

// kwsHold holds WebSocket grants a moment (renews, reads, fencestore
// writes), stops using one as soon as it is pushed lost, then releases
// each — also a revoked one, whose release must be refused not_holder —
// or lets it expire.
func (w *Workload) kwsHold(ctx context.Context, rng *rand.Rand, c *kwsClient, gs []kindGrant, ttl time.Duration) {
	w.registerKind(gs)
	defer w.unregisterKind(gs)
	ep := &endpoint{next: rng.IntN(len(w.opts.Endpoints))}
	for steps := rng.IntN(4); steps > 0 && ctx.Err() == nil && !c.isDead(); steps-- {
		g := &gs[rng.IntN(len(gs))]
		if _, lost := c.lostReason(g.token); lost || w.rec.Now() > g.until-int64(150*time.Millisecond) {
			break
		}
		switch rng.IntN(4) {
		case 0, 1:
			if g.fence {
				w.fenceWrite(ctx, c.worker, g.lock, c.cid, g.token)
			} else {
				w.read(ctx, ep, c.worker, g.lock, "")
			}
		case 2:
			r := c.renew(ctx, g.lock, g.token, ttl)
			switch r.Outcome {
			case Ok:
				g.until = max(g.until, r.ExpiryLB)
				if r.ExpiresAt != 0 {
					g.end = max(g.end, r.ExpiresAt+int64(w.grace()+time.Second))
				} else {
					g.end = max(g.end, w.rec.Now()+int64(ttl+w.grace()+time.Second))
				}
			case Unknown:
				c.end("a renew of unknown outcome")
				return
			}
		case 3:
			w.read(ctx, ep, c.worker, g.lock, "")
		}
		sleep(ctx, jitter(rng, 10*time.Millisecond, 120*time.Millisecond))
	}
	// A revoke's lost push may still be on its way: give it a moment.
	sleep(ctx, jitter(rng, 0, 30*time.Millisecond))
	for _, g := range gs {
		if c.isDead() {
			return
		}
		reason, lost := c.lostReason(g.token)
		if lost && reason != api.ReasonRevoked {
			continue // expired: nothing to release
		}
		if !lost && rng.IntN(100) >= 85 {
			c.walkAway(g.lock, g.end) // let it expire
			continue
		}
		if r := c.release(g.lock, g.token); r.Outcome == Unknown {
			c.end("a release of unknown outcome")
			return
		}
	}
}
