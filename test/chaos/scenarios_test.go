package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// Workers that provoke the liveness bugs: requests abandoned mid-commit,
// a renew racing a release, a try-acquire by a client already queued —
// and the probe that watches every lock for one held past its expiry.

// quickTimeout is a client timeout that ends a request while its command
// is being committed: long enough for the request to reach the leader, too
// short for the commit.
func quickTimeout(rng *rand.Rand) time.Duration {
	return jitter(rng, time.Millisecond, 30*time.Millisecond)
}

// grace is how long past its expiry a lock may stay held (SPEC semantics 9).
func (w *Workload) grace() time.Duration { return w.electionTimeout() + time.Second }

// hastyWorker plays rounds on a fresh lock each. A client gives up on a
// request a few milliseconds after sending it — an acquire, a renew to a
// longer TTL, or a release with a waiter queued — and walks away; then a
// next client waits for the lock, which must come free by the walked-away
// grant's expiry plus the grace whatever became of the abandoned request.
func (w *Workload) hastyWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("hasty%d", id)
	ep, wep := &endpoint{next: id}, &endpoint{next: id + 1}
	for seq := 0; ctx.Err() == nil; seq++ {
		lock := fmt.Sprintf("hasty%d-%d", id, seq)
		cid := lock + "-a"
		ttl := jitter(rng, 400*time.Millisecond, 1200*time.Millisecond)
		wait := ttl + w.grace() + time.Second
		switch rng.IntN(3) {
		case 0: // an acquire abandoned mid-commit
			w.acquireWithin(ctx, ep, name, lock, cid, w.rec.NewAttempt(), ttl, 0, "", quickTimeout(rng))
		case 1: // a renew to a longer TTL abandoned mid-commit
			g := w.acquireChain(ctx, ep, rng, name, lock, cid, ttl, 0, "", 5*time.Second)
			if g.Outcome != Ok {
				continue
			}
			longer := ttl + 600*time.Millisecond
			w.renewWithin(ctx, ep, name, lock, cid, g.OutToken, longer, "", quickTimeout(rng))
			wait = longer + w.grace() + time.Second
		case 2: // a release abandoned mid-commit, a waiter queued behind it
			g := w.acquireChain(ctx, ep, rng, name, lock, cid, ttl, 0, "", 5*time.Second)
			if g.Outcome != Ok {
				continue
			}
			done := make(chan struct{})
			wrng := rand.New(rand.NewPCG(uint64(id), uint64(seq)))
			go func() {
				defer close(done)
				w.nextHolder(ctx, wep, wrng, name+"-w", lock, cid+"-w", wait)
			}()
			w.awaitQueued(ctx, ep, name, lock, cid, 1, time.Second)
			w.releaseWithin(ctx, ep, name, lock, cid, g.OutToken, "", quickTimeout(rng))
			<-done
			continue
		}
		w.nextHolder(ctx, wep, rng, name+"-next", lock, cid+"-n", wait)
	}
}

// nextHolder waits up to wait for lock, then holds it a moment and
// releases it.
func (w *Workload) nextHolder(ctx context.Context, ep *endpoint, rng *rand.Rand, worker, lock, cid string, wait time.Duration) {
	g := w.acquireChain(ctx, ep, rng, worker, lock, cid, 800*time.Millisecond, wait, "", wait+3*time.Second)
	if g.Outcome != Ok {
		return
	}
	sleep(ctx, jitter(rng, 10*time.Millisecond, 50*time.Millisecond))
	w.releaseChain(ctx, ep, rng, worker, lock, cid, g.OutToken, "")
}

// awaitQueued reads lock until it shows holder holding with n waiters, or d
// passes.
func (w *Workload) awaitQueued(ctx context.Context, ep *endpoint, worker, lock, holder string, n int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline) && ctx.Err() == nil; {
		r := w.read(ctx, ep, worker, lock, "")
		if r.Outcome == Ok && r.Held && r.Holder == holder && r.Waiters == n {
			return true
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return false
}

// cancelWorker does what hastyWorker does through the Go client: a try
// acquire whose context is cancelled a few milliseconds in, or a granted
// lock whose renew or release is cancelled mid-commit, then walks away
// (the client's lease ends the lock; Lost() must close before anyone else
// is told it holds it). A next client (raw HTTP) waits for the lock.
func (w *Workload) cancelWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("cancel%d", id)
	c := w.newClient(ctx, fmt.Sprintf("cx%d", id))
	if c == nil {
		return
	}
	ep := &endpoint{next: id}
	for seq := 0; ctx.Err() == nil; seq++ {
		lock := fmt.Sprintf("cx%d-%d", id, seq)
		ttl := jitter(rng, 500*time.Millisecond, 1200*time.Millisecond)
		mode := rng.IntN(3)
		limit := 4 * time.Second
		if mode == 0 {
			limit = quickTimeout(rng)
		}
		actx, cancel := context.WithTimeout(ctx, limit)
		op, l, sent := w.clientAcquire(ctx, actx, name, c, lock, w.rec.NewAttempt(), ttl, 0, true)
		cancel()
		if !sent {
			continue
		}
		if op.Outcome == Ok {
			switch mode {
			case 1:
				w.clientRenew(ctx, name, c, l, ttl+500*time.Millisecond, quickTimeout(rng))
			case 2:
				w.clientRelease(ctx, name, c, l, quickTimeout(rng))
			}
		}
		w.nextHolder(ctx, ep, rng, name+"-next", lock, lock+"-n", ttl+500*time.Millisecond+w.grace()+time.Second)
	}
}

// scenarios alternates renew-racing-release and try-while-queued rounds.
func (w *Workload) scenarios(ctx context.Context, rng *rand.Rand) {
	for round := 1; ctx.Err() == nil; round++ {
		if round%2 == 1 {
			w.renewRace(ctx, rng, round)
		} else {
			w.tryWhileQueued(ctx, rng, round)
		}
		sleep(ctx, jitter(rng, 50*time.Millisecond, 200*time.Millisecond))
	}
}

// waitFor sends a waiting acquire in the background; the result arrives
// on the channel.
func (w *Workload) waitFor(ctx context.Context, worker, lock, cid string, ttl, wait time.Duration, seed uint64) <-chan Op {
	out := make(chan Op, 1)
	go func() {
		rng := rand.New(rand.NewPCG(seed, 3))
		out <- w.acquireChain(ctx, &endpoint{next: int(seed)}, rng, worker, lock, cid, ttl, wait, "", wait+3*time.Second)
	}()
	return out
}

// renewRace: a holder with one waiter queued sends a renew and a release
// of its grant at the same moment. The waiter gets the lock and walks away
// from it: its grant must expire by its expires_at plus the grace (a
// renew applied to the wrong grant must not leave it without an expiry),
// which a read then checks.
func (w *Workload) renewRace(ctx context.Context, rng *rand.Rand, round int) {
	lock := fmt.Sprintf("race-%d", round)
	holder, waiter := lock+"-h", lock+"-w"
	ep := &endpoint{}
	const ttl = 1500 * time.Millisecond
	g := w.acquireChain(ctx, ep, rng, "race", lock, holder, ttl, 0, "", 5*time.Second)
	if g.Outcome != Ok {
		return
	}
	waited := w.waitFor(ctx, "race-w", lock, waiter, 700*time.Millisecond, 6*time.Second, uint64(round))
	w.awaitQueued(ctx, ep, "race", lock, holder, 1, 2*time.Second)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		w.renew(ctx, &endpoint{next: 1}, "race-renew", lock, holder, g.OutToken, ttl, "")
	}()
	go func() {
		defer wg.Done()
		w.release(context.WithoutCancel(ctx), &endpoint{next: 2}, "race-release", lock, holder, g.OutToken, "")
	}()
	wg.Wait()
	got := <-waited
	if got.Outcome != Ok {
		w.releaseChain(ctx, ep, rng, "race", lock, holder, g.OutToken, "")
		return
	}
	exp := got.ExpiresAt
	if exp == 0 {
		exp = got.Return + int64(700*time.Millisecond)
	}
	if sleep(ctx, time.Duration(exp+int64(w.grace()+300*time.Millisecond)-w.rec.Now())) {
		w.read(ctx, ep, "race", lock, "")
	}
}

// tryWhileQueued: a client waiting for a lock sends a try-acquire
// (wait_timeout_ms 0) of the same lock. It keeps its place in the queue
// (SPEC: an acquire by a client already waiting keeps its place), so when
// the holder releases, its waiting acquire is granted — and told.
func (w *Workload) tryWhileQueued(ctx context.Context, rng *rand.Rand, round int) {
	lock := fmt.Sprintf("tryq-%d", round)
	holder, waiter := lock+"-h", lock+"-w"
	ep := &endpoint{}
	g := w.acquireChain(ctx, ep, rng, "tryq", lock, holder, 3*time.Second, 0, "", 5*time.Second)
	if g.Outcome != Ok {
		return
	}
	waited := w.waitFor(ctx, "tryq-w", lock, waiter, 700*time.Millisecond, 5*time.Second, uint64(round))
	w.awaitQueued(ctx, ep, "tryq", lock, holder, 1, 2*time.Second)
	try := w.acquire(ctx, &endpoint{next: 1}, "tryq-try", lock, waiter, w.rec.NewAttempt(), 700*time.Millisecond, 0, "")
	w.read(ctx, ep, "tryq", lock, "")
	w.releaseChain(ctx, ep, rng, "tryq", lock, holder, g.OutToken, "")
	got := <-waited
	tok := got.OutToken
	if got.Outcome != Ok && try.Outcome == Ok {
		tok = try.OutToken
	}
	if tok != 0 {
		w.releaseChain(ctx, ep, rng, "tryq-w", lock, waiter, tok, "")
	}
}

// probe lists every lock with state now and then (linearizable reads), so
// a lock held past its expiry is seen even when no worker reads it.
func (w *Workload) probe(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	for ctx.Err() == nil {
		w.list(ctx, ep, "probe", "", "")
		sleep(ctx, jitter(rng, 400*time.Millisecond, 900*time.Millisecond))
	}
}

// unrecordedPrefix names locks whose acquires no history records (the
// nemesis's failover probe, the overload flood): reads of them would
// contradict the model.
const unrecordedPrefix = "chaos-"

// list reads every lock under prefix with one linearizable list request
// and records each lock with state as a read; it returns those reads.
func (w *Workload) list(ctx context.Context, ep *endpoint, worker, prefix, tag string) []Op {
	var out []Op
	after := ""
	for page := 0; page < 100; page++ {
		q := url.Values{}
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		if after != "" {
			q.Set("after", after)
		}
		path := "/api/v1/locks"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		inv := w.rec.Now()
		r := w.call(ctx, ep, http.MethodGet, path, nil, 2500*time.Millisecond)
		ret := w.rec.Now()
		if r.outcome != Ok {
			return out
		}
		var ll struct {
			Locks []api.LockStatus `json:"locks"`
			Next  string           `json:"next"`
		}
		if err := json.Unmarshal(r.body, &ll); err != nil {
			w.rec.Add(Op{Worker: worker, Via: w.via, Kind: KindRead, Lock: prefix, Tag: tag, Invoke: inv, Return: ret,
				Outcome: Unknown, Code: "unexpected", Err: fmt.Sprintf("a list reply that does not parse: %.200q", r.body)})
			return out
		}
		// One page of the whole table is one read at one log index: a
		// snapshot (a kinds lock it does not list was free).
		var snap int64
		if prefix == "" && page == 0 && ll.Next == "" {
			snap = w.snapSeq.Add(1)
		}
		for _, st := range ll.Locks {
			if strings.HasPrefix(st.Lock, unrecordedPrefix) {
				continue
			}
			op := Op{Worker: worker, Via: w.via, Kind: KindRead, Lock: st.Lock, Tag: tag, Invoke: inv, Return: ret,
				Outcome: Ok, Status: r.status, Snap: snap}
			w.fillStatus(&op, st, false)
			out = append(out, w.rec.Add(op))
		}
		if ll.Next == "" {
			return out
		}
		after = ll.Next
	}
	return out
}

// settle lists the locks under prefix until none is held that should come
// free within limit — each held lock read once more after its expires_at +
// the grace, or found free — so the expiry checker sees every grant whose
// holder walked away. Faults are over when it starts (a fault moves the
// bound to its end + the grace), so each lock is read again after
// max(expires_at, start) + the grace. Locks with a long TTL are left alone.
func (w *Workload) settle(ctx context.Context, prefix, tag string, limit time.Duration) {
	ep := &endpoint{}
	start := w.rec.Now()
	end := start + int64(limit)
	margin := int64(200 * time.Millisecond)
	for ctx.Err() == nil {
		next := int64(0)
		now := w.rec.Now()
		for _, r := range w.list(ctx, ep, "settle", prefix, tag) {
			if !r.Held || r.ExpiresAt == 0 {
				continue
			}
			due := max(r.ExpiresAt, start) + int64(w.grace()) + margin
			if due > r.Invoke && due <= end && (next == 0 || due < next) {
				next = due
			}
		}
		if next == 0 {
			return
		}
		if !sleep(ctx, time.Duration(max(next, now+int64(100*time.Millisecond))-w.rec.Now())) {
			return
		}
	}
}
