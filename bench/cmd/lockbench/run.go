package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// workload is one of the workloads.
type workload struct {
	Key     string `json:"key"`
	Desc    string `json:"desc"`
	Clients int    `json:"clients"` // sessions opened (each with keepalives)
	Lockers int    `json:"lockers"` // of them, how many loop acquire → release
	Hot     bool   `json:"hot"`     // every locker on one lock
}

var allWorkloads = []workload{
	{Key: "a", Desc: "1 client, 1 lock", Clients: 1, Lockers: 1},
	{Key: "b", Desc: "32 clients, 32 locks", Clients: 32, Lockers: 32},
	{Key: "c", Desc: "32 clients, 1 hot lock", Clients: 32, Lockers: 32, Hot: true},
	{Key: "d", Desc: "256 clients, 256 locks", Clients: 256, Lockers: 256},
	{Key: "e", Desc: "1000 sessions, 10% locking", Clients: 1000, Lockers: 100},
}

// latency is a summary of one HdrHistogram, in milliseconds.
type latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	Mean  float64 `json:"mean_ms"`
}

func newHist() *hdr.Histogram { return hdr.New(1, 120_000_000, 3) } // µs, up to 2 min

func summarize(h *hdr.Histogram) latency {
	ms := func(v int64) float64 { return float64(v) / 1000 }
	return latency{
		Count: h.TotalCount(),
		P50:   ms(h.ValueAtQuantile(50)),
		P99:   ms(h.ValueAtQuantile(99)),
		Max:   ms(h.Max()),
		Mean:  h.Mean() / 1000,
	}
}

// runResult is one measured run: one system, one setup, one client setup,
// one workload, one round.
type runResult struct {
	System       string  `json:"system"`
	Setup        string  `json:"setup"`
	Clients      string  `json:"clients"`  // per-worker or shared
	Sessions     int     `json:"sessions"` // sessions the workers held
	Workload     string  `json:"workload"`
	Round        int     `json:"round"`
	Seconds      float64 `json:"seconds"` // measured window
	Cycles       int64   `json:"cycles"`  // releases completed inside the window
	CyclesPerSec float64 `json:"cycles_per_sec"`
	Acquire      latency `json:"acquire"`
	Release      latency `json:"release"`
	ServerCPU    float64 `json:"server_cpu_seconds"` // all members, inside the window
	LeaderCPU    float64 `json:"leader_cpu_seconds"`
	ClientCPU    float64 `json:"client_cpu_seconds"` // this process (all clients)
	// OtherCPU is CPU the rest of the machine used inside the window
	// (other workers on a shared machine): a noise indicator.
	OtherCPU     float64 `json:"other_cpu_seconds"`
	CPUPer1k     float64 `json:"server_cpu_seconds_per_1k_cycles"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error,omitempty"`
	SetupSeconds float64 `json:"setup_seconds"` // opening the sessions
	// lockd only, from the leader's /metrics over the window: commands per
	// Raft log entry (group commit) and log entries per StoreLogs (one
	// bolt transaction, two fdatasyncs).
	CommandsPerEntry float64 `json:"commands_per_raft_entry,omitempty"`
	EntriesPerStore  float64 `json:"raft_entries_per_store,omitempty"`
	StoresPerSec     float64 `json:"raft_stores_per_sec,omitempty"`
	// Breakdown: lockd only, the commit latency stage by stage over the
	// window, from every member's /metrics (nil when the leader changed).
	Breakdown *commitBreakdown `json:"commit_breakdown,omitempty"`
	// The leader's read- and write-family system calls and context
	// switches (all threads) inside the window, from /proc.
	LeaderReads  int64 `json:"leader_read_syscalls"`
	LeaderWrites int64 `json:"leader_write_syscalls"`
	LeaderCtxSw  int64 `json:"leader_context_switches"`

	acqH, relH *hdr.Histogram
}

// preparer is a system whose locks need something made before they are
// used (ZooKeeper: the lock's parent node); runOne calls it before the clock
// starts.
type preparer interface {
	prepare(ctx context.Context, runID string, names []string) error
}

type runOpts struct {
	warmup, duration time.Duration
	opTimeout        time.Duration
	prog             *progress
	// hook, if set, runs with the leader's pid over the measured window.
	hook func(ctx context.Context, sys system, wl workload, setup, clients string, leaderPID int, d time.Duration)
}

type lockerStats struct {
	acq, rel *hdr.Histogram
	cycles   int64
	errs     int64
	firstErr error
}

var runSeq int

// runsShared reports whether wl has a shared-client run: a workload with
// idle sessions (e) is about holding many sessions, which one shared
// session is not.
func runsShared(wl workload) bool { return wl.Clients == wl.Lockers }

// runOne opens the workload's sessions on sys (per-worker: one per client
// of the workload; shared: one for all its lockers), lets every locker loop
// acquire → release for warmup+duration, and measures the window after the
// warmup.
func runOne(ctx context.Context, sys system, wl workload, setup, clients string, round int, o runOpts) (*runResult, error) {
	runSeq++
	runID := fmt.Sprintf("%s%d%c%c%d", wl.Key, round, setup[0], clients[0], runSeq)
	shared := clients == clientsShared
	n, sessions := wl.Clients, wl.Clients
	if shared {
		n, sessions = wl.Lockers, 1
	}
	names := make([]string, wl.Lockers)
	for i := range names {
		names[i] = fmt.Sprintf("lb-%s-%d", runID, i)
		if wl.Hot {
			names[i] = "lb-" + runID + "-hot"
		}
	}
	t0 := time.Now()
	ws, closeShared, err := sys.workers(ctx, n, setup, shared, runID)
	if err != nil {
		return nil, fmt.Errorf("%s %s (%s, %s): opening %d sessions: %w", sys.name(), wl.Key, setup, clients, sessions, err)
	}
	defer closeShared()
	defer closeParallel(ws)
	if p, ok := sys.(preparer); ok {
		if err := p.prepare(ctx, runID, slices.Compact(slices.Clone(names))); err != nil {
			return nil, fmt.Errorf("%s %s (%s, %s): preparing the locks: %w", sys.name(), wl.Key, setup, clients, err)
		}
	}
	setupSec := time.Since(t0).Seconds()

	pids := sys.serverPIDs()
	leader := sys.leaderPID(ctx)
	self := os.Getpid()

	start := time.Now()
	mStart := start.Add(o.warmup)
	end := mStart.Add(o.duration)
	o.prog.startRun(fmt.Sprintf("%s %-6s %-10s %s r%d", wl.Key, setup, clients, sys.name(), round), o.warmup+o.duration)

	// Every op is bounded; the run as a whole ends at most 30 s after end.
	runCtx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()

	stats := make([]*lockerStats, wl.Lockers)
	var wg sync.WaitGroup
	for i := 0; i < wl.Lockers; i++ {
		st := &lockerStats{acq: newHist(), rel: newHist()}
		stats[i] = st
		name := names[i]
		w := ws[i*(n/wl.Lockers)] // lockers spread over the sessions
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) {
				st.errs++
				if st.firstErr == nil {
					st.firstErr = err
				}
				time.Sleep(10 * time.Millisecond)
			}
			for runCtx.Err() == nil && time.Now().Before(end) {
				opCtx, opCancel := context.WithTimeout(runCtx, o.opTimeout)
				a0 := time.Now()
				err := w.lock(opCtx, name)
				a1 := time.Now()
				if err != nil {
					opCancel()
					fail(fmt.Errorf("acquire: %w", err))
					continue
				}
				err = w.unlock(opCtx)
				a2 := time.Now()
				opCancel()
				if a1.After(mStart) && !a1.After(end) {
					st.acq.RecordValue(max(a1.Sub(a0).Microseconds(), 1))
				}
				if err != nil {
					fail(fmt.Errorf("release: %w", err))
					continue
				}
				if a2.After(mStart) && !a2.After(end) {
					st.rel.RecordValue(max(a2.Sub(a1).Microseconds(), 1))
					st.cycles++
				}
			}
		}()
	}

	// CPU at the edges of the measured window.
	var cpu0, cpu1, lcpu0, lcpu1, scpu0, scpu1, m0, m1 float64
	sleepUntil(ctx, mStart)
	// CPU first: the leader's /metrics can take longer than a quick run's
	// window to answer under load, and a reading after it would measure
	// nothing.
	cpu0, lcpu0, scpu0, m0 = sumCPU(pids), sumCPU([]int{leader}), sumCPU([]int{self}), machineBusy()
	rd0, wr0, cs0, pcOK0 := procCounters(leader)
	lm0 := snapshotLockd(ctx, sys)
	hookDone := make(chan struct{})
	if o.hook != nil {
		go func() {
			defer close(hookDone)
			o.hook(ctx, sys, wl, setup, clients, leader, o.duration)
		}()
	} else {
		close(hookDone)
	}
	sleepUntil(ctx, end)
	cpu1, lcpu1, scpu1, m1 = sumCPU(pids), sumCPU([]int{leader}), sumCPU([]int{self}), machineBusy()
	rd1, wr1, cs1, pcOK1 := procCounters(leader)
	lm1 := snapshotLockd(ctx, sys)
	wg.Wait()
	<-hookDone
	o.prog.endRun()

	r := &runResult{
		System: sys.name(), Setup: setup, Clients: clients, Sessions: sessions, Workload: wl.Key, Round: round,
		Seconds:   o.duration.Seconds(),
		ServerCPU: cpu1 - cpu0, LeaderCPU: lcpu1 - lcpu0, ClientCPU: scpu1 - scpu0,
		OtherCPU:     max((m1-m0)-(cpu1-cpu0)-(scpu1-scpu0), 0),
		SetupSeconds: setupSec,
		acqH:         newHist(), relH: newHist(),
	}
	for _, st := range stats {
		r.acqH.Merge(st.acq)
		r.relH.Merge(st.rel)
		r.Cycles += st.cycles
		r.Errors += st.errs
		if st.firstErr != nil && r.FirstError == "" {
			r.FirstError = st.firstErr.Error()
		}
	}
	r.CommandsPerEntry, r.EntriesPerStore, r.StoresPerSec = groupCommit(lm0, lm1, o.duration.Seconds())
	r.Breakdown = breakdown(lm0, lm1)
	if pcOK0 && pcOK1 && leader != 0 {
		r.LeaderReads, r.LeaderWrites, r.LeaderCtxSw = rd1-rd0, wr1-wr0, cs1-cs0
	}
	r.finish()
	return r, ctx.Err()
}

func (r *runResult) finish() {
	r.CyclesPerSec = float64(r.Cycles) / r.Seconds
	r.Acquire, r.Release = summarize(r.acqH), summarize(r.relH)
	if r.Cycles > 0 {
		r.CPUPer1k = r.ServerCPU / float64(r.Cycles) * 1000
	}
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}
