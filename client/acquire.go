package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lockd/lockd/api"
)

// AcquireOption configures Acquire, TryAcquire and Do.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	ttl       time.Duration
	wait      time.Duration
	waitSet   bool
	autoRenew bool
}

// WithTTL gives the lock a TTL of its own on top of the session: it is lost
// when not renewed within d (see WithAutoRenew and Lock.Renew), or when the
// session ends, whichever is first. Without it the lock lives as long as
// the session. Either way the lock's lease is what the server granted: an
// Acquire that adopts an abandoned wait of the same lock (see Acquire) may
// get the TTL that wait was queued with; a lock wanted without a TTL that
// the server gave one is then renewed automatically, as WithAutoRenew does.
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

// acquireOp is an acquire waiting for its grant. It outlives a connection:
// it is re-sent on the next one (with the wait time left) and keeps its
// place, because acquire is idempotent per client ID.
type acquireOp struct {
	name string
	acquireOptions
	try      bool
	deadline time.Time       // end of an explicit wait
	ctx      context.Context // the caller's: bounds an implicit wait
	// abandoned: the caller went away; a grant that still comes is released.
	abandoned bool
	// sends counts the requests sent for this wait, over every caller
	// that adopted it; lastTTL is the last TTL one of them carried (the
	// server keeps a queued TTL when a resend carries none).
	sends   int
	lastTTL time.Duration
	// confirming: granted; a renew is confirming the lease before the
	// lock is handed out (see onGrantedLocked).
	confirming bool

	sess *session // the session it was last sent in
	conn *wsConn  // the connection it was last sent on
	// resent: it went out on an earlier connection that failed before the
	// answer, so that send may have been granted (see ErrMaybeGrantedLost).
	resent bool
	reqID  uint64
	sentAt time.Time

	done chan struct{}
	lock *Lock
	err  error
}

// waitSlack is how long past an explicit wait deadline Acquire still waits
// for the server's answer before it gives up on its own.
const waitSlack = time.Second

// Acquire takes lock name in the client's session. It blocks until the lock
// is granted, ctx is done, or the wait timeout (WithWaitTimeout) runs out.
// Several goroutines of one Client acquiring the same name are served one
// at a time: the server knows the client by its ID, not by goroutine. A
// wait whose caller gave up stays queued on the server (no request
// withdraws one); the next Acquire of the name adopts it, with its own
// options, and keeps its place. While the client is still releasing a lock
// of that name in the background (see Lock.Release), Acquire waits for that
// first, at most Config.CloseTimeout.
func (c *Client) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	var o acquireOptions
	for _, f := range opts {
		f(&o)
	}
	return c.acquire(ctx, name, o, false)
}

// TryAcquire takes lock name if it is free now; otherwise the error matches
// ErrLockHeld. It still waits for a connection to the leader within ctx.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	var o acquireOptions
	for _, f := range opts {
		f(&o)
	}
	o.wait, o.waitSet = 0, true
	return c.acquire(ctx, name, o, true)
}

func (c *Client) acquire(ctx context.Context, name string, o acquireOptions, try bool) (*Lock, error) {
	if name == "" {
		return nil, errors.New("lockd: empty lock name")
	}
	if o.waitSet && (o.wait < 0 || o.wait > api.MaxWaitTimeoutMs*time.Millisecond) {
		return nil, fmt.Errorf("lockd: wait timeout %v out of range 0–10m", o.wait)
	}
	start := time.Now()
	var op *acquireOp
	for op == nil {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		var busy <-chan struct{}
		releasing := false
		if l := c.locks[name]; l != nil {
			busy = l.lost
		} else if c.releasing[name] > 0 {
			// The server would answer with the grant being released (same
			// token), and the release would then end it.
			busy, releasing = c.relCh, true
		} else if p := c.ops[name]; p != nil && !p.abandoned {
			busy = p.done
		} else {
			if p != nil {
				op = p // an abandoned wait: adopt it, it keeps its place
			} else {
				op = &acquireOp{name: name, done: make(chan struct{})}
				c.ops[name] = op
			}
			op.acquireOptions, op.try, op.ctx, op.abandoned = o, try, ctx, false
			op.deadline = start.Add(o.wait)
			frame := c.prepAcquireLocked(op, true)
			cs := c.cur
			c.mu.Unlock()
			if frame != nil {
				_ = c.write(cs, frame)
			}
			break
		}
		c.mu.Unlock()
		if try && !releasing {
			return nil, fmt.Errorf("%w: lock %q: held or awaited by this client", ErrLockHeld, name)
		}
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}

	var timeout <-chan time.Time
	if o.waitSet && !try {
		t := time.NewTimer(time.Until(op.deadline) + waitSlack)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-op.done:
		return op.lock, op.err
	case <-ctx.Done():
		c.abandon(op)
		return nil, ctx.Err()
	case <-timeout:
		c.abandon(op)
		return nil, fmt.Errorf("%w: lock %q: no answer from the leader within the wait", ErrWaitTimeout, name)
	}
}

// abandon gives up on op for its caller. A lock it already got is released;
// a wait still queued on the server stays there until it resolves (no
// request withdraws a wait), and a grant it gets then is released.
func (c *Client) abandon(op *acquireOp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-op.done:
		if l := op.lock; l != nil && l.err == nil {
			c.goLocked(func() { c.releaseQuietly(l) })
		}
	default:
		op.abandoned = true
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
// send it), op was already sent on it and force is false, or op is granted
// already.
func (c *Client) prepAcquireLocked(op *acquireOp, force bool) []byte {
	cs := c.cur
	if cs == nil || c.sess == nil || c.sess.lost || op.confirming || (op.conn == cs && !force) {
		return nil
	}
	delete(c.opByID, op.reqID)
	op.reqID = c.nextID()
	c.opByID[op.reqID] = op
	op.resent = op.resent || (op.conn != nil && op.conn != cs)
	op.conn, op.sess, op.sentAt = cs, c.sess, time.Now()
	op.sends++

	var wait time.Duration
	switch {
	case op.abandoned || op.try:
		// A resend only to learn whether the lock came while away.
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
	req := api.WSRequest{ID: op.reqID, Op: api.OpAcquire, Lock: op.name, WaitTimeoutMs: &waitMs}
	if op.ttl > 0 {
		req.TTLms = ms(op.ttl)
		op.lastTTL = op.ttl
	}
	data, _ := json.Marshal(&req)
	return data
}

// finishLocked resolves op.
func (c *Client) finishLocked(op *acquireOp, l *Lock, err error) {
	if c.ops[op.name] == op {
		delete(c.ops, op.name)
	}
	delete(c.opByID, op.reqID)
	select {
	case <-op.done:
		return
	default:
	}
	op.lock, op.err = l, err
	close(op.done)
	if op.abandoned && l != nil {
		c.releaseLaterLocked(l)
	}
}

// onGrantedLocked takes a grant for a pending acquire. The lock's lease is
// what the server granted, never what the caller asked for: a grant
// without expires_at has no TTL of its own (the session's lease covers it);
// one with expires_at has the TTL the server holds, which the client knows
// only when the grant answers the one request this wait ever sent, with a
// TTL (the server counts that TTL from the commit, after the send). In
// every other case — a wait re-sent after a reconnect or adopted by a later
// Acquire (a resend without ttl_ms keeps the queued TTL), a grant pushed
// under a later request than the one it answers, a late grant whose lease
// is mostly spent — a renew with an explicit TTL confirms the lease before
// the lock is handed out (see confirmLease).
func (c *Client) onGrantedLocked(cs *wsConn, m *api.WSMessage) []func() {
	op := c.opByID[m.ID]
	if op == nil {
		if p := c.ops[m.Lock]; p != nil {
			op = p // a grant answering an earlier request of the same wait
		}
	}
	if op == nil || op.name != m.Lock {
		if l := c.locks[m.Lock]; l != nil && l.token == m.FencingToken {
			return nil // a repeat of a grant we hold
		}
		// A grant nobody waits for (its wait was given up): hand it back.
		c.releaseLaterLocked(&Lock{c: c, name: m.Lock, token: m.FencingToken, sess: cs.sess, lost: make(chan struct{})})
		return nil
	}
	if op.confirming {
		return nil // a repeat of the grant being confirmed
	}
	exp, _ := api.ParseTime(m.ExpiresAt)
	l := &Lock{
		c:         c,
		name:      m.Lock,
		token:     m.FencingToken,
		proof:     m.FencingProof,
		sess:      op.sess,
		lost:      make(chan struct{}),
		expiresAt: exp,
	}
	switch {
	case exp.IsZero() || op.abandoned:
		// Bound to the session only; or released at once.
	case op.sends == 1 && op.ttl > 0 && m.ID == op.reqID && time.Since(op.sentAt) <= op.ttl/2:
		l.ttl, l.deadline = op.ttl, op.sentAt.Add(op.ttl)
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
		c.goLocked(func() { c.confirmLease(op, l, ttl) })
		return nil
	}
	c.grantLocked(op, l)
	return nil
}

// confirmLease renews l, just granted to op, with an explicit ttl and
// hands it out with the lease the answer confirms: from the renew's send
// time, for ttl. The renew's answer is the reply to that very request, so
// it says exactly which TTL the server holds and from when.
func (c *Client) confirmLease(op *acquireOp, l *Lock, ttl time.Duration) {
	m, sent, err := c.roundTrip(c.ctx, op.sess, &api.WSRequest{Op: api.OpRenew, Lock: l.name, FencingToken: l.token, TTLms: ms(ttl)})
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-op.done:
		return // ended meanwhile: the session was lost, or the client closed
	default:
	}
	switch {
	case err != nil:
		c.finishLocked(op, nil, err)
	case m.Type == api.TypeOK:
		l.ttl, l.deadline = ttl, sent.Add(ttl)
		if exp, perr := api.ParseTime(m.ExpiresAt); perr == nil && !exp.IsZero() {
			l.expiresAt = exp
		}
		c.grantLocked(op, l)
	case m.Type == api.TypeError:
		c.finishLocked(op, nil, fmt.Errorf("lockd: lock %q was granted (token %d) but lost before its lease was confirmed: %w", l.name, l.token, serverError(m.Error, 0)))
	default:
		c.finishLocked(op, nil, fmt.Errorf("lockd: renew: unexpected reply %q", m.Type))
	}
}

// grantLocked hands l to op's caller, or releases it if op was abandoned.
func (c *Client) grantLocked(op *acquireOp, l *Lock) {
	if !op.abandoned {
		c.locks[l.name] = l
		if l.ttl > 0 && (op.autoRenew || op.ttl == 0) {
			c.goLocked(func() { c.autoRenew(l) })
		}
		c.kickLease()
	}
	c.finishLocked(op, l, nil)
}

func (c *Client) onAcquireErrorLocked(cs *wsConn, op *acquireOp, m *api.WSMessage) []func() {
	se := serverError(m.Error, 0)
	se.Leader = m.Leader
	var err error = se
	switch se.API.Code {
	case api.CodeSessionExpired:
		c.sessionLostLocked(op.sess, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
		return nil
	case api.CodeNotLeader, api.CodeNoLeader:
		c.killLocked(cs, se.API.Code) // re-sent to the next leader
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
			err = waitTimeoutErr(op.name, se)
		}
	}
	if op.resent && (se.API.Code == api.CodeLockHeld || se.API.Code == api.CodeWaitTimeout) {
		err = fmt.Errorf("%w: %w", ErrMaybeGrantedLost, err)
	}
	c.finishLocked(op, nil, err)
	return nil
}
