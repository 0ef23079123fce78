package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// The elections workload (SPEC "Values and elections", "Watches"), on
// locks named electPrefix<epoch>-<i> that no other worker uses: an
// election is a lock with values — campaign = acquire with a wait and a
// value, proclaim = value, resign = release, leader = status, observe =
// watch.
//
// Candidates:
//   - raw WebSocket candidates: one session per connection (TTL
//     electSessionTTL); leadership bound to the session alone, or one time
//     in three to a TTL of its own that the leader renews; a leader
//     proclaims new values, reads the election, then resigns, or walks
//     away (lets the TTL run out), or dies (drops the connection: its
//     session expires). The nemesis kills their sessions too;
//   - raw HTTP candidates: a TTL, renewed while leading; they resign or
//     walk away;
//   - Go-client candidates: client.Election (Campaign with a deadline,
//     Proclaim, Resign), Lost() recorded as for the other Go-client
//     locks.
//
// Observers (they record every status they see, with its index):
//   - raw WebSocket prefix watchers: watch electPrefix; on a resync they
//     list the prefix again; now and then they reconnect on purpose, and
//     after any reconnect they watch again;
//   - raw WebSocket single-lock watchers: watch each election of the
//     current epoch, unwatch the old ones;
//   - HTTP blocking queries (?index=N&wait=D) on one election each;
//   - a Go client: WatchPrefix(electPrefix) and Election.Observe of the
//     current elections.
//
// Every value is unique ("<client>#<n>"), so a value shown with a
// leader's token names who set it.

// electPrefix names the election locks; nothing else uses them.
const electPrefix = "elect-"

func isElect(name string) bool { return strings.HasPrefix(name, electPrefix) }

// electNames is how many elections run at once.
const electNames = 2

// electSessionTTL is the session TTL of the election candidates: a dead
// leader's session ends this long after its last keepalive.
const electSessionTTL = 4 * time.Second

// Tags of observer reads.
const (
	tagBlocking = "blocking" // a blocking query (?index=N&wait=D)
	tagReread   = "reread"   // a read after a resync
	tagObserve  = "observe"  // an Election.Observe event: the leader only
	tagStop     = "stop"     // a watch still running when the observers stopped
)

// electEpoch is the epoch of the election names: the clock's, or the one
// frozen when the candidates stopped.
func (w *Workload) electEpoch() int {
	if f := w.electFrozen.Load(); f > 0 {
		return int(f - 1)
	}
	return w.kindEpoch()
}

func (w *Workload) electLock(i int) string {
	return fmt.Sprintf("%s%d-%d", electPrefix, w.electEpoch(), i)
}

func (w *Workload) electLocks() []string {
	out := make([]string, electNames)
	for i := range out {
		out[i] = w.electLock(i)
	}
	return out
}

// freezeElections keeps the observers on the elections of the epoch the
// candidates stopped in.
func (w *Workload) freezeElections() {
	w.electFrozen.CompareAndSwap(0, int64(w.kindEpoch())+1)
}

// observers are the watchers and blocking queries: they run from Run until
// StopObservers, past the other workers, so that they see the state the
// run ends in.
type observers struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   map[*kwsClient]map[uint64]Op // raw WebSocket observers → their running watches
	client  map[string]Op                // Go-client watches running (by worker)
	gcs     []*client.Client
	stopped bool
	final   Op // the final leader's grant (FinishElections)
}

// startElections starts the candidates (on ctx, through spawn) and the
// observers (on their own context).
func (w *Workload) startElections(ctx context.Context, spawn func(func(context.Context, *rand.Rand), uint64)) {
	for i := 0; i < w.opts.ElectWS; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.electWSWorker(ctx, id, rng) }, uint64(1400+i))
	}
	for i := 0; i < w.opts.ElectHTTP; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.electHTTPWorker(ctx, id, rng) }, uint64(1500+i))
	}
	for i := 0; i < w.opts.ElectClient; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.electClientWorker(ctx, id, rng) }, uint64(1600+i))
	}
	observe := func(f func(ctx context.Context, rng *rand.Rand), n uint64) {
		w.obs.wg.Add(1)
		go func() {
			defer w.obs.wg.Done()
			f(w.obs.ctx, rand.New(rand.NewPCG(w.opts.Seed, n)))
		}()
	}
	for i := 0; i < w.opts.PrefixWatchers; i++ {
		id := i
		observe(func(ctx context.Context, rng *rand.Rand) { w.prefixWatcher(ctx, id, rng) }, uint64(1700+i))
	}
	for i := 0; i < w.opts.LockWatchers; i++ {
		id := i
		observe(func(ctx context.Context, rng *rand.Rand) { w.lockWatcher(ctx, id, rng) }, uint64(1800+i))
	}
	for i := 0; i < w.opts.Blockers; i++ {
		id := i
		observe(func(ctx context.Context, rng *rand.Rand) { w.blocker(ctx, id, rng) }, uint64(1900+i))
	}
	if w.opts.ClientObserver {
		observe(w.clientObserver, 2000)
	}
}

// ---- candidates ----

// campaign sends one acquire of an election over the connection, with a
// wait and a value, bound to the session (ttl 0) or to a TTL too, and
// records it.
func (c *kwsClient) campaign(run context.Context, lock string, ttl, wait time.Duration, value string) Op {
	waitMs := wait.Milliseconds()
	v := value
	req := api.WSRequest{Op: api.OpAcquire, Lock: lock, WaitTimeoutMs: &waitMs, Value: &v}
	op := Op{Worker: c.worker, Via: "ws", Kind: KindAcquire, Lock: lock, ClientID: c.cid, Attempt: c.w.rec.NewAttempt(),
		WaitMs: waitMs, Value: value}
	if ttl > 0 {
		ttlMs := ttl.Milliseconds()
		req.TTLms, op.TTLms = &ttlMs, ttlMs
	}
	op.Invoke = c.w.rec.Now()
	m, oc, code, gaveUp := c.request(run, req, wait+4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	if oc != Fail {
		// Bound to the session: it ends no earlier than the session can
		// expire (every acknowledged keepalive moved that), or its TTL.
		op.ExpiryLB = c.sessionLB()
		if ttl > 0 {
			op.ExpiryLB = min(op.ExpiryLB, expiryLB(op.Invoke, ttl))
		}
	}
	switch {
	case oc == Ok && m.FencingToken != 0:
		op.OutToken, op.ExpiresAt, op.GrantMode = m.FencingToken, c.w.wallTime(m.ExpiresAt), m.Mode
	case oc == Ok:
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("a grant without a token: %+v", m)
	case oc == Fail:
		op.Holder = m.Holder
	}
	return c.w.rec.Add(op)
}

// setValue proclaims a value over the connection and records it.
func (c *kwsClient) setValue(lock string, tok uint64, value string) Op {
	v := value
	op := Op{Worker: c.worker, Via: "ws", Kind: KindValue, Lock: lock, ClientID: c.cid, Token: tok, Value: value, Invoke: c.w.rec.Now()}
	m, oc, code, gaveUp := c.request(context.Background(), api.WSRequest{Op: api.OpValue, Lock: lock, FencingToken: tok, Value: &v}, 3*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	if oc == Ok && m.FencingToken != tok {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("a value reply naming token %d", m.FencingToken)
	}
	return c.w.rec.Add(op)
}

// setValue proclaims a value over HTTP and records it.
func (w *Workload) setValue(ctx context.Context, ep *endpoint, worker, lock, cid string, tok uint64, value string) Op {
	op := Op{Worker: worker, Via: w.via, Kind: KindValue, Lock: lock, ClientID: cid, Token: tok, Value: value, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodPost, lockPath(lock, "value"), api.ValueRequest{ClientID: cid, FencingToken: tok, Value: value}, 2500*time.Millisecond)
	op.Return = w.rec.Now()
	op.fill(r)
	var vr api.ValueReply
	if op.Outcome == Ok && (json.Unmarshal(r.body, &vr) != nil || !vr.Updated || vr.FencingToken != tok) {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("200 that is not this grant's value update: %q", r.body)
	}
	return w.rec.Add(op)
}

// electWSWorker campaigns over raw WebSocket connections. Any outcome it
// cannot know ends the connection (its session then expires, and with it
// whatever it may hold or wait for); the next campaign opens a new one.
func (w *Workload) electWSWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("elect-ws%d", id)
	var c *kwsClient
	defer func() {
		if c != nil {
			c.end("the run ended")
			c.loops.Wait()
		}
	}()
	for gen, seq := 0, 0; ctx.Err() == nil; seq++ {
		if c == nil || c.isDead() {
			if c != nil {
				c.loops.Wait()
			}
			c = w.dialKWSWith(ctx, name, fmt.Sprintf("ew%d-%d", id, gen), rng, electSessionTTL, nil, false)
			gen++
			if c == nil {
				return
			}
		}
		lock := w.electLock(rng.IntN(electNames))
		if c.mayHold(lock) {
			sleep(ctx, jitter(rng, 20*time.Millisecond, 100*time.Millisecond))
			continue
		}
		var ttl time.Duration
		if rng.IntN(3) == 0 {
			ttl = jitter(rng, 1500*time.Millisecond, 3*time.Second)
		}
		g := c.campaign(ctx, lock, ttl, jitter(rng, 500*time.Millisecond, 4*time.Second), fmt.Sprintf("%s#%d", c.cid, seq))
		switch g.Outcome {
		case Unknown:
			c.end("a campaign of unknown outcome")
			continue
		case Fail:
			sleep(ctx, jitter(rng, 0, 100*time.Millisecond))
			continue
		}
		seq = w.wsLead(ctx, rng, c, g, ttl, seq)
		sleep(ctx, jitter(rng, 0, 200*time.Millisecond))
	}
}

// wsLead is a WebSocket candidate's term: proclaim, renew (a TTL-bound
// leadership), read; then resign, walk away or die. It returns the last
// value number used.
func (w *Workload) wsLead(ctx context.Context, rng *rand.Rand, c *kwsClient, g Op, ttl time.Duration, seq int) int {
	lock, tok := g.Lock, g.OutToken
	until := g.ExpiryLB
	if g.WaitMs > 0 && ttl > 0 {
		if r := c.renew(ctx, lock, tok, ttl); r.Outcome == Ok {
			until = r.ExpiryLB
		} else if r.Outcome == Unknown {
			c.end("a renew of unknown outcome")
			return seq
		}
	}
	ep := &endpoint{next: rng.IntN(len(w.opts.Endpoints))}
	end := func() int64 { // the latest the leadership may last on its own
		if ttl > 0 {
			return until + int64(w.grace()+time.Second)
		}
		return w.rec.Now() + int64(electSessionTTL+w.grace()+time.Second)
	}
	for steps := 1 + rng.IntN(5); steps > 0 && ctx.Err() == nil && !c.isDead(); steps-- {
		if ttl == 0 {
			until = c.sessionLB()
		}
		if _, lost := c.lostReason(tok); lost || w.rec.Now() > until-int64(200*time.Millisecond) {
			break
		}
		switch rng.IntN(5) {
		case 0, 1:
			seq++
			if r := c.setValue(lock, tok, fmt.Sprintf("%s#%d", c.cid, seq)); r.Outcome == Unknown {
				c.end("a proclaim of unknown outcome")
				return seq
			}
		case 2:
			if ttl == 0 {
				w.read(ctx, ep, c.worker, lock, "")
				break
			}
			r := c.renew(ctx, lock, tok, ttl)
			switch r.Outcome {
			case Ok:
				until = max(until, r.ExpiryLB)
			case Unknown:
				c.end("a renew of unknown outcome")
				return seq
			}
		default:
			w.read(ctx, ep, c.worker, lock, "")
		}
		sleep(ctx, jitter(rng, 50*time.Millisecond, 400*time.Millisecond))
	}
	if c.isDead() {
		return seq
	}
	if _, lost := c.lostReason(tok); lost {
		return seq
	}
	switch p := rng.IntN(10); {
	case p < 6 || ctx.Err() != nil:
		if r := c.release(lock, tok); r.Outcome == Unknown {
			c.end("a resignation of unknown outcome")
		}
	case p < 8 && ttl > 0:
		c.walkAway(lock, end()) // let the TTL run out
	default:
		c.end("the leader died") // its session expires
	}
	return seq
}

// electHTTPWorker campaigns over raw HTTP with a TTL (fresh client id per
// campaign), renews while leading, proclaims, and resigns or walks away.
func (w *Workload) electHTTPWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("elect-http%d", id)
	ep := &endpoint{next: id}
	for seq := 0; ctx.Err() == nil; seq++ {
		cid := fmt.Sprintf("eh%d-%d", id, seq)
		lock := w.electLock(rng.IntN(electNames))
		ttl := jitter(rng, time.Second, 3*time.Second)
		wait := jitter(rng, 500*time.Millisecond, 4*time.Second)
		g := w.kindAcquireChain(ctx, ep, rng, name, lock, cid, ttl, wait, kindOpts{Value: cid + "#0"}, "", 8*time.Second)
		if g.Outcome != Ok {
			sleep(ctx, jitter(rng, 0, 100*time.Millisecond))
			continue
		}
		tok, until := g.OutToken, g.ExpiryLB
		if r := w.renew(ctx, ep, name, lock, cid, tok, ttl, ""); r.Outcome == Ok {
			until = r.ExpiryLB
		}
		n := 0
		for steps := 1 + rng.IntN(5); steps > 0 && ctx.Err() == nil; steps-- {
			if w.rec.Now() > until-int64(200*time.Millisecond) {
				break
			}
			switch rng.IntN(4) {
			case 0, 1:
				n++
				w.setValue(ctx, ep, name, lock, cid, tok, fmt.Sprintf("%s#%d", cid, n))
			case 2:
				if r := w.renew(ctx, ep, name, lock, cid, tok, ttl, ""); r.Outcome == Ok {
					until = max(until, r.ExpiryLB)
				}
			default:
				w.read(ctx, ep, name, lock, "")
			}
			sleep(ctx, jitter(rng, 50*time.Millisecond, 400*time.Millisecond))
		}
		if rng.IntN(10) < 7 || ctx.Err() != nil {
			w.releaseChain(ctx, ep, rng, name, lock, cid, tok, "")
		}
		sleep(ctx, jitter(rng, 0, 200*time.Millisecond))
	}
}

// electClientWorker campaigns through the Go client's Election: Campaign
// with a deadline (an abandoned campaign may still be elected; the client
// then resigns by itself), Proclaim, Resign.
func (w *Workload) electClientWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("elect-client%d", id)
	c := w.newClientWith(ctx, fmt.Sprintf("ec%d", id), electSessionTTL, true)
	if c == nil {
		return
	}
	cid := c.ClientID()
	pending := map[string]int64{} // lock → attempt of a campaign whose outcome is unknown
	for seq := 0; ctx.Err() == nil; seq++ {
		lock := w.electLock(rng.IntN(electNames))
		e := client.NewElection(c, lock)
		attempt, ok := pending[lock]
		if !ok {
			attempt = w.rec.NewAttempt()
		}
		wait := jitter(rng, 500*time.Millisecond, 4*time.Second)
		value := fmt.Sprintf("%s#%d", cid, seq)
		op := Op{Worker: name, Via: "client", Kind: KindAcquire, Lock: lock, ClientID: cid, Attempt: attempt,
			WaitMs: wait.Milliseconds(), Value: value, Limit: 1, Invoke: w.rec.Now()}
		cctx, cancel := context.WithTimeout(ctx, wait)
		err := e.Campaign(cctx, value)
		cancel()
		op.Return = w.rec.Now()
		l := e.Lock()
		if err == nil && l == nil {
			err = errors.New("Campaign returned nil without a leadership")
		}
		if !classifyClientAcquire(ctx, w, &op, l, err) {
			sleep(ctx, jitter(rng, 20*time.Millisecond, 100*time.Millisecond))
			continue
		}
		op = w.rec.Add(op)
		if op.Outcome == Unknown {
			pending[lock] = attempt
			sleep(ctx, jitter(rng, 50*time.Millisecond, 200*time.Millisecond))
			continue
		}
		delete(pending, lock)
		if op.Outcome != Ok {
			sleep(ctx, jitter(rng, 0, 100*time.Millisecond))
			continue
		}
		w.watchLost(name, cid, l)
		for steps := 1 + rng.IntN(4); steps > 0 && ctx.Err() == nil && l.Err() == nil; steps-- {
			seq++
			w.clientProclaim(ctx, name, cid, e, l, fmt.Sprintf("%s#%d", cid, seq))
			sleep(ctx, jitter(rng, 50*time.Millisecond, 400*time.Millisecond))
		}
		if l.Err() == nil {
			w.clientResign(context.WithoutCancel(ctx), name, cid, e, l)
		}
		sleep(ctx, jitter(rng, 0, 200*time.Millisecond))
	}
}

// classifyClientAcquire fills op (a Go-client acquire that returned l,
// err) as clientAcquire does; false when the client refused locally and
// nothing was sent.
func classifyClientAcquire(run context.Context, w *Workload, op *Op, l *client.Lock, err error) bool {
	var se *client.ServerError
	switch {
	case err == nil:
		op.Outcome, op.OutToken = Ok, l.Token()
		op.ExpiryLB = w.rec.At(l.Deadline())
		if exp := l.ExpiresAt(); !exp.IsZero() {
			op.ExpiresAt = w.rec.At(exp)
		}
	case errors.Is(err, client.ErrMaybeGrantedLost):
		op.Outcome, op.Err = Unknown, err.Error()
	case errors.As(err, &se) && (se.API.Code == api.CodeLockHeld || se.API.Code == api.CodeWaitTimeout):
		op.Outcome, op.Code, op.Holder = Fail, se.API.Code, se.Holder
	case errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrClosed):
		return false
	default:
		// A campaign whose deadline passed may still be elected, and the
		// client then resigns by itself: no bound.
		op.Outcome, op.Err = Unknown, err.Error()
		if errors.As(err, &se) {
			op.Code = se.API.Code
		}
		op.GaveUp = clientGaveUp(run, err)
	}
	return true
}

// clientProclaim sets the leader's value through Election.Proclaim and
// records it (nothing when the client knew it no longer leads).
func (w *Workload) clientProclaim(ctx context.Context, name, cid string, e *client.Election, l *client.Lock, value string) {
	op := Op{Worker: name, Via: "client", Kind: KindValue, Lock: e.Name(), ClientID: cid, Token: l.Token(), Value: value, Invoke: w.rec.Now()}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := e.Proclaim(pctx, value)
	cancel()
	op.Return = w.rec.Now()
	var se *client.ServerError
	switch {
	case err == nil:
		op.Outcome = Ok
	case errors.Is(err, client.ErrNotHolder) || errors.As(err, &se) && se.API.Code == api.CodeNotHolder:
		op.Outcome, op.Code = Fail, api.CodeNotHolder
	case errors.Is(err, client.ErrElectionNotLeader):
		return // refused locally: the leadership had ended
	default:
		op.Outcome, op.Err = Unknown, err.Error()
		op.GaveUp = clientGaveUp(ctx, err)
	}
	w.rec.Add(op)
}

// clientResign resigns through Election.Resign and records it as a
// release.
func (w *Workload) clientResign(ctx context.Context, name, cid string, e *client.Election, l *client.Lock) {
	op := Op{Worker: name, Via: "client", Kind: KindRelease, Lock: e.Name(), ClientID: cid, Token: l.Token(), Invoke: w.rec.Now()}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := e.Resign(rctx)
	cancel()
	op.Return = w.rec.Now()
	switch {
	case err == nil && errors.Is(l.Err(), client.ErrReleased):
		op.Outcome = Ok
	case err == nil:
		// Nothing was held any more (lost meanwhile): a release that
		// changed nothing, or one of unknown outcome.
		op.Outcome, op.Err = Unknown, fmt.Sprintf("Resign: nil, leadership ended by %v", l.Err())
	default:
		op.Outcome, op.Err = Unknown, err.Error()
		op.GaveUp = clientGaveUp(ctx, err)
	}
	w.rec.Add(op)
}

// ---- observers ----

// frameOp records a changed, synced or resync frame of connection cid.
func (w *Workload) frameOp(worker, cid string, m api.WSMessage, at int64) Op {
	switch m.Type {
	case api.TypeResync:
		return w.rec.Add(Op{Worker: worker, Via: "ws", Kind: KindResync, ClientID: cid, WatchID: m.WatchID, Invoke: at, Return: at, Outcome: Ok})
	case api.TypeSynced:
		return w.rec.Add(Op{Worker: worker, Via: "ws", Kind: KindSynced, ClientID: cid, WatchID: m.WatchID, Index: m.Index,
			Invoke: at, Return: at, Outcome: Ok})
	}
	op := Op{Worker: worker, Via: "ws", Kind: KindChanged, ClientID: cid, WatchID: m.WatchID, Lock: m.Lock, Invoke: at, Return: at, Outcome: Ok}
	if m.Status == nil {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", "a changed frame without a status"
	} else {
		w.fillStatus(&op, *m.Status, true)
		op.StatusIndex = m.Status.Index
		if m.Status.Lock != m.Lock {
			op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("a changed frame of %q with the status of %q", m.Lock, m.Status.Lock)
		}
	}
	op.Index = m.Index
	return w.rec.Add(op)
}

// watch starts a watch of lock, or of every lock under prefix, on the
// connection and records it; a running watch is registered for
// StopObservers.
func (c *kwsClient) watch(run context.Context, lock, prefix string) Op {
	req := api.WSRequest{Op: api.OpWatch, Lock: lock}
	if prefix != "" {
		p := prefix
		req.Prefix = &p
	}
	op := Op{Worker: c.worker, Via: "ws", Kind: KindWatch, Lock: lock, Prefix: prefix, ClientID: c.cid, Invoke: c.w.rec.Now()}
	m, oc, code, gaveUp := c.request(run, req, 4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp, op.WatchID = oc, code, gaveUp, m.WatchID
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	if oc == Ok && m.WatchID == 0 {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", "a watch answered without a watch_id"
	}
	op = c.w.rec.Add(op)
	if op.Outcome == Ok {
		c.w.obs.mu.Lock()
		if ws := c.w.obs.conns[c]; ws != nil {
			ws[op.WatchID] = op
		}
		c.w.obs.mu.Unlock()
	}
	return op
}

// unwatch ends a watch on the connection and records it.
func (c *kwsClient) unwatch(run context.Context, wop Op) Op {
	c.w.obs.mu.Lock()
	delete(c.w.obs.conns[c], wop.WatchID)
	c.w.obs.mu.Unlock()
	op := Op{Worker: c.worker, Via: "ws", Kind: KindUnwatch, Lock: wop.Lock, Prefix: wop.Prefix, ClientID: c.cid, WatchID: wop.WatchID,
		Invoke: c.w.rec.Now()}
	m, oc, code, gaveUp := c.request(run, api.WSRequest{Op: api.OpUnwatch, WatchID: wop.WatchID}, 4*time.Second)
	op.Return = c.w.rec.Now()
	op.Outcome, op.Code, op.GaveUp = oc, code, gaveUp
	if m.Error != nil {
		op.Err = m.Error.Message
	}
	return c.w.rec.Add(op)
}

// dialObserver connects a raw WebSocket observer whose frames are
// recorded as they are read; resync gets a signal for each resync frame.
func (w *Workload) dialObserver(ctx context.Context, worker, cid string, rng *rand.Rand, resync chan<- uint64) *kwsClient {
	c := w.dialKWSWith(ctx, worker, cid, rng, kwsSessionTTL, func(m api.WSMessage, at int64) {
		w.frameOp(worker, cid, m, at)
		if m.Type == api.TypeResync {
			select {
			case resync <- m.WatchID:
			default:
			}
		}
	}, false)
	if c == nil {
		return nil
	}
	w.obs.mu.Lock()
	defer w.obs.mu.Unlock()
	if w.obs.conns == nil {
		w.obs.conns = map[*kwsClient]map[uint64]Op{}
	}
	if w.obs.stopped {
		c.end("the observers stopped")
		return nil
	}
	w.obs.conns[c] = map[uint64]Op{}
	return c
}

// closeObserver ends an observer's connection and forgets it.
func (w *Workload) closeObserver(c *kwsClient, why string) {
	c.end(why)
	c.loops.Wait()
	w.obs.mu.Lock()
	delete(w.obs.conns, c)
	w.obs.mu.Unlock()
}

// prefixWatcher watches every election (the prefix) over raw WebSocket.
// On a resync it lists the prefix again (linearizable reads); the
// connection is dropped on purpose every 15–40 s, and after any reconnect
// it watches again.
func (w *Workload) prefixWatcher(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("watch-prefix%d", id)
	ep := &endpoint{next: id}
	for gen := 0; ctx.Err() == nil; gen++ {
		resync := make(chan uint64, 1)
		c := w.dialObserver(ctx, name, fmt.Sprintf("wp%d-%d", id, gen), rng, resync)
		if c == nil {
			return
		}
		if wop := c.watch(ctx, "", electPrefix); wop.Outcome != Ok {
			w.closeObserver(c, "the watch was not answered ok")
			sleep(ctx, jitter(rng, 100*time.Millisecond, 300*time.Millisecond))
			continue
		}
		life := time.NewTimer(jitter(rng, 15*time.Second, 40*time.Second))
	live:
		for {
			select {
			case <-ctx.Done():
				life.Stop()
				return // StopObservers marks the watch and closes the connection
			case <-c.dead:
				break live
			case <-resync:
				w.list(ctx, ep, name, electPrefix, tagReread)
			case <-life.C:
				break live
			}
		}
		life.Stop()
		w.closeObserver(c, "reconnecting")
	}
}

// lockWatcher watches each election of the current epoch over raw
// WebSocket, one watch per lock, and unwatches the old ones. On a resync
// it reads the lock again; the connection is dropped on purpose every
// 20–50 s.
func (w *Workload) lockWatcher(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("watch-lock%d", id)
	ep := &endpoint{next: id}
	for gen := 0; ctx.Err() == nil; gen++ {
		resync := make(chan uint64, 1)
		c := w.dialObserver(ctx, name, fmt.Sprintf("wl%d-%d", id, gen), rng, resync)
		if c == nil {
			return
		}
		watched := map[string]Op{}
		until := time.Now().Add(jitter(rng, 20*time.Second, 50*time.Second))
		for ctx.Err() == nil && !c.isDead() && time.Now().Before(until) {
			cur := w.electLocks()
			for _, l := range cur {
				if _, ok := watched[l]; ok {
					continue
				}
				if wop := c.watch(ctx, l, ""); wop.Outcome == Ok {
					watched[l] = wop
				} else if wop.Outcome == Unknown {
					c.end("a watch of unknown outcome")
				}
			}
			for l, wop := range watched {
				if !strings.HasPrefix(l, fmt.Sprintf("%s%d-", electPrefix, w.electEpoch())) && !c.isDead() {
					if u := c.unwatch(ctx, wop); u.Outcome == Unknown {
						c.end("an unwatch of unknown outcome")
					}
					delete(watched, l)
				}
			}
			select {
			case <-ctx.Done():
			case <-c.dead:
			case wid := <-resync:
				for l, wop := range watched {
					if wop.WatchID == wid {
						w.read(ctx, ep, name, l, tagReread)
					}
				}
			case <-time.After(300 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.closeObserver(c, "reconnecting")
	}
}

// blockingRead sends GET /api/v1/locks/{name}?index=N&wait=D and records
// it as a linearizable read (tag "blocking").
func (w *Workload) blockingRead(ctx context.Context, ep *endpoint, worker, lock string, index uint64, wait time.Duration) Op {
	op := Op{Worker: worker, Via: w.via, Kind: KindRead, Lock: lock, Tag: tagBlocking, BlockIndex: index, WaitMs: wait.Milliseconds(),
		Invoke: w.rec.Now()}
	path := fmt.Sprintf("%s?index=%d&wait=%dms", lockPath(lock, ""), index, wait.Milliseconds())
	r := w.call(ctx, ep, http.MethodGet, path, nil, wait+2500*time.Millisecond)
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome == Ok {
		var st api.LockStatus
		if err := json.Unmarshal(r.body, &st); err != nil || st.Lock != lock {
			op.Outcome, op.Code = Unknown, "unexpected"
		} else {
			w.fillStatus(&op, st, false)
		}
	}
	return w.rec.Add(op)
}

// blocker follows one election with blocking queries: each asks for a
// change above the index the last one returned.
func (w *Workload) blocker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("blocking%d", id)
	ep := &endpoint{next: id}
	lock, index := "", uint64(0)
	for ctx.Err() == nil {
		if l := w.electLock(id % electNames); l != lock {
			lock, index = l, 0
		}
		r := w.blockingRead(ctx, ep, name, lock, index, jitter(rng, 500*time.Millisecond, 3*time.Second))
		switch {
		case r.Outcome != Ok:
			sleep(ctx, jitter(rng, 50*time.Millisecond, 200*time.Millisecond))
		case !hasState(r):
			// A lock without state answers at any index at or above its
			// last change (the member's own): do not spin on it.
			index = max(index, r.Index)
			sleep(ctx, jitter(rng, 20*time.Millisecond, 100*time.Millisecond))
		default:
			index = max(index, r.Index)
		}
	}
}

// hasState reports whether a status the op shows is of a lock with state
// (held, awaited or delayed): its index is then its last change's.
func hasState(op Op) bool {
	return op.Held || op.Waiters > 0 || op.DelayedUntil != 0 || len(op.Holders) > 0
}

// clientObserver follows the elections through the Go client: one
// WatchPrefix of every election, and Election.Observe of each election of
// the current epoch. Its client reconnects by itself (the nemesis sees to
// that) and re-establishes the watches.
func (w *Workload) clientObserver(ctx context.Context, rng *rand.Rand) {
	c := w.newClientWith(ctx, "gc-observer", kwsSessionTTL, false)
	if c == nil {
		return
	}
	w.obs.mu.Lock()
	w.obs.gcs = append(w.obs.gcs, c)
	w.obs.mu.Unlock()
	const watcher = "gc-watch"
	var events <-chan client.WatchEvent
	for events == nil && ctx.Err() == nil {
		op := Op{Worker: watcher, Via: "client", Kind: KindWatch, Prefix: electPrefix, ClientID: c.ClientID(), WatchID: 1, Invoke: w.rec.Now()}
		ch, err := c.WatchPrefix(ctx, electPrefix)
		op.Return = w.rec.Now()
		if err != nil {
			op.Outcome, op.Err = Unknown, err.Error()
			w.rec.Add(op)
			sleep(ctx, jitter(rng, 100*time.Millisecond, 300*time.Millisecond))
			continue
		}
		op.Outcome = Ok
		events = ch
		w.obs.mu.Lock()
		if w.obs.client == nil {
			w.obs.client = map[string]Op{}
		}
		w.obs.client[watcher] = w.rec.Add(op)
		w.obs.mu.Unlock()
	}
	var observing sync.WaitGroup
	defer observing.Wait()
	stopObserve := func() {}
	defer func() { stopObserve() }()
	epoch := -1
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if e := w.electEpoch(); e != epoch {
			stopObserve()
			observing.Wait()
			epoch = e
			octx, cancel := context.WithCancel(ctx)
			stopObserve = cancel
			for _, lock := range w.electLocks() {
				observing.Add(1)
				go func() {
					defer observing.Done()
					w.observeElection(octx, c, lock)
				}()
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		case ev, ok := <-events:
			if !ok {
				events = nil
				break
			}
			now := w.rec.Now()
			op := Op{Worker: watcher, Via: "client", Kind: KindChanged, ClientID: c.ClientID(), WatchID: 1, Lock: ev.Lock,
				Invoke: now, Return: now, Outcome: Ok, Resync: ev.Resync}
			w.fillStatus(&op, ev.Status, true)
			op.Index, op.StatusIndex = ev.Index, ev.Status.Index
			w.rec.Add(op)
		}
	}
}

// observeElection records what Election.Observe tells of one election
// until ctx ends (tag "observe": the leader only, no full status).
func (w *Workload) observeElection(ctx context.Context, c *client.Client, lock string) {
	worker := "gc-observe"
	e := client.NewElection(c, lock)
	var ch <-chan client.LeaderInfo
	for ch == nil && ctx.Err() == nil {
		var err error
		if ch, err = e.Observe(ctx); err != nil {
			ch = nil
			sleep(ctx, 200*time.Millisecond)
		}
	}
	for li := range ch {
		now := w.rec.Now()
		w.rec.Add(Op{Worker: worker, Via: "client", Kind: KindChanged, ClientID: c.ClientID(), Lock: lock, Tag: tagObserve,
			Invoke: now, Return: now, Outcome: Ok, Held: true, Holder: li.ClientID, OutToken: li.Token, Value: li.Value, Index: li.Index,
			StatusIndex: li.Index})
	}
}

// ---- the end of a run ----

// SettleElections, after the workers stopped, lists the elections until
// none has state (every leader resigned, or its session or TTL ran out,
// and every campaign ended), at most for limit; then a final leader takes
// the first election of the frozen epoch with a long TTL and proclaims:
// the state the observers must end with (see checkWatchFinal). It holds
// until ReleaseFinal.
func (w *Workload) SettleElections(ctx context.Context, limit time.Duration) {
	if w.opts.ElectWS+w.opts.ElectHTTP+w.opts.ElectClient == 0 {
		return
	}
	w.freezeElections()
	ep := &endpoint{}
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		busy := false
		for _, r := range w.list(ctx, ep, "settle", electPrefix, "") {
			busy = busy || hasState(r)
		}
		if !busy {
			break
		}
		sleep(ctx, 300*time.Millisecond)
	}
	rng := rand.New(rand.NewPCG(w.opts.Seed, 2100))
	lock, cid := w.electLock(0), "final-leader"
	g := w.kindAcquireChain(ctx, ep, rng, "final", lock, cid, time.Minute, 0, kindOpts{Value: cid + "#0"}, "", 10*time.Second)
	if g.Outcome != Ok {
		return
	}
	w.setValue(ctx, ep, "final", lock, cid, g.OutToken, cid+"#1")
	w.obs.mu.Lock()
	w.obs.final = g
	w.obs.mu.Unlock()
}

// ReleaseFinal resigns the final leader (after StopObservers).
func (w *Workload) ReleaseFinal(ctx context.Context) {
	w.obs.mu.Lock()
	g := w.obs.final
	w.obs.final = Op{}
	w.obs.mu.Unlock()
	if g.OutToken != 0 {
		w.releaseChain(ctx, &endpoint{}, rand.New(rand.NewPCG(w.opts.Seed, 2101)), "final", g.Lock, g.ClientID, g.OutToken, "")
	}
}

// RecordFinal records the replicated state every member agreed on at the
// end (KindFinal, one op per lock with state, Node naming the applied
// index): what the watchers' last frames must show.
func (w *Workload) RecordFinal(f *finalState) {
	if f == nil {
		return
	}
	now := w.rec.Now()
	for _, st := range f.Locks {
		if strings.HasPrefix(st.Lock, unrecordedPrefix) {
			continue
		}
		op := Op{Worker: "replicas", Via: "nemesis", Kind: KindFinal, Lock: st.Lock, Invoke: now, Return: now, Outcome: Ok,
			Node: fmt.Sprintf("every member at applied index %d", f.Applied)}
		w.fillStatus(&op, st, true)
		w.rec.Add(op)
	}
	// An op with no lock marks when the final state was read, also when
	// every lock was free.
	w.rec.Add(Op{Worker: "replicas", Via: "nemesis", Kind: KindFinal, Invoke: now, Return: now, Outcome: Ok, Index: f.Applied,
		Node: fmt.Sprintf("every member at applied index %d", f.Applied)})
}

// StopObservers stops the observers: every watch still running is
// recorded as such (KindUnwatch, tag "stop") with the moment its frames
// end, then the connections and the Go client close.
func (w *Workload) StopObservers() {
	w.obs.mu.Lock()
	if w.obs.stopped {
		w.obs.mu.Unlock()
		return
	}
	w.obs.stopped = true
	w.obs.mu.Unlock()
	w.obs.cancel()
	w.obs.wg.Wait()
	w.obs.mu.Lock()
	conns := w.obs.conns
	w.obs.conns = nil
	gcs := w.obs.gcs
	cws := w.obs.client
	w.obs.mu.Unlock()
	now := w.rec.Now()
	for c, ws := range conns {
		if c.isDead() {
			continue
		}
		for _, wop := range ws {
			w.rec.Add(Op{Worker: wop.Worker, Via: wop.Via, Kind: KindUnwatch, Lock: wop.Lock, Prefix: wop.Prefix, ClientID: wop.ClientID,
				WatchID: wop.WatchID, Tag: tagStop, Invoke: now, Return: now, Outcome: Ok})
		}
	}
	for _, wop := range cws {
		w.rec.Add(Op{Worker: wop.Worker, Via: wop.Via, Kind: KindUnwatch, Lock: wop.Lock, Prefix: wop.Prefix, ClientID: wop.ClientID,
			WatchID: wop.WatchID, Tag: tagStop, Invoke: now, Return: now, Outcome: Ok})
	}
	for c := range conns {
		c.end("the observers stopped")
		c.loops.Wait()
	}
	for _, c := range gcs {
		_ = c.Close()
	}
}
