package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/server"
)

// WorkloadOptions size the clients.
type WorkloadOptions struct {
	Endpoints []string
	Fence     string // fencestore URL; "" writes nothing
	Seed      uint64
	// Raw HTTP lock workers, Go-client (WebSocket session) workers and
	// linearizable readers. The FIFO prober and the long-lease keeper run
	// when their flags are set.
	HTTPWorkers, ClientWorkers, Readers int
	FIFO, Keeper                        bool
	// Hasty HTTP workers give up on acquires, renews and releases a few
	// milliseconds after sending them (mid-commit), then walk away;
	// Cancellers do the same through the Go client with cancelled
	// contexts. Scenarios runs renew-racing-release and
	// try-acquire-while-queued rounds. Probe lists every lock with state
	// now and then, so a lock held past its expiry is seen.
	Hasty, Cancellers int
	Scenarios, Probe  bool
	// Lock kinds (kinds_workload_test.go): KindsHTTP raw HTTP and KindsWS
	// raw WebSocket workers taking shared and exclusive grants of
	// read-write locks, permits of semaphores and multi-acquires;
	// DelayRounds runs lock-delay rounds; Revoker revokes held grants now
	// and then.
	KindsHTTP, KindsWS   int
	DelayRounds, Revoker bool
	// Withdraw plays cancel rounds (cancel_workload_test.go): waits over
	// HTTP and WebSocket, single and multi-acquires, withdrawn by a cancel.
	Withdraw bool
	// Elections and watches (elect_workload_test.go): candidates over raw
	// WebSocket (leadership bound to the session, or to a TTL), raw HTTP
	// (a TTL) and the Go client (Election); observers: raw WebSocket
	// watchers of the election prefix and of single election locks, HTTP
	// blocking queries, and a Go client (WatchPrefix, Election.Observe).
	// Observers outlive the other workers: they stop at StopObservers,
	// after the final state was read.
	ElectWS, ElectHTTP, ElectClient        int
	PrefixWatchers, LockWatchers, Blockers int
	ClientObserver                         bool
	// WSRetry raw WebSocket clients re-send a waiting acquire with a
	// shorter wait; Churners HTTP clients take and free a few locks as
	// fast as they can while ChurnWatchers raw WebSocket watchers start
	// watch after watch of them (retrywatch_workload_test.go).
	WSRetry, Churners, ChurnWatchers int
	// Flood HTTP generators each start floodRate acquire-and-release
	// cycles a second on flood locks, open loop; FloodBurst sends bursts
	// of waits over WebSocket now and then (flood_workload_test.go): the
	// overload phase.
	Flood      int
	FloodBurst bool
	// ElectionTimeout is the members' election timeout (0: lockd's
	// default): waits that must outlast an expiry are sized with it.
	ElectionTimeout time.Duration
	// Epoch is how long one set of lock names is used; LocksPerEpoch how
	// many. Rotating names keeps each porcupine partition short.
	Epoch         time.Duration
	LocksPerEpoch int
}

// Workload runs lock clients against a cluster and records every
// operation.
type Workload struct {
	via  string // Op.Via of the raw HTTP ops
	opts WorkloadOptions
	rec  *Recorder
	hc   *http.Client
	t0   time.Time

	keeperLock atomic.Value // string
	fifoLock   atomic.Value // string

	mu      sync.Mutex
	clients []*client.Client
	held    map[*client.Lock][2]string // Go-client locks not lost yet → worker, client id

	// Lock kinds: grants the revoker may pick (token → grant), raw
	// WebSocket clients to close at the end, list snapshot ids.
	kmu     sync.Mutex
	kheld   map[uint64]kindHeld
	kgone   []kindHeld // grants held lately, released or not
	kws     []*kwsClient
	snapSeq atomic.Int64

	// Elections and watches: the election epoch frozen when the
	// candidates stopped (1 + epoch; 0: it follows the clock), and the
	// observers, which run until StopObservers.
	electFrozen atomic.Int64
	obs         observers

	// watchers record when Lost() closes for each Go-client grant;
	// closingAt is when Run began closing the clients (history time, 0
	// before), the moment holders stopped counting on what they held.
	watchers  sync.WaitGroup
	closingAt atomic.Int64

	flood floodStats // the overload phase's flood (not in the history)
}

var errRedirectLoop = errors.New("too many redirects")

// NewWorkload prepares a workload; Run starts it.
func NewWorkload(rec *Recorder, opts WorkloadOptions) *Workload {
	tr := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}
	w := &Workload{via: "http", opts: opts, rec: rec, t0: time.Now(),
		hc: &http.Client{Transport: tr, CheckRedirect: func(_ *http.Request, via []*http.Request) error {
			if len(via) >= 4 {
				return errRedirectLoop
			}
			return nil
		}}}
	w.keeperLock.Store("")
	w.fifoLock.Store("")
	w.obs.ctx, w.obs.cancel = context.WithCancel(context.Background())
	return w
}

// Run runs every worker until ctx ends, then closes the Go clients — after
// every worker and reader stopped, because closing a client ends its
// session and releases its locks, which no recorded read must see.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	spawn := func(f func(ctx context.Context, rng *rand.Rand), n uint64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx, rand.New(rand.NewPCG(w.opts.Seed, n)))
		}()
	}
	for i := 0; i < w.opts.HTTPWorkers; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.httpWorker(ctx, id, rng) }, uint64(100+i))
	}
	for i := 0; i < w.opts.ClientWorkers; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.clientWorker(ctx, id, rng) }, uint64(200+i))
	}
	for i := 0; i < w.opts.Readers; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.reader(ctx, id, rng) }, uint64(300+i))
	}
	if w.opts.FIFO {
		spawn(w.fifoProber, 400)
	}
	if w.opts.Keeper {
		spawn(w.keeper, 500)
	}
	for i := 0; i < w.opts.Hasty; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.hastyWorker(ctx, id, rng) }, uint64(600+i))
	}
	for i := 0; i < w.opts.Cancellers; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.cancelWorker(ctx, id, rng) }, uint64(700+i))
	}
	if w.opts.Scenarios {
		spawn(w.scenarios, 800)
	}
	if w.opts.Probe {
		spawn(w.probe, 900)
	}
	for i := 0; i < w.opts.KindsHTTP; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.kindsHTTPWorker(ctx, id, rng) }, uint64(1000+i))
	}
	for i := 0; i < w.opts.KindsWS; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.kindsWSWorker(ctx, id, rng) }, uint64(1100+i))
	}
	if w.opts.DelayRounds {
		spawn(w.delayRounds, 1200)
	}
	if w.opts.Revoker {
		spawn(w.revoker, 1300)
	}
	for i := 0; i < w.opts.WSRetry; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.wsRetryWorker(ctx, id, rng) }, uint64(2100+i))
	}
	for i := 0; i < w.opts.Churners; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.churner(ctx, id, rng) }, uint64(2200+i))
	}
	for i := 0; i < w.opts.ChurnWatchers; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.churnWatcher(ctx, id, rng) }, uint64(2300+i))
	}
	if w.opts.Withdraw {
		spawn(w.wdRounds, 1400)
	}
	for i := 0; i < w.opts.Flood; i++ {
		id := i
		spawn(func(ctx context.Context, rng *rand.Rand) { w.floodHTTP(ctx, id, rng) }, uint64(2400+i))
	}
	if w.opts.FloodBurst {
		spawn(w.floodBurst, 2500)
	}
	w.startElections(ctx, spawn)
	wg.Wait()
	w.freezeElections()
	w.closeKWS()
	w.mu.Lock()
	cs := w.clients
	w.clients = nil
	held := w.held
	w.held = nil
	w.mu.Unlock()
	closing := max(w.rec.Now(), 1)
	w.closingAt.Store(closing)
	for _, c := range cs {
		_ = c.Close()
	}
	// Close deletes each session, which releases its locks: a release
	// whose outcome is unknown (the delete may not have reached the
	// leader), sent when the closing began.
	for l, who := range held {
		w.rec.Add(Op{Worker: who[0], Via: "client", Kind: KindRelease, Lock: l.Name(), ClientID: who[1], Token: l.Token(),
			Invoke: closing, Return: w.rec.Now(), Outcome: Unknown, Err: "the client closed: its session deleted"})
	}
	w.watchers.Wait()
	w.hc.CloseIdleConnections()
}

func (w *Workload) electionTimeout() time.Duration {
	if w.opts.ElectionTimeout > 0 {
		return w.opts.ElectionTimeout
	}
	return server.DefaultElectionTimeout
}

func (w *Workload) lockName(rng *rand.Rand) string {
	epoch := int(time.Since(w.t0) / w.opts.Epoch)
	return fmt.Sprintf("e%d-l%d", epoch, rng.IntN(w.opts.LocksPerEpoch))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func jitter(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// expiryLB is the earliest moment a grant made by a request sent at inv
// with ttl can end on its own: the leader stamps the command when it
// proposes it, which is after the request was sent.
func expiryLB(inv int64, ttl time.Duration) int64 {
	return inv + int64(ttl) - int64(clockMargin(ttl))
}

// reply is the classified answer to one HTTP request.
type reply struct {
	status     int
	body       []byte
	outcome    Outcome
	code       string
	err        string
	gaveUp     bool          // the call's own timeout ran out, no reply read
	retryAfter time.Duration // Retry-After of an admission refusal
}

// endpoint keeps a worker's guess of the leader.
type endpoint struct {
	hint string
	next int
}

// call sends one request to the leader (following 307s), trying other
// members when a connection is refused — nothing was sent then. The
// outcome: Ok for 2xx; Fail with the code for a SPEC refusal (409), or
// without a code when no member took the request; Unknown for everything
// that may have been proposed (timeouts, resets, 503, 5xx).
func (w *Workload) call(ctx context.Context, ep *endpoint, method, path string, body any, timeout time.Duration) reply {
	var payload []byte
	if body != nil {
		payload, _ = json.Marshal(body)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	eps := w.opts.Endpoints
	var last reply
	for try := 0; try < len(eps)+1; try++ {
		base := ep.hint
		if base == "" {
			base = eps[ep.next%len(eps)]
			ep.next++
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(payload))
		if err != nil {
			return reply{outcome: Fail, err: err.Error()}
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := w.hc.Do(req)
		if err != nil {
			ep.hint = ""
			if notSent(err) && ctx.Err() == nil {
				last = reply{outcome: Fail, err: err.Error()}
				continue
			}
			return reply{outcome: Unknown, err: err.Error(), gaveUp: gaveUp(ctx, parent)}
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := reply{status: resp.StatusCode, body: b}
		if rerr != nil {
			r.outcome, r.err, r.gaveUp = Unknown, rerr.Error(), gaveUp(ctx, parent)
			return r
		}
		var er api.ErrorReply
		_ = json.Unmarshal(b, &er)
		r.code = er.Error.Code
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			r.outcome, r.code = Ok, ""
			ep.hint = resp.Request.URL.Scheme + "://" + resp.Request.URL.Host
		case resp.StatusCode == 409:
			r.outcome = Fail
			ep.hint = resp.Request.URL.Scheme + "://" + resp.Request.URL.Host
		case resp.StatusCode == 503 && er.Error.Code == api.CodeOverloaded,
			resp.StatusCode == 429 && er.Error.Code == api.CodeResourceExhausted:
			// Refused before anything was proposed (admission control, or
			// a quota): definite, and a refusal for now carries when to
			// come back.
			r.outcome = Fail
			if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
				r.retryAfter = time.Duration(ra) * time.Second
			}
			ep.hint = resp.Request.URL.Scheme + "://" + resp.Request.URL.Host
		case resp.StatusCode == 503 && strings.HasPrefix(er.Error.Message, "no leader"):
			// Answered before anything was proposed: this member knows no
			// leader, or it leads but is not ready (docs/API.md: a 503 after
			// a proposal says that the outcome is unknown instead).
			r.outcome, r.code, r.err = Fail, "", "503 "+er.Error.Message
			ep.hint = ""
		case resp.StatusCode == 503:
			r.outcome = Unknown
			ep.hint = ""
		case resp.StatusCode == 400 || resp.StatusCode == 500:
			r.outcome = Unknown // flagged by checkReplies through the code
		default:
			r.outcome, r.code = Unknown, "unexpected"
		}
		return r
	}
	return last
}

// gaveUp reports that a call's own timeout ended it, not its caller.
func gaveUp(ctx, parent context.Context) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil
}

// notSent reports a transport error that proves no member received the
// request: a refused dial (to the first member or to the redirect target),
// or a redirect loop (a 307 proposes nothing).
func notSent(err error) bool {
	if errors.Is(err, errRedirectLoop) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func lockPath(name, op string) string {
	p := "/api/v1/locks/" + url.PathEscape(name)
	if op != "" {
		p += "/" + op
	}
	return p
}

// acquire sends one acquire and records it.
func (w *Workload) acquire(ctx context.Context, ep *endpoint, worker, lock, cid string, attempt int64, ttl, wait time.Duration, tag string) Op {
	return w.acquireWithin(ctx, ep, worker, lock, cid, attempt, ttl, wait, tag, wait+2500*time.Millisecond)
}

// acquireWithin is acquire with the client's own timeout.
func (w *Workload) acquireWithin(ctx context.Context, ep *endpoint, worker, lock, cid string, attempt int64, ttl, wait time.Duration, tag string, timeout time.Duration) Op {
	return w.acquireKind(ctx, ep, worker, lock, cid, attempt, ttl, wait, kindOpts{}, tag, timeout)
}

// acquireKind is acquireWithin with the lock-kind fields of ko.
func (w *Workload) acquireKind(ctx context.Context, ep *endpoint, worker, lock, cid string, attempt int64, ttl, wait time.Duration, ko kindOpts, tag string, timeout time.Duration) Op {
	ttlMs, waitMs := ttl.Milliseconds(), wait.Milliseconds()
	op := Op{Worker: worker, Via: w.via, Kind: KindAcquire, Lock: lock, ClientID: cid, Attempt: attempt,
		TTLms: ttlMs, WaitMs: waitMs, Tag: tag, Mode: ko.Mode, Limit: ko.Limit, DelayMs: ko.DelayMs, Value: ko.Value, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodPost, lockPath(lock, "acquire"), ko.request(cid, &ttlMs, &waitMs), timeout)
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome != Fail {
		op.ExpiryLB = expiryLB(op.Invoke, ttl)
	}
	var ar api.AcquireReply
	perr := json.Unmarshal(r.body, &ar)
	switch {
	case op.Outcome == Ok && (perr != nil || !ar.Acquired || ar.FencingToken == 0):
		// A 200 that is not a grant: a protocol bug (flagged by
		// checkReplies); whether the client holds the lock is unknown.
		op.Outcome, op.Code = Unknown, "unexpected"
		op.Err = fmt.Sprintf("200 without a grant: %q", r.body)
	case op.Outcome == Ok:
		op.OutToken = ar.FencingToken
		op.ExpiresAt = w.wallTime(ar.ExpiresAt)
		if isKind(lock) {
			op.GrantMode = ar.Mode
		}
	case r.status == 409 && perr == nil:
		op.Holder = ar.Holder
		if ar.Error != nil {
			op.Code = ar.Error.Code
		}
	}
	return w.rec.Add(op)
}

func (op *Op) fill(r reply) {
	op.Outcome, op.Code, op.Status, op.Err, op.GaveUp = r.outcome, r.code, r.status, r.err, r.gaveUp
	op.RetryAfterMs = r.retryAfter.Milliseconds()
}

// refusedForNow reports an admission refusal (overloaded, or a client's
// or token's share in use): nothing was proposed, and the request may be
// sent again after its retry delay.
func refusedForNow(op Op) bool {
	return op.Outcome == Fail && (op.Code == api.CodeOverloaded || (op.Code == api.CodeResourceExhausted && op.RetryAfterMs > 0))
}

// wallTime converts a SPEC time from the server (its wall clock) to history
// time; 0 for none or an unreadable one.
func (w *Workload) wallTime(s string) int64 {
	t, err := api.ParseTime(s)
	if err != nil || t.IsZero() {
		return 0
	}
	return w.rec.At(t)
}

// definite reports whether an op's outcome is known.
func definite(op Op) bool { return op.Outcome == Ok || op.Outcome == Fail && op.Code != "" }

// acquireChain retries one logical acquire (same client id, so the server
// treats the retries as one) until its outcome is definite or d passes.
func (w *Workload) acquireChain(ctx context.Context, ep *endpoint, rng *rand.Rand, worker, lock, cid string, ttl, wait time.Duration, tag string, d time.Duration) Op {
	attempt := w.rec.NewAttempt()
	return retryChain(ctx, rng, d, func() Op {
		return w.acquire(ctx, ep, worker, lock, cid, attempt, ttl, wait, tag)
	})
}

// retryChain repeats try until its outcome is definite or d passes, pausing
// between tries (until ctx ends).
func retryChain(ctx context.Context, rng *rand.Rand, d time.Duration, try func() Op) Op {
	deadline := time.Now().Add(d)
	unknowns := 0
	for {
		op := try()
		if refusedForNow(op) && !time.Now().After(deadline) {
			// Nothing was proposed; come back when the member said to.
			if !sleep(ctx, time.Duration(op.RetryAfterMs)*time.Millisecond+jitter(rng, 0, 100*time.Millisecond)) {
				return op
			}
			continue
		}
		if definite(op) || time.Now().After(deadline) {
			return op
		}
		pause := jitter(rng, 50*time.Millisecond, 150*time.Millisecond)
		if op.Outcome == Unknown {
			// Each unknown outcome stays open in the history until its
			// end (it may take effect late), and many open ones make the
			// linearizability search explode: give up after a few.
			if unknowns++; unknowns >= maxUnknownRetries {
				return op
			}
			pause = jitter(rng, 200*time.Millisecond, 500*time.Millisecond)
		}
		if !sleep(ctx, pause) {
			return op
		}
	}
}

// maxUnknownRetries bounds the unknown outcomes of one retry chain.
const maxUnknownRetries = 3

func (w *Workload) release(ctx context.Context, ep *endpoint, worker, lock, cid string, token uint64, tag string) Op {
	return w.releaseWithin(ctx, ep, worker, lock, cid, token, tag, 2500*time.Millisecond)
}

// releaseWithin is release with the client's own timeout.
func (w *Workload) releaseWithin(ctx context.Context, ep *endpoint, worker, lock, cid string, token uint64, tag string, timeout time.Duration) Op {
	op := Op{Worker: worker, Via: w.via, Kind: KindRelease, Lock: lock, ClientID: cid, Token: token, Tag: tag, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodPost, lockPath(lock, "release"), api.ReleaseRequest{ClientID: cid, FencingToken: token}, timeout)
	op.Return = w.rec.Now()
	op.fill(r)
	var rr api.ReleaseReply
	if op.Outcome == Ok && (json.Unmarshal(r.body, &rr) != nil || !rr.Released) {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("200 that is not a release: %q", r.body)
	}
	return w.rec.Add(op)
}

// releaseChain retries a release until its outcome is definite (release
// is idempotent for the client that released).
func (w *Workload) releaseChain(ctx context.Context, ep *endpoint, rng *rand.Rand, worker, lock, cid string, token uint64, tag string) Op {
	ctx = context.WithoutCancel(ctx) // a release is seen through to its outcome
	return retryChain(ctx, rng, 6*time.Second, func() Op {
		return w.release(ctx, ep, worker, lock, cid, token, tag)
	})
}

func (w *Workload) renew(ctx context.Context, ep *endpoint, worker, lock, cid string, token uint64, ttl time.Duration, tag string) Op {
	return w.renewWithin(ctx, ep, worker, lock, cid, token, ttl, tag, 2500*time.Millisecond)
}

// renewWithin is renew with the client's own timeout.
func (w *Workload) renewWithin(ctx context.Context, ep *endpoint, worker, lock, cid string, token uint64, ttl time.Duration, tag string, timeout time.Duration) Op {
	ttlMs := ttl.Milliseconds()
	op := Op{Worker: worker, Via: w.via, Kind: KindRenew, Lock: lock, ClientID: cid, Token: token, TTLms: ttlMs, Tag: tag, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodPost, lockPath(lock, "renew"), api.RenewRequest{ClientID: cid, FencingToken: token, TTLms: &ttlMs}, timeout)
	op.Return = w.rec.Now()
	op.fill(r)
	if op.Outcome != Fail {
		op.ExpiryLB = expiryLB(op.Invoke, ttl)
	}
	var rr api.RenewReply
	if op.Outcome == Ok && (json.Unmarshal(r.body, &rr) != nil || !rr.Renewed) {
		op.Outcome, op.Code, op.Err = Unknown, "unexpected", fmt.Sprintf("200 that is not a renewal: %q", r.body)
	}
	if op.Outcome == Ok {
		op.ExpiresAt = w.wallTime(rr.ExpiresAt)
	}
	return w.rec.Add(op)
}

func (w *Workload) read(ctx context.Context, ep *endpoint, worker, lock, tag string) Op {
	op := Op{Worker: worker, Via: w.via, Kind: KindRead, Lock: lock, Tag: tag, Invoke: w.rec.Now()}
	r := w.call(ctx, ep, http.MethodGet, lockPath(lock, ""), nil, 2500*time.Millisecond)
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

// fillStatus records a lock's status in op: holder, token, waiters,
// expires_at, value and index; for a kinds or election lock (or with all)
// also what it says of its kind: mode, limit, every holder with its
// value, the end of a running lock-delay.
func (w *Workload) fillStatus(op *Op, st api.LockStatus, all bool) {
	op.Held, op.Holder, op.OutToken, op.Waiters = st.Held, st.ClientID, st.FencingToken, st.Waiters
	op.ExpiresAt = w.wallTime(st.ExpiresAt)
	op.Index, op.Value = st.Index, st.Value
	if !all && !isKind(st.Lock) && !isElect(st.Lock) {
		return
	}
	op.Mode, op.Limit, op.DelayedUntil = st.Mode, st.Limit, w.wallTime(st.DelayedUntil)
	for _, x := range st.Holders {
		op.Holders = append(op.Holders, HolderRec{Client: x.ClientID, Token: x.FencingToken,
			ExpiresAt: w.wallTime(x.ExpiresAt), Mode: x.Mode, Value: x.Value})
	}
}

// fenceWrite writes to the fencestore object named after the lock with
// the holder's token.
func (w *Workload) fenceWrite(ctx context.Context, worker, lock, cid string, token uint64) {
	if w.opts.Fence == "" {
		return
	}
	op := Op{Worker: worker, Via: w.via, Kind: KindFence, Lock: lock, ClientID: cid, Token: token, Invoke: w.rec.Now()}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, w.opts.Fence+"/v1/objects/"+url.PathEscape(lock),
		bytes.NewReader([]byte(cid+" "+strconv.FormatUint(token, 10))))
	req.Header.Set(client.HeaderFencingToken, strconv.FormatUint(token, 10))
	req.Header.Set(client.HeaderFencingLock, lock)
	resp, err := w.hc.Do(req)
	op.Return = w.rec.Now()
	if err != nil {
		op.Outcome, op.Err = Unknown, err.Error()
		w.rec.Add(op)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	op.Return = w.rec.Now()
	op.Status = resp.StatusCode
	switch resp.StatusCode {
	case 200:
		op.Outcome = Ok
	case 409:
		var sr struct {
			Error   api.Error `json:"error"`
			Highest uint64    `json:"highest_token"`
		}
		_ = json.Unmarshal(b, &sr)
		op.Outcome, op.Code, op.OutToken = Fail, sr.Error.Code, sr.Highest
	default:
		op.Outcome, op.Code = Unknown, "unexpected"
	}
	w.rec.Add(op)
}

// httpWorker acquires random locks of the current epoch over the raw HTTP
// API, holds them a little (fencestore writes, renews, reads), and releases
// them — or lets them expire, or keeps writing past its TTL as a paused
// client would (the fencestore must then refuse it once a newer holder
// wrote).
func (w *Workload) httpWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("http%d", id)
	ep := &endpoint{next: id}
	for seq := 0; ctx.Err() == nil; seq++ {
		lock := w.lockName(rng)
		cid := fmt.Sprintf("h%d-%d", id, seq) // fresh per attempt chain
		ttl := jitter(rng, 800*time.Millisecond, 3*time.Second)
		var wait time.Duration
		if rng.IntN(2) == 0 {
			wait = jitter(rng, 200*time.Millisecond, 1500*time.Millisecond)
		}
		op := w.acquireChain(ctx, ep, rng, name, lock, cid, ttl, wait, "", 8*time.Second)
		if op.Outcome != Ok {
			sleep(ctx, jitter(rng, 0, 50*time.Millisecond))
			continue
		}
		w.hold(ctx, ep, rng, name, op, ttl, wait > 0)
		sleep(ctx, jitter(rng, 0, 30*time.Millisecond))
	}
}

func (w *Workload) hold(ctx context.Context, ep *endpoint, rng *rand.Rand, name string, g Op, ttl time.Duration, waited bool) {
	lock, cid, tok := g.Lock, g.ClientID, g.OutToken
	until := g.ExpiryLB
	if waited {
		// A wait may have eaten most of the TTL counted from the acquire's
		// send time; a renew now gives the hold a fresh bound.
		if r := w.renew(ctx, ep, name, lock, cid, tok, ttl, ""); r.Outcome == Ok {
			until = r.ExpiryLB
		}
	}
	for steps := rng.IntN(4); steps > 0 && ctx.Err() == nil; steps-- {
		if w.rec.Now() > until-int64(150*time.Millisecond) {
			break
		}
		switch rng.IntN(4) {
		case 0, 1:
			w.fenceWrite(ctx, name, lock, cid, tok)
		case 2:
			if r := w.renew(ctx, ep, name, lock, cid, tok, ttl, ""); r.Outcome == Ok {
				until = max(until, r.ExpiryLB)
			}
		case 3:
			w.read(ctx, ep, name, lock, "")
		}
		sleep(ctx, jitter(rng, 10*time.Millisecond, 120*time.Millisecond))
	}
	switch p := rng.Float64(); {
	case p < 0.8:
		w.releaseChain(ctx, ep, rng, name, lock, cid, tok, "")
	case p < 0.9:
		// Let it expire.
	default:
		// A zombie: keeps working past its lease, as after a long pause.
		if d := time.Duration(until-w.rec.Now()) + 50*time.Millisecond; d < 3*time.Second {
			sleep(ctx, d)
		}
		w.fenceWrite(ctx, name, lock, cid, tok)
		w.releaseChain(ctx, ep, rng, name, lock, cid, tok, "")
	}
}

// reader sends linearizable reads of the locks in use.
func (w *Workload) reader(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("reader%d", id)
	ep := &endpoint{next: id}
	for ctx.Err() == nil {
		lock := w.lockName(rng)
		switch p := rng.IntN(10); {
		case p == 0 && w.keeperLock.Load().(string) != "":
			lock = w.keeperLock.Load().(string)
		case p == 1 && w.fifoLock.Load().(string) != "":
			lock = w.fifoLock.Load().(string)
		}
		w.read(ctx, ep, name, lock, "")
		sleep(ctx, jitter(rng, 5*time.Millisecond, 40*time.Millisecond))
	}
}

// keeper holds one lock at a time for about 15 s with a short TTL and
// regular renews, through whatever the nemesis does: a lock that must
// survive failovers, readable by everyone.
func (w *Workload) keeper(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	const ttl = 5 * time.Second
	for k := 1; ctx.Err() == nil; k++ {
		lock := fmt.Sprintf("keeper-%d", k)
		cid := lock + "-c"
		w.keeperLock.Store(lock)
		g := w.acquireChain(ctx, ep, rng, "keeper", lock, cid, ttl, 0, "", 10*time.Second)
		if g.Outcome != Ok {
			continue
		}
		for i := 0; i < 12 && sleep(ctx, 1200*time.Millisecond); i++ {
			r := w.renew(ctx, ep, "keeper", lock, cid, g.OutToken, ttl, "")
			for j := 0; j < 5 && !definite(r) && ctx.Err() == nil; j++ {
				r = w.renew(ctx, ep, "keeper", lock, cid, g.OutToken, ttl, "")
			}
			if r.Code == "not_holder" {
				break
			}
			if i%3 == 0 {
				w.fenceWrite(ctx, "keeper", lock, cid, g.OutToken)
			}
		}
		w.releaseChain(ctx, ep, rng, "keeper", lock, cid, g.OutToken, "")
	}
}

// fifoProber runs FIFO rounds (see checkFIFO): a holder takes a fresh lock,
// waiters queue one by one, each confirmed queued by a linearizable read
// before the next is sent; then the holder releases and the waiters take
// the lock in turn.
func (w *Workload) fifoProber(ctx context.Context, rng *rand.Rand) {
	ep := &endpoint{}
	for round := 1; ctx.Err() == nil; round++ {
		lock := fmt.Sprintf("fifo-%d", round)
		w.fifoLock.Store(lock)
		tag := func(s string) string { return fmt.Sprintf("fifo:%d:%s", round, s) }
		holder := lock + "-h"
		h := w.acquireChain(ctx, ep, rng, "fifo", lock, holder, 8*time.Second, 0, tag("holder"), 5*time.Second)
		if h.Outcome != Ok {
			continue
		}
		var wg sync.WaitGroup
		for j := 1; j <= 3 && ctx.Err() == nil; j++ {
			wid := fmt.Sprintf("%s-w%d", lock, j)
			wg.Add(1)
			go func() {
				defer wg.Done()
				wrng := rand.New(rand.NewPCG(uint64(round), uint64(j)))
				wep := &endpoint{next: j}
				name := fmt.Sprintf("fifo-w%d", j)
				const ttl = 2 * time.Second
				g := w.acquireChain(ctx, wep, wrng, name, lock, wid, ttl, 15*time.Second, tag(fmt.Sprintf("w%d", j)), 20*time.Second)
				if g.Outcome != Ok {
					return
				}
				w.renew(ctx, wep, name, lock, wid, g.OutToken, ttl, "")
				time.Sleep(20 * time.Millisecond)
				w.releaseChain(ctx, wep, wrng, name, lock, wid, g.OutToken, "")
			}()
			confirmed := false
			for deadline := time.Now().Add(3 * time.Second); !confirmed && time.Now().Before(deadline) && ctx.Err() == nil; {
				r := w.read(ctx, ep, "fifo", lock, tag("confirm"))
				confirmed = r.Outcome == Ok && r.Held && r.Holder == holder && r.Waiters == j
				if !confirmed {
					sleep(ctx, 30*time.Millisecond)
				}
			}
			if !confirmed {
				break
			}
		}
		w.releaseChain(ctx, ep, rng, "fifo", lock, holder, h.OutToken, tag("release"))
		wg.Wait()
		sleep(ctx, jitter(rng, 100*time.Millisecond, 500*time.Millisecond))
	}
}

// clientWorker does the same through the public Go client: one session
// over WebSocket, locks with a TTL of their own (or, one time in four,
// bound to the session alone).
func (w *Workload) clientWorker(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("client%d", id)
	c := w.newClient(ctx, fmt.Sprintf("ws%d", id))
	if c == nil {
		return
	}
	pending := map[string]int64{} // lock → attempt of an acquire whose outcome is unknown
	for ctx.Err() == nil {
		lock := w.lockName(rng)
		ttl := jitter(rng, time.Second, 3*time.Second)
		if rng.IntN(4) == 0 {
			ttl = 0 // bound to the session only: its keepalives keep it
		}
		try := rng.IntN(5) < 2
		var wait time.Duration
		if !try {
			wait = jitter(rng, 200*time.Millisecond, 1500*time.Millisecond)
		}
		attempt, ok := pending[lock]
		if !ok {
			attempt = w.rec.NewAttempt()
		}
		actx, cancel := context.WithTimeout(ctx, wait+4*time.Second)
		op, l, sent := w.clientAcquire(ctx, actx, name, c, lock, attempt, ttl, wait, try)
		cancel()
		if !sent {
			continue
		}
		if op.Outcome == Unknown {
			pending[lock] = attempt
			sleep(ctx, jitter(rng, 50*time.Millisecond, 200*time.Millisecond))
			continue
		}
		delete(pending, lock)
		if op.Outcome != Ok {
			sleep(ctx, jitter(rng, 0, 50*time.Millisecond))
			continue
		}
		w.clientHold(ctx, rng, name, c, l, ttl)
		sleep(ctx, jitter(rng, 0, 30*time.Millisecond))
	}
}

// newClient opens a Go client (a session over WebSocket), retrying until
// ctx ends; Run closes it. nil when ctx ended first.
func (w *Workload) newClient(ctx context.Context, id string) *client.Client {
	return w.newClientWith(ctx, id, 10*time.Second, true)
}

// newClientWith is newClient with the session's TTL; an untracked client
// is closed by its owner, not by Run.
func (w *Workload) newClientWith(ctx context.Context, id string, ttl time.Duration, track bool) *client.Client {
	for ctx.Err() == nil {
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := client.New(nctx, client.Config{Endpoints: append([]string(nil), w.opts.Endpoints...),
			ClientID: id, SessionTTL: ttl})
		cancel()
		if err == nil && ctx.Err() != nil {
			_ = c.Close()
			return nil
		}
		if err == nil {
			if track {
				w.mu.Lock()
				w.clients = append(w.clients, c)
				w.mu.Unlock()
			}
			return c
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return nil
}

// clientAcquire acquires lock through the Go client within actx (run is
// the run's context) and records it. ttl 0: bound to the session only.
// sent is false when the client refused locally and nothing was recorded.
func (w *Workload) clientAcquire(run, actx context.Context, name string, c *client.Client, lock string, attempt int64,
	ttl, wait time.Duration, try bool) (op Op, l *client.Lock, sent bool) {
	cid := c.ClientID()
	op = Op{Worker: name, Via: "client", Kind: KindAcquire, Lock: lock, ClientID: cid, Attempt: attempt,
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds(), Invoke: w.rec.Now()}
	var err error
	opts := []client.AcquireOption{}
	if ttl > 0 {
		opts = append(opts, client.WithTTL(ttl))
	}
	if try {
		l, err = c.TryAcquire(actx, lock, opts...)
	} else {
		l, err = c.Acquire(actx, lock, append(opts, client.WithWaitTimeout(wait))...)
	}
	op.Return = w.rec.Now()
	var se *client.ServerError
	switch {
	case err == nil:
		op.Outcome, op.OutToken = Ok, l.Token()
		op.ExpiryLB = w.rec.At(l.Deadline())
		if ttl > 0 {
			op.ExpiryLB = min(op.ExpiryLB, expiryLB(op.Invoke, ttl))
		}
		if exp := l.ExpiresAt(); !exp.IsZero() {
			op.ExpiresAt = w.rec.At(exp)
		}
		w.watchLost(name, cid, l)
	case errors.Is(err, client.ErrMaybeGrantedLost):
		// Re-sent after a reconnect: the first send may have been
		// granted and lost while the client was away.
		op.Outcome, op.Err = Unknown, err.Error()
	case errors.As(err, &se) && (se.API.Code == api.CodeLockHeld || se.API.Code == api.CodeWaitTimeout):
		op.Outcome, op.Code, op.Holder = Fail, se.API.Code, se.Holder
	case errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrClosed):
		// Refused locally ("already held or awaited by this client"):
		// nothing was sent.
		return op, nil, false
	default:
		// The client may still get the grant and hand it back by itself
		// (an abandoned wait), so it may end at any moment: no bound.
		op.Outcome, op.Err = Unknown, err.Error()
		if errors.As(err, &se) {
			op.Code = se.API.Code
		}
		op.GaveUp = clientGaveUp(run, err)
	}
	return w.rec.Add(op), l, true
}

func (w *Workload) clientHold(ctx context.Context, rng *rand.Rand, name string, c *client.Client, l *client.Lock, ttl time.Duration) {
	for steps := rng.IntN(3); steps > 0 && ctx.Err() == nil && l.Err() == nil; steps-- {
		if rng.IntN(2) == 0 || ttl == 0 {
			w.fenceWrite(ctx, name, l.Name(), c.ClientID(), l.Token())
		} else {
			w.clientRenew(ctx, name, c, l, ttl, 3*time.Second)
		}
		sleep(ctx, jitter(rng, 10*time.Millisecond, 100*time.Millisecond))
	}
	if l.Err() != nil {
		return // lost: nothing to release
	}
	w.clientRelease(context.WithoutCancel(ctx), name, c, l, 5*time.Second)
}

// clientRenew renews l to ttl within timeout and records it.
func (w *Workload) clientRenew(ctx context.Context, name string, c *client.Client, l *client.Lock, ttl, timeout time.Duration) Op {
	op := Op{Worker: name, Via: "client", Kind: KindRenew, Lock: l.Name(), ClientID: c.ClientID(), Token: l.Token(),
		TTLms: ttl.Milliseconds(), Invoke: w.rec.Now()}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	err := l.Renew(rctx, ttl)
	cancel()
	op.Return = w.rec.Now()
	var se *client.ServerError
	switch {
	case err == nil:
		op.Outcome = Ok
		op.ExpiryLB = min(expiryLB(op.Invoke, ttl), w.rec.At(l.Deadline()))
		if exp := l.ExpiresAt(); !exp.IsZero() {
			op.ExpiresAt = w.rec.At(exp)
		}
	case errors.As(err, &se) && se.API.Code == api.CodeNotHolder:
		op.Outcome, op.Code = Fail, se.API.Code
	default:
		// An unconfirmed renew does not move the client's lease, and
		// the client ends the grant by its lease: no new bound.
		op.Outcome, op.Err = Unknown, err.Error()
		op.GaveUp = clientGaveUp(ctx, err)
	}
	return w.rec.Add(op)
}

// clientRelease releases l within timeout and records it.
func (w *Workload) clientRelease(ctx context.Context, name string, c *client.Client, l *client.Lock, timeout time.Duration) Op {
	op := Op{Worker: name, Via: "client", Kind: KindRelease, Lock: l.Name(), ClientID: c.ClientID(), Token: l.Token(), Invoke: w.rec.Now()}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	err := l.Release(rctx)
	cancel()
	op.Return = w.rec.Now()
	var se *client.ServerError
	switch {
	case err == nil:
		op.Outcome = Ok
	case errors.As(err, &se) && se.API.Code == api.CodeNotHolder:
		op.Outcome, op.Code = Fail, se.API.Code
	default:
		op.Outcome, op.Err = Unknown, err.Error()
		op.GaveUp = clientGaveUp(ctx, err)
	}
	return w.rec.Add(op)
}

// clientGaveUp reports that a Go-client call ended because the caller's
// own timeout ran out, or the client stopped waiting for an answer to a
// wait on its own — not a refusal, a lost connection or the run's end.
func clientGaveUp(run context.Context, err error) bool {
	var se *client.ServerError
	if run.Err() != nil || errors.As(err, &se) {
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrWaitTimeout)
}

// watchLost records when the lock's Lost() closes (a KindLost op): the
// holder counts on the lock until then, or until it sends a release, or
// until Run begins closing the clients (then Invoke is that moment).
func (w *Workload) watchLost(worker, cid string, l *client.Lock) {
	w.mu.Lock()
	if w.held == nil {
		w.held = map[*client.Lock][2]string{}
	}
	w.held[l] = [2]string{worker, cid}
	w.mu.Unlock()
	w.watchers.Add(1)
	go func() {
		defer w.watchers.Done()
		<-l.Lost()
		now := w.rec.Now()
		w.mu.Lock()
		delete(w.held, l)
		w.mu.Unlock()
		op := Op{Worker: worker, Via: "client", Kind: KindLost, Lock: l.Name(), ClientID: cid, Token: l.Token(),
			Invoke: now, Return: now, Outcome: Ok}
		if c := w.closingAt.Load(); c != 0 && c < now {
			op.Invoke = c
		}
		if err := l.Err(); err != nil {
			op.Err = err.Error()
		}
		w.rec.Add(op)
	}()
}
