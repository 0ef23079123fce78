package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The overload run on etcd, under the same offered load: etcd's lock
// (clientv3/concurrency.Mutex) for the cycles and the burst (a waiting
// Lock is a key under the lock's prefix and a watch on the key before it),
// leases for the sessions: a keepalive-only session is a lease kept alive
// with KeepAliveOnce every third of its TTL, a holder is a key on a lease of
// --holder-ttl renewed with KeepAliveOnce every --renew-every. etcd gives no
// Retry-After, so its refusals are retried with exponential backoff.

// etcdCode names an etcd error in lockd's terms where there is one:
// "too many requests" is etcd's overload refusal, "no leader", "leader
// changed" and "timed out due to leader failure" its no-leader answers.
func etcdCode(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled_by_bench"
	case errors.Is(err, rpctypes.ErrTooManyRequests):
		return "overloaded"
	case errors.Is(err, rpctypes.ErrNoSpace):
		return "resource_exhausted"
	case errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrLeaderChanged), errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail):
		return "no_leader"
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return "lease_not_found"
	case errors.Is(err, rpctypes.ErrTimeout):
		return "etcd_request_timeout"
	case errors.Is(err, concurrency.ErrSessionExpired):
		return "session_expired"
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		if ee.Code() == codes.ResourceExhausted {
			return "resource_exhausted"
		}
		return "etcd_" + strings.ReplaceAll(strings.TrimPrefix(ee.Error(), "etcdserver: "), " ", "_")
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return "grpc_" + s.Code().String()
	}
	return "transport"
}

// etcdRetryable: the request may be sent again after a backoff.
func etcdRetryable(code string) bool {
	switch code {
	case "overloaded", "resource_exhausted", "no_leader", "etcd_request_timeout", "grpc_Unavailable":
		return true
	}
	return false
}

// etcdRefused records err in st and reports whether to retry it.
func etcdRefused(st *roleStats, err error) bool {
	code := etcdCode(err)
	if code == "timeout" || code == "cancelled_by_bench" {
		return false
	}
	st.refused(&apiErr{Code: code, Msg: err.Error()})
	return etcdRetryable(code)
}

// etcdDo runs f until it succeeds, fails for good, or ctx ends, backing
// off exponentially between retryable failures.
func etcdDo(ctx context.Context, st *roleStats, f func(ctx context.Context) error) error {
	for attempt := 0; ; attempt++ {
		err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !etcdRefused(st, err) {
			return err
		}
		if !sleepCtx(ctx, backoffFor(nil, attempt)) {
			return err
		}
		st.retried()
	}
}

func etcdCycle(ctx context.Context, st *roleStats, s *concurrency.Session, key string) error {
	m := concurrency.NewMutex(s, key)
	if err := etcdDo(ctx, st, m.Lock); err != nil {
		return err
	}
	return etcdDo(ctx, st, m.Unlock)
}

func runOverloadEtcd(ctx context.Context, dir string, o overloadOpts) (*overloadResult, error) {
	res := &overloadResult{System: "etcd", NotMeasured: []string{notMeasuredRetryAfter, notMeasuredCuts,
		"time from winning an election to serving: etcd logs no such line at the bench's log level; elections are counted from each member's raft term"}}
	res.Notes = append(res.Notes, "etcd's \"too many requests\" is counted as overloaded and \"no leader\", \"leader changed\" and \"timed out due to leader failure\" as no_leader;"+
		" a holder's lease expiry is taken from the client's side (send time of the acknowledged keepalive + its TTL), a lower bound of etcd's own")
	fmt.Fprintf(os.Stderr, "starting %d etcd members ...\n", o.members)
	ec, err := startEtcd(ctx, dir, o.members)
	if err != nil {
		return res, err
	}
	defer ec.stop()
	leader, err := ec.leader(ctx)
	if err != nil {
		return res, err
	}
	probe, closeProbe, err := etcdProber(ec)
	if err != nil {
		return res, err
	}
	defer closeProbe()
	mon := startMonitor(ctx, probe, o.sample)
	monDone := false
	finishMon := func() {
		if !monDone {
			monDone = true
			res.Samples = mon.finish()
		}
	}
	defer finishMon()

	// Clients talk to the leader (followers would forward), as lockd's do.
	var clients []*clientv3.Client
	newClient := func() (*clientv3.Client, error) {
		c, err := newEtcdClient([]string{leader.clientURL})
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}
	// Waiting Locks that are cancelled delete their key with the client's
	// own context: closing the clients first makes the teardown quick.
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	var bg sync.WaitGroup
	ttlSec := max(int(o.sessionTTL/time.Second), 1)
	kaEvery := o.sessionTTL / 3

	// ---- baseline ----
	floodSt := newRoleStats()
	fc, err := newClient()
	if err != nil {
		return res, err
	}
	sessions := make([]*concurrency.Session, o.workers)
	if err := parallel(ctx, o.workers, o.openParallel, func(i int) error {
		s, err := concurrency.NewSession(fc, concurrency.WithTTL(ttlSec))
		sessions[i] = s
		return err
	}); err != nil {
		return res, fmt.Errorf("etcd sessions: %w", err)
	}
	rate, err := measureBaseline(ctx, o, res, func(cctx context.Context, w int) error {
		return etcdCycle(cctx, floodSt, sessions[w], fmt.Sprintf("/ov/b/%d", w))
	})
	if err != nil {
		return res, err
	}

	// ---- keepalive-only sessions: leases kept alive by hand, timed ----
	fmt.Fprintf(os.Stderr, "granting %d keepalive-only leases, %d holders' leases, the burst's %d sessions and %d held locks ...\n",
		o.sessions, o.holders, o.burstConns, o.burstLocks)
	sessSt, sessT := newRoleStats(), newSessionTally()
	kc, err := newClient()
	if err != nil {
		return res, err
	}
	for i := 0; i < o.sessions; i++ {
		lease, err := kc.Grant(ctx, int64(ttlSec))
		if err != nil {
			return res, fmt.Errorf("etcd lease: %w", err)
		}
		id := lease.ID
		bg.Go(func() {
			etcdKeepalives(actx, kc, &id, int64(ttlSec), time.Now().Add(spread(i, o.sessions, kaEvery)), kaEvery, sessSt,
				func(lat time.Duration, err error) {
					sessT.mu.Lock()
					defer sessT.mu.Unlock()
					switch {
					case err == nil:
						sessT.acked++
						sessT.lat.record(lat)
					case errors.Is(err, rpctypes.ErrLeaseNotFound):
						sessT.lost++
						sessT.failed[etcdCode(err)]++
					default:
						sessT.failed[etcdCode(err)]++
					}
				})
		})
	}

	// ---- holders: a key on a short lease, renewed on schedule ----
	holdSt, holdT := newRoleStats(), newHolderTally()
	hc, err := newClient()
	if err != nil {
		return res, err
	}
	for i := 0; i < o.holders; i++ {
		h := &etcdHolder{holder: holder{ttl: o.holderTTL, t: holdT}, c: hc, key: fmt.Sprintf("/ov/h/%d", i), st: holdSt}
		if err := h.acquire(ctx); err != nil {
			return res, fmt.Errorf("etcd holder: %w", err)
		}
		bg.Go(func() { h.renewals(actx, time.Now().Add(spread(i, o.holders, o.renewEvery)), o.renewEvery) })
	}

	// ---- the burst: held locks and sessions to wait on them ----
	burstSt, blockSt := newRoleStats(), newRoleStats()
	var burstSess []*concurrency.Session
	if o.burst > 0 {
		bc, err := newClient()
		if err != nil {
			return res, err
		}
		blocker, err := concurrency.NewSession(bc, concurrency.WithTTL(ttlSec))
		if err != nil {
			return res, err
		}
		if err := parallel(ctx, o.burstLocks, 16, func(j int) error {
			return etcdDo(ctx, blockSt, concurrency.NewMutex(blocker, etcdBurstLock(j)).Lock)
		}); err != nil {
			return res, fmt.Errorf("holding the burst's locks: %w", err)
		}
		burstSess = make([]*concurrency.Session, o.burstConns)
		if err := parallel(ctx, o.burstConns, o.openParallel, func(k int) error {
			c, err := newEtcdClient([]string{leader.clientURL})
			if err != nil {
				return err
			}
			s, err := concurrency.NewSession(c, concurrency.WithTTL(ttlSec))
			if err != nil {
				c.Close()
				return err
			}
			burstSess[k] = s
			return nil
		}); err != nil {
			return res, fmt.Errorf("the burst's sessions: %w", err)
		}
		for _, s := range burstSess {
			if s != nil {
				clients = append(clients, s.Client())
			}
		}
	}

	// ---- the window ----
	t0 := time.Now().Add(200 * time.Millisecond)
	end := t0.Add(o.duration)
	mon.setZero(t0)
	resetPeaks(ec.pids())
	log := newCycleLog(t0, end)
	fmt.Fprintf(os.Stderr, "overload: %.0f cycles/s offered for %v; burst of %d at +%v ...\n", rate, o.duration, o.burst, o.burstAt)
	var started, skipped int64
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		started, skipped = openLoop(ctx, rate, t0, end, o.maxInFlight, func(k int64, due time.Time) {
			cctx, cancel := context.WithDeadline(ctx, due.Add(o.opTimeout))
			defer cancel()
			if err := etcdCycle(cctx, floodSt, sessions[k%int64(len(sessions))], fmt.Sprintf("/ov/f/%d", k)); err != nil {
				log.fail(etcdCode(err))
				return
			}
			log.done(due, time.Now())
		})
	}()
	var bsent, bgranted atomic.Int64
	var stopping atomic.Bool
	bended := map[string]int64{}
	var bmu sync.Mutex
	var bStart, bDone time.Time
	if o.burst > 0 && sleepCtx(ctx, time.Until(t0.Add(o.burstAt))) {
		fmt.Fprintf(os.Stderr, "burst: %d waits over %d sessions\n", o.burst, o.burstConns)
		bStart = time.Now()
		for k, s := range burstSess {
			for _, key := range burstNames(k, o.burstConns, o.burst, o.burstLocks, etcdBurstLock) {
				bsent.Add(1)
				bg.Go(func() {
					err := etcdDo(actx, burstSt, func(ctx context.Context) error {
						err := concurrency.NewMutex(s, key).Lock(ctx)
						if stopping.Load() {
							return context.Canceled // the run ended: not an answer
						}
						return err
					})
					if actx.Err() != nil || stopping.Load() {
						return
					}
					bmu.Lock()
					defer bmu.Unlock()
					if err == nil {
						bgranted.Add(1)
					} else {
						bended[etcdCode(err)]++
					}
				})
			}
		}
		bDone = time.Now()
	}
	progressUntil(ctx, floodDone, t0, log, nil)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	var queued int64 = -1
	if o.burst > 0 {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if r, err := fc.Get(qctx, "/ov/q/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil {
			queued = r.Count - int64(o.burstLocks)
		}
		cancel()
	}
	// The burst's waiting Locks end first, by closing their clients (a
	// cancelled wait would delete its key through the server, one request
	// per wait); what they answer then is not counted.
	stopping.Store(true)
	for _, s := range burstSess {
		if s != nil {
			s.Client().Close()
		}
	}
	acancel()
	bg.Wait()
	finishMon()

	res.Flood = floodOutcome(log, rate, started, skipped, res.C, o.duration, o.burstAt, o.burst > 0)
	if o.burst > 0 {
		bmu.Lock()
		res.Burst = burstResult{Waits: o.burst, Conns: o.burstConns, Locks: o.burstLocks, AtSeconds: o.burstAt.Seconds(),
			SendSeconds: bDone.Sub(bStart).Seconds(), Sent: bsent.Load(), Retried: burstSt.summary("").Retries,
			Granted: bgranted.Load(), Ended: sortedCounts(bended), Queued: queued}
		bmu.Unlock()
		res.Notes = append(res.Notes, "burst: every wait is a concurrency.Mutex.Lock in its own goroutine (a key under the lock's prefix and a watch on the key before it); \"queued\" counts the waiters' keys under the burst's prefixes at the end of the window; send time is the time to start them")
	}
	res.Sessions = sessT.result(o.sessions, o.sessionTTL, kaEvery)
	res.Holders = holdT.result(o.holders, o.holderTTL, o.renewEvery)
	res.Roles = []roleSummary{floodSt.summary("flood"), sessSt.summary("keepalive sessions"), holdSt.summary("holders")}
	all := []*roleStats{floodSt, sessSt, holdSt}
	if o.burst > 0 {
		res.Roles = append(res.Roles, burstSt.summary("burst"), blockSt.summary("burst locks' holder"))
		all = append(all, burstSt, blockSt)
	}
	res.All = mergeRoles("all", all...)
	res.Monitor = summarizeMonitor(res.Samples, o.duration.Seconds())
	return res, nil
}

func etcdBurstLock(j int) string { return fmt.Sprintf("/ov/q/%d", j) }

// etcdKeepalives keeps the lease *id alive with KeepAliveOnce every period
// from first, each on time in its own goroutine; a lease found gone is
// reported and replaced by a new one.
func etcdKeepalives(ctx context.Context, c *clientv3.Client, id *clientv3.LeaseID, ttlSec int64, first time.Time, every time.Duration, st *roleStats, report func(time.Duration, error)) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	for t := first; ; t = t.Add(every) {
		if !sleepCtx(ctx, time.Until(t)) {
			return
		}
		wg.Add(1)
		go func(sent time.Time) {
			defer wg.Done()
			mu.Lock()
			lease := *id
			mu.Unlock()
			kctx, cancel := context.WithDeadline(ctx, sent.Add(time.Duration(ttlSec)*time.Second))
			defer cancel()
			t0 := time.Now()
			err := etcdDo(kctx, st, func(ctx context.Context) error {
				_, err := c.KeepAliveOnce(ctx, lease)
				return err
			})
			if ctx.Err() != nil {
				return
			}
			report(time.Since(t0), err)
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				if l, gerr := c.Grant(ctx, ttlSec); gerr == nil {
					mu.Lock()
					if *id == lease {
						*id = l.ID
					}
					mu.Unlock()
				}
			}
		}(t)
	}
}

// etcdHolder is a key on a short lease, the lease renewed on a schedule.
type etcdHolder struct {
	holder
	c   *clientv3.Client
	key string
	st  *roleStats
}

func (h *etcdHolder) acquire(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		l, err := h.c.Grant(ctx, int64(h.ttl/time.Second))
		if err == nil {
			_, err = h.c.Put(ctx, h.key, "held", clientv3.WithLease(l.ID))
		}
		if err == nil {
			h.granted(uint64(l.ID), time.Now(), sent.Add(time.Duration(l.TTL)*time.Second))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		etcdRefused(h.st, err)
		if !sleepCtx(ctx, backoffFor(nil, attempt)) {
			return ctx.Err()
		}
	}
}

func (h *etcdHolder) renewals(ctx context.Context, first time.Time, every time.Duration) {
	h.holder.renewals(ctx, first, every, h.acquire, h.renew)
}

// renew sends one KeepAliveOnce of the lease token and follows it to its
// answer, retrying a refusal with backoff while the lease lasts.
func (h *etcdHolder) renew(ctx context.Context, token uint64, _, due time.Time) {
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := h.c.KeepAliveOnce(rctx, clientv3.LeaseID(token))
		cancel()
		if err == nil {
			h.acked(token, due, time.Now(), sent.Add(time.Duration(resp.TTL)*time.Second))
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			h.st.refused(&apiErr{Code: etcdCode(err)})
			h.lost(token, "keepalive answered lease not found")
			return
		}
		retry := etcdRefused(h.st, err)
		_, exp, held := h.book.current()
		wait := backoffFor(nil, attempt)
		if !retry || !held || time.Now().Add(wait).After(exp) {
			h.t.add(func(t *holderTally) {
				if retry {
					t.gaveUp++
				} else {
					t.failed[etcdCode(err)]++
				}
			})
			return
		}
		if !sleepCtx(ctx, wait) {
			return
		}
		h.st.retried()
	}
}

// etcdProber reads every member: RSS from /proc, term, raft index and
// leadership from Status, the Go heap from its /metrics.
func etcdProber(ec *etcdCluster) (prober, func(), error) {
	cs := make([]*clientv3.Client, len(ec.members))
	closeAll := func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}
	for i, m := range ec.members {
		c, err := newEtcdClient([]string{m.clientURL})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		cs[i] = c
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) []memberSample {
		out := make([]memberSample, len(ec.members))
		var wg sync.WaitGroup
		for i, m := range ec.members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := memberSample{Member: m.name}
				if p := m.p; p != nil && !p.exited() {
					rss, hwm := memKB(p.pid())
					s.RSSMiB, s.HWMMiB = float64(rss)/1024, float64(hwm)/1024
				}
				if st, err := cs[i].Status(ctx, m.clientURL); err == nil {
					s.OK = true
					s.Term, s.Commit = st.RaftTerm, st.RaftIndex
					s.Leader = st.Leader != 0 && st.Leader == st.Header.MemberId
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.clientURL+"/metrics", nil)
				if resp, err := hc.Do(req); err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					for _, l := range strings.Split(string(b), "\n") {
						if x, ok := parsePromLine(l); ok && x.name == "go_memstats_heap_inuse_bytes" {
							s.HeapMiB = x.value / (1 << 20)
						}
					}
				}
				out[i] = s
			}()
		}
		wg.Wait()
		return out
	}, closeAll, nil
}
