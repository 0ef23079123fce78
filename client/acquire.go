package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
)

// AcquireOption configures Acquire, TryAcquire, AcquireMany,
// TryAcquireMany and Do.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	ttl       time.Duration
	wait      time.Duration
	waitSet   bool
	autoRenew bool
	// Lock kinds: mode "" is exclusive; limit 0 is none given (join what
	// the lock has); lockDelay 0 is none; value nil is none.
	mode      string
	limit     int
	lockDelay time.Duration
	value     *string
}

// WithTTL gives the lock a TTL of its own on top of the session: it is lost
// when not renewed within d (see WithAutoRenew and Lock.Renew), or when the
// session ends, whichever is first. Without it the lock lives as long as
// the session. Either way the lock's lease is what the server granted (a
// wait re-sent after a reconnect is confirmed with a renew; see
// Lock.Deadline); a lock wanted without a TTL that the server gave one —
// another user of this client ID queued it with one — is renewed
// automatically, as WithAutoRenew does.
func WithTTL(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.ttl = d }
}

// WithWaitTimeout bounds the wait for the lock to d; when it runs out the
// error matches ErrWaitTimeout. Without it Acquire waits as long as ctx
// allows (the wait is sent to the server in periods of at most the SPEC's
// 10 minutes; a new period queues the request again at the end of the
// queue).
func WithWaitTimeout(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait, o.waitSet = d, true }
}

// WithAutoRenew renews a lock acquired WithTTL every third of its TTL until
// it is released or lost.
func WithAutoRenew() AcquireOption {
	return func(o *acquireOptions) { o.autoRenew = true }
}

// WithShared asks for a shared grant: shared holders coexist with each
// other, never with an exclusive one (a read-write lock: readers take it
// WithShared, writers without). Queues are FIFO across modes, so a reader
// that comes after a waiting writer waits behind it. Not with WithLimit
// above 1.
func WithShared() AcquireOption {
	return func(o *acquireOptions) { o.mode = api.ModeShared }
}

// WithLimit makes the lock a semaphore of n permits (1–10 000): up to n
// holders at once, each with its own fencing token (each holder's grant
// is exclusive: it holds one permit). The first acquire that creates the
// lock sets n; while the lock has holders or waiters, an acquire giving
// another n fails with an error matching ErrLimitMismatch, and one without
// WithLimit joins whatever the lock has. A client holds at most one permit
// of a lock (acquire is idempotent per client ID). WithLimit(0) is no
// WithLimit. Not with AcquireMany (above 1), which takes limit-1 locks
// only.
func WithLimit(n int) AcquireOption {
	return func(o *acquireOptions) { o.limit = n }
}

// WithLockDelay sets the grant's lock-delay (0–60s): when the grant ends
// without a release — its TTL runs out, the session expires, or it is
// revoked — the server grants the lock to no one until d has passed, so
// that a holder cut off from the cluster (which may still be writing) has
// time to notice its loss before the next holder starts. A release,
// Client.Close included, applies no delay.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay = d }
}

// WithValue gives the grant a value (a UTF-8 string of at most 4096
// bytes) that the lock's status shows to everyone: who the holder is, or
// where to reach it (the leader of an election). The holder changes it
// with Lock.SetValue.
func WithValue(v string) AcquireOption {
	return func(o *acquireOptions) { o.value = &v }
}

// check reports an option out of the SPEC's ranges before anything is
// sent.
func (o *acquireOptions) check(multi bool) error {
	if o.waitSet && (o.wait < 0 || o.wait > api.MaxWaitTimeoutMs*time.Millisecond) {
		return fmt.Errorf("lockd: wait timeout %v out of range 0–10m", o.wait)
	}
	if o.limit < 0 || o.limit > api.MaxLimit {
		return fmt.Errorf("lockd: limit %d out of range 1–%d", o.limit, api.MaxLimit)
	}
	if o.mode == api.ModeShared && o.limit > 1 {
		return fmt.Errorf("lockd: a shared lock has no limit above 1 (got %d)", o.limit)
	}
	if multi && o.limit > 1 {
		return fmt.Errorf("lockd: AcquireMany takes limit-1 locks only (got limit %d)", o.limit)
	}
	if o.lockDelay < 0 || o.lockDelay > api.MaxLockDelayMs*time.Millisecond {
		return fmt.Errorf("lockd: lock-delay %v out of range 0–1m", o.lockDelay)
	}
	if o.value != nil {
		if err := checkValue(*o.value); err != nil {
			return err
		}
	}
	return nil
}

func checkValue(v string) error {
	if len(v) > api.MaxValueBytes || !utf8.ValidString(v) {
		return fmt.Errorf("lockd: a value is valid UTF-8 of at most %d bytes (got %d bytes)", api.MaxValueBytes, len(v))
	}
	return nil
}

// acquireOp is an acquire waiting for its grant. It outlives a connection:
// it is re-sent on the next one (with the wait time left) and keeps its
// place, because acquire is idempotent per client ID.
type acquireOp struct {
	// names are the lock, or the locks of a multi-acquire in name order;
	// the op is pending under each of them in Client.ops.
	names []string
	acquireOptions
	try      bool
	deadline time.Time       // end of an explicit wait
	ctx      context.Context // the caller's: bounds an implicit wait
	// abandoned: the caller went away; the wait is withdrawn (see
	// withdraw.go) and a grant that still comes is released.
	abandoned bool
	// cancelID is the id of the cancel request under way, 0 for none;
	// cancelConn the connection it went out on.
	cancelID   uint64
	cancelConn *wsConn
	// sends counts the requests sent for this wait; lastTTL is the last
	// TTL one of them carried (the server keeps a queued TTL when a resend
	// carries none).
	sends   int
	lastTTL time.Duration
	// confirming: granted; a renew is confirming the lease before the
	// lock is handed out (see onGrantedLocked).
	confirming bool
	// retrying: refused as overloaded; a resend is scheduled. heldBack:
	// a send was due while a release of one of its names was unsettled;
	// it goes out once that is settled (see releaseDoneLocked).
	retrying bool
	heldBack bool
	bo       *backoff

	sess *session // the session it was last sent in
	conn *wsConn  // the connection it was last sent on
	// resent: it went out on an earlier connection that failed before the
	// answer, so that send may have been granted (see ErrMaybeGrantedLost).
	resent bool
	reqID  uint64
	sentAt time.Time

	done  chan struct{}
	locks []*Lock // one per name
	err   error
}

func (op *acquireOp) multi() bool { return len(op.names) > 1 }

// what names the op's lock(s) in messages.
func (op *acquireOp) what() string { return describe(op.names) }

func describe(names []string) string {
	if len(names) == 1 {
		return fmt.Sprintf("lock %q", names[0])
	}
	return fmt.Sprintf("locks %q", names)
}

// waitSlack is how long past an explicit wait deadline Acquire still waits
// for the server's answer before it gives up on its own.
const waitSlack = time.Second

// Acquire takes lock name in the client's session. It blocks until the lock
// is granted, ctx is done, or the wait timeout (WithWaitTimeout) runs out.
//
// Goroutines of one Client acquiring the same name are served one at a
// time, in the order their calls arrived (the server knows the client by
// its ID, not by goroutine): the Client keeps a queue per lock name, and
// only its head waits on the server. When the holder releases the lock
// and the next in that queue is another Acquire of this Client, the
// release hands the lock on in the same committed step (one commit, not
// two); that Acquire still joins the server's queue behind other clients'
// waiters, and gets a grant of its own with a new token.
//
// When ctx ends (or the wait timeout passes with no answer) while the
// wait is queued on the server, the client withdraws it (a cancel), so the
// lock does not go to a waiter nobody listens for; a grant that raced the
// cancel is released at once. If the connection is down then, the cancel
// goes out on the next one, for at most Config.CloseTimeout; a later Acquire
// of the name waits until it is settled. While the client is still
// releasing a lock of that name in the background (see Lock.Release),
// Acquire waits for that first, at most Config.CloseTimeout.
func (c *Client) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	ls, err := c.acquire(ctx, []string{name}, options(opts), false)
	if err != nil {
		return nil, err
	}
	return ls[0], nil
}

// TryAcquire takes lock name if it is free now; otherwise the error matches
// ErrLockHeld. It still waits for a connection to the leader within ctx.
// A lock that is free but has waiters (or a running lock-delay) is not
// free: FIFO order comes first. A lock this Client already holds (or is
// acquiring in another call) is not free either, as a sync.Mutex's TryLock
// is false for its own holder: the error then also matches
// ErrHeldByThisClient and names the token held ("lock "x" is already held
// by this client (token 42)"). It does not hand out the existing grant a
// second time; keep the *Lock the first call returned.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	ls, err := c.acquire(ctx, []string{name}, options(opts), true)
	if err != nil {
		return nil, err
	}
	return ls[0], nil
}

// AcquireMany takes every lock of names in one step, or none of them (a
// multi-acquire: 2–64 distinct names of limit-1 locks; one name is
// Acquire). It waits as Acquire does: in every lock's queue at once, and
// is granted when it heads every queue and every lock is free, so two
// AcquireMany calls of overlapping names, in whatever order, never
// deadlock (the Client's own queues per name work the same way). A wait
// whose ctx ends is withdrawn as Acquire's is. WithShared applies to every
// lock; WithLimit above 1 is refused.
//
// It returns one Lock per name, in name order (not the order of names),
// each with its own fencing token. They share one fate: when any of them
// is lost — its TTL or local lease runs out, it is revoked, the session
// ends — Lost closes on all of them, with that cause (errors.Is matches
// it on each), and the client releases the others in the background. A
// Release of one of them is that lock's alone: the others stay held, and
// each is renewed on its own.
//
// A refused try matches ErrLockHeld, and its *ServerError names the first
// blocking lock (Lock) and its holder (Holder); a lock with limit > 1
// gives ErrLimitMismatch.
func (c *Client) AcquireMany(ctx context.Context, names []string, opts ...AcquireOption) ([]*Lock, error) {
	ns, err := lockSet(names)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, ns, options(opts), false)
}

// TryAcquireMany is AcquireMany without waiting: every lock if all are
// free now, else none, and an error matching ErrLockHeld that names the
// first blocking lock (ServerError.Lock).
func (c *Client) TryAcquireMany(ctx context.Context, names []string, opts ...AcquireOption) ([]*Lock, error) {
	ns, err := lockSet(names)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, ns, options(opts), true)
}

func options(opts []AcquireOption) acquireOptions {
	var o acquireOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// lockSet checks a multi-acquire's names and sorts a copy of them.
func lockSet(names []string) ([]string, error) {
	if len(names) == 0 || len(names) > api.MaxMultiLocks {
		return nil, fmt.Errorf("lockd: AcquireMany takes 1–%d names, got %d", api.MaxMultiLocks, len(names))
	}
	ns := slices.Clone(names)
	slices.Sort(ns)
	for i, n := range ns {
		if n == "" {
			return nil, errors.New("lockd: empty lock name")
		}
		if i > 0 && ns[i-1] == n {
			return nil, fmt.Errorf("lockd: AcquireMany names lock %q twice", n)
		}
	}
	return ns, nil
}

// acquire takes names (one, or a multi-acquire's in name order).
func (c *Client) acquire(ctx context.Context, names []string, o acquireOptions, try bool) ([]*Lock, error) {
	if len(names) == 1 && names[0] == "" {
		return nil, errors.New("lockd: empty lock name")
	}
	if try {
		o.wait, o.waitSet = 0, true
	}
	if err := o.check(len(names) > 1); err != nil {
		return nil, err
	}
	t := &ticket{names: names, o: o, try: try, ctx: ctx, start: time.Now(), ready: make(chan struct{})}
	op, err := c.takeTurn(t)
	if err != nil {
		return nil, err
	}

	var timeout <-chan time.Time
	if o.waitSet && !try {
		tm := time.NewTimer(time.Until(op.deadline) + waitSlack)
		defer tm.Stop()
		timeout = tm.C
	}
	select {
	case <-op.done:
		if err := op.err; err != nil && !o.waitSet && !try && errors.Is(err, ErrWaitTimeout) && !errors.Is(err, ErrMaybeGrantedLost) {
			// Without WithWaitTimeout the wait sent was what was left of
			// ctx: the server's wait_timeout (or a last resend's refusal)
			// can come a moment before ctx's own timer fires. What ended
			// the wait is ctx, as documented.
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < waitSlack {
				tm := time.NewTimer(time.Until(dl) + 10*time.Millisecond)
				defer tm.Stop()
				select {
				case <-ctx.Done():
				case <-tm.C:
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
			}
		}
		return op.locks, op.err
	case <-ctx.Done():
		c.abandon(op)
		return nil, ctx.Err()
	case <-timeout:
		c.abandon(op)
		return nil, fmt.Errorf("%w: %s: no answer from the leader within the wait", ErrWaitTimeout, op.what())
	}
}

// abandon gives up on op for its caller. A lock it already got is released;
// a wait still pending is withdrawn (see withdrawLocked), and a grant it
// gets meanwhile is released.
func (c *Client) abandon(op *acquireOp) {
	c.mu.Lock()
	var send func()
	select {
	case <-op.done:
		for _, l := range op.locks {
			if l.err == nil {
				c.goLocked(func() { c.releaseQuietly(l) })
			}
		}
	default:
		send = c.withdrawLocked(op)
	}
	c.mu.Unlock()
	if send != nil {
		send()
	}
}

// releaseQuietly releases a lock its caller gave up, bounded by
// CloseTimeout.
func (c *Client) releaseQuietly(l *Lock) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.CloseTimeout)
	defer cancel()
	if err := l.Release(ctx); err != nil && c.ctx.Err() == nil {
		c.log.Info("lockd: releasing an unwanted grant", "lock", l.name, "token", l.token, "err", err)
	}
}

// prepAcquireLocked assigns op a new request id and returns its frame for
// the live connection, or nil when there is none (the next connection will
// send it), op was already sent on it and force is false, op is granted
// already, is waiting out an overloaded refusal, was given up (its wait
// is withdrawn instead: see withdrawLocked), or a release of one of its
// names is under way (the server would answer the acquire with that very
// grant; see Client.releasing).
func (c *Client) prepAcquireLocked(op *acquireOp, force bool) []byte {
	req := c.acquireRequestLocked(op, force, false)
	if req == nil {
		return nil
	}
	data, _ := json.Marshal(req)
	return data
}

// acquireRequestLocked is prepAcquireLocked's request, not yet encoded;
// handOff says it rides on a release of the same lock (see
// handOffLocked), which the server applies before it.
func (c *Client) acquireRequestLocked(op *acquireOp, force, handOff bool) *api.WSRequest {
	cs := c.cur
	if cs == nil || c.sess == nil || c.sess.lost || op.confirming || op.retrying || op.abandoned || (op.conn == cs && !force) {
		return nil
	}
	for _, n := range op.names {
		if c.releasing[n] > 0 && !handOff {
			op.heldBack = true
			return nil
		}
	}
	op.heldBack = false
	delete(c.opByID, op.reqID)
	op.reqID = c.nextID()
	c.opByID[op.reqID] = op
	op.resent = op.resent || (op.conn != nil && op.conn != cs)
	op.conn, op.sess, op.sentAt = cs, c.sess, time.Now()
	op.sends++

	var wait time.Duration
	switch {
	case op.try:
	case op.waitSet:
		wait = time.Until(op.deadline)
	default:
		wait = api.MaxWaitTimeoutMs * time.Millisecond
		if dl, ok := op.ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
	}
	wait = min(max(wait, 0), api.MaxWaitTimeoutMs*time.Millisecond)
	waitMs := wait.Milliseconds()
	req := &api.WSRequest{ID: op.reqID, Op: api.OpAcquire, WaitTimeoutMs: &waitMs, Mode: op.mode, Value: op.value}
	if op.multi() {
		req.Locks = op.names
	} else {
		req.Lock = op.names[0]
		if op.limit > 0 {
			n := int64(op.limit)
			req.Limit = &n
		}
	}
	if op.ttl > 0 {
		req.TTLms = ms(op.ttl)
		op.lastTTL = op.ttl
	}
	if op.lockDelay > 0 {
		req.LockDelayMs = ms(op.lockDelay)
	}
	return req
}

// finishLocked resolves op, and lets the next in the Client's queues of
// its names go.
func (c *Client) finishLocked(op *acquireOp, ls []*Lock, err error) {
	for _, name := range op.names {
		if c.ops[name] == op {
			delete(c.ops, name)
		}
	}
	delete(c.opByID, op.reqID)
	if op.cancelID != 0 {
		delete(c.cancels, op.cancelID)
		op.cancelID = 0
	}
	select {
	case <-op.done:
		return
	default:
	}
	op.locks, op.err = ls, err
	close(op.done)
	if op.abandoned {
		for _, l := range ls {
			c.releaseLaterLocked(l)
		}
	}
	c.pumpLocked(op.names...)
}

// grants are the grants a granted frame carries: a multi-acquire's, or
// the one of the older fields.
func grants(m *api.WSMessage) []api.Grant {
	if len(m.Grants) > 0 {
		return m.Grants
	}
	return []api.Grant{{Lock: m.Lock, FencingToken: m.FencingToken, ExpiresAt: m.ExpiresAt, Mode: m.Mode, FencingProof: m.FencingProof}}
}

// onGrantedLocked takes a grant for a pending acquire. The lock's lease is
// what the server granted, never what the caller asked for: a grant
// without expires_at has no TTL of its own (the session's lease covers it);
// one with expires_at has the TTL the server holds, which the client knows
// only when the grant answers the one request this wait ever sent, with a
// TTL (the server counts that TTL from the commit, after the send). In
// every other case — a wait re-sent after a reconnect (a resend without
// ttl_ms keeps the queued TTL), a grant pushed
// under a later request than the one it answers, a late grant whose lease
// is mostly spent — a renew with an explicit TTL confirms the lease before
// the lock is handed out (see confirmLease). A multi-acquire's grants are
// taken, or confirmed, together.
func (c *Client) onGrantedLocked(cs *wsConn, m *api.WSMessage) []func() {
	gs := grants(m)
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.Lock
	}
	slices.Sort(names)
	op := c.opByID[m.ID]
	if op == nil {
		if p := c.ops[names[0]]; p != nil {
			op = p // a grant answering an earlier request of the same wait
		}
	}
	if op == nil || !slices.Equal(op.names, names) {
		for _, g := range gs {
			if l := c.locks[g.Lock]; l != nil && l.token == g.FencingToken {
				continue // a repeat of a grant we hold
			}
			// A grant nobody waits for (its wait was given up): hand it back.
			c.releaseLaterLocked(&Lock{c: c, name: g.Lock, token: g.FencingToken, sess: cs.sess, lost: make(chan struct{})})
		}
		return nil
	}
	if op.confirming {
		return nil // a repeat of the grant being confirmed
	}
	ls := make([]*Lock, 0, len(gs))
	withTTL := false
	for _, name := range op.names { // in name order
		for _, g := range gs {
			if g.Lock != name {
				continue
			}
			exp, _ := api.ParseTime(g.ExpiresAt)
			withTTL = withTTL || !exp.IsZero()
			mode := g.Mode
			if mode == "" {
				mode = m.Mode
			}
			if mode == "" {
				mode = api.ModeExclusive
				if op.mode != "" {
					mode = op.mode
				}
			}
			l := &Lock{
				c:         c,
				name:      g.Lock,
				token:     g.FencingToken,
				proof:     g.FencingProof,
				mode:      mode,
				sess:      op.sess,
				lost:      make(chan struct{}),
				expiresAt: exp,
			}
			if op.value != nil {
				l.value = *op.value
			}
			ls = append(ls, l)
			break
		}
	}
	if op.multi() {
		g := &lockGroup{locks: ls}
		for _, l := range ls {
			l.group = g
		}
	}
	switch {
	case !withTTL || op.abandoned:
		// Bound to the session only; or released at once.
	case op.sends == 1 && op.ttl > 0 && m.ID == op.reqID && time.Since(op.sentAt) <= op.ttl/2:
		for _, l := range ls {
			if !l.expiresAt.IsZero() {
				l.ttl, l.deadline = op.ttl, op.sentAt.Add(op.ttl)
			}
		}
	default:
		ttl := op.ttl
		if ttl == 0 {
			// Wanted without a TTL, granted with one: keep the TTL the
			// server most likely holds (renewed automatically).
			ttl = op.lastTTL
		}
		if ttl == 0 {
			ttl = op.sess.ttl
		}
		op.confirming = true
		delete(c.opByID, op.reqID)
		c.goLocked(func() { c.confirmLease(op, ls, ttl) })
		return nil
	}
	c.grantLocked(op, ls)
	return nil
}

// confirmLease renews ls, just granted to op, with an explicit ttl and
// hands them out with the lease the answers confirm: from each renew's
// send time, for ttl. A renew's answer is the reply to that very request,
// so it says exactly which TTL the server holds and from when. When one
// lock of a multi-acquire cannot be confirmed, the others are released.
func (c *Client) confirmLease(op *acquireOp, ls []*Lock, ttl time.Duration) {
	type confirmed struct {
		sent  time.Time
		exp   time.Time
		proof string // signed for the renewed expiry
	}
	got := make([]confirmed, len(ls))
	var err error
	for i, l := range ls {
		m, sent, rerr := c.roundTrip(c.ctx, op.sess, &api.WSRequest{Op: api.OpRenew, Lock: l.name, FencingToken: l.token, TTLms: ms(ttl)})
		switch {
		case rerr != nil:
			err = rerr
		case m.Type == api.TypeOK:
			got[i].sent, got[i].proof = sent, m.FencingProof
			if exp, perr := api.ParseTime(m.ExpiresAt); perr == nil && !exp.IsZero() {
				got[i].exp = exp
			}
		case m.Type == api.TypeError:
			err = fmt.Errorf("lockd: lock %q was granted (token %d) but lost before its lease was confirmed: %w", l.name, l.token, serverError(m.Error, 0))
		default:
			err = fmt.Errorf("lockd: renew: unexpected reply %q", m.Type)
		}
		if err != nil {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-op.done:
		return // ended meanwhile: the session was lost, or the client closed
	default:
	}
	if err != nil {
		if op.multi() && !op.sess.lost {
			for _, l := range ls {
				c.releaseLaterLocked(l)
			}
		}
		c.finishLocked(op, nil, err)
		return
	}
	for i, l := range ls {
		l.ttl, l.deadline = ttl, got[i].sent.Add(ttl)
		if !got[i].exp.IsZero() {
			l.expiresAt = got[i].exp
		}
		if got[i].proof != "" {
			l.proof = got[i].proof
		}
	}
	c.grantLocked(op, ls)
}

// grantLocked hands ls to op's caller, or releases them if op was
// abandoned.
func (c *Client) grantLocked(op *acquireOp, ls []*Lock) {
	if !op.abandoned {
		for _, l := range ls {
			c.locks[l.name] = l
			if l.ttl > 0 && (op.autoRenew || op.ttl == 0) {
				c.goLocked(func() { c.autoRenew(l) })
			}
		}
		c.kickLease()
	}
	c.finishLocked(op, ls, nil)
}

func (c *Client) onAcquireErrorLocked(cs *wsConn, op *acquireOp, m *api.WSMessage) []func() {
	se := serverError(m.Error, 0)
	se.Leader, se.Holder, se.Lock = m.Leader, m.Holder, m.Lock
	var err error = se
	code := se.API.Code
	if refusedForNow(m.Error, m.RetryAfterMs) {
		code = api.CodeOverloaded // a budget's refusal: retried alike
	}
	switch code {
	case api.CodeSessionExpired:
		c.sessionLostLocked(op.sess, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
		return nil
	case api.CodeNotLeader, api.CodeNoLeader:
		c.killLocked(cs, se.API.Code) // re-sent to the next leader
		return nil
	case api.CodeOverloaded:
		if op.abandoned {
			if op.sends == 1 && !op.resent {
				c.finishLocked(op, nil, err) // refused before anything was queued
			}
			return nil // the wait's withdrawal settles it
		}
		// Nothing was proposed: send it again once the member says it
		// takes work again, on whatever connection is live then.
		op.retrying = true
		if op.bo == nil {
			op.bo = newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
		}
		d := max(op.bo.next(), retryAfter(m))
		c.goLocked(func() { c.resendAfter(op, d) })
		return nil
	case api.CodeWaitTimeout:
		if !op.abandoned && !op.waitSet && !op.try && op.ctx.Err() == nil {
			if dl, ok := op.ctx.Deadline(); !ok || time.Until(dl) > 0 {
				if f := c.prepAcquireLocked(op, true); f != nil {
					return []func(){func() { _ = c.write(cs, f) }}
				}
				return nil
			}
		}
	case api.CodeLockHeld:
		if !op.try {
			err = waitTimeoutErr(op.what(), se)
		}
	}
	if op.resent && (se.API.Code == api.CodeLockHeld || se.API.Code == api.CodeWaitTimeout) {
		err = fmt.Errorf("%w: %w", ErrMaybeGrantedLost, err)
	}
	c.finishLocked(op, nil, err)
	return nil
}

// resendAfter sends op again after d, once an overloaded refusal's pause
// is over.
func (c *Client) resendAfter(op *acquireOp, d time.Duration) {
	if !sleep(c.ctx, d) {
		return
	}
	c.mu.Lock()
	op.retrying = false
	var cs *wsConn
	var f []byte
	if c.ops[op.names[0]] == op {
		cs, f = c.cur, c.prepAcquireLocked(op, true)
	}
	c.mu.Unlock()
	if f != nil {
		_ = c.write(cs, f)
	}
}
