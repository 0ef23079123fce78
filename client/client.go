package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
)

// Client is one lockd session over one WebSocket connection to the leader.
// It is safe for concurrent use. Create it with New, end it with Close.
type Client struct {
	cfg    Config
	api    *API
	dialHC *http.Client
	ownHC  bool
	log    *slog.Logger
	ids    atomic.Uint64

	// ctx is cancelled by Close; every goroutine of the client stops on it
	// and wg waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the lease loop after a deadline moved

	mu      sync.Mutex
	closed  bool
	cur     *wsConn       // the live connection, nil while reconnecting
	connCh  chan struct{} // closed (and replaced) whenever cur changes
	sess    *session      // the current session, possibly lost
	orphans []string      // sessions given up locally, still to delete on the server
	locks   map[string]*Lock
	ops     map[string]*acquireOp // pending acquires by lock name
	opByID  map[uint64]*acquireOp // the same, by the id of their last request
	cancels map[uint64]*acquireOp // withdrawn acquires, by the id of their cancel
	// queues are the calls waiting for their turn per lock name, in the
	// order they came (see queue.go).
	queues map[string][]*ticket
	// releasing counts the background releases under way per lock name
	// (see releaseLaterLocked); relCh is closed (and replaced) when one
	// ends.
	releasing map[string]int
	relCh     chan struct{}
	// watches are the active Watch and WatchPrefix calls.
	watches map[*watch]struct{}
}

// session is one server session as the client sees it.
type session struct {
	id string
	// readOnly: the connection carries no session (the token has read
	// access only): no id, no lease, no keepalives; Done closes on Close.
	readOnly bool
	ttl      time.Duration
	// deadline is the local lease: the send time of the last keepalive (or
	// of the hello that created the session) the leader confirmed, plus ttl.
	deadline time.Time
	done     chan struct{}
	lost     bool
	err      error // why it was lost
}

// New opens a session with the cluster: it finds the leader from any
// endpoint and says hello. It blocks until the session is established, ctx
// is done, or Config.DialTimeout (default 10s) has passed; then the error
// matches ErrNoLeader, the context error and the last attempt's error (so a
// member that never answers gives up after DialTimeout even with
// context.Background()). When every endpoint fails in a way waiting cannot
// fix — the connection refused, or the TLS handshake failed for a reason
// of the configuration (see ErrUnreachable) — it returns at once, as soon
// as each endpoint failed so once, with an error matching ErrUnreachable
// and ErrNoLeader. A token the cluster refuses fails it at once with
// an error matching ErrUnauthenticated or ErrPermissionDenied (a token
// without access to any lock), and an http:// endpoint of a member
// that serves HTTPS with one matching ErrHTTPSRequired. ctx and DialTimeout
// bound only this first connect; the Client lives until Close. Later
// reconnects keep trying even when the token is refused (it may be accepted
// again after the cluster reloads its token file); the session's local lease
// ends the session meanwhile.
//
// A token with read access only (no lock access on any prefix) gives a
// read-only client (see ReadOnly): the cluster opens no session for it;
// Watch, WatchPrefix, Election.Observe, Election.Leader and the API's reads
// work, and acquires fail with ErrPermissionDenied.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	for i, e := range cfg.Endpoints {
		cfg.Endpoints[i] = normalizeEndpoint(e)
	}
	hc := cfg.HTTPClient
	own := hc == nil
	if own {
		hc = defaultHTTPClient(cfg.TLSConfig)
	}
	a, err := NewAPI(APIConfig{Endpoints: cfg.Endpoints, HTTPClient: hc, Token: cfg.Token, Logger: cfg.Logger, MinBackoff: cfg.MinBackoff, MaxBackoff: cfg.MaxBackoff})
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:     cfg,
		api:     a,
		dialHC:  noRedirect(hc),
		ownHC:   own,
		log:     cfg.Logger,
		kick:    make(chan struct{}, 1),
		connCh:  make(chan struct{}),
		locks:   make(map[string]*Lock),
		ops:     make(map[string]*acquireOp),
		opByID:  make(map[uint64]*acquireOp),
		cancels: make(map[uint64]*acquireOp),
		queues:  make(map[string][]*ticket),

		releasing: make(map[string]int),
		relCh:     make(chan struct{}),
		watches:   make(map[*watch]struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	dctx := ctx
	if cfg.DialTimeout > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
	}
	cs, err := c.connect(dctx, true)
	var gu *gaveUpError
	if errors.As(err, &gu) && ctx.Err() == nil {
		gu.within = cfg.DialTimeout // DialTimeout ran out, not the caller's ctx
	}
	if err != nil {
		c.cancel()
		if own {
			hc.CloseIdleConnections()
		}
		return nil, err
	}
	c.wg.Add(2)
	go c.leaseLoop()
	go c.run(cs)
	return c, nil
}

// ClientID returns the client ID the session was opened with.
func (c *Client) ClientID() string { return c.cfg.ClientID }

// ReadOnly reports a client without a session: the cluster said its token
// has read access only (see New). It watches and reads; it takes no lock.
func (c *Client) ReadOnly() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess != nil && c.sess.readOnly
}

// SessionID returns the ID of the current session ("" for a read-only
// client). After a session is lost
// the client opens a new one for later calls, and the ID changes.
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return ""
	}
	return c.sess.id
}

// Done returns a channel closed when the current session is definitely lost:
// expired on the server, counted as expired by the local lease, or ended by
// Close. Every lock of that session is lost with it. Err tells why. The
// client then opens a fresh session for later calls; call Done again to
// watch that one. A read-only client has no session: Done closes when it is
// closed.
func (c *Client) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess.done
}

// Err returns why the current session was lost, or nil while it lives.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess.err
}

// API returns the plain HTTP client on the same endpoints and HTTP client.
func (c *Client) API() *API { return c.api }

// Revoke ends the grants of lock name, held by any client: every grant, or
// with token > 0 only that one (an admin operation: it needs a token with
// admin access when the cluster runs with tokens). It goes over HTTP (see
// API.Revoke). The holders' Lost closes with ErrRevoked, lock-delays
// apply, and waiters are granted. It returns the tokens revoked (none for
// a lock without holders); a token that names no current grant gives
// ErrNotHolder.
func (c *Client) Revoke(ctx context.Context, name string, token uint64) ([]uint64, error) {
	if name == "" {
		return nil, errors.New("lockd: empty lock name")
	}
	return c.api.Revoke(ctx, name, token)
}

// Close ends the client. It deletes the session on the server (which
// releases every lock the session holds and drops its waits, in one step),
// closes Lost of every lock and Done with ErrClosed, fails pending acquires
// with ErrClosed, and waits for the client's goroutines. The clean-up on
// the server is bounded by Config.CloseTimeout; if it fails (the error is
// returned), the session still ends by itself after its TTL.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closed = true
	for _, l := range c.locks {
		l.loseLocked(ErrClosed)
	}
	for _, op := range c.ops {
		c.finishLocked(op, nil, ErrClosed)
	}
	for _, q := range c.queues {
		for _, t := range q {
			if !t.signalled {
				t.signalled = true
				close(t.ready)
			}
		}
	}
	ids := c.orphans
	c.orphans = nil
	if s := c.sess; !s.lost {
		s.lost, s.err = true, ErrClosed
		close(s.done)
		if !s.readOnly {
			ids = append(ids, s.id)
		}
	}
	if c.cur != nil {
		c.api.setLeader(c.cur.base)
	}
	c.mu.Unlock()

	var err error
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CloseTimeout)
	for _, id := range ids {
		if e := c.api.DeleteSession(ctx, id); e != nil && !isGone(e) {
			err = errors.Join(err, fmt.Errorf("lockd: deleting session %s: %w", id, e))
		}
	}
	cancel()
	c.cancel()
	c.wg.Wait()
	if c.ownHC {
		c.api.closeIdle()
		c.dialHC.CloseIdleConnections()
	}
	return err
}

// isGone reports an error saying the session is not there any more.
func isGone(err error) bool {
	var se *ServerError
	return errors.As(err, &se) && (se.API.Code == api.CodeSessionExpired || se.API.Code == api.CodeNotFound)
}

func (c *Client) nextID() uint64 { return c.ids.Add(1) }

func (c *Client) kickLease() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// leaseLoop enforces the conservative local lease: it wakes at the earliest
// deadline of the session and of the TTL locks and declares lost what ran
// out.
func (c *Client) leaseLoop() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		c.mu.Lock()
		next := c.expireLocked(time.Now())
		c.mu.Unlock()
		d := time.Hour
		if !next.IsZero() {
			d = time.Until(next)
		}
		t.Reset(d)
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		case <-t.C:
		}
	}
}

// expireLocked declares lost whatever deadline passed by now and returns
// the next deadline (zero if none).
func (c *Client) expireLocked(now time.Time) time.Time {
	if c.closed {
		return time.Time{}
	}
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if s := c.sess; s != nil && !s.lost && !s.readOnly {
		if end := c.leaseEnd(s.deadline, s.ttl); !now.Before(end) {
			c.log.Warn("lockd: session lease ran out", "session", s.id, "ttl", s.ttl)
			c.sessionLostLocked(s, fmt.Errorf("%w: session %s: no keepalive sent in the last %v was confirmed: %w", ErrLeaseExpired, s.id, s.ttl, ErrSessionExpired), true)
		} else {
			earlier(end)
		}
	}
	for _, l := range c.locks {
		if l.ttl <= 0 {
			continue
		}
		if end := c.leaseEnd(l.deadline, l.ttl); !now.Before(end) {
			c.log.Warn("lockd: lock lease ran out", "lock", l.name, "token", l.token, "ttl", l.ttl)
			l.loseLocked(fmt.Errorf("%w: lock %q: no acquire or renew sent in the last %v was confirmed", ErrLeaseExpired, l.name, l.ttl))
		} else {
			earlier(end)
		}
	}
	return next
}

// leaseEnd is when a lease of ttl whose request was sent at deadline-ttl
// counts as run out: deadline less the safety margin (see
// Config.LeaseMargin): a part for timer lateness, and one that grows with
// the TTL for the drift of the clock rates.
func (c *Client) leaseEnd(deadline time.Time, ttl time.Duration) time.Time {
	m := c.cfg.LeaseMargin
	if m == 0 {
		m = min(ttl/20, 100*time.Millisecond) + ttl/1000
	}
	if m < 0 {
		m = 0
	}
	return deadline.Add(-m)
}

// sessionLostLocked ends session s: its locks are lost, its pending acquires
// fail with cause, and the connection is dropped so that the next one opens
// a fresh session. local says the server may still hold the session (the
// local lease ran out), so it is deleted there before anything else.
func (c *Client) sessionLostLocked(s *session, cause error, local bool) {
	if s == nil || s.lost {
		return
	}
	s.lost, s.err = true, cause
	close(s.done)
	for _, l := range c.locks {
		if l.sess == s {
			l.loseLocked(cause)
		}
	}
	for _, op := range c.ops {
		if op.sess == s {
			c.finishLocked(op, nil, cause)
		}
	}
	if local {
		c.orphans = append(c.orphans, s.id)
	}
	if c.cur != nil {
		c.killLocked(c.cur, "session lost")
	}
}

// confirmSession moves the session's local lease after a confirmed
// keepalive sent at sent.
func (c *Client) confirmSession(s *session, sent time.Time, ttlMs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != s || s.lost {
		return
	}
	s.setTTLLocked(ttlMs)
	if d := sent.Add(s.ttl); d.After(s.deadline) {
		s.deadline = d
		c.kickLease()
	}
}

// setTTLLocked takes the session TTL the server reports (0: none
// reported). A shorter one shortens the lease at once: the server counts
// it from the last keepalive it received.
func (s *session) setTTLLocked(ttlMs int64) {
	ttl := time.Duration(ttlMs) * time.Millisecond
	if ttl <= 0 || ttl == s.ttl {
		return
	}
	if ttl < s.ttl {
		s.deadline = s.deadline.Add(ttl - s.ttl)
	}
	s.ttl = ttl
}

// goLocked starts a goroutine owned by the client, unless it is closed.
func (c *Client) goLocked(f func()) {
	if c.closed {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}
