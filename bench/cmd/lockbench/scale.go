package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
)

// The scale benchmark: one lockd cluster filled with --locks held locks
// (plain HTTP acquires with a 24 h TTL, from many concurrent clients) and
// --waiters queued acquires (WebSocket sessions, each waiting on held locks),
// measuring on the way the cost of one acquire+release as the table grows,
// then memory per member, a snapshot of the full table, and a restart of
// every member from its snapshot.

type scalePoint struct {
	Held          int64   `json:"held_locks"`
	Cycles        int     `json:"cycles"`
	AcquireP50    float64 `json:"acquire_p50_ms"`
	AcquireP99    float64 `json:"acquire_p99_ms"`
	AcquireMean   float64 `json:"acquire_mean_ms"`
	ReleaseP50    float64 `json:"release_p50_ms"`
	LeaderCPUms   float64 `json:"leader_cpu_ms_per_cycle"`
	ServerCPUms   float64 `json:"server_cpu_ms_per_cycle"`
	LeaderRSSMiB  float64 `json:"leader_rss_mib"`
	LoadRate      float64 `json:"load_rate_per_sec"` // acquires/s while loading up to this point
	OtherCPUShare float64 `json:"other_cpu_share"`
}

type memberMem struct {
	ID     string  `json:"id"`
	Leader bool    `json:"leader"`
	RSSMiB float64 `json:"rss_mib"`
	HWMMiB float64 `json:"peak_rss_mib"`
}

type snapEvent struct {
	Member string `json:"member"`
	Index  uint64 `json:"index"`
	// Persist: hashicorp/raft's "starting snapshot" → "snapshot complete",
	// i.e. writing and syncing the encoded table (logged after the FSM
	// captured it).
	Persist float64 `json:"persist_seconds"`
	// Took: lockd's own "snapshot taken ... took=", from the start of the
	// FSM capture (the table encoded while applies wait) to the end of
	// Persist; 0 when this lockd does not log it.
	Took      float64 `json:"took_seconds,omitempty"`
	Locks     int64   `json:"locks,omitempty"`
	SizeBytes int64   `json:"size_bytes,omitempty"`
	At        string  `json:"at"`
}

// total is the snapshot's whole time as well as it is known.
func (e snapEvent) total() float64 {
	if e.Took > 0 {
		return e.Took
	}
	return e.Persist
}

type restartResult struct {
	StopSeconds      float64            `json:"stop_seconds"`       // SIGTERM of all members → all exited
	ReadySeconds     float64            `json:"ready_seconds"`      // start of all members → every /readyz 200
	FirstReadSeconds float64            `json:"first_read_seconds"` // start → first linearizable GET of a held lock answered
	RestoreSeconds   map[string]float64 `json:"restore_seconds"`    // per member: process start → "restored from snapshot"
	SnapshotBytes    map[string]int64   `json:"restored_snapshot_bytes"`
	LeaderReadyAfter string             `json:"leader_ready_after"` // the new leader's own "ready_after" (barrier + timer rebuild)
	RestoredLocks    int64              `json:"restored_locks_all_members"`
	HeldAfter        int64              `json:"held_after"`
	WaitersAfter     int64              `json:"waiters_after"`
	MemoryAfter      []memberMem        `json:"memory_after"`
}

type scaleReport struct {
	Started     time.Time      `json:"started"`
	Finished    time.Time      `json:"finished"`
	Host        hostInfo       `json:"host"`
	Members     int            `json:"members"`
	Locks       int64          `json:"locks"`
	Waiters     int64          `json:"waiters"`
	LoadSeconds float64        `json:"load_seconds"`
	LoadRate    float64        `json:"load_rate_per_sec"`
	WaitSeconds float64        `json:"waiters_load_seconds"`
	LockdFlags  []string       `json:"lockd_flags"`
	Sweep       []scalePoint   `json:"sweep"`
	MemoryHeld  []memberMem    `json:"memory_with_held_locks"`
	MemoryFull  []memberMem    `json:"memory_with_held_and_waiters"`
	HeldMetric  int64          `json:"held_metric"`
	WaitMetric  int64          `json:"waiters_metric"`
	Snapshots   []snapEvent    `json:"snapshots"`
	Final       []snapEvent    `json:"final_snapshot"` // per member, the first snapshot covering all locks and waiters
	Restart     *restartResult `json:"restart,omitempty"`
	Errors      int64          `json:"load_errors"`
	// SnapshotNudges: acquire+release cycles run after loading until every
	// member's snapshot threshold (in log entries) was crossed.
	SnapshotNudges int        `json:"snapshot_nudge_cycles"`
	ErrorSample    string     `json:"first_retried_error,omitempty"`
	LoadOnlySecs   float64    `json:"load_only_seconds"`
	Notes          []string   `json:"notes,omitempty"`
	Elections      []election `json:"elections"`
	// The leadership measurements (SPEC 17), see scale_failover.go.
	WaiterBurst *waiterBurstResult `json:"waiter_burst,omitempty"`
	Failover    *failoverResult    `json:"failover,omitempty"`
	Sigterm     *sigtermResult     `json:"sigterm,omitempty"`
}

func scaleMain(args []string) int {
	fs := flag.NewFlagSet("lockbench scale", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	locks := fs.Int64("locks", 1_000_000, "held locks to load")
	waiters := fs.Int64("waiters", 100_000, "queued acquires to load on top (on the first held locks, one each)")
	conc := fs.Int("concurrency", 256, "concurrent HTTP clients loading the held locks")
	wsConns := fs.Int("waiter-conns", 100, "WebSocket sessions carrying the waiters")
	sweepFlag := fs.String("sweep", "", "held-lock counts at which to measure one client's acquire+release (default 1k, 10k, 100k, ... up to --locks)")
	sweepOps := fs.Int("sweep-cycles", 1000, "acquire+release cycles of one client per sweep point")
	snapInterval := fs.Duration("snapshot-interval", 0, "lockd --snapshot-interval (how often a member checks whether a snapshot is due; 0: lockd's default)")
	extraFlags := fs.String("lockd-flags", "", "extra lockd flags for every member, space-separated (e.g. \"--leader-lease-timeout 1s\")")
	patience := fs.Duration("patience", 3*time.Minute, "how long one request may keep failing (no leader during elections) before the run gives up")
	timeout := fs.Duration("timeout", 45*time.Minute, "bound of the whole scale run")
	noRestart := fs.Bool("no-restart", false, "skip the restart of every member at the end")
	noFailover := fs.Bool("no-failover", false, "skip the kill -9 of the leader and the SIGTERM of a member (and their restarts)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *locks < 1 || *waiters < 0 || *waiters > *locks || *conc < 1 || *wsConns < 1 {
		fmt.Fprintln(os.Stderr, "lockbench scale: need --locks ≥ 1, 0 ≤ --waiters ≤ --locks, positive concurrency")
		return 2
	}
	sweep := defaultSweep(*locks)
	if *sweepFlag != "" {
		sweep = nil
		for _, f := range splitList(*sweepFlag) {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil || v < 0 || v > *locks {
				fmt.Fprintf(os.Stderr, "lockbench scale: bad sweep point %q\n", f)
				return 2
			}
			sweep = append(sweep, v)
		}
		sort.Slice(sweep, func(i, j int) bool { return sweep[i] < sweep[j] })
	}

	sctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	repo, bin, dir, done, err := cf.prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer done()
	rep := &scaleReport{Started: time.Now(), Host: describeHost(repo), Members: cf.members, Locks: *locks, Waiters: *waiters}
	rep.LockdFlags = []string{"--log-level", "info", "--raft-log-level", "info"}
	if *snapInterval > 0 {
		rep.LockdFlags = append(rep.LockdFlags, "--snapshot-interval", snapInterval.String())
	}
	rep.LockdFlags = append(rep.LockdFlags, strings.Fields(*extraFlags)...)
	retryFor = *patience
	lc, err := startLockd(ctx, bin, filepath.Join(dir, "lockd"), cf.members, rep.LockdFlags)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer lc.stop()
	err = runScale(ctx, lc, rep, sweep, *conc, *wsConns, *sweepOps, !*noFailover, !*noRestart)
	if rep.Snapshots == nil {
		rep.Snapshots = allSnapshots(lc)
	}
	rep.Elections = electionsOf(lc)
	if err != nil {
		rep.Notes = append(rep.Notes, "the run stopped early: "+err.Error())
	}
	rep.Finished = time.Now()
	var md strings.Builder
	writeScaleMarkdown(&md, rep)
	writeOutputs(cf.out, "scale", md.String(), rep)
	fmt.Fprintf(os.Stderr, "wrote %s/scale.json, scale.md (%s)\n", cf.out, rep.Finished.Sub(rep.Started).Round(time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench scale:", err)
		return 1
	}
	return 0
}

func defaultSweep(locks int64) []int64 {
	var s []int64
	for v := int64(1000); v < locks; v *= 10 {
		s = append(s, v)
	}
	return append(s, locks)
}

func scaleLockName(i int64) string { return fmt.Sprintf("s%07d", i) }

func runScale(ctx context.Context, lc *lockdCluster, rep *scaleReport, sweep []int64, conc, wsConns, sweepOps int, failovers, restart bool) error {
	leader, err := lc.leader(ctx)
	if err != nil {
		return err
	}
	ref := &leaderRef{lc: lc, m: leader, at: time.Now()}
	// Leader changes the clients saw until the failover measurements
	// (which change the leader on purpose).
	changes := -1
	defer func() {
		if changes < 0 {
			changes = ref.changes
		}
		if changes > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the leader changed %d time(s) during loading and measuring; the clients followed it", changes))
		}
	}()
	tr := &http.Transport{MaxIdleConns: conc + 16, MaxIdleConnsPerHost: conc + 16}
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer tr.CloseIdleConnections()

	// ---- held locks, with the sweep on the way ----
	var loaded int64
	var errs atomic.Int64
	loadStart := time.Now()
	for _, target := range sweep {
		t0, n0 := time.Now(), loaded
		if err := loadHeld(ctx, hc, ref, loaded, target, conc, &errs); err != nil {
			return fmt.Errorf("loading held locks: %w", err)
		}
		loaded = target
		rep.LoadOnlySecs += time.Since(t0).Seconds()
		rate := float64(loaded-n0) / time.Since(t0).Seconds()
		fmt.Fprintf(os.Stderr, "\r%-90s\rheld %d (%.0f acquires/s); measuring one client ...\n", "", loaded, rate)
		pt, err := sweepPoint(ctx, hc, lc, ref, loaded, sweepOps)
		if err != nil {
			return fmt.Errorf("sweep at %d: %w", loaded, err)
		}
		pt.LoadRate = rate
		rep.Sweep = append(rep.Sweep, pt)
		fmt.Fprintf(os.Stderr, "  held %d: acquire p50 %.2f ms p99 %.2f ms, leader CPU %.3f ms/cycle, leader RSS %.0f MiB\n",
			pt.Held, pt.AcquireP50, pt.AcquireP99, pt.LeaderCPUms, pt.LeaderRSSMiB)
	}
	rep.LoadSeconds = time.Since(loadStart).Seconds()
	rep.LoadRate = float64(rep.Locks) / rep.LoadOnlySecs
	rep.Errors = errs.Load()
	if v, ok := firstRetried.Load().(string); ok {
		rep.ErrorSample = v
	}
	rep.MemoryHeld = memberMemory(lc, ref.refresh(ctx))

	// ---- waiters ----
	if rep.Waiters > 0 {
		fmt.Fprintf(os.Stderr, "queueing %d waiters over %d WebSocket sessions ...\n", rep.Waiters, wsConns)
		// The sessions live on (1 h TTL) after their connections close, so
		// the waits stay queued through what follows.
		wb, err := queueWaiters(ctx, lc, ref, rep.Waiters, wsConns)
		if err != nil {
			return fmt.Errorf("loading waiters: %w", err)
		}
		rep.WaiterBurst = wb
		rep.WaitSeconds = wb.Seconds
		fmt.Fprintf(os.Stderr, "waiters queued in %.1fs; %d elections meanwhile\n", rep.WaitSeconds, len(wb.Elections))
	}
	time.Sleep(2 * time.Second)
	leader = ref.refresh(ctx)
	rep.MemoryFull = memberMemory(lc, leader)
	rep.HeldMetric, rep.WaitMetric = tableMetrics(ctx, leader.httpURL)

	// ---- a snapshot of the full table on every member ----
	commit := metricValue(ctx, leader.httpURL, "lockd_raft_commit_index")
	fmt.Fprintf(os.Stderr, "waiting for every member to snapshot past index %d ...\n", int64(commit))
	final, nudges, err := waitSnapshots(ctx, lc, hc, ref, uint64(commit), 6*time.Minute)
	rep.Final, rep.SnapshotNudges = final, nudges
	if err != nil {
		rep.Notes = append(rep.Notes, err.Error())
	}
	rep.Snapshots = allSnapshots(lc)

	// ---- kill -9 of the leader, SIGTERM of the next one ----
	changes = ref.changes
	if failovers && len(lc.members) > 1 {
		f, err := failover(ctx, lc, ref)
		rep.Failover = f
		if err != nil {
			return fmt.Errorf("failover: %w", err)
		}
		st, err := sigtermMember(ctx, lc, ref)
		rep.Sigterm = st
		if err != nil {
			return fmt.Errorf("SIGTERM: %w", err)
		}
	}

	// ---- restart every member from its snapshot ----
	if restart {
		r, err := restartCluster(ctx, lc)
		rep.Restart = r
		if err != nil {
			return fmt.Errorf("restart: %w", err)
		}
	}
	return nil
}

// leaderRef tracks the current leader; on errors callers refresh it.
type leaderRef struct {
	lc      *lockdCluster
	mu      sync.Mutex
	m       *lockdMember
	at      time.Time
	changes int
}

func (r *leaderRef) get() *lockdMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

// refresh asks the cluster for its leader (at most every 100 ms).
func (r *leaderRef) refresh(ctx context.Context) *lockdMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.at) < 100*time.Millisecond {
		return r.m
	}
	if m, err := r.lc.leader(ctx); err == nil {
		if m != r.m {
			r.changes++
		}
		r.m = m
	}
	r.at = time.Now()
	return r.m
}

// retryFor bounds how long one request keeps being retried.
var retryFor = 3 * time.Minute

// retrying reports whether a request first tried at t0 that failed with
// err may be tried again (try counts from 0), after a backoff: the
// Retry-After the server gave, else a linear one up to 1 s.
func retrying(ctx context.Context, t0 time.Time, try int, err error) bool {
	if ctx.Err() != nil || time.Since(t0) > retryFor {
		return false
	}
	var e *apiErr
	if errors.As(err, &e) && e.HasRetryAfter {
		return sleepCtx(ctx, backoffFor(e, try))
	}
	return sleepCtx(ctx, min(time.Duration(try+1)*50*time.Millisecond, time.Second))
}

// retry runs f until it succeeds or retrying gives up (returning f's last
// error), finding the leader again between tries. onFail, when set, sees
// every failure.
func (r *leaderRef) retry(ctx context.Context, f func() error, onFail func(error)) error {
	t0 := time.Now()
	for try := 0; ; try++ {
		err := f()
		if err == nil {
			return nil
		}
		if onFail != nil {
			onFail(err)
		}
		if !retrying(ctx, t0, try, err) {
			return err
		}
		r.refresh(ctx)
	}
}

// firstRetried keeps the first error a loader retried, for the report.
var firstRetried atomic.Value

// loadHeld acquires locks [from, to) with conc concurrent clients.
func loadHeld(ctx context.Context, hc *http.Client, ref *leaderRef, from, to int64, conc int, errs *atomic.Int64) error {
	var next atomic.Int64
	next.Store(from)
	var done atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopProg := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-stopProg:
				return
			case <-t.C:
				d := done.Load()
				fmt.Fprintf(os.Stderr, "\rloading held locks: %d / %d (%.0f/s, %d errors)   ", from+d, to, float64(d)/time.Since(start).Seconds(), errs.Load())
			}
		}
	}()
	defer close(stopProg)
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			body := []byte(fmt.Sprintf(`{"client_id":"holder-%d","ttl_ms":%d}`, w, api.MaxTTLms))
			for lctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= to {
					return
				}
				var err error
				err = ref.retry(lctx, func() error {
					return postOK(lctx, hc, ref.get().httpURL+"/api/v1/locks/"+scaleLockName(i)+"/acquire", body)
				}, func(err error) {
					if errs.Add(1) == 1 {
						firstRetried.Store(err.Error())
					}
				})
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				done.Add(1)
			}
		}(w)
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// postOK posts body and wants 200.
func postOK(ctx context.Context, hc *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s: %w", url, resp.StatusCode, bytes.TrimSpace(b), httpAPIErr(resp, b))
	}
	return nil
}

// httpAPIErr reads an HTTP error answer: its code and message from the
// body, its Retry-After from the header.
func httpAPIErr(resp *http.Response, body []byte) *apiErr {
	e := &apiErr{Code: fmt.Sprintf("http_%d", resp.StatusCode)}
	var er api.ErrorReply
	if json.Unmarshal(body, &er) == nil && er.Error.Code != "" {
		e.Code, e.Msg = er.Error.Code, er.Error.Message
	}
	e.RetryAfter, e.HasRetryAfter = parseRetryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
	return e
}

// sweepPoint measures n sequential acquire+release cycles of one HTTP
// client on fresh lock names, with nothing else running.
func sweepPoint(ctx context.Context, hc *http.Client, lc *lockdCluster, ref *leaderRef, held int64, n int) (scalePoint, error) {
	leader := ref.refresh(ctx)
	time.Sleep(time.Second) // let the loaders' connections and goroutines quiet down
	acq, rel := newHist(), newHist()
	pids := lc.pids()
	lp := []int{leader.p.pid()}
	c0, l0, m0, s0 := sumCPU(pids), sumCPU(lp), machineBusy(), sumCPU([]int{os.Getpid()})
	t0 := time.Now()
	for i := 0; i < n; i++ {
		var ad, rd time.Duration
		var err error
		err = ref.retry(ctx, func() (err error) {
			ad, rd, err = cycle(ctx, hc, ref.get().httpURL, fmt.Sprintf("probe-%d-%d", held, i), "probe")
			return err
		}, nil)
		if err != nil {
			return scalePoint{}, err
		}
		acq.RecordValue(max(ad.Microseconds(), 1))
		rel.RecordValue(max(rd.Microseconds(), 1))
	}
	el := time.Since(t0).Seconds()
	c1, l1, m1, s1 := sumCPU(pids), sumCPU(lp), machineBusy(), sumCPU([]int{os.Getpid()})
	rss, _ := memKB(leader.p.pid())
	a, r := summarize(acq), summarize(rel)
	return scalePoint{
		Held: held, Cycles: n,
		AcquireP50: a.P50, AcquireP99: a.P99, AcquireMean: a.Mean, ReleaseP50: r.P50,
		LeaderCPUms:   (l1 - l0) / float64(n) * 1000,
		ServerCPUms:   (c1 - c0) / float64(n) * 1000,
		LeaderRSSMiB:  float64(rss) / 1024,
		OtherCPUShare: max((m1-m0)-(c1-c0)-(s1-s0), 0) / (el * float64(numCPU())),
	}, nil
}

func memberMemory(lc *lockdCluster, leader *lockdMember) []memberMem {
	var out []memberMem
	for _, m := range lc.members {
		rss, hwm := memKB(m.p.pid())
		out = append(out, memberMem{ID: m.id, Leader: m == leader, RSSMiB: float64(rss) / 1024, HWMMiB: float64(hwm) / 1024})
	}
	return out
}

// metricValue reads one unlabelled gauge from /metrics.
func metricValue(ctx context.Context, base, name string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, name+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(l[len(name):]), 64)
			return v
		}
	}
	return -1
}

func tableMetrics(ctx context.Context, base string) (held, waiters int64) {
	return int64(metricValue(ctx, base, "lockd_locks_held")), int64(metricValue(ctx, base, "lockd_waiters"))
}

// election is one "became leader" of lockd's log: ready_after is the time
// from winning the election to serving (barrier, then rebuilding every
// timer from the table).
type election struct {
	At         string  `json:"at"`
	Member     string  `json:"member"`
	Term       int64   `json:"term"`
	ReadyAfter float64 `json:"ready_after_seconds"`
}

var reBecame = regexp.MustCompile(`^time=(\S+) .*msg="became leader" id=(\S+) term=(\d+) ready_after=(\S+)`)

func electionsOf(lc *lockdCluster) []election {
	var out []election
	for _, m := range lc.members {
		b, _ := os.ReadFile(filepath.Join(lc.dir, m.id+".log"))
		for _, l := range strings.Split(string(b), "\n") {
			if g := reBecame.FindStringSubmatch(l); g != nil {
				t, _ := strconv.ParseInt(g[3], 10, 64)
				d, _ := time.ParseDuration(g[4])
				out = append(out, election{At: g[1], Member: g[2], Term: t, ReadyAfter: d.Seconds()})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// hashicorp/raft's log lines, in its own format, e.g.
// 2026-11-29T08:48:41.061Z [INFO]  raft.n1: starting snapshot up to: index=24
// or through lockd's slog logger (one log format), e.g.
// time=2026-11-29T08:48:41.061Z level=INFO msg="starting snapshot up to" component=raft index=24
var (
	reSnapStart  = regexp.MustCompile(`^(?:time=)?(\S+) .*starting snapshot up to\b.*\bindex=(\d+)`)
	reSnapCreate = regexp.MustCompile(`^(?:time=)?(\S+) .*creating new snapshot\b.*\bpath="?([^"\s]+)`)
	reSnapDone   = regexp.MustCompile(`^(?:time=)?(\S+) .*snapshot complete up to\b.*\bindex=(\d+)`)
	reSnapTaken  = regexp.MustCompile(`msg="snapshot taken" id=\d+-(\d+)-\d+ bytes=(\d+) locks=(\d+).* took=(\S+)`)
	reRestoredL  = regexp.MustCompile(`^time=(\S+) .*msg="snapshot restored" bytes=(\d+) locks=(\d+)`)
	reRestored   = regexp.MustCompile(`^(?:time=)?(\S+) .*restored from snapshot\b.*size-in-bytes=(\d+)`)
	reReadyAfter = regexp.MustCompile(`msg="became leader".*ready_after=(\S+)`)
)

func parseLogTime(s string) time.Time {
	t, _ := time.Parse("2006-01-02T15:04:05.000Z0700", s)
	if t.IsZero() {
		t, _ = time.Parse(time.RFC3339Nano, s)
	}
	return t
}

// snapshotsOf parses every completed snapshot from a member's log.
func snapshotsOf(m *lockdMember, logPath string) []snapEvent {
	f, err := os.Open(logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []snapEvent
	var start time.Time
	var path string
	type taken struct {
		took         float64
		bytes, locks int64
	}
	tk := map[uint64]taken{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if g := reSnapTaken.FindStringSubmatch(l); g != nil {
			idx, _ := strconv.ParseUint(g[1], 10, 64)
			b, _ := strconv.ParseInt(g[2], 10, 64)
			n, _ := strconv.ParseInt(g[3], 10, 64)
			d, _ := time.ParseDuration(g[4])
			tk[idx] = taken{took: d.Seconds(), bytes: b, locks: n}
		} else if g := reSnapStart.FindStringSubmatch(l); g != nil {
			start, path = parseLogTime(g[1]), ""
		} else if g := reSnapCreate.FindStringSubmatch(l); g != nil {
			path = strings.TrimSuffix(g[2], ".tmp")
		} else if g := reSnapDone.FindStringSubmatch(l); g != nil && !start.IsZero() {
			end := parseLogTime(g[1])
			idx, _ := strconv.ParseUint(g[2], 10, 64)
			ev := snapEvent{Member: m.id, Index: idx, Persist: end.Sub(start).Seconds(), At: end.Format(time.RFC3339)}
			if path != "" {
				if st, err := os.Stat(filepath.Join(path, "state.bin")); err == nil {
					ev.SizeBytes = st.Size()
				}
			}
			out = append(out, ev)
			start = time.Time{}
		}
	}
	for i := range out {
		if t, ok := tk[out[i].Index]; ok {
			out[i].Took, out[i].Locks = t.took, t.locks
			if out[i].SizeBytes == 0 {
				out[i].SizeBytes = t.bytes
			}
		}
	}
	return out
}

func allSnapshots(lc *lockdCluster) []snapEvent {
	var out []snapEvent
	for _, m := range lc.members {
		out = append(out, snapshotsOf(m, filepath.Join(lc.dir, m.id+".log"))...)
	}
	return out
}

// waitSnapshots waits until every member logged a completed snapshot at or
// past index, and returns those. Snapshots are due every
// --snapshot-threshold log entries (checked every --snapshot-interval);
// with group commit a log entry carries many commands, so while waiting it
// adds entries with sequential acquire+release cycles of one client (one
// entry each), which is how a snapshot of the full table comes about
// through the threshold.
func waitSnapshots(ctx context.Context, lc *lockdCluster, hc *http.Client, ref *leaderRef, index uint64, timeout time.Duration) ([]snapEvent, int, error) {
	deadline := time.Now().Add(timeout)
	nudges := 0
	for {
		var got []snapEvent
		for _, m := range lc.members {
			for _, ev := range snapshotsOf(m, filepath.Join(lc.dir, m.id+".log")) {
				if ev.Index >= index {
					got = append(got, ev)
					break
				}
			}
		}
		if len(got) == len(lc.members) {
			return got, nudges, nil
		}
		if time.Now().After(deadline) {
			return got, nudges, fmt.Errorf("only %d of %d members snapshotted past index %d within %v", len(got), len(lc.members), index, timeout)
		}
		if ctx.Err() != nil {
			return got, nudges, ctx.Err()
		}
		// One second of sequential cycles (until 5000 cycles, 10,000 log
		// entries, crossed lockd's default threshold of 8192), then look
		// again; the snapshot loop checks every --snapshot-interval (at
		// random between 1× and 2× of it).
		t := time.Now()
		if nudges >= 5000 {
			time.Sleep(time.Second)
		}
		for nudges < 5000 && time.Since(t) < time.Second && ctx.Err() == nil {
			if _, _, err := cycle(ctx, hc, ref.get().httpURL, "nudge", "nudge"); err != nil {
				time.Sleep(200 * time.Millisecond)
				ref.refresh(ctx)
				continue
			}
			nudges++
		}
	}
}

// cycle acquires name for client over HTTP and releases it with the
// granted token, returning both latencies.
func cycle(ctx context.Context, hc *http.Client, base, name, client string) (acq, rel time.Duration, err error) {
	a0 := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/locks/"+name+"/acquire",
		strings.NewReader(`{"client_id":"`+client+`","ttl_ms":30000}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, 0, fmt.Errorf("acquire %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("acquire %s: status %d: %w", name, resp.StatusCode, httpAPIErr(resp, b))
	}
	var ar api.AcquireReply
	if err := json.Unmarshal(b, &ar); err != nil {
		return 0, 0, fmt.Errorf("acquire %s: %w", name, err)
	}
	a1 := time.Now()
	err = postOK(ctx, hc, base+"/api/v1/locks/"+name+"/release",
		[]byte(fmt.Sprintf(`{"client_id":%q,"fencing_token":%d}`, client, ar.FencingToken)))
	return a1.Sub(a0), time.Since(a1), err
}

// restartCluster stops every member (SIGTERM) and starts them again on
// their data directories.
func restartCluster(ctx context.Context, lc *lockdCluster) (*restartResult, error) {
	r := &restartResult{RestoreSeconds: map[string]float64{}, SnapshotBytes: map[string]int64{}}
	fmt.Fprintln(os.Stderr, "restarting every member ...")
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, m := range lc.members {
		wg.Add(1)
		go func(m *lockdMember) { defer wg.Done(); m.p.stop(60 * time.Second) }(m)
	}
	wg.Wait()
	r.StopSeconds = time.Since(t0).Seconds()
	// Only the log lines of the new processes count.
	offsets := map[string]int64{}
	for _, m := range lc.members {
		if st, err := os.Stat(filepath.Join(lc.dir, m.id+".log")); err == nil {
			offsets[m.id] = st.Size()
		}
	}
	start := time.Now()
	for _, m := range lc.members {
		p, err := startProc("lockd-"+m.id, filepath.Join(lc.dir, m.id+".log"), lc.bin, m.args...)
		if err != nil {
			return r, err
		}
		m.p = p
	}
	// The first linearizable read of a held lock, from any member (-L).
	readDone := make(chan float64, 1)
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer rcancel()
	go func() {
		hc := &http.Client{Timeout: 5 * time.Second}
		for rctx.Err() == nil {
			for _, m := range lc.members {
				req, _ := http.NewRequestWithContext(rctx, http.MethodGet, m.httpURL+"/api/v1/locks/"+scaleLockName(0), nil)
				resp, err := hc.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						readDone <- time.Since(start).Seconds()
						return
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		readDone <- -1
	}()
	for _, m := range lc.members {
		if err := waitHTTP200(ctx, m.httpURL+"/readyz", 5*time.Minute); err != nil {
			return r, fmt.Errorf("lockd %s: %v\n%s", m.id, err, m.p.logTail(2000))
		}
	}
	r.ReadySeconds = time.Since(start).Seconds()
	r.FirstReadSeconds = <-readDone
	for _, m := range lc.members {
		b, _ := os.ReadFile(filepath.Join(lc.dir, m.id+".log"))
		if off := offsets[m.id]; off <= int64(len(b)) {
			b = b[off:]
		}
		for _, l := range strings.Split(string(b), "\n") {
			if g := reRestored.FindStringSubmatch(l); g != nil {
				r.RestoreSeconds[m.id] = parseLogTime(g[1]).Sub(start).Seconds()
				r.SnapshotBytes[m.id], _ = strconv.ParseInt(g[2], 10, 64)
			}
			if g := reRestoredL.FindStringSubmatch(l); g != nil {
				r.RestoredLocks += func() int64 { v, _ := strconv.ParseInt(g[3], 10, 64); return v }()
			}
			if g := reReadyAfter.FindStringSubmatch(l); g != nil {
				r.LeaderReadyAfter = m.id + ": " + g[1]
			}
		}
	}
	leader, err := lc.leader(ctx)
	if err != nil {
		return r, err
	}
	r.HeldAfter, r.WaitersAfter = tableMetrics(ctx, leader.httpURL)
	time.Sleep(2 * time.Second)
	r.MemoryAfter = memberMemory(lc, leader)
	return r, nil
}

func numCPU() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu") && len(l) > 3 && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	return max(n, 1)
}

func writeScaleMarkdown(w io.Writer, rep *scaleReport) {
	fmt.Fprintf(w, "Scale run: %d members, %d held locks (loaded at %.0f acquires/s by concurrent HTTP clients; %.0f s with the sweep; %d retried errors), %d waiters (queued in %.1f s); lockd %s; lockd flags %s.\n\n",
		rep.Members, rep.Locks, rep.LoadRate, rep.LoadSeconds, rep.Errors, rep.Waiters, rep.WaitSeconds, rep.Host.LockdCommit, strings.Join(rep.LockdFlags, " "))
	fmt.Fprintln(w, "One client's acquire+release on a fresh lock, nothing else running, as the table grows:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| held locks | acquire p50 / p99 / mean ms | release p50 ms | leader CPU ms per cycle | all members CPU ms per cycle | leader RSS MiB | load rate to here (acquires/s) | other load |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, p := range rep.Sweep {
		fmt.Fprintf(w, "| %d | %.2f / %.2f / %.2f | %.2f | %.3f | %.3f | %.0f | %.0f | %.0f%% |\n", p.Held, p.AcquireP50, p.AcquireP99, p.AcquireMean,
			p.ReleaseP50, p.LeaderCPUms, p.ServerCPUms, p.LeaderRSSMiB, p.LoadRate, p.OtherCPUShare*100)
	}
	fmt.Fprintln(w)
	mem := func(title string, ms []memberMem) {
		if len(ms) == 0 {
			return
		}
		fmt.Fprintf(w, "%s: ", title)
		var parts []string
		for _, m := range ms {
			role := ""
			if m.Leader {
				role = " (leader)"
			}
			parts = append(parts, fmt.Sprintf("%s%s %.0f MiB (peak %.0f)", m.ID, role, m.RSSMiB, m.HWMMiB))
		}
		fmt.Fprintln(w, strings.Join(parts, ", ")+"  ")
	}
	mem("RSS with the held locks", rep.MemoryHeld)
	mem("RSS with held locks and waiters", rep.MemoryFull)
	fmt.Fprintf(w, "Table per /metrics: %d held, %d waiting.\n\n", rep.HeldMetric, rep.WaitMetric)
	writeWaiterBurstMarkdown(w, rep)
	if len(rep.Final) > 0 {
		fmt.Fprintln(w, "Snapshot of the full table (total = lockd's \"snapshot taken ... took=\": the FSM encoding the table while applies wait, then writing and syncing it; persist = hashicorp/raft's \"starting snapshot\" → \"snapshot complete\", the write and sync alone):")
		fmt.Fprintln(w)
		fmt.Fprintf(w, "(%d sequential acquire+release cycles after loading took each member past its snapshot threshold.)\n\n", rep.SnapshotNudges)
		fmt.Fprintln(w, "| member | index | locks in it | total s | persist s | size MiB |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|")
		for _, s := range rep.Final {
			fmt.Fprintf(w, "| %s | %d | %d | %.3f | %.3f | %.1f |\n", s.Member, s.Index, s.Locks, s.total(), s.Persist, float64(s.SizeBytes)/(1<<20))
		}
		fmt.Fprintln(w)
	}
	if len(rep.Snapshots) > 0 {
		fmt.Fprintln(w, "Every snapshot the members took during the run:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| at | member | index | locks in it | total s | persist s | size MiB |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|")
		ss := append([]snapEvent(nil), rep.Snapshots...)
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].At < ss[j].At })
		for _, s := range ss {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %.3f | %.3f | %.1f |\n", s.At, s.Member, s.Index, s.Locks, s.total(), s.Persist, float64(s.SizeBytes)/(1<<20))
		}
		fmt.Fprintln(w)
	}
	if rep.Errors > 0 {
		fmt.Fprintf(w, "Loading retried %d requests; the first: %s\n\n", rep.Errors, rep.ErrorSample)
	}
	writeFailoverMarkdown(w, rep)
	if r := rep.Restart; r != nil {
		fmt.Fprintf(w, "Restart of every member: stop %.2f s; start → every /readyz 200: %.2f s; start → first linearizable read answered: %.2f s.  \n", r.StopSeconds, r.ReadySeconds, r.FirstReadSeconds)
		var parts []string
		ids := make([]string, 0, len(r.RestoreSeconds))
		for id := range r.RestoreSeconds {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			parts = append(parts, fmt.Sprintf("%s %.2f s (%.1f MiB)", id, r.RestoreSeconds[id], float64(r.SnapshotBytes[id])/(1<<20)))
		}
		fmt.Fprintf(w, "Start → \"restored from snapshot\": %s. New leader ready after %s (barrier + timer rebuild).  \n", strings.Join(parts, ", "), r.LeaderReadyAfter)
		fmt.Fprintf(w, "After the restart: %d held, %d waiting (/metrics of the new leader); locks restored from snapshots, all members: %d.  \n", r.HeldAfter, r.WaitersAfter, r.RestoredLocks)
		mem("RSS after the restart", r.MemoryAfter)
	}
	if len(rep.Elections) > 0 {
		var worst float64
		for _, e := range rep.Elections {
			worst = max(worst, e.ReadyAfter)
		}
		fmt.Fprintf(w, "Leader elections during the run (the first is the bootstrap): %d; longest time from winning to serving (ready_after: barrier + rebuilding every lock's and waiter's timer): %.1f s.\n\n", len(rep.Elections), worst)
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "\nNote:", n)
	}
}
