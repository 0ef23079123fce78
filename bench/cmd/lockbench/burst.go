package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
)

// A burst of waits: many acquires with a wait, pipelined over a few
// WebSocket sessions, on locks that are held, so they queue. A queued
// acquire gets no answer until it is granted or its wait ends, so the burst
// keeps every wait's state: sent and unanswered (queued, or still in
// flight), refused (waiting out its Retry-After before it is sent again),
// or answered. When a connection is cut, the session is resumed on a new one
// and every unanswered wait is sent again: acquire is idempotent, a waiter
// keeps its place.

const (
	waitUnsent = iota
	waitSent
	waitRefused
	waitDone
)

type burst struct {
	waitMs int64
	st     *roleStats
	conns  []*burstConn

	sent, resent, granted atomic.Int64
	mu                    sync.Mutex
	ended                 map[string]int64 // final answers other than a grant, by code
	reopenFailed          int64            // times a session could not be reopened for now
	firstGetErr           string           // why a session first failed to reopen
	sendStart             time.Time
	sendDone              atomic.Int64 // unix ns when the last first send was written
	sending               atomic.Int64 // connections still making their first sends
}

type burstConn struct {
	b       *burst
	s       *wsSession
	names   []string
	state   []atomic.Int32
	tries   []uint8
	retryq  chan burstRetry
	pending atomic.Int64 // waits in retryq
}

type burstRetry struct {
	i  int
	at time.Time
}

// burstSpec says what to open: conns sessions of clients prefix-k, each
// with the names namesOf(k), a session TTL and (every > 0) keepalives.
type burstSpec struct {
	ref      *leaderRef
	conns    int
	prefix   string
	namesOf  func(k int) []string
	waitMs   int64
	ttl      time.Duration
	every    time.Duration // keepalive period; 0: none
	parallel int           // sessions opened at once
}

// openBurst opens the burst's sessions (hello only; nothing is queued yet).
func openBurst(ctx context.Context, sp burstSpec) (*burst, error) {
	b := &burst{waitMs: sp.waitMs, st: newRoleStats(), ended: map[string]int64{}}
	b.conns = make([]*burstConn, sp.conns)
	for k := range b.conns {
		names := sp.namesOf(k)
		bc := &burstConn{b: b, names: names, state: make([]atomic.Int32, len(names)), tries: make([]uint8, len(names)),
			retryq: make(chan burstRetry, len(names))}
		bc.s = &wsSession{ref: sp.ref, clientID: fmt.Sprintf("%s-%d", sp.prefix, k), ttlMs: sp.ttl.Milliseconds(), st: b.st,
			onReconnect: bc.resend}
		b.conns[k] = bc
	}
	err := parallel(ctx, len(b.conns), max(sp.parallel, 1), func(k int) error {
		_, err := b.conns[k].s.get(ctx)
		return err
	})
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// keepalive runs every session's keepalives until ctx ends (in the
// background; the returned func waits for them).
func (b *burst) keepalive(ctx context.Context, every time.Duration) func() {
	var wg sync.WaitGroup
	for k, bc := range b.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := time.Now().Add(every * time.Duration(k) / time.Duration(max(len(b.conns), 1)))
			bc.s.keepalives(ctx, first, every, func(time.Time, time.Duration, error) {})
		}()
	}
	return wg.Wait
}

// start sends every wait (in the background) and serves the retries until
// ctx ends; the returned func waits for the senders to stop.
func (b *burst) start(ctx context.Context) func() {
	b.sendStart = time.Now()
	b.sending.Store(int64(len(b.conns)))
	var wg sync.WaitGroup
	for _, bc := range b.conns {
		wg.Add(3)
		go func() {
			defer wg.Done()
			bc.sendAll(ctx)
			if b.sending.Add(-1) == 0 {
				b.sendDone.Store(time.Now().UnixNano())
			}
		}()
		go func() { defer wg.Done(); bc.retries(ctx) }()
		go func() { defer wg.Done(); bc.reconnects(ctx) }()
	}
	return wg.Wait
}

// settled reports whether every wait was sent once and no refused wait is
// waiting to be sent again.
func (b *burst) settled() bool {
	if b.sending.Load() > 0 {
		return false
	}
	for _, bc := range b.conns {
		if bc.pending.Load() > 0 {
			return false
		}
	}
	return true
}

// sendSeconds is the time from the burst's start to its last first send.
func (b *burst) sendSeconds() float64 {
	if d := b.sendDone.Load(); d > 0 {
		return time.Unix(0, d).Sub(b.sendStart).Seconds()
	}
	return 0
}

func (b *burst) close() {
	var wg sync.WaitGroup
	for _, bc := range b.conns {
		if bc != nil {
			wg.Add(1)
			go func() { defer wg.Done(); bc.s.close() }()
		}
	}
	wg.Wait()
}

// counts returns the waits in each state.
func (b *burst) counts() (unsent, sent, refused, done int64) {
	for _, bc := range b.conns {
		for i := range bc.state {
			switch bc.state[i].Load() {
			case waitUnsent:
				unsent++
			case waitSent:
				sent++
			case waitRefused:
				refused++
			case waitDone:
				done++
			}
		}
	}
	return
}

func (bc *burstConn) sendAll(ctx context.Context) {
	i := 0
	for i < len(bc.names) && ctx.Err() == nil {
		c, err := bc.s.get(ctx)
		if err != nil {
			return
		}
		for ; i < len(bc.names); i++ {
			if bc.state[i].Load() != waitUnsent {
				continue
			}
			bc.b.sent.Add(1)
			runtime.Gosched() // behind what the network woke (see openLoop)
			if err := bc.send(ctx, c, i); err != nil {
				i++ // marked sent: the reconnect sends it again
				c.abort()
				break
			}
		}
	}
}

func (bc *burstConn) send(ctx context.Context, c *wsConn, i int) error {
	bc.state[i].Store(waitSent)
	wait := bc.b.waitMs
	_, err := c.send(ctx, api.WSRequest{Op: api.OpAcquire, Lock: bc.names[i], WaitTimeoutMs: &wait}, func(f wsFrame, err error) {
		bc.answer(i, f, err)
	})
	return err
}

// answer handles the frame that answers wait i (on the reader goroutine).
func (bc *burstConn) answer(i int, f wsFrame, err error) {
	if err != nil {
		return // the connection ended: the wait stays "sent" and is sent again on the next one
	}
	b := bc.b
	if e := frameErr(f); e != nil {
		b.st.refused(e)
		if retryable(e.Code) && e.Code != api.CodeNotLeader {
			bc.state[i].Store(waitRefused)
			t := bc.tries[i]
			if t < 255 {
				bc.tries[i]++
			}
			bc.pending.Add(1)
			select {
			case bc.retryq <- burstRetry{i: i, at: time.Now().Add(backoffFor(e, int(t)))}:
			default: // cannot happen: a wait is queued at most once and the queue holds them all
				bc.pending.Add(-1)
				bc.state[i].Store(waitSent)
			}
			return
		}
		if e.Code == api.CodeNotLeader {
			return // the connection ends; the wait is sent again on the next one
		}
		bc.state[i].Store(waitDone)
		b.mu.Lock()
		b.ended[e.Code]++
		b.mu.Unlock()
		return
	}
	if f.Type == api.TypeGranted {
		b.granted.Add(1)
	}
	bc.state[i].Store(waitDone)
}

// retries sends refused waits again once their Retry-After has passed.
// A session that cannot be reached for now (no leader, refused, a hello
// that failed) delays the wait and tries again: a burst only gives up when
// ctx ends or the session is closed.
func (bc *burstConn) retries(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-bc.retryq:
			if !sleepCtx(ctx, time.Until(r.at)) {
				return
			}
			c, err := bc.s.get(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, errSessionClosed) {
					return
				}
				bc.b.getFailed(err)
				r.at = time.Now().Add(time.Second)
				bc.retryq <- r // it came out of this queue: there is room
				continue
			}
			bc.pending.Add(-1)
			bc.b.st.retried()
			if bc.send(ctx, c, r.i) != nil {
				c.abort() // marked sent: the reconnect sends it again
			}
		}
	}
}

// reconnects resumes the session as soon as its connection ends (which
// sends its unanswered waits again), until ctx ends or the session is
// closed.
func (bc *burstConn) reconnects(ctx context.Context) {
	for {
		c, err := bc.s.get(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, errSessionClosed) {
				return
			}
			bc.b.getFailed(err)
			if !sleepCtx(ctx, time.Second) {
				return
			}
			continue
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			return
		}
	}
}

// getFailed counts a session that could not be (re)opened for now, and
// keeps the first reason for the report.
func (b *burst) getFailed(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reopenFailed++
	if b.firstGetErr == "" {
		b.firstGetErr = err.Error()
	}
}

// resend sends every unanswered wait again on a new connection. It runs
// as the session's onReconnect, so it only starts the sending: the writes
// may wait on the server, and the session's other users (its keepalives)
// must not wait behind them.
func (bc *burstConn) resend(c *wsConn) {
	go bc.resendAll(c)
}

func (bc *burstConn) resendAll(c *wsConn) {
	for i := range bc.state {
		if bc.state[i].Load() != waitSent {
			continue
		}
		bc.b.resent.Add(1)
		if bc.send(context.Background(), c, i) != nil {
			return
		}
	}
}

// burstResult is the report of a burst.
type burstResult struct {
	Waits       int         `json:"waits"`
	Conns       int         `json:"sessions"`
	Locks       int         `json:"locks"`
	AtSeconds   float64     `json:"at_seconds"`
	SendSeconds float64     `json:"send_seconds"`
	Sent        int64       `json:"sent"`
	Resent      int64       `json:"resent_after_cuts"`
	Retried     int64       `json:"resent_after_refusals"`
	Granted     int64       `json:"granted"`
	Ended       []codeCount `json:"ended_by"`
	Unanswered  int64       `json:"unanswered_at_end"`
	Refused     int64       `json:"still_refused_at_end"`
	Unsent      int64       `json:"never_sent"`
	Queued      int64       `json:"queued_per_leader_metrics"`
	// ReopenFailed counts the times a session could not be reopened for
	// now (its waits were delayed and tried again); FirstReopenError says
	// why the first time.
	ReopenFailed     int64  `json:"reopen_failed_for_now,omitempty"`
	FirstReopenError string `json:"first_reopen_error,omitempty"`
}

func (b *burst) result(locks int, at float64, queued int64) burstResult {
	unsent, sent, refused, _ := b.counts()
	n := 0
	for _, bc := range b.conns {
		n += len(bc.names)
	}
	b.mu.Lock()
	ended := sortedCounts(b.ended)
	reopenFailed, firstGetErr := b.reopenFailed, b.firstGetErr
	b.mu.Unlock()
	b.st.mu.Lock()
	retried := b.st.retries
	b.st.mu.Unlock()
	return burstResult{Waits: n, Conns: len(b.conns), Locks: locks, AtSeconds: at, SendSeconds: b.sendSeconds(),
		Sent: b.sent.Load(), Resent: b.resent.Load(), Retried: retried, Granted: b.granted.Load(), Ended: ended,
		Unanswered: sent, Refused: refused, Unsent: unsent, Queued: queued,
		ReopenFailed: reopenFailed, FirstReopenError: firstGetErr}
}

// parallel runs f(0..n-1), at most k at once, and returns the first error
// (the others still run to the end).
func parallel(ctx context.Context, n, k int, f func(i int) error) error {
	sem := make(chan struct{}, k)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
