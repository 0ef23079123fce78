package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// Two workloads for promises about one request among others on a
// WebSocket connection (retrywatch_checkers_test.go checks them):
//
//   - wsRetryWorker: a raw WebSocket client sends an acquire with a long
//     wait, then — while it is pending — the same acquire with a short
//     one. The state machine keeps one wait, with the retry's deadline;
//     both requests must be answered, the same way, while the connection
//     lives.
//   - churners and churnWatcher: HTTP clients take and free a few locks
//     under wchurnPrefix as fast as they can, while a raw WebSocket
//     watcher starts watch after watch of the prefix (and now and then of
//     one of its locks): every watch's first picture is read while the
//     prefix changes, so changes committed between its registration and
//     its read are the rule, not the exception.

// wsRetryPrefix names the retry scenario's locks (one fresh lock a round).
const wsRetryPrefix = "wsretry-"

// wchurnPrefix names the churned locks (wchurnLocks of them an epoch).
const (
	wchurnPrefix = "wchurn-"
	wchurnLocks  = 4
)

// Tags of the retry scenario's two acquires: "wsretry:R:first" (the long
// wait) and "wsretry:R:retry" (the short one, sent while the first is
// pending).
const (
	tagRetryFirst = "first"
	tagRetryAgain = "retry"
)

func retryTag(round int, which string) string { return fmt.Sprintf("wsretry:%d:%s", round, which) }

// startRequest sends req on the connection; its reply is read from the
// returned channel. ok is false when the connection had ended (nothing
// sent) or the write failed (the connection is then ended).
func (c *kwsClient) startRequest(req api.WSRequest) (ch chan api.WSMessage, done func(), ok bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, func() {}, false
	}
	c.next++
	req.ID = c.next
	ch = make(chan api.WSMessage, 1)
	c.waiting[req.ID] = ch
	c.mu.Unlock()
	done = func() {
		c.mu.Lock()
		delete(c.waiting, req.ID)
		c.mu.Unlock()
	}
	b, _ := json.Marshal(req)
	wctx, cancel := context.WithTimeout(c.ctx, 3*time.Second)
	defer cancel()
	if err := c.conn.Write(wctx, websocket.MessageText, b); err != nil {
		c.end("write: " + err.Error())
		return ch, done, false
	}
	return ch, done, true
}

// awaitAcquire waits for an acquire's reply until the connection ends or
// the deadline, and fills op with what came of it.
func (c *kwsClient) awaitAcquire(op *Op, ch chan api.WSMessage, deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var m api.WSMessage
	select {
	case m = <-ch:
	case <-c.dead:
		// The reply may have been read just before the connection ended.
		select {
		case m = <-ch:
		default:
			op.Return, op.Outcome, op.Err = c.w.rec.Now(), Unknown, "the connection ended"
			return
		}
	case <-t.C:
		op.Return, op.Outcome, op.GaveUp, op.Err = c.w.rec.Now(), Unknown, true, "no answer in time, the connection open"
		return
	}
	op.Return = c.w.rec.Now()
	switch {
	case m.Type == api.TypeGranted && m.FencingToken != 0:
		op.Outcome, op.OutToken, op.ExpiresAt = Ok, m.FencingToken, c.w.wallTime(m.ExpiresAt)
	case m.Type == api.TypeError && m.Error != nil:
		op.Err = m.Error.Message
		switch m.Error.Code {
		case api.CodeLockHeld, api.CodeWaitTimeout:
			op.Outcome, op.Code, op.Holder = Fail, m.Error.Code, m.Holder
		default:
			op.Outcome, op.Code = Unknown, m.Error.Code
		}
	default:
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("an acquire answered %+v", m)
	}
}

// wsRetryWorker plays retry rounds, each on a fresh lock that an HTTP
// client holds: the WebSocket client sends an acquire with a 20 s wait,
// and once it waits, the same acquire with a wait of 0.3–1.2 s. In two
// rounds of three the holder keeps the lock past that (the one wait times
// out: both requests are told wait_timeout); in the others it releases it
// first (both are granted, one token). The client waits 2 s past the
// retry's answer for the first request's, then gives up on it. Any
// outcome it cannot know ends the connection.
func (w *Workload) wsRetryWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("wsretry%d", id)
	ep := &endpoint{next: id}
	var c *kwsClient
	gen := 0
	for round := 0; ctx.Err() == nil; round++ {
		if c == nil || c.isDead() {
			c = w.dialKWS(ctx, name, fmt.Sprintf("wr%d-%d", id, gen), rng)
			gen++
			if c == nil {
				return
			}
		}
		lock := fmt.Sprintf("%s%d-%d-%d", wsRetryPrefix, w.kindEpoch(), id, round)
		holder := fmt.Sprintf("wrh%d-%d", id, round)
		short := jitter(rng, 300*time.Millisecond, 1200*time.Millisecond)
		hold := short + jitter(rng, 500*time.Millisecond, time.Second) // past the retry's deadline
		grant := rng.IntN(3) == 0
		if grant {
			hold = jitter(rng, 0, short*2/3)
		}
		ttl := hold + 2*time.Second
		h := w.acquire(ctx, ep, name+"/holder", lock, holder, w.rec.NewAttempt(), ttl, 0, "")
		if h.Outcome != Ok {
			sleep(ctx, jitter(rng, 50*time.Millisecond, 200*time.Millisecond))
			continue
		}
		held := time.Now()
		if !w.retryRound(ctx, c, name, lock, round, short, hold-time.Since(held), func() {
			w.release(ctx, ep, name+"/holder", lock, holder, h.OutToken, "")
		}) {
			c.end("a retry round of unknown outcome")
		}
		sleep(ctx, jitter(rng, 0, 100*time.Millisecond))
	}
}

// retryRound sends the two acquires of a round on c, the holder's release
// (after hold) meanwhile, and records them. It reports false when an
// outcome is unknown (the connection must end: a grant may be out there).
func (w *Workload) retryRound(ctx context.Context, c *kwsClient, worker, lock string, round int, short, hold time.Duration, release func()) bool {
	attempt := w.rec.NewAttempt()
	ttl := 3 * time.Second
	send := func(wait time.Duration, which string) (*Op, chan api.WSMessage, func(), bool) {
		ttlMs, waitMs := ttl.Milliseconds(), wait.Milliseconds()
		op := &Op{Worker: worker + "/" + which, Via: "ws", Kind: KindAcquire, Lock: lock, ClientID: c.cid, Attempt: attempt,
			TTLms: ttlMs, WaitMs: waitMs, Tag: retryTag(round, which), Invoke: w.rec.Now()}
		ch, done, ok := c.startRequest(api.WSRequest{Op: api.OpAcquire, Lock: lock, TTLms: &ttlMs, WaitTimeoutMs: &waitMs})
		return op, ch, done, ok
	}
	first, fch, fdone, ok := send(20*time.Second, tagRetryFirst)
	defer fdone()
	if !ok {
		first.Return, first.Outcome, first.Err = w.rec.Now(), Unknown, "the connection ended as it was sent"
		w.rec.Add(*first)
		return false
	}
	// The retry goes out once the first waits (a linearizable read shows
	// the waiter), or after a moment if no read says so.
	ep := &endpoint{}
	for i := 0; i < 10 && ctx.Err() == nil; i++ {
		if r := w.read(ctx, ep, worker, lock, ""); r.Outcome == Ok && r.Waiters > 0 {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		sleep(ctx, hold)
		release()
	}()
	defer func() { <-released }()
	retry, rch, rdone, ok := send(short, tagRetryAgain)
	defer rdone()
	if ok {
		c.awaitAcquire(retry, rch, time.Now().Add(short+4*time.Second))
	} else {
		retry.Return, retry.Outcome, retry.Err = w.rec.Now(), Unknown, "the connection ended as it was sent"
	}
	// Both are one wait: the first's answer comes with the retry's.
	c.awaitAcquire(first, fch, time.Now().Add(2*time.Second))
	if first.Outcome != Fail {
		first.ExpiryLB = min(expiryLB(first.Invoke, ttl), c.sessionLB())
	}
	if retry.Outcome != Fail {
		retry.ExpiryLB = min(expiryLB(retry.Invoke, ttl), c.sessionLB())
	}
	*first = w.rec.Add(*first)
	*retry = w.rec.Add(*retry)
	if first.Outcome == Unknown || retry.Outcome == Unknown {
		return false
	}
	tok := first.OutToken
	if tok == 0 {
		tok = retry.OutToken
	}
	if tok != 0 {
		if r := c.release(lock, tok); r.Outcome == Unknown {
			return false
		}
	}
	return true
}

// churnLock is one of the churned locks of the current epoch.
func (w *Workload) churnLock(rng *rand.Rand) string {
	return fmt.Sprintf("%s%d-%d", wchurnPrefix, w.kindEpoch(), rng.IntN(wchurnLocks))
}

// churner takes and frees churned locks over HTTP, each round with a
// fresh client id (an acquire of unknown outcome leaves a grant that
// expires by its TTL), now and then reading the lock (linearizable reads
// with their index: evidence for the watch checkers).
func (w *Workload) churner(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("churn%d", id)
	ep := &endpoint{next: id}
	for n := 0; ctx.Err() == nil; n++ {
		lock := w.churnLock(rng)
		cid := fmt.Sprintf("wc%d-%d", id, n)
		a := w.acquire(ctx, ep, name, lock, cid, w.rec.NewAttempt(), jitter(rng, time.Second, 2*time.Second), 0, "")
		if rng.IntN(4) == 0 {
			w.read(ctx, ep, name, lock, "")
		}
		if a.Outcome != Ok {
			sleep(ctx, jitter(rng, 0, 20*time.Millisecond))
			continue
		}
		sleep(ctx, jitter(rng, 0, 60*time.Millisecond))
		w.release(ctx, ep, name, lock, cid, a.OutToken, "")
	}
}

// churnWatcher starts watch after watch of the churned prefix (one time in
// four, of one churned lock) on a raw WebSocket connection whose frames
// are recorded: it waits for the watch's synced frame (at most 3 s), keeps
// it 0.1–0.8 s more, and unwatches. A new connection every 20 watches, or
// when one ends.
func (w *Workload) churnWatcher(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("churn-watch%d", id)
	for gen := 0; ctx.Err() == nil; gen++ {
		cid := fmt.Sprintf("cw%d-%d", id, gen)
		synced := make(chan uint64, 16)
		c := w.dialKWSWith(ctx, name, cid, rng, kwsSessionTTL, func(m api.WSMessage, at int64) {
			w.frameOp(name, cid, m, at)
			if m.Type == api.TypeSynced {
				select {
				case synced <- m.WatchID:
				default:
				}
			}
		}, true)
		if c == nil {
			return
		}
		for n := 0; n < 20 && ctx.Err() == nil && !c.isDead(); n++ {
			prefix, lock := wchurnPrefix, ""
			if rng.IntN(4) == 0 {
				prefix, lock = "", w.churnLock(rng)
			}
			wop := c.watch(ctx, lock, prefix)
			if wop.Outcome == Unknown {
				c.end("a watch of unknown outcome")
				break
			}
			if wop.Outcome != Ok {
				continue
			}
			wait := time.NewTimer(3 * time.Second)
		await:
			for {
				select {
				case wid := <-synced:
					if wid == wop.WatchID {
						break await
					}
				case <-wait.C:
					break await
				case <-c.dead:
					break await
				case <-ctx.Done():
					break await
				}
			}
			wait.Stop()
			sleep(ctx, jitter(rng, 100*time.Millisecond, 800*time.Millisecond))
			if c.isDead() {
				break
			}
			if u := c.unwatch(context.Background(), wop); u.Outcome == Unknown {
				c.end("an unwatch of unknown outcome")
			}
		}
		c.end("reconnecting")
		c.loops.Wait()
	}
}
