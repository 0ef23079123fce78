package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// wsConn is one WebSocket connection to the leader.
type wsConn struct {
	ws      *websocket.Conn
	base    string   // the leader's HTTP base URL
	sess    *session // the session it carries
	resumed bool     // the hello resumed an existing session
	ctx     context.Context
	cancel  context.CancelFunc
	calls   map[uint64]chan *api.WSMessage // replies awaited; guarded by Client.mu
	// Watches on this connection, guarded by Client.mu: by the server's
	// watch_id, by the id of a watch request awaiting its answer, and the
	// ids of unwatch requests (whose answers need nothing).
	watchIDs  map[uint64]*watch
	watchReqs map[uint64]*watch
	unwatches map[uint64]bool
	done      chan struct{} // closed once torn down
	once      sync.Once
}

// retryAfter is an error frame's retry hint (retry_after_ms of an
// overloaded refusal), 0 for none.
func retryAfter(m *api.WSMessage) time.Duration {
	return time.Duration(max(m.RetryAfterMs, 0)) * time.Millisecond
}

// refusedForNow reports whether an error frame refused the request only
// for the moment, nothing proposed: overloaded, or a client's or token's
// share of the member in use (resource_exhausted with a retry hint; a
// quota's has none and stands until something is released).
func refusedForNow(e *api.Error, retryAfterMs int64) bool {
	return e != nil && (e.Code == api.CodeOverloaded || (e.Code == api.CodeResourceExhausted && retryAfterMs > 0))
}

// errConnLost: the connection went away before the reply came; the caller
// may retry on the next one.
var errConnLost = errors.New("lockd: connection lost")

// maxLeaderHops bounds not_leader hops from one endpoint in one round.
const maxLeaderHops = 3

// connect finds the leader and establishes (or resumes) the session,
// retrying rounds over the endpoints with backoff until ctx is done. When
// first is set (New), a refused token or a redirect refused for good
// (isFatalHop) ends it at once; a reconnect keeps trying, since the token
// may be accepted again after a reload, and the session's lease decides
// meanwhile.
func (c *Client) connect(ctx context.Context, first bool) (*wsConn, error) {
	bo := newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		cs, round, err := c.connectRound(ctx)
		if cs != nil {
			return cs, nil
		}
		if errors.Is(err, ErrClosed) || (first && (isAuthError(err) || isFatalHop(err) || errors.Is(err, ErrHTTPSRequired))) {
			return nil, err
		}
		if u := round.unreachable(); first && u != nil && ctx.Err() == nil {
			// Every endpoint refused the connection or the TLS handshake
			// for a reason that waiting does not change.
			return nil, u
		}
		wait := bo.next()
		if isAuthError(err) {
			c.log.Warn("lockd: the cluster refuses the token, retrying", "err", err, "wait", wait)
		} else if isFatalHop(err) {
			c.log.Warn("lockd: a member redirects outside the cluster, retrying", "err", err, "wait", wait)
		} else {
			c.log.Info("lockd: no leader reachable, retrying", "err", err, "wait", wait)
		}
		if ctx.Err() == nil && first && c.cfg.OnRetry != nil {
			c.cfg.OnRetry(err)
		}
		if ctx.Err() != nil || !sleep(ctx, wait) {
			return nil, &gaveUpError{ctx: ctx.Err(), last: err}
		}
	}
}

// gaveUpError is the error of a connect whose ctx ended before a leader
// was found: it matches ErrNoLeader, ctx's error and the last attempt's.
type gaveUpError struct {
	ctx, last error
	// within is the Config.DialTimeout that ran out, 0 when the caller's
	// ctx ended.
	within time.Duration
}

func (e *gaveUpError) Error() string {
	last := "none"
	if e.last != nil {
		last = e.last.Error()
	}
	if e.within > 0 {
		return fmt.Sprintf("%v: no member led to a leader within %v (Config.DialTimeout); last error: %s", ErrNoLeader, e.within, last)
	}
	return fmt.Sprintf("%v: %v (last error: %s)", ErrNoLeader, e.ctx, last)
}

func (e *gaveUpError) Is(target error) bool { return target == ErrNoLeader }

func (e *gaveUpError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.ctx, e.last} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// connectRound tries every endpoint once, the last known leader first.
func (c *Client) connectRound(ctx context.Context) (*wsConn, *roundErrors, error) {
	var lastErr error
	round := &roundErrors{}
	for _, base := range c.api.candidates() {
		for hop := 0; hop <= maxLeaderHops && base != "" && ctx.Err() == nil; hop++ {
			cs, next, err := c.tryMember(ctx, base)
			if cs != nil {
				return cs, round, nil
			}
			if errors.Is(err, ErrClosed) || isAuthError(err) || isFatalHop(err) {
				return nil, round, err
			}
			lastErr = err
			if next == "" {
				round.add(err)
			} else {
				round.transient = true // a member answered
			}
			c.log.Debug("lockd: connect attempt failed", "endpoint", base, "next", next, "err", err)
			if next != "" {
				c.api.setLeader(next)
			}
			base = normalizeEndpoint(next)
		}
	}
	if lastErr == nil {
		lastErr = ctx.Err()
		round.transient = true
	}
	return nil, round, lastErr
}

func wsURL(base string) string { return base + "/api/v1/ws" }

// tryMember connects to one member and says hello. next names the member
// to try instead: the leader a follower pointed to, or the same member again
// after a resume found the session gone.
func (c *Client) tryMember(ctx context.Context, base string) (cs *wsConn, next string, err error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	hdr := http.Header{}
	setAuth(hdr, c.cfg.Token)
	ws, resp, err := websocket.Dial(dctx, wsURL(base), &websocket.DialOptions{HTTPClient: c.dialHC, HTTPHeader: hdr})
	if err != nil {
		if resp != nil {
			switch resp.StatusCode {
			case http.StatusUnauthorized, http.StatusForbidden:
				// The token is refused; every member would say the same.
				var b []byte
				if resp.Body != nil {
					b, _ = io.ReadAll(resp.Body)
				}
				return nil, "", fmt.Errorf("%s: %w", base, replyError(resp.StatusCode, b, "WebSocket upgrade refused: HTTP "+resp.Status))
			case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
				u, perr := url.Parse(wsURL(base))
				if perr != nil {
					return nil, "", perr
				}
				_, leader, herr := c.api.redirectTarget(u, resp.Header)
				if herr != nil {
					return nil, "", fmt.Errorf("%s: %w", base, herr)
				}
				return nil, leader, fmt.Errorf("%s: redirected to the leader %q", base, leader)
			case http.StatusServiceUnavailable:
				return nil, "", fmt.Errorf("%s: %w", base, ErrNoLeader)
			case http.StatusBadRequest:
				var b []byte
				if resp.Body != nil {
					b, _ = io.ReadAll(io.LimitReader(resp.Body, 4096))
				}
				if httpsRequired(resp.StatusCode, b) {
					return nil, "", fmt.Errorf("%s: %w", base, ErrHTTPSRequired)
				}
			}
		}
		return nil, "", err
	}
	ws.SetReadLimit(4 * api.MaxBodyBytes)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		ws.CloseNow()
		return nil, "", ErrClosed
	}
	s := c.sess
	resume := s != nil && !s.lost && !s.readOnly
	ttl := c.cfg.SessionTTL
	hello := api.WSRequest{ID: c.nextID(), Op: api.OpHello, ClientID: c.cfg.ClientID, SessionTTLms: ms(ttl)}
	if resume {
		hello.SessionID = s.id
	}
	c.mu.Unlock()

	sent := time.Now()
	m, err := helloExchange(dctx, ws, &hello)
	if err != nil {
		ws.CloseNow()
		return nil, "", fmt.Errorf("%s: hello: %w", base, err)
	}
	if m.Type == api.TypeError {
		ws.CloseNow()
		se := serverError(m.Error, 0)
		se.Leader = m.Leader
		switch se.API.Code {
		case api.CodeNotLeader:
			if m.Leader == "" {
				return nil, "", fmt.Errorf("%s: %w", base, se)
			}
			if herr := c.api.leaderHop(base, m.Leader, true); herr != nil {
				return nil, "", fmt.Errorf("%s: %w", base, herr)
			}
			return nil, m.Leader, fmt.Errorf("%s: %w", base, se)
		case api.CodeSessionExpired:
			if resume {
				c.mu.Lock()
				c.log.Warn("lockd: session expired while disconnected", "session", s.id)
				c.sessionLostLocked(s, fmt.Errorf("%w: session %s ended on the server before it could be resumed", ErrSessionExpired, s.id), false)
				c.mu.Unlock()
				return nil, base, se
			}
		}
		return nil, "", fmt.Errorf("%s: %w", base, se)
	}
	if m.Type != api.TypeHello || (m.SessionID == "") != m.ReadOnly {
		ws.CloseNow()
		return nil, "", fmt.Errorf("%s: hello: unexpected reply %q", base, m.Type)
	}

	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		ws.CloseNow()
		if !resume && !m.ReadOnly {
			// Close ran during the hello; end the session it opened.
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CloseTimeout)
			_ = c.api.DeleteSession(ctx, m.SessionID)
			cancel()
		}
		return nil, "", ErrClosed
	case m.ReadOnly:
		// The token has read access only: no session, no lease. The
		// connection serves watches; the server refuses acquires.
		if resume {
			// Not expected (the server refuses a read token's resume), but
			// the session cannot go on over this connection.
			c.sessionLostLocked(s, fmt.Errorf("%w: the token has read access only now: session %s cannot go on", ErrPermissionDenied, s.id), false)
		}
		if s == nil || s.lost || !s.readOnly {
			c.sess = &session{readOnly: true, done: make(chan struct{})}
		}
	case resume && (c.sess != s || s.lost):
		// The local lease ran out during the hello: the session was given
		// up (and will be deleted); start over with a fresh one.
		c.mu.Unlock()
		ws.CloseNow()
		return nil, base, errors.New("session lost during resume")
	case resume:
		s.setTTLLocked(m.SessionTTLms)
		c.kickLease()
	default:
		if m.SessionTTLms > 0 {
			ttl = time.Duration(m.SessionTTLms) * time.Millisecond
		}
		if s != nil && s.readOnly && !s.lost {
			// The token gained lock access: the client has a session now.
			s.lost, s.err = true, errors.New("lockd: the read-only connection was replaced by one with a session")
			close(s.done)
		}
		c.sess = &session{id: m.SessionID, ttl: ttl, deadline: sent.Add(ttl), done: make(chan struct{})}
		c.kickLease()
	}
	sess := c.sess
	var orphans []string
	if !m.ReadOnly {
		// (A read token may not delete them, and its connection acquires
		// nothing: they wait for a connection with a session.)
		orphans, c.orphans = c.orphans, nil
	}
	c.mu.Unlock()
	c.api.setLeader(base)
	if m.ReadOnly {
		c.log.Info("lockd: read-only connection established (the token has read access only: watches, no session)", "leader", base)
	} else {
		c.log.Info("lockd: session established", "leader", base, "session", m.SessionID, "resumed", resume)
	}

	// Sessions given up locally may still hold locks on the server under
	// this client ID; end them before the new session can acquire anything.
	for i, id := range orphans {
		dctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		err := c.api.DeleteSession(dctx, id)
		cancel()
		if err != nil && !isGone(err) {
			c.mu.Lock()
			c.orphans = append(c.orphans, orphans[i:]...)
			c.mu.Unlock()
			ws.CloseNow()
			return nil, "", fmt.Errorf("deleting abandoned session %s: %w", id, err)
		}
	}

	cctx, ccancel := context.WithCancel(c.ctx)
	cs = &wsConn{ws: ws, base: base, sess: sess, resumed: resume, ctx: cctx, cancel: ccancel, calls: make(map[uint64]chan *api.WSMessage), done: make(chan struct{}),
		watchIDs: make(map[uint64]*watch), watchReqs: make(map[uint64]*watch), unwatches: make(map[uint64]bool)}
	c.install(cs)
	return cs, "", nil
}

// helloExchange sends hello and reads the first frame. A follower sends
// not_leader as soon as it accepts, so that frame may arrive instead.
func helloExchange(ctx context.Context, ws *websocket.Conn, hello *api.WSRequest) (*api.WSMessage, error) {
	data, err := json.Marshal(hello)
	if err != nil {
		return nil, err
	}
	werr := ws.Write(ctx, websocket.MessageText, data)
	_, b, rerr := ws.Read(ctx)
	if rerr != nil {
		if werr != nil {
			return nil, werr
		}
		return nil, rerr
	}
	var m api.WSMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("bad frame: %w", err)
	}
	return &m, nil
}

// install makes cs the live connection and re-sends the pending acquires
// and the watches on it. On a resumed session it also checks the locks
// held (see recheck).
func (c *Client) install(cs *wsConn) {
	c.mu.Lock()
	c.cur = cs
	close(c.connCh)
	c.connCh = make(chan struct{})
	if cs.resumed {
		c.goLocked(func() { c.recheck(cs) })
	}
	var frames [][]byte
	seen := make(map[*acquireOp]bool, len(c.ops))
	for _, op := range c.ops {
		if !seen[op] {
			seen[op] = true
			if f := c.pendingFrameLocked(op); f != nil {
				frames = append(frames, f)
			}
		}
	}
	for w := range c.watches {
		if f := c.watchFrameLocked(w, cs); f != nil {
			frames = append(frames, f)
		}
	}
	c.mu.Unlock()
	for _, f := range frames {
		if c.write(cs, f) != nil {
			return // the reader sees the connection fail; the next one re-sends
		}
	}
}

// pendingFrameLocked is what op needs sent on the live connection, if it
// was not sent there yet: its acquire again (it keeps its place), or, for
// an op whose caller gave up, the cancel of its wait.
func (c *Client) pendingFrameLocked(op *acquireOp) []byte {
	if op.abandoned {
		_, f := c.cancelFrameLocked(op)
		return f
	}
	return c.prepAcquireLocked(op, false)
}

// run owns the connection: it serves cs, then reconnects, until Close.
func (c *Client) run(cs *wsConn) {
	defer c.wg.Done()
	bo := newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		start := time.Now()
		c.serve(cs)
		if c.ctx.Err() != nil {
			return
		}
		// A connection that died young (a member that accepts and drops)
		// must not turn this into a busy loop.
		if time.Since(start) < time.Second {
			if !sleep(c.ctx, bo.next()) {
				return
			}
		} else {
			bo.reset()
		}
		var err error
		if cs, err = c.connect(c.ctx, false); err != nil {
			return
		}
	}
}

// serve reads cs until it fails and keeps the session alive meanwhile.
func (c *Client) serve(cs *wsConn) {
	var kwg sync.WaitGroup
	kwg.Add(1)
	go func() {
		defer kwg.Done()
		c.keepalive(cs)
	}()
	err := c.readLoop(cs)
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		c.log.Info("lockd: connection lost", "leader", cs.base, "err", err)
	}
	c.teardown(cs, err)
	kwg.Wait()
}

func (c *Client) readLoop(cs *wsConn) error {
	for {
		_, data, err := cs.ws.Read(cs.ctx)
		if err != nil {
			return err
		}
		var m api.WSMessage
		if err := json.Unmarshal(data, &m); err != nil {
			c.log.Warn("lockd: bad frame from server", "err", err)
			continue
		}
		c.mu.Lock()
		var after []func()
		if c.cur == cs && !c.closed {
			after = c.dispatchLocked(cs, &m)
		}
		c.mu.Unlock()
		for _, f := range after {
			f()
		}
	}
}

// teardown forgets cs and fails the calls waiting on it; the watches that
// lived on it are told (see WithConnEvents).
func (c *Client) teardown(cs *wsConn, err error) {
	c.mu.Lock()
	c.killLocked(cs, "")
	if !c.closed {
		for w := range c.watches {
			if w.conn == cs {
				c.connLostLocked(w, fmt.Errorf("connection to %s lost: %w", cs.base, err))
			}
		}
	}
	c.mu.Unlock()
	cs.once.Do(func() { close(cs.done) })
	cs.ws.CloseNow()
}

// killLocked stops using cs; its reader then fails and tears it down.
func (c *Client) killLocked(cs *wsConn, why string) {
	if why != "" {
		c.log.Info("lockd: dropping connection", "leader", cs.base, "why", why)
	}
	if c.cur == cs {
		c.cur = nil
		close(c.connCh)
		c.connCh = make(chan struct{})
	}
	cs.cancel()
}

// write sends one frame on cs. A failed write closes the connection, which
// the reader then reports.
func (c *Client) write(cs *wsConn, data []byte) error {
	ctx, cancel := context.WithTimeout(cs.ctx, c.cfg.AttemptTimeout)
	defer cancel()
	return cs.ws.Write(ctx, websocket.MessageText, data)
}

// exchange sends req on cs and waits for its reply. sent is taken before
// the write: the start of any lease the reply confirms.
func (c *Client) exchange(ctx context.Context, cs *wsConn, req *api.WSRequest) (m *api.WSMessage, sent time.Time, err error) {
	ch := make(chan *api.WSMessage, 1)
	c.mu.Lock()
	if c.cur != cs {
		c.mu.Unlock()
		return nil, sent, errConnLost
	}
	req.ID = c.nextID()
	cs.calls[req.ID] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(cs.calls, req.ID)
		c.mu.Unlock()
	}
	data, err := json.Marshal(req)
	if err != nil {
		forget()
		return nil, sent, err
	}
	sent = time.Now()
	if err := c.write(cs, data); err != nil {
		forget()
		return nil, sent, errConnLost
	}
	select {
	case m := <-ch:
		return m, sent, nil
	case <-cs.done:
		forget()
		return nil, sent, errConnLost
	case <-ctx.Done():
		forget()
		return nil, sent, ctx.Err()
	}
}

// waitConn waits for a live connection of session s (any session if s is
// nil).
func (c *Client) waitConn(ctx context.Context, s *session) (*wsConn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if s != nil && s.lost {
			c.mu.Unlock()
			return nil, s.err
		}
		if c.cur != nil && (s == nil || c.sess == s) {
			cs := c.cur
			c.mu.Unlock()
			return cs, nil
		}
		ch := c.connCh
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: waiting for a connection to the leader: %w", ErrNoLeader, ctx.Err())
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// roundTrip sends req within session s and waits for the reply, again on
// the next connection if the current one is lost first. sent is the send
// time of the request the reply answers; with an error, that of the first
// send (zero if nothing was sent): the server may have applied it.
func (c *Client) roundTrip(ctx context.Context, s *session, req *api.WSRequest) (m *api.WSMessage, sent time.Time, err error) {
	var first time.Time
	var bo *backoff
	for {
		cs, err := c.waitConn(ctx, s)
		if err != nil {
			return nil, first, err
		}
		m, sent, err := c.exchange(ctx, cs, req)
		if first.IsZero() {
			first = sent
		}
		if errors.Is(err, errConnLost) {
			continue
		}
		if err != nil {
			return nil, first, err
		}
		if m.Type == api.TypeError && m.Error != nil {
			code := m.Error.Code
			if refusedForNow(m.Error, m.RetryAfterMs) {
				code = api.CodeOverloaded // a budget's refusal: retried alike
			}
			switch code {
			case api.CodeNotLeader, api.CodeNoLeader:
				// The member lost the leadership: find the new leader.
				c.mu.Lock()
				c.killLocked(cs, "leadership lost")
				c.mu.Unlock()
				continue
			case api.CodeOverloaded:
				// Nothing was proposed: ask again after the pause the
				// member asks for (or a backoff), until ctx ends.
				if bo == nil {
					bo = newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
				}
				if !sleep(ctx, max(bo.next(), retryAfter(m))) {
					return nil, first, fmt.Errorf("%w: %w", serverError(m.Error, 0), ctx.Err())
				}
				continue
			case api.CodeSessionExpired:
				c.mu.Lock()
				c.sessionLostLocked(s, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
				c.mu.Unlock()
			}
		}
		return m, sent, nil
	}
}

// keepalive sends a keepalive every third of the session TTL (at once after
// a resume) and drops the connection when one goes unanswered for that
// long.
func (c *Client) keepalive(cs *wsConn) {
	s := cs.sess
	if s.readOnly {
		return // no session to keep alive
	}
	interval := func() time.Duration {
		c.mu.Lock()
		defer c.mu.Unlock()
		return s.ttl / 3
	}
	first := interval()
	if cs.resumed {
		first = 0
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-cs.ctx.Done():
			return
		case <-t.C:
		}
		iv := interval()
		ctx, cancel := context.WithTimeout(cs.ctx, iv)
		m, sent, err := c.exchange(ctx, cs, &api.WSRequest{Op: api.OpKeepalive})
		cancel()
		if err != nil {
			if cs.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				c.mu.Lock()
				c.killLocked(cs, "keepalive unanswered")
				c.mu.Unlock()
			}
			return
		}
		switch {
		case m.Type == api.TypeOK:
			c.confirmSession(s, sent, m.SessionTTLms)
		case m.Type == api.TypeError && m.Error != nil && m.Error.Code == api.CodeOverloaded:
			// Not refused for good: ask again soon (well within the TTL).
			t.Reset(max(min(iv/4, retryAfter(m)), c.cfg.MinBackoff))
			continue
		case m.Type == api.TypeError && m.Error != nil:
			c.mu.Lock()
			switch m.Error.Code {
			case api.CodeSessionExpired:
				c.log.Warn("lockd: session expired on the server", "session", s.id)
				c.sessionLostLocked(s, fmt.Errorf("%w: session %s ended on the server", ErrSessionExpired, s.id), false)
			default:
				c.killLocked(cs, "keepalive: "+m.Error.Code)
			}
			c.mu.Unlock()
			return
		}
		t.Reset(max(0, time.Until(sent.Add(iv))))
	}
}

// dispatchLocked handles one server frame; it returns work to do after
// the lock is released (writes).
func (c *Client) dispatchLocked(cs *wsConn, m *api.WSMessage) []func() {
	if m.ID != 0 {
		if ch, ok := cs.calls[m.ID]; ok {
			delete(cs.calls, m.ID)
			ch <- m
			return nil
		}
		if op := c.cancels[m.ID]; op != nil {
			delete(c.cancels, m.ID)
			return c.onCancelReplyLocked(cs, op, m)
		}
		if w := cs.watchReqs[m.ID]; w != nil {
			delete(cs.watchReqs, m.ID)
			return c.onWatchReplyLocked(cs, w, m)
		}
		if cs.unwatches[m.ID] {
			delete(cs.unwatches, m.ID)
			return nil
		}
	}
	switch m.Type {
	case api.TypeChanged:
		if w := cs.watchIDs[m.WatchID]; w != nil {
			c.onChangedLocked(w, m)
		}
	case api.TypeSynced:
		if w := cs.watchIDs[m.WatchID]; w != nil {
			c.onSyncedLocked(w, m)
		}
	case api.TypeResync:
		if w := cs.watchIDs[m.WatchID]; w != nil {
			c.log.Info("lockd: the server dropped changes for a watch; reading it again", "watch", w.what())
			cs, frames := c.resyncLocked(w)
			return []func(){func() {
				for _, f := range frames {
					if c.write(cs, f) != nil {
						return
					}
				}
			}}
		}
	case api.TypeGranted:
		return c.onGrantedLocked(cs, m)
	case api.TypeLost:
		c.onLostLocked(m)
	case api.TypeError:
		if op := c.opByID[m.ID]; op != nil && m.ID != 0 {
			return c.onAcquireErrorLocked(cs, op, m)
		}
		if m.ID == 0 && m.WatchID != 0 {
			if w := cs.watchIDs[m.WatchID]; w != nil {
				c.onWatchEndedLocked(cs, w, m)
			}
			return nil
		}
		code := ""
		if m.Error != nil {
			code = m.Error.Code
		}
		switch code {
		case api.CodeWaitTimeout, api.CodeCancelled:
			// The end of a wait answers every request that joined it: this
			// is one the client re-sent under a newer id, whose own answer
			// comes with that id; or the answer of an acquire whose
			// withdrawal settled it already.
			c.log.Debug("lockd: the end of a wait answered an earlier request of it", "code", code, "id", m.ID)
		case api.CodeSessionExpired:
			c.sessionLostLocked(c.sess, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
		case api.CodeNotLeader, api.CodeNoLeader:
			if m.Leader != "" {
				if err := c.api.leaderHop(cs.base, m.Leader, true); err != nil {
					c.log.Warn("lockd: not following the leader a member named", "err", err)
				} else {
					c.api.setLeader(m.Leader)
				}
			}
			c.killLocked(cs, code)
		default:
			c.log.Warn("lockd: unsolicited error from server", "code", code, "id", m.ID)
		}
	}
	return nil
}

func (c *Client) onLostLocked(m *api.WSMessage) {
	if m.Reason == api.ReasonSessionExpired {
		c.sessionLostLocked(c.sess, fmt.Errorf("%w: the server ended the session (lock %q lost)", ErrSessionExpired, m.Lock), false)
		return
	}
	l := c.locks[m.Lock]
	if l == nil || (m.FencingToken != 0 && m.FencingToken != l.token) {
		return
	}
	var cause error
	switch m.Reason {
	case api.ReasonExpired:
		cause = fmt.Errorf("%w: lock %q token %d", ErrLockExpired, l.name, l.token)
	case api.ReasonRevoked:
		cause = fmt.Errorf("%w: lock %q token %d", ErrRevoked, l.name, l.token)
	default:
		cause = fmt.Errorf("%w: lock %q token %d lost (%s)", ErrNotHolder, l.name, l.token, m.Reason)
	}
	l.loseLocked(cause)
}
