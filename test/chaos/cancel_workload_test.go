package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// Withdrawing waits (SPEC 18), on kinds locks named kind-wd<round>-...
// that no other worker touches (so porcupine's model of an exclusive lock
// leaves them to the kinds checkers; each is a plain lock, limit 1). A
// round: a holder takes the lock(s) over HTTP; a waiter with a fresh
// client id waits for them — one lock or two (a multi-acquire), over HTTP
// or over a raw WebSocket — with one request it does not retry; now and
// then a second client waits behind it; the waiter's wait is withdrawn (a
// cancel over HTTP, or the WebSocket op on the waiter's own connection);
// the holder releases; the lock is read. The cancel's reply says whether a
// wait was withdrawn; the waiter's request is answered cancelled then.
// The checker (cancel_checkers_test.go) flags a withdrawn waiter that is
// granted all the same.

// Tags of a cancel round r.
func wdTag(r int64, what string) string { return fmt.Sprintf("wd:%d:%s", r, what) }

// wdRounds plays cancel rounds until ctx ends.
func (w *Workload) wdRounds(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	for r := int64(1); ctx.Err() == nil; r++ {
		w.wdRound(ctx, ep, rng, r)
		sleep(ctx, jitter(rng, 20*time.Millisecond, 100*time.Millisecond))
	}
}

func (w *Workload) wdRound(ctx context.Context, ep *endpoint, rng *rand.Rand, r int64) {
	const worker = "withdraw"
	multi := rng.IntN(2) == 0
	ws := rng.IntN(2) == 0
	locks := []string{fmt.Sprintf("%swd%d-a", kindPrefix, r)}
	if multi {
		locks = append(locks, fmt.Sprintf("%swd%d-b", kindPrefix, r))
	}
	holder, waiter, next := fmt.Sprintf("wdh%d", r), fmt.Sprintf("wdw%d", r), fmt.Sprintf("wdn%d", r)
	// The holder holds the first lock only: a multi-acquire then waits in
	// both queues, for one of them.
	ttl := 4 * time.Second
	h := w.acquireKind(ctx, ep, worker, locks[0], holder, w.rec.NewAttempt(), ttl, 0, kindOpts{}, wdTag(r, "hold"), 2500*time.Millisecond)
	if h.Outcome != Ok {
		return
	}
	wait := jitter(rng, 3*time.Second, 6*time.Second)
	var kc *kwsClient
	if ws {
		if kc = w.dialKWSWith(ctx, worker, waiter, rng, kwsSessionTTL, nil, false); kc == nil {
			w.releaseWithin(context.Background(), ep, worker, locks[0], holder, h.OutToken, wdTag(r, "release"), 2500*time.Millisecond)
			return
		}
		defer kc.end("round over")
	}
	var wg sync.WaitGroup
	var waited Op
	// The goroutines below start from the hint as it is now: the holder's
	// release (on ep, below) may move it meanwhile.
	hint := ep.hint
	wg.Add(1)
	go func() {
		defer wg.Done()
		// One request, never retried: its answer is the wait's.
		switch {
		case ws && multi:
			waited = kc.acquireTag(ctx, "", locks, ttl, wait, kindOpts{}, wdTag(r, "wait"))
		case ws:
			waited = kc.acquireTag(ctx, locks[0], nil, ttl, wait, kindOpts{}, wdTag(r, "wait"))
		case multi:
			waited = w.multiAcquire(ctx, &endpoint{hint: hint}, worker, locks, waiter, w.rec.NewAttempt(), ttl, wait, "", wdTag(r, "wait"))
		default:
			waited = w.acquireKind(ctx, &endpoint{hint: hint}, worker, locks[0], waiter, w.rec.NewAttempt(), ttl, wait, kindOpts{}, wdTag(r, "wait"), wait+2500*time.Millisecond)
		}
	}()
	behind := rng.IntN(3) == 0
	if behind {
		time.Sleep(jitter(rng, 50*time.Millisecond, 150*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := w.acquireKind(ctx, &endpoint{hint: hint}, worker, locks[0], next, w.rec.NewAttempt(), ttl, wait, kindOpts{}, wdTag(r, "next"), wait+2500*time.Millisecond)
			if n.Outcome == Ok {
				w.releaseWithin(context.Background(), &endpoint{hint: hint}, worker, locks[0], next, n.OutToken, wdTag(r, "release"), 2500*time.Millisecond)
			}
		}()
	}
	sleep(ctx, jitter(rng, 150*time.Millisecond, 500*time.Millisecond))
	if ws && rng.IntN(2) == 0 {
		kc.cancelWait(locks, wdTag(r, "cancel"))
	} else {
		w.cancelWait(ctx, ep, worker, waiter, locks, wdTag(r, "cancel"))
	}
	// The withdrawn request is answered at once; the holder then lets go,
	// and the lock (read linearizably) must not show the waiter.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(300 * time.Millisecond):
	}
	w.releaseWithin(ctx, ep, worker, locks[0], holder, h.OutToken, wdTag(r, "release"), 2500*time.Millisecond)
	<-done
	if waited.Outcome == Ok {
		// Granted before the cancel: give it back.
		for _, l := range locks {
			tok := waited.OutToken
			for _, g := range waited.Grants {
				if g.Lock == l {
					tok = g.Token
				}
			}
			switch {
			case tok == 0:
			case ws:
				kc.release(l, tok)
			default:
				w.releaseWithin(context.Background(), ep, worker, l, waiter, tok, wdTag(r, "release"), 2500*time.Millisecond)
			}
		}
	}
	for _, l := range locks {
		w.read(ctx, ep, worker, l, wdTag(r, "read"))
	}
}

// cancelWait withdraws client cid's wait on locks over HTTP (POST
// .../cancel, or /api/v1/cancel for several) and records it.
func (w *Workload) cancelWait(ctx context.Context, ep *endpoint, worker, cid string, locks []string, tag string) Op {
	op := Op{Worker: worker, Via: w.via, Kind: KindCancel, ClientID: cid, Tag: tag, Invoke: w.rec.Now()}
	var r reply
	if len(locks) == 1 {
		op.Lock = locks[0]
		r = w.call(ctx, ep, http.MethodPost, lockPath(locks[0], "cancel"), api.CancelRequest{ClientID: cid}, 2500*time.Millisecond)
	} else {
		op.Locks = sortedNames(locks)
		r = w.call(ctx, ep, http.MethodPost, "/api/v1/cancel", api.CancelManyRequest{ClientID: cid, Locks: locks}, 2500*time.Millisecond)
	}
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome == Ok {
		var cr api.CancelReply
		if err := json.Unmarshal(r.body, &cr); err != nil {
			op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("200 that is not a cancel reply: %q", r.body)
		}
		op.Withdrawn = cr.Cancelled
	}
	return w.rec.Add(op)
}

// cancelWait withdraws the connection's wait on locks with the WebSocket
// op and records it.
func (c *kwsClient) cancelWait(locks []string, tag string) Op {
	op := Op{Worker: c.worker, Via: "ws", Kind: KindCancel, ClientID: c.cid, Tag: tag}
	req := api.WSRequest{Op: api.OpCancel}
	if len(locks) == 1 {
		op.Lock, req.Lock = locks[0], locks[0]
	} else {
		op.Locks, req.Locks = sortedNames(locks), locks
	}
	op.Invoke = c.w.rec.Now()
	m, oc, code, gaveUp := c.request(context.Background(), req, 4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	switch {
	case oc == Ok && m.Cancelled == nil:
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("a cancel reply without cancelled: %+v", m)
	case oc == Ok:
		op.Withdrawn = *m.Cancelled
	case m.Error != nil:
		op.Err = m.Error.Message
	}
	return c.w.rec.Add(op)
}
