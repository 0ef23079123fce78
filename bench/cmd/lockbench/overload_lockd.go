package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
)

// The overload run on lockd: every client is a raw WebSocket session
// (wsSession), so each refusal, Retry-After, lost push and cut is seen.

func runOverloadLockd(ctx context.Context, bin, dir string, o overloadOpts) (*overloadResult, error) {
	res := &overloadResult{System: "lockd"}
	flags := append([]string{"--log-level", "info", "--raft-log-level", "info"}, o.lockdFlags...)
	fmt.Fprintf(os.Stderr, "starting %d lockd members ...\n", o.members)
	lc, err := startLockd(ctx, bin, dir, o.members, flags)
	if err != nil {
		return res, err
	}
	defer lc.stop()
	leader, err := lc.leader(ctx)
	if err != nil {
		return res, err
	}
	ready := time.Now()
	ref := &leaderRef{lc: lc, m: leader, at: ready}
	mon := startMonitor(ctx, lockdProber(lc, true), o.sample)
	monDone := false
	finishMon := func() {
		if !monDone {
			monDone = true
			res.Samples = mon.finish()
		}
	}
	defer finishMon()

	// Every background loop (keepalives, renewals, burst) runs under actx
	// and is waited for through bg.
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	var bg sync.WaitGroup
	var toClose []*wsSession
	defer func() {
		acancel()
		bg.Wait()
		closeSessions(toClose)
	}()
	kaEvery := o.sessionTTL / 3
	ttlMs := o.sessionTTL.Milliseconds()

	// ---- baseline: closed loop, one session and one lock per worker ----
	floodSt := newRoleStats()
	workers := make([]*wsSession, o.workers)
	for i := range workers {
		workers[i] = &wsSession{ref: ref, clientID: fmt.Sprintf("ov-w-%d", i), ttlMs: ttlMs, st: floodSt}
	}
	toClose = append(toClose, workers...)
	if err := openSessions(ctx, workers, o.openParallel); err != nil {
		return res, fmt.Errorf("opening the workers' sessions: %w", err)
	}
	for i, s := range workers {
		bg.Go(func() { s.keepalives(actx, time.Now().Add(spread(i, len(workers), kaEvery)), kaEvery, ignoreKeepalive) })
	}
	rate, err := measureBaseline(ctx, o, res, func(cctx context.Context, w int) error {
		return lockdCycle(cctx, workers[w], fmt.Sprintf("ov-b-%d", w))
	})
	if err != nil {
		return res, err
	}

	// ---- the sessions that keep promises alive ----
	fmt.Fprintf(os.Stderr, "opening %d keepalive-only sessions, %d holders (%s), the burst's %d sessions and %d held locks ...\n",
		o.sessions, o.holders, probesWhere(o), o.burstConns, o.burstLocks)
	var keepers *promiseKeepers
	var probes *probesProcess
	if o.probesProcess {
		probes, err = startProbesProcess(ctx, lc.members, o)
		if err != nil {
			return res, err
		}
		defer probes.kill()
	} else {
		keepers, err = startPromiseKeepers(ctx, actx, ref, o, &bg)
		toClose = append(toClose, keepers.toClose...)
		if err != nil {
			return res, err
		}
	}

	var b *burst
	blockSt := newRoleStats()
	if o.burst > 0 {
		blocker := &wsSession{ref: ref, clientID: "ov-blocker", ttlMs: ttlMs, st: blockSt}
		toClose = append(toClose, blocker)
		zero := int64(0)
		if err := parallel(ctx, o.burstLocks, 16, func(j int) error {
			f, err := blocker.do(ctx, api.WSRequest{Op: api.OpAcquire, Lock: burstLock(j), WaitTimeoutMs: &zero})
			if err == nil && f.Type != api.TypeGranted {
				err = fmt.Errorf("acquire %s: %s", burstLock(j), f.Type)
			}
			return err
		}); err != nil {
			return res, fmt.Errorf("holding the burst's locks: %w", err)
		}
		bg.Go(func() { blocker.keepalives(actx, time.Now().Add(kaEvery), kaEvery, ignoreKeepalive) })
		b, err = openBurst(ctx, burstSpec{ref: ref, conns: o.burstConns, prefix: "ov-burst", waitMs: o.burstWait.Milliseconds(),
			ttl: o.sessionTTL, parallel: o.openParallel,
			namesOf: func(k int) []string { return burstNames(k, o.burstConns, o.burst, o.burstLocks, burstLock) }})
		if err != nil {
			return res, fmt.Errorf("opening the burst's sessions: %w", err)
		}
		defer b.close()
		bg.Go(func() { b.keepalive(actx, kaEvery)() })
	}

	// ---- the window ----
	t0 := time.Now().Add(200 * time.Millisecond)
	end := t0.Add(o.duration)
	mon.setZero(t0)
	resetPeaks(lc.pids())
	var histBefore map[string]wsHistogram
	histLeader, err := lc.leader(ctx)
	if err == nil {
		histBefore = readWSHistograms(ctx, histLeader.httpURL)
	}
	log := newCycleLog(t0, end)
	fmt.Fprintf(os.Stderr, "overload: %.0f cycles/s offered for %v; burst of %d at +%v ...\n", rate, o.duration, o.burst, o.burstAt)
	var started, skipped int64
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		started, skipped = openLoop(ctx, rate, t0, end, o.maxInFlight, func(k int64, due time.Time) {
			cctx, cancel := context.WithDeadline(ctx, due.Add(o.opTimeout))
			defer cancel()
			if err := lockdCycle(cctx, workers[k%int64(len(workers))], fmt.Sprintf("ov-f-%d", k)); err != nil {
				log.fail(errCode(err))
				return
			}
			log.done(due, time.Now())
		})
	}()
	if b != nil {
		if sleepCtx(ctx, time.Until(t0.Add(o.burstAt))) {
			fmt.Fprintf(os.Stderr, "burst: %d waits over %d sessions\n", o.burst, o.burstConns)
			wait := b.start(actx)
			bg.Go(wait)
		}
	}
	progressUntil(ctx, floodDone, t0, log, b)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	// The flood's last cycles are waited for (each bounded by
	// --op-timeout); the promises are kept up meanwhile.
	var held, waiting int64 = -1, -1
	if l, err := lc.leader(ctx); err == nil {
		held, waiting = tableMetrics(ctx, l.httpURL)
		if histLeader != nil && l.httpURL == histLeader.httpURL && histBefore != nil {
			res.ServerLatency = windowLatency(histBefore, readWSHistograms(ctx, l.httpURL))
		}
	}
	var kept probeReport
	if probes != nil {
		kept, err = probes.finish()
		if err != nil {
			return res, err
		}
	}
	acancel()
	bg.Wait()
	finishMon()
	if keepers != nil {
		kept = keepers.report(o)
	}
	sessSt, holdSt := kept.SessionStats.stats(), kept.HolderStats.stats()
	res.Notes = append(res.Notes, "keepalive-only sessions and holders ran "+probesWhere(o))

	res.Flood = floodOutcome(log, rate, started, skipped, res.C, o.duration, o.burstAt, b != nil)
	if b != nil {
		res.Burst = b.result(o.burstLocks, o.burstAt.Seconds(), waiting)
	}
	res.HeldAtEnd = held
	res.Sessions, res.Holders = kept.Sessions, kept.Holders
	roles := []roleSummary{floodSt.summary("flood"), sessSt.summary("keepalive sessions"), holdSt.summary("holders")}
	all := []*roleStats{floodSt, sessSt, holdSt}
	if b != nil {
		roles = append(roles, b.st.summary("burst"), blockSt.summary("burst locks' holder"))
		all = append(all, b.st, blockSt)
	}
	res.Roles, res.All = roles, mergeRoles("all", all...)
	res.Monitor = summarizeMonitor(res.Samples, o.duration.Seconds())
	for _, e := range electionsOf(lc) {
		if parseLogTime(e.At).After(ready) {
			res.ElectionsLog = append(res.ElectionsLog, e)
		}
	}
	return res, nil
}

// probesWhere says where the promise keepers run, for the report.
func probesWhere(o overloadOpts) string {
	if o.probesProcess {
		return "in a process of their own (--probes-process)"
	}
	return "in the bench's process, beside the flood (--probes-process=false)"
}

func burstLock(j int) string { return fmt.Sprintf("ov-q-%d", j) }

// spread is the i-th of n offsets spread over period, so n loops with the
// same period do not fire together.
func spread(i, n int, period time.Duration) time.Duration {
	return period * time.Duration(i) / time.Duration(max(n, 1))
}

func ignoreKeepalive(time.Time, time.Duration, error) {}

func openSessions(ctx context.Context, ss []*wsSession, k int) error {
	return parallel(ctx, len(ss), k, func(i int) error {
		_, err := ss[i].get(ctx)
		return err
	})
}

func closeSessions(ss []*wsSession) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, s := range ss {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); defer func() { <-sem }(); s.close() }()
	}
	wg.Wait()
}

// errCode names an error for the counts.
func errCode(err error) string {
	var e *apiErr
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled_by_bench"
	case errors.Is(err, errConnEnded):
		return "connection_ended"
	}
	return "transport"
}

// lockdCycle acquires name (no wait) and releases it, retrying refusals and
// cuts as a well-behaved client does, until ctx ends.
func lockdCycle(ctx context.Context, s *wsSession, name string) error {
	zero := int64(0)
	f, err := s.do(ctx, api.WSRequest{Op: api.OpAcquire, Lock: name, WaitTimeoutMs: &zero})
	if err != nil {
		return err
	}
	if f.Type != api.TypeGranted {
		return &apiErr{Code: "unexpected_" + f.Type}
	}
	runtime.Gosched() // behind what the network woke (see openLoop)
	_, err = s.do(ctx, api.WSRequest{Op: api.OpRelease, Lock: name, FencingToken: f.FencingToken})
	return err
}

// closedLoop runs n workers, each looping cycle(ctx, worker, k) for
// warmup+window, and counts the cycles that completed inside the window and
// the errors.
func closedLoop(ctx context.Context, n int, warmup, window, opTimeout time.Duration, cycle func(ctx context.Context, w int, k int64) error) (cycles, errs int64, err error) {
	mStart := time.Now().Add(warmup)
	end := mStart.Add(window)
	var c, e atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int64(0); ctx.Err() == nil && time.Now().Before(end); k++ {
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				err := cycle(cctx, w, k)
				cancel()
				if err != nil {
					e.Add(1)
					sleepCtx(ctx, 10*time.Millisecond)
					continue
				}
				if t := time.Now(); !t.Before(mStart) && t.Before(end) {
					c.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return c.Load(), e.Load(), ctx.Err()
}

// progressUntil prints the window's progress every 2 s until done closes.
func progressUntil(ctx context.Context, done <-chan struct{}, t0 time.Time, log *cycleLog, b *burst) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			fmt.Fprintln(os.Stderr)
			return
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
			log.mu.Lock()
			ok, failed := log.inWindow, int64(0)
			for _, v := range log.failed {
				failed += v
			}
			log.mu.Unlock()
			line := fmt.Sprintf("\r+%4.0fs cycles completed %d, failed %d", time.Since(t0).Seconds(), ok, failed)
			if b != nil {
				line += fmt.Sprintf("; burst sent %d", b.sent.Load())
			}
			fmt.Fprint(os.Stderr, line+"   ")
		}
	}
}

// lockdHolder holds one lock with a short TTL and renews it on a fixed
// schedule, whatever became of the previous renewals.
type lockdHolder struct {
	holder
	s    *wsSession
	lock string
}

func (h *lockdHolder) push(f wsFrame) {
	if f.Type == api.TypeLost && f.Lock == h.lock {
		h.lost(f.FencingToken, "lost push ("+f.Reason+")")
	}
}

// acquire takes the holder's lock (again), retrying until ctx ends.
func (h *lockdHolder) acquire(ctx context.Context) error {
	ttl, zero := h.ttl.Milliseconds(), int64(0)
	for attempt := 0; ; attempt++ {
		f, err := h.s.do(ctx, api.WSRequest{Op: api.OpAcquire, Lock: h.lock, TTLms: &ttl, WaitTimeoutMs: &zero})
		if err == nil && f.Type == api.TypeGranted {
			exp, _ := api.ParseTime(f.ExpiresAt)
			h.granted(f.FencingToken, f.at, exp)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !sleepCtx(ctx, backoffFor(nil, attempt)) {
			return ctx.Err()
		}
	}
}

// renewals sends a renew every period from first until ctx ends; a holder
// that lost its lock takes it again.
func (h *lockdHolder) renewals(ctx context.Context, first time.Time, every time.Duration) {
	h.holder.renewals(ctx, first, every, h.acquire, h.renew)
}

// renew sends one renewal of token and follows it to its answer: a
// refusal is retried after its Retry-After while the lease lasts, a cut on
// a new connection.
func (h *lockdHolder) renew(ctx context.Context, token uint64, against, sent time.Time) {
	ttl := h.ttl.Milliseconds()
	for attempt := 0; ; attempt++ {
		c, err := h.s.get(ctx)
		if err != nil {
			return
		}
		cctx, cancel := context.WithDeadline(ctx, later(against, time.Now()).Add(30*time.Second))
		f, err := c.call(cctx, api.WSRequest{Op: api.OpRenew, Lock: h.lock, FencingToken: token, TTLms: &ttl})
		cancel()
		if err == nil {
			exp, _ := api.ParseTime(f.ExpiresAt)
			h.acked(token, sent, f.at, exp)
			return
		}
		if ctx.Err() != nil {
			return
		}
		_, exp, held := h.book.current()
		var e *apiErr
		switch {
		case errors.As(err, &e):
			h.s.st.refused(e)
			switch {
			case e.Code == api.CodeNotHolder:
				h.lost(token, "renew answered not_holder")
				return
			case e.Code == api.CodeSessionExpired:
				h.s.expired(c)
				h.lost(token, "renew answered session_expired")
				return
			case e.Code == api.CodeNotLeader:
				h.s.ref.refresh(ctx)
			case !retryable(e.Code):
				h.t.add(func(t *holderTally) { t.failed[e.Code]++ })
				return
			}
			wait := backoffFor(e, attempt)
			if !held || time.Now().Add(wait).After(exp) {
				h.t.add(func(t *holderTally) { t.gaveUp++ })
				return
			}
			if !sleepCtx(ctx, wait) {
				return
			}
		case errors.Is(err, errConnEnded):
			if !held || time.Now().After(exp) {
				h.t.add(func(t *holderTally) { t.gaveUp++ })
				return
			}
		default:
			h.t.add(func(t *holderTally) { t.failed["no answer within 30 s of expiry"]++ })
			return
		}
		h.s.st.retried()
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// lockdProber reads every member: RSS from /proc; term, commit index and
// Raft state from /api/v1/status (served locally, cheap); with heap, the Go
// heap from /metrics (whose scrape also counts the lock table under the
// lock Apply takes: leave it off where the table is large).
func lockdProber(lc *lockdCluster, heap bool) prober {
	hc := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) []memberSample {
		out := make([]memberSample, len(lc.members))
		var wg sync.WaitGroup
		for i, m := range lc.members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := memberSample{Member: m.id}
				if p := m.p; p != nil && !p.exited() {
					rss, hwm := memKB(p.pid())
					s.RSSMiB, s.HWMMiB = float64(rss)/1024, float64(hwm)/1024
				}
				if st, err := nodeStatus(ctx, hc, m.httpURL); err == nil {
					s.OK = true
					s.Term, s.Commit, s.Leader = st.Term, st.CommitIndex, st.State == "Leader"
				}
				if heap {
					for _, x := range scrape(ctx, m.httpURL) {
						if x.name == "go_memstats_heap_inuse_bytes" {
							s.HeapMiB = x.value / (1 << 20)
						}
					}
				}
				out[i] = s
			}()
		}
		wg.Wait()
		return out
	}
}

// nodeStatus reads a member's own view (GET /api/v1/status).
func nodeStatus(ctx context.Context, hc *http.Client, base string) (api.NodeStatus, error) {
	var st api.NodeStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}
