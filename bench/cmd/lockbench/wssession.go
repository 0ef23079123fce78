package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// wsSession is one lockd session over a WebSocket that is re-established
// when the server ends it: it reconnects to the leader and resumes the
// session (hello with its id); when the server says the session expired it
// reports that (onExpired) and starts a new one. Every refusal on the way
// is counted in st and waited out as the server asked (Retry-After).
type wsSession struct {
	ref      *leaderRef
	clientID string
	ttlMs    int64
	st       *roleStats
	opts     dialOpts
	// onPush gets the frames of any of its connections that answer no
	// request (lost pushes, watch frames, connection-level errors).
	onPush func(wsFrame)
	// onReconnect runs after the session was resumed or replaced on a new
	// connection, before that connection is handed out (e.g. to send again
	// the waits of the old one). It must not call get.
	onReconnect func(c *wsConn)
	// onExpired runs when the server answered that the session expired.
	onExpired func()

	mu     sync.Mutex
	conn   *wsConn
	id     string
	opened bool // a first connection was made
	closed bool
	dead   map[string]bool // session ids the server said expired (each reported once)
}

var errSessionClosed = errors.New("session closed")

// get returns the session's live connection, making one if needed.
func (s *wsSession) get(ctx context.Context) (*wsConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errSessionClosed
	}
	if s.conn != nil && !s.conn.isEnded() {
		return s.conn, nil
	}
	s.conn = nil
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		base := s.ref.get().httpURL
		c, err := dialWS(ctx, base, s.onPush, s.opts)
		if err != nil {
			var e *apiErr
			if errors.As(err, &e) {
				s.st.refused(e)
			}
			s.ref.refresh(ctx)
			if !sleepCtx(ctx, backoffFor(e, attempt)) {
				return nil, ctx.Err()
			}
			continue
		}
		err = c.hello(ctx, s.clientID, s.ttlMs, s.id)
		if err != nil {
			c.closeNow()
			var e *apiErr
			if !errors.As(err, &e) {
				if !sleepCtx(ctx, backoffFor(nil, attempt)) {
					return nil, ctx.Err()
				}
				continue
			}
			s.st.refused(e)
			switch {
			case e.Code == api.CodeSessionExpired:
				s.expiredLocked(s.id)
				s.id = ""
				continue
			case e.Code == api.CodeNotLeader:
				s.ref.refresh(ctx)
				continue
			case retryable(e.Code):
				if !sleepCtx(ctx, backoffFor(e, attempt)) {
					return nil, ctx.Err()
				}
				continue
			}
			return nil, err
		}
		go func() {
			<-c.done
			s.st.connEnded(c.cutReason())
		}()
		if s.opened {
			s.st.reconnected()
			if s.onReconnect != nil {
				s.onReconnect(c)
			}
		}
		s.opened, s.conn, s.id = true, c, c.session
		return c, nil
	}
}

// expired makes the next get start a new session: the server said the
// session of c is gone.
func (s *wsSession) expired(c *wsConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == c {
		s.conn = nil
		c.closeNow()
	}
	if s.id == c.session {
		s.id = ""
	}
	s.expiredLocked(c.session)
}

// expiredLocked reports a session the server said expired, once per id.
func (s *wsSession) expiredLocked(id string) {
	if id == "" || s.dead[id] {
		return
	}
	if s.dead == nil {
		s.dead = map[string]bool{}
	}
	s.dead[id] = true
	if s.onExpired != nil {
		s.onExpired()
	}
}

// close ends the session's connection (the session itself lives on until
// its TTL runs out).
func (s *wsSession) close() {
	s.mu.Lock()
	c := s.conn
	s.closed, s.conn = true, nil
	s.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// do sends req on the session until it is answered or ctx ends: after a
// cut it reconnects and sends again (lockd's requests are idempotent or
// say not_holder when repeated); after a retryable refusal it waits as the
// server asked. It returns the answer or the last error; refusals and
// retries are counted in st.
func (s *wsSession) do(ctx context.Context, req api.WSRequest) (wsFrame, error) {
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.st.retried()
		}
		c, err := s.get(ctx)
		if err != nil {
			if last == nil {
				last = err
			}
			return wsFrame{}, last
		}
		f, err := c.call(ctx, req)
		if err == nil {
			return f, nil
		}
		last = err
		var e *apiErr
		switch {
		case errors.As(err, &e):
			s.st.refused(e)
			if e.Code == api.CodeSessionExpired {
				s.expired(c)
				return f, err
			}
			if e.Code == api.CodeNotLeader {
				s.ref.refresh(ctx)
				continue // the connection is ending; get makes a new one
			}
			if !retryable(e.Code) {
				return f, err
			}
			if !sleepCtx(ctx, backoffFor(e, attempt)) {
				return f, err
			}
		case errors.Is(err, errConnEnded):
			// reconnect on the next turn
		default:
			return f, err // ctx ended
		}
	}
}

// keepalives sends a keepalive every `every` on a fixed schedule starting
// at first (each on time, whatever became of the previous ones) until ctx
// ends, and reports each one's outcome: the time from its first send to
// its acknowledgement (retries included) or its error.
func (s *wsSession) keepalives(ctx context.Context, first time.Time, every time.Duration, report func(sent time.Time, lat time.Duration, err error)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for t := first; ; t = t.Add(every) {
		if !sleepCtx(ctx, time.Until(t)) {
			return
		}
		wg.Add(1)
		go func(sent time.Time) {
			defer wg.Done()
			// A keepalive is worth retrying until the session's TTL has
			// run out from the time it was due.
			kctx, cancel := context.WithDeadline(ctx, sent.Add(time.Duration(s.ttlMs)*time.Millisecond))
			defer cancel()
			t0 := time.Now()
			f, err := s.do(kctx, api.WSRequest{Op: api.OpKeepalive})
			if ctx.Err() != nil {
				return // the run ended: not an outcome
			}
			report(sent, f.at.Sub(t0), err)
		}(t)
	}
}
