package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// Fencing headers, as fencestore and the fence package read them.
const (
	HeaderFencingToken = "Fencing-Token"
	HeaderFencingLock  = "Fencing-Lock"
	HeaderFencingProof = "Fencing-Proof"
)

// Lock is a granted lock. Its methods are safe for concurrent use.
type Lock struct {
	c     *Client
	name  string
	token uint64
	mode  string
	sess  *session
	lost  chan struct{}
	// group links the locks of one AcquireMany: the loss of one is the
	// loss of all (see loseLocked).
	group *lockGroup

	// renewMu makes the renews of the lock one at a time, so that the
	// answer that sets the lease is the one of the last renew applied.
	renewMu sync.Mutex

	// Guarded by c.mu.
	proof     string        // the grant's proof, as last signed (grant or renew)
	ttl       time.Duration // 0: bound to the session only
	expiresAt time.Time
	deadline  time.Time // local lease of the TTL; see Client.expireLocked
	value     string    // the value this client last gave the grant
	err       error
}

// lockGroup is the locks of one AcquireMany.
type lockGroup struct {
	locks []*Lock
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Token returns the fencing token of the grant: pass it to every resource
// the critical section writes to.
func (l *Lock) Token() uint64 { return l.token }

// Mode returns the grant's mode: api.ModeShared for a lock acquired
// WithShared, else api.ModeExclusive (a semaphore's permits included), as
// the server reported it.
func (l *Lock) Mode() string { return l.mode }

// Value returns the value this client last gave the grant: the one of
// WithValue, or of the last SetValue the server confirmed ("" for none).
// Others see it in the lock's status.
func (l *Lock) Value() string {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.value
}

// Proof returns the fencing proof the server signed for this grant, or ""
// when it sends none. A proof expires with the grant's expiry it was signed
// for; every renew (Renew, WithAutoRenew) brings one signed for the new
// expiry, which Proof and Fence return from then on.
func (l *Lock) Proof() string {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.proof
}

// ExpiresAt returns the expiry the server reported for the lock's TTL (zero
// for a lock bound only to its session): in the grant, the last renew's
// answer, or the check after a resume. It is the server's wall clock; the
// client itself goes by Deadline.
func (l *Lock) ExpiresAt() time.Time {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.expiresAt
}

// Deadline returns the conservative local lease: the moment Lost closes
// unless a keepalive (or, for a TTL lock, a renew) is confirmed first.
func (l *Lock) Deadline() time.Time {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	d := l.c.leaseEnd(l.sess.deadline, l.sess.ttl)
	if l.ttl > 0 {
		if ld := l.c.leaseEnd(l.deadline, l.ttl); ld.Before(d) {
			d = ld
		}
	}
	return d
}

// Lost returns a channel closed when the lock stops being held: lost (the
// local lease ran out, the server pushed "lost" or said not_holder, the
// lock was revoked, the check after a resume found it gone, the session
// ended), released (or a release's outcome is unknown), or the client
// closed. Err tells which. A lock of an AcquireMany is also lost when any
// other lock of that call is (not when one is released).
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err returns nil while the lock is held, then why it is not: an error
// matching ErrLeaseExpired, ErrLockExpired, ErrRevoked, ErrNotHolder,
// ErrSessionExpired, ErrReleased, ErrUnknownOutcome (a Release without an
// answer) or ErrClosed. A lock of an AcquireMany lost with another of that
// call has that lock's cause (wrapped, naming it).
func (l *Lock) Err() error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.err
}

// Fence sets the fencing headers on req: Fencing-Token, Fencing-Lock and,
// when the server sent one, Fencing-Proof (the latest: see Proof).
func (l *Lock) Fence(req *http.Request) {
	req.Header.Set(HeaderFencingToken, strconv.FormatUint(l.token, 10))
	req.Header.Set(HeaderFencingLock, l.name)
	if p := l.Proof(); p != "" {
		req.Header.Set(HeaderFencingProof, p)
	}
}

// loseLocked marks the lock not held, for cause. Once lost, always lost.
// A lock of an AcquireMany that is lost (not released, not closed) takes
// the others of its call with it: they are lost with the same cause, and
// released in the background while the session lives.
func (l *Lock) loseLocked(cause error) {
	if !l.markLostLocked(cause) || l.group == nil || !losesGroup(cause) {
		return
	}
	c := l.c
	for _, s := range l.group.locks {
		if s == l || !s.markLostLocked(fmt.Errorf("lockd: lock %q lost with lock %q of the same AcquireMany: %w", s.name, l.name, cause)) {
			continue
		}
		if !s.sess.lost && !c.closed {
			c.releaseLaterLocked(s)
		}
	}
}

// markLostLocked marks the lock not held, unless it was already; it
// reports whether it did.
func (l *Lock) markLostLocked(cause error) bool {
	if l.err != nil {
		return false
	}
	l.err = cause
	close(l.lost)
	if l.c.locks[l.name] == l {
		delete(l.c.locks, l.name)
		l.c.pumpLocked(l.name) // the next caller of this Client may go
	}
	return true
}

// losesGroup reports a cause that ends the other locks of an AcquireMany:
// anything but the caller's own release and the client's close.
func losesGroup(cause error) bool {
	return !errors.Is(cause, ErrReleased) && !errors.Is(cause, ErrUnknownOutcome) && !errors.Is(cause, ErrClosed)
}

// SetValue sets the grant's value (a UTF-8 string of at most 4096 bytes),
// which the lock's status shows to everyone (see WithValue). When the
// server says the lock is not held any more, the lock is lost and the
// error matches ErrNotHolder. Without an answer (ctx ends, the connection
// breaks) the error matches ErrUnknownOutcome: the value may or may not
// have been set.
func (l *Lock) SetValue(ctx context.Context, v string) error {
	if err := checkValue(v); err != nil {
		return err
	}
	c := l.c
	c.mu.Lock()
	err := l.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	m, sent, err := c.roundTrip(ctx, l.sess, &api.WSRequest{Op: api.OpValue, Lock: l.name, FencingToken: l.token, Value: &v})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if !sent.IsZero() && l.err == nil {
			return fmt.Errorf("%w: setting the value of lock %q token %d: %w", ErrUnknownOutcome, l.name, l.token, err)
		}
		return err
	}
	switch m.Type {
	case api.TypeOK:
		l.value = v
		return nil
	case api.TypeError:
		return l.refusedLocked(m.Error)
	}
	return fmt.Errorf("lockd: value: unexpected reply %q", m.Type)
}

// Release releases the lock. It returns nil once the server confirmed, and
// also for a lock already released. For a lock lost before, it returns the
// cause of the loss; when the server says the lock is not held any more,
// an error matching ErrNotHolder.
//
// When another Acquire of this Client waits for the same lock (the next in
// the Client's queue for it), the release hands the lock on to it in the
// same committed step: that Acquire joins the server's queue at once, and
// is granted in that step when no other client waits (see Acquire).
//
// When no answer comes (ctx ends, the connection breaks) the server may
// have released the lock already: the error matches ErrUnknownOutcome (and
// ctx's error), the lock counts as gone (Lost closes, Err matches
// ErrUnknownOutcome), and the client goes on releasing it in the
// background, bounded by Config.CloseTimeout (an Acquire of the same name
// waits for that). Calling Release again retries at once.
func (l *Lock) Release(ctx context.Context) error {
	c := l.c
	c.mu.Lock()
	err := l.err
	if errors.Is(err, ErrReleased) {
		c.mu.Unlock()
		return nil
	}
	if err != nil && !errors.Is(err, ErrUnknownOutcome) {
		c.mu.Unlock()
		return err
	}
	var hand *api.WSRequest
	var next *acquireOp
	cs := c.cur
	if err == nil {
		if hand, next = c.handOffLocked(l, cs); hand != nil {
			// Until this release is settled, the acquire it carries is
			// not sent again on its own (see acquireRequestLocked).
			c.releasing[l.name]++
		}
	}
	c.mu.Unlock()
	if hand != nil {
		defer c.releaseSettled(l.name)
		m, _, err := c.exchange(ctx, cs, hand)
		if done, rerr := l.releaseAnswered(m, err, true); done {
			return rerr
		}
		// Nothing was applied, or the connection broke before the
		// answer: release on its own; the acquire is sent again, on its
		// own too, once that is settled.
		c.mu.Lock()
		next.heldBack = true
		c.mu.Unlock()
	}
	m, _, err := c.roundTrip(ctx, l.sess, &api.WSRequest{Op: api.OpRelease, Lock: l.name, FencingToken: l.token})
	_, rerr := l.releaseAnswered(m, err, false)
	return rerr
}

// releaseAnswered takes the answer (or the failure) of a release of l.
// With handOff, done is false when the release should be sent again on
// its own: the member applied nothing, or the connection broke first.
func (l *Lock) releaseAnswered(m *api.WSMessage, err error, handOff bool) (done bool, _ error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if handOff {
		if errors.Is(err, errConnLost) {
			return false, nil
		}
		if err == nil && m.Type == api.TypeError && m.Error != nil {
			switch m.Error.Code {
			case api.CodeNotLeader, api.CodeNoLeader, api.CodeOverloaded, api.CodeInvalidArgument:
				// Refused before anything was proposed (a member that
				// takes no hand-off says invalid_argument).
				return false, nil
			}
		}
	}
	if err != nil {
		if l.err != nil && !errors.Is(l.err, ErrUnknownOutcome) {
			return true, l.err // lost meanwhile (the session ended, the client closed)
		}
		uerr := fmt.Errorf("%w: releasing lock %q token %d: %w", ErrUnknownOutcome, l.name, l.token, err)
		if l.err == nil {
			l.loseLocked(uerr)
			c.releaseLaterLocked(l)
		}
		return true, uerr
	}
	switch m.Type {
	case api.TypeOK:
		l.loseLocked(ErrReleased)
		return true, nil
	case api.TypeError:
		return true, l.refusedLocked(m.Error)
	}
	return true, fmt.Errorf("lockd: release: unexpected reply %q", m.Type)
}

// releaseSettled ends a release of name counted in Client.releasing: the
// acquires it held back are sent, and the next caller in line may go.
func (c *Client) releaseSettled(name string) {
	c.mu.Lock()
	frames := c.releaseDoneLocked(name)
	cs := c.cur
	c.mu.Unlock()
	for _, f := range frames {
		if c.write(cs, f) != nil {
			return // the next connection sends them
		}
	}
}

// releaseDoneLocked counts a release of name as settled and returns the
// frames of what it held back, for the live connection.
func (c *Client) releaseDoneLocked(name string) [][]byte {
	if c.releasing[name]--; c.releasing[name] <= 0 {
		delete(c.releasing, name)
	}
	close(c.relCh)
	c.relCh = make(chan struct{})
	var frames [][]byte
	if op := c.ops[name]; op != nil && c.releasing[name] == 0 {
		var f []byte
		switch {
		case op.heldBack && !op.abandoned:
			f = c.prepAcquireLocked(op, true)
		case op.conn != c.cur:
			f = c.pendingFrameLocked(op)
		}
		if f != nil {
			frames = append(frames, f)
		}
	}
	c.pumpLocked(name)
	return frames
}

// releaseLaterLocked releases l in the background, bounded by
// CloseTimeout: a grant nobody will use, or a lock whose release had no
// answer. Until it ends, an Acquire of the same name waits (see acquire):
// the server would answer it with this very grant (same token), which the
// release would then end under the new caller.
func (c *Client) releaseLaterLocked(l *Lock) {
	if c.closed {
		return // the session's deletion releases it
	}
	c.releasing[l.name]++
	c.goLocked(func() {
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.CloseTimeout)
		m, _, err := c.roundTrip(ctx, l.sess, &api.WSRequest{Op: api.OpRelease, Lock: l.name, FencingToken: l.token})
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case err != nil:
			if c.ctx.Err() == nil {
				c.log.Info("lockd: releasing in the background", "lock", l.name, "token", l.token, "err", err)
			}
		case m.Type == api.TypeOK:
			l.loseLocked(ErrReleased)
		case m.Type == api.TypeError && m.Error != nil:
			// not_holder: it ended by itself, or an unanswered release
			// went through after all.
			c.log.Debug("lockd: background release refused", "lock", l.name, "token", l.token, "code", m.Error.Code)
		}
		frames := c.releaseDoneLocked(l.name)
		if cs := c.cur; len(frames) > 0 {
			c.goLocked(func() {
				for _, f := range frames {
					if c.write(cs, f) != nil {
						return
					}
				}
			})
		}
	})
}

// Renew extends the lock's TTL to ttl from now (0: the lock's own TTL) and
// moves its local lease to the renew's send time plus ttl. For a lock
// bound only to its session, Renew(ctx, 0) sends a session keepalive. When
// the server says the lock is gone, the lock is lost and the error matches
// ErrNotHolder. Renews of one lock go one at a time. A renew without an
// answer may still have been applied: the local lease then ends no later
// than its send time plus ttl (so a shorter ttl counts at once).
func (l *Lock) Renew(ctx context.Context, ttl time.Duration) error {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	c := l.c
	c.mu.Lock()
	err := l.err
	if ttl == 0 {
		ttl = l.ttl
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if ttl == 0 {
		m, sent, err := c.roundTrip(ctx, l.sess, &api.WSRequest{Op: api.OpKeepalive})
		if err != nil {
			return err
		}
		if m.Type == api.TypeError {
			return serverError(m.Error, 0)
		}
		c.confirmSession(l.sess, sent, m.SessionTTLms)
		return l.Err()
	}
	m, sent, err := c.roundTrip(ctx, l.sess, &api.WSRequest{Op: api.OpRenew, Lock: l.name, FencingToken: l.token, TTLms: ms(ttl)})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if !sent.IsZero() {
			l.maybeRenewedLocked(sent, ttl)
		}
		return err
	}
	switch m.Type {
	case api.TypeOK:
		if l.err != nil {
			return l.err // lost meanwhile, and lost stays lost
		}
		l.ttl = ttl
		l.deadline = sent.Add(ttl)
		if exp, err := api.ParseTime(m.ExpiresAt); err == nil && !exp.IsZero() {
			l.expiresAt = exp
		}
		if m.FencingProof != "" {
			l.proof = m.FencingProof // signed for the new expiry
		}
		c.kickLease()
		return nil
	case api.TypeError:
		if m.Error != nil && !refusedUnapplied(m.Error.Code) {
			l.maybeRenewedLocked(sent, ttl)
		}
		return l.refusedLocked(m.Error)
	}
	return fmt.Errorf("lockd: renew: unexpected reply %q", m.Type)
}

// maybeRenewedLocked counts with a renew to ttl, sent at sent, that may or
// may not have been applied: the server's expiry is then at least sent+ttl
// or what it was, so the local lease ends at the earlier of the two. A lock
// bound to its session only may have a TTL now.
func (l *Lock) maybeRenewedLocked(sent time.Time, ttl time.Duration) {
	if l.err != nil {
		return
	}
	d := sent.Add(ttl)
	switch {
	case l.ttl == 0:
		l.ttl, l.deadline = ttl, d
	case d.Before(l.deadline):
		l.deadline = d
	default:
		return
	}
	l.c.kickLease()
}

// refusedUnapplied reports an error code that says the request was refused
// before it could take effect.
func refusedUnapplied(code string) bool {
	switch code {
	case api.CodeNotHolder, api.CodeInvalidArgument, api.CodeUnauthenticated, api.CodePermissionDenied, api.CodeSessionExpired, api.CodeNotFound:
		return true
	}
	return false
}

// refusedLocked turns a refused release or renew into its error; a
// not_holder refusal means the lock is gone, so it is lost too.
func (l *Lock) refusedLocked(e *api.Error) error {
	se := serverError(e, 0)
	if se.API.Code == api.CodeNotHolder {
		l.loseLocked(fmt.Errorf("lock %q token %d: %w", l.name, l.token, se))
	}
	return se
}

// autoRenew renews l every third of its TTL until it is lost or released.
func (c *Client) autoRenew(l *Lock) {
	c.mu.Lock()
	ttl := l.ttl
	c.mu.Unlock()
	t := time.NewTimer(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.lost:
			return
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, ttl/3)
		err := l.Renew(ctx, ttl)
		cancel()
		next := ttl / 3
		if err != nil {
			if l.Err() != nil {
				return
			}
			c.log.Info("lockd: auto-renew failed, retrying", "lock", l.name, "err", err)
			next = max(ttl/10, 10*time.Millisecond)
		}
		t.Reset(next)
	}
}
