package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The overload benchmark (`lockbench overload`): a 3-member cluster; first
// a baseline rate C, closed-loop acquire+release cycles by --workers
// sessions on distinct locks (as workload b); then, for --duration, 2×C
// offered open-loop (cycle k due at k/rate, started on time whatever the
// earlier ones do), a burst of waits on held locks at --burst-at, while
// keepalive-only sessions and short-TTL holders keep their promises alive.
// It reports what SPEC 15 promises: elections, sessions and leases lost,
// renewals acknowledged after their lease ran out, refusals by code with
// their Retry-After, connections the server cut, keepalive latency,
// goodput ÷ C, the leader's memory and commit rate.

type overloadOpts struct {
	systems      []string
	members      int
	workers      int
	warmup       time.Duration
	baseline     time.Duration
	offered      float64
	rate         float64
	duration     time.Duration
	burst        int
	burstConns   int
	burstLocks   int
	burstAt      time.Duration
	burstWait    time.Duration
	sessions     int
	sessionTTL   time.Duration
	holders      int
	holderTTL    time.Duration
	renewEvery   time.Duration
	opTimeout    time.Duration
	maxInFlight  int64
	sample       time.Duration
	lockdFlags   []string
	quick        bool
	openParallel int
	// probesProcess runs the keepalive-only sessions and the holders in
	// a process of their own (lockd only; see probes.go).
	probesProcess bool
}

// overloadConfig is the run's configuration in the report.
type overloadConfig struct {
	Systems         []string `json:"systems"`
	Members         int      `json:"members"`
	Workers         int      `json:"workers"`
	WarmupSeconds   float64  `json:"warmup_seconds"`
	BaselineSeconds float64  `json:"baseline_seconds"`
	Offered         float64  `json:"offered_times_baseline"`
	Rate            float64  `json:"fixed_rate_per_sec,omitempty"`
	DurationSeconds float64  `json:"duration_seconds"`
	Burst           int      `json:"burst_waits"`
	BurstConns      int      `json:"burst_sessions"`
	BurstLocks      int      `json:"burst_locks"`
	BurstAtSeconds  float64  `json:"burst_at_seconds"`
	BurstWaitMs     int64    `json:"burst_wait_timeout_ms"`
	Sessions        int      `json:"keepalive_sessions"`
	SessionTTLms    int64    `json:"session_ttl_ms"`
	Holders         int      `json:"holders"`
	HolderTTLms     int64    `json:"holder_ttl_ms"`
	RenewEveryMs    int64    `json:"renew_every_ms"`
	OpTimeoutMs     int64    `json:"cycle_timeout_ms"`
	MaxInFlight     int64    `json:"client_bound_cycles_in_flight"`
	LockdFlags      []string `json:"lockd_flags"`
	Quick           bool     `json:"quick"`
}

func (o overloadOpts) config() overloadConfig {
	return overloadConfig{Systems: o.systems, Members: o.members, Workers: o.workers, WarmupSeconds: o.warmup.Seconds(),
		BaselineSeconds: o.baseline.Seconds(), Offered: o.offered, Rate: o.rate, DurationSeconds: o.duration.Seconds(),
		Burst: o.burst, BurstConns: o.burstConns, BurstLocks: o.burstLocks, BurstAtSeconds: o.burstAt.Seconds(),
		BurstWaitMs: o.burstWait.Milliseconds(), Sessions: o.sessions, SessionTTLms: o.sessionTTL.Milliseconds(),
		Holders: o.holders, HolderTTLms: o.holderTTL.Milliseconds(), RenewEveryMs: o.renewEvery.Milliseconds(),
		OpTimeoutMs: o.opTimeout.Milliseconds(), MaxInFlight: o.maxInFlight, LockdFlags: o.lockdFlags, Quick: o.quick}
}

// floodResult is the open-loop flood of one system.
type floodResult struct {
	OfferedPerSec float64     `json:"offered_cycles_per_sec"`
	Scheduled     int64       `json:"scheduled"`
	Started       int64       `json:"started"`
	Skipped       int64       `json:"skipped_at_client_bound"`
	Completed     int64       `json:"completed_in_window"`
	Late          int64       `json:"completed_after_window"`
	Failed        []codeCount `json:"failed_by"`
	Goodput       float64     `json:"goodput_per_sec"`
	Ratio         float64     `json:"goodput_over_baseline"`
	// After the burst: from --burst-at to the end of the window.
	GoodputAfterBurst float64 `json:"goodput_after_burst_per_sec"`
	RatioAfterBurst   float64 `json:"goodput_after_burst_over_baseline"`
	// The worst whole second of the window, ÷ C.
	WorstSecond      int64   `json:"worst_second_cycles"`
	WorstSecondAt    int     `json:"worst_second_at"`
	WorstSecondRatio float64 `json:"worst_second_over_baseline"`
	Latency          latency `json:"latency_from_due"` // due time → release answered
	PerSecond        []int64 `json:"completed_per_second"`
}

// overloadResult is one system's run.
type overloadResult struct {
	System          string  `json:"system"`
	BaselineCycles  int64   `json:"baseline_cycles"`
	BaselineSeconds float64 `json:"baseline_seconds"`
	BaselineErrors  int64   `json:"baseline_errors"`
	C               float64 `json:"baseline_cycles_per_sec"`

	Flood    floodResult    `json:"flood"`
	Burst    burstResult    `json:"burst"`
	Sessions sessionsResult `json:"keepalive_sessions"`
	Holders  holdersResult  `json:"holders"`

	// Roles: what the server answered each kind of client; All: summed.
	Roles []roleSummary `json:"roles"`
	All   roleSummary   `json:"all_clients"`

	// ElectionsLog: leaders elected after the cluster first became ready,
	// from the members' logs (lockd: "became leader"; empty for etcd).
	ElectionsLog []election      `json:"elections_logged,omitempty"`
	Monitor      monitorSummary  `json:"monitor"`
	Samples      []monitorSample `json:"samples"`
	HeldAtEnd    int64           `json:"held_at_end"`
	// ServerLatency: the leader's own time per WebSocket request over the
	// window, by op (lockd_websocket_request_duration_seconds; lockd only,
	// and only when one member led throughout).
	ServerLatency map[string]serverLatency `json:"server_latency,omitempty"`
	// NotMeasured names what this system does not let the bench measure.
	NotMeasured []string `json:"not_measured,omitempty"`
	Notes       []string `json:"notes,omitempty"`
	Error       string   `json:"error,omitempty"`
}

type overloadReport struct {
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Host     hostInfo          `json:"host"`
	Config   overloadConfig    `json:"config"`
	Results  []*overloadResult `json:"results"`
}

var overloadSystems = []string{"lockd", "etcd"}

func overloadMain(args []string) int {
	fs := flag.NewFlagSet("lockbench overload", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	var o overloadOpts
	systems := fs.String("systems", "lockd", "systems to overload, from lockd,etcd (each on its own cluster, one after the other)")
	fs.IntVar(&o.workers, "workers", 32, "baseline: closed-loop workers, each its own session and lock (as workload b); the flood's cycles go over as many sessions")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "baseline: unmeasured time before its window")
	fs.DurationVar(&o.baseline, "baseline", 10*time.Second, "baseline: measured window that gives C")
	fs.Float64Var(&o.offered, "offered", 2, "flood rate as a multiple of C")
	fs.Float64Var(&o.rate, "rate", 0, "flood rate in cycles/s (overrides --offered; 0: --offered × C)")
	fs.DurationVar(&o.duration, "duration", time.Minute, "the overload window: flood, burst, keepalives and renewals")
	fs.IntVar(&o.burst, "burst", 100_000, "waits in the burst (acquires with a wait on held locks)")
	fs.IntVar(&o.burstConns, "burst-conns", 100, "WebSocket sessions (etcd: sessions) carrying the burst")
	fs.IntVar(&o.burstLocks, "burst-locks", 1000, "held locks the burst waits on (at least --burst ÷ --burst-conns: one session waits once per lock)")
	fs.DurationVar(&o.burstAt, "burst-at", 20*time.Second, "when in the window the burst starts")
	fs.DurationVar(&o.burstWait, "burst-wait", 10*time.Minute, "wait timeout of each burst acquire")
	fs.IntVar(&o.sessions, "keepalive-sessions", 200, "sessions that only keep alive (a keepalive every third of --session-ttl)")
	fs.DurationVar(&o.sessionTTL, "session-ttl", 15*time.Second, "TTL of every session of the run (keepalives at a third of it)")
	fs.IntVar(&o.holders, "holders", 50, "holders of a short-TTL lock that renew it on a fixed schedule")
	fs.BoolVar(&o.probesProcess, "probes-process", true, "run lockd's keepalive-only sessions and holders in a process of their own, so that the bench's own flood does not delay reading their answers")
	fs.DurationVar(&o.holderTTL, "holder-ttl", 5*time.Second, "TTL of each holder's lock (etcd: of its lease)")
	fs.DurationVar(&o.renewEvery, "renew-every", time.Second, "renew period of the holders")
	fs.DurationVar(&o.opTimeout, "op-timeout", 10*time.Second, "bound of one flood cycle from its due time (retries included)")
	fs.Int64Var(&o.maxInFlight, "max-inflight", 100_000, "the bench's own bound on flood cycles in flight; a due cycle beyond it is skipped and counted")
	fs.DurationVar(&o.sample, "sample", time.Second, "how often every member's RSS, term, commit index and heap are read")
	lockdFlags := fs.String("lockd-flags", "", "extra lockd flags for every member, space-separated")
	fs.BoolVar(&o.quick, "quick", false, "a smoke run (well under a minute): --workers 8 --warmup 500ms --baseline 2s --duration 8s --burst 2000 --burst-conns 10 --burst-locks 200 --burst-at 3s --keepalive-sessions 20 --holders 5, unless set")
	timeout := fs.Duration("timeout", 20*time.Minute, "bound of the whole run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		quickDefaults(set, map[string]func(){
			"workers":            func() { o.workers = 8 },
			"warmup":             func() { o.warmup = 500 * time.Millisecond },
			"baseline":           func() { o.baseline = 2 * time.Second },
			"duration":           func() { o.duration = 8 * time.Second },
			"burst":              func() { o.burst = 2000 },
			"burst-conns":        func() { o.burstConns = 10 },
			"burst-locks":        func() { o.burstLocks = 200 },
			"burst-at":           func() { o.burstAt = 3 * time.Second },
			"keepalive-sessions": func() { o.sessions = 20 },
			"holders":            func() { o.holders = 5 },
		})
	}
	o.members = cf.members
	o.lockdFlags = strings.Fields(*lockdFlags)
	o.systems = splitList(*systems)
	o.openParallel = 32
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench overload:", err)
		return 2
	}

	sctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	var bin, dir string
	var done func()
	var repo string
	var err error
	if slices.Contains(o.systems, "lockd") {
		repo, bin, dir, done, err = cf.prepare()
	} else {
		dir, done, err = prepareDirOnly(&cf)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer done()
	if repo == "" && cf.repo != "" {
		repo = cf.repo
	}
	rep := &overloadReport{Started: time.Now(), Host: describeHost(repo), Config: o.config()}
	failed := false
	for _, sys := range o.systems {
		var r *overloadResult
		var err error
		fmt.Fprintf(os.Stderr, "== %s\n", sys)
		switch sys {
		case "lockd":
			r, err = runOverloadLockd(ctx, bin, filepath.Join(dir, "lockd"), o)
		case "etcd":
			r, err = runOverloadEtcd(ctx, filepath.Join(dir, "etcd"), o)
		}
		if r == nil {
			r = &overloadResult{System: sys}
		}
		if err != nil {
			r.Error = err.Error()
			failed = true
			fmt.Fprintf(os.Stderr, "lockbench overload: %s: %v\n", sys, err)
		}
		rep.Results = append(rep.Results, r)
		if ctx.Err() != nil {
			break
		}
	}
	rep.Finished = time.Now()
	var md strings.Builder
	writeOverloadMarkdown(&md, rep)
	writeOutputs(cf.out, "overload", md.String(), rep)
	fmt.Fprintf(os.Stderr, "wrote %s/overload.json, overload.md (%s)\n", cf.out, rep.Finished.Sub(rep.Started).Round(time.Second))
	if failed {
		return 1
	}
	return 0
}

// quickDefaults applies each default whose flag was not set.
func quickDefaults(set map[string]bool, defaults map[string]func()) {
	for name, apply := range defaults {
		if !set[name] {
			apply()
		}
	}
}

// prepareDirOnly makes the work directory when no lockd is needed.
func prepareDirOnly(cf *commonFlags) (string, func(), error) {
	if err := os.MkdirAll(cf.out, 0o755); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "lockbench-")
	if err != nil {
		return "", nil, err
	}
	if cf.keep {
		fmt.Fprintln(os.Stderr, "data and logs in", dir)
		return dir, func() {}, nil
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

func (o overloadOpts) validate() error {
	if len(o.systems) == 0 {
		return fmt.Errorf("no --systems")
	}
	for _, s := range o.systems {
		if !slices.Contains(overloadSystems, s) {
			return fmt.Errorf("unknown system %q (want lockd or etcd)", s)
		}
	}
	switch {
	case o.members < 1:
		return fmt.Errorf("--members must be positive")
	case o.workers < 1:
		return fmt.Errorf("--workers must be positive")
	case o.baseline <= 0 || o.warmup < 0:
		return fmt.Errorf("--baseline must be positive and --warmup not negative")
	case o.duration <= 0:
		return fmt.Errorf("--duration must be positive")
	case o.offered <= 0 && o.rate <= 0:
		return fmt.Errorf("--offered or --rate must be positive")
	case o.rate < 0:
		return fmt.Errorf("--rate must not be negative")
	case o.burst < 0 || o.sessions < 0 || o.holders < 0:
		return fmt.Errorf("--burst, --keepalive-sessions and --holders must not be negative")
	case o.burst > 0 && (o.burstConns < 1 || o.burstLocks < 1):
		return fmt.Errorf("a burst needs --burst-conns and --burst-locks ≥ 1")
	case o.burst > 0 && o.burstLocks < (o.burst+o.burstConns-1)/o.burstConns:
		return fmt.Errorf("--burst-locks %d is less than the waits per session (%d): one session waits on a lock once", o.burstLocks, (o.burst+o.burstConns-1)/o.burstConns)
	case o.burstAt < 0 || o.burstAt >= o.duration && o.burst > 0:
		return fmt.Errorf("--burst-at must be inside --duration")
	case o.burstWait < 0 || o.burstWait.Milliseconds() > 600_000:
		return fmt.Errorf("--burst-wait must be 0–10m (the API's bound)")
	case o.sessionTTL < time.Second || o.sessionTTL > time.Hour:
		return fmt.Errorf("--session-ttl must be 1s–1h (the API's bounds)")
	case o.holderTTL < time.Second || o.renewEvery <= 0 || o.renewEvery >= o.holderTTL:
		return fmt.Errorf("--holder-ttl must be ≥ 1s and --renew-every positive and shorter than it")
	case o.opTimeout <= 0 || o.maxInFlight < 1 || o.sample <= 0:
		return fmt.Errorf("--op-timeout, --max-inflight and --sample must be positive")
	}
	return nil
}

// burstNames is the locks session k of a burst waits on: per consecutive
// lock indexes from k·per, modulo the burst's locks (distinct within a
// session as long as per ≤ locks), the last session taking what is left.
func burstNames(k, conns, waits, locks int, name func(int) string) []string {
	per := (waits + conns - 1) / conns
	from, to := k*per, min((k+1)*per, waits)
	var out []string
	for i := from; i < to; i++ {
		out = append(out, name(i%locks))
	}
	return out
}

// floodOutcome turns a cycle log into the report.
func floodOutcome(l *cycleLog, rate float64, started, skipped int64, c float64, window, burstAt time.Duration, burst bool) floodResult {
	r := floodResult{OfferedPerSec: rate, Scheduled: scheduled(rate, window), Started: started, Skipped: skipped}
	l.mu.Lock()
	r.Completed, r.Late = l.inWindow, l.late
	r.Failed = sortedCounts(l.failed)
	r.PerSecond = slices.Clone(l.perSecond)
	l.mu.Unlock()
	r.Latency = l.lat.summary()
	r.Goodput = float64(r.Completed) / window.Seconds()
	secs := len(r.PerSecond)
	if burst {
		from := int(burstAt / time.Second)
		if n := secs - from; n > 0 {
			r.GoodputAfterBurst = float64(l.completedBetween(from, secs)) / float64(n)
		}
	}
	r.WorstSecond = -1
	// Whole seconds only: the last one may be cut short by the window.
	whole := int(window / time.Second)
	for i := 0; i < min(whole, secs); i++ {
		if r.WorstSecond < 0 || r.PerSecond[i] < r.WorstSecond {
			r.WorstSecond, r.WorstSecondAt = r.PerSecond[i], i
		}
	}
	if r.WorstSecond < 0 {
		r.WorstSecond = 0
	}
	if c > 0 {
		r.Ratio = r.Goodput / c
		r.RatioAfterBurst = r.GoodputAfterBurst / c
		r.WorstSecondRatio = float64(r.WorstSecond) / c
	}
	return r
}

// ---- the report ----

// overloadRow is one line of the comparison table: a measure, the goal
// the issue sets for it, and each system's value.
type overloadRow struct {
	measure, goal string
	value         func(r *overloadResult) string
	met           func(r *overloadResult) *bool
}

// measureBaseline runs the closed-loop baseline (o.workers workers, each
// running cycle back to back), records C in res and returns the rate the
// window offers: --rate, else --offered × C.
func measureBaseline(ctx context.Context, o overloadOpts, res *overloadResult, cycle func(ctx context.Context, w int) error) (float64, error) {
	fmt.Fprintf(os.Stderr, "baseline: %d workers, closed loop, %v + %v ...\n", o.workers, o.warmup, o.baseline)
	cycles, errs, err := closedLoop(ctx, o.workers, o.warmup, o.baseline, o.opTimeout, func(cctx context.Context, w int, _ int64) error {
		return cycle(cctx, w)
	})
	if err != nil {
		return 0, err
	}
	res.BaselineCycles, res.BaselineErrors, res.BaselineSeconds = cycles, errs, o.baseline.Seconds()
	res.C = float64(cycles) / o.baseline.Seconds()
	fmt.Fprintf(os.Stderr, "baseline C = %.0f cycles/s (%d errors)\n", res.C, errs)
	if cycles == 0 {
		return 0, errors.New("the baseline completed no cycle")
	}
	if o.rate > 0 {
		return o.rate, nil
	}
	return o.offered * res.C, nil
}

func boolp(b bool) *bool { return &b }

func codeOf(cs []codeCount, code string) int64 {
	for _, c := range cs {
		if c.Code == code {
			return c.Count
		}
	}
	return 0
}

// rejections counts the refusals: overloaded, resource_exhausted, no_leader
// (not_leader with it), and every other error code, apart from the
// answers that are outcomes, not refusals.
func rejections(s roleSummary) (overloaded, exhausted, noLeader, other int64) {
	for _, c := range s.Codes {
		switch c.Code {
		case "overloaded":
			overloaded += c.Count
		case "resource_exhausted":
			exhausted += c.Count
		case "no_leader", "not_leader":
			noLeader += c.Count
		case "lock_held", "wait_timeout", "not_holder", "session_expired", "cancelled":
		default:
			other += c.Count
		}
	}
	return
}

// internalCuts counts the connections ended with an internal error frame.
func internalCuts(s roleSummary) (internal, all int64) {
	for _, c := range s.Cuts {
		all += c.Count
		if strings.HasPrefix(c.Code, "internal") {
			internal += c.Count
		}
	}
	return
}

func elections(r *overloadResult) int64 {
	if len(r.ElectionsLog) > int(r.Monitor.TermsStarted) {
		return int64(len(r.ElectionsLog))
	}
	return r.Monitor.TermsStarted
}

var overloadRows = []overloadRow{
	{"baseline C (closed loop, cycles/s)", "", func(r *overloadResult) string { return fmt.Sprintf("%.0f", r.C) }, nil},
	{"offered (open loop, cycles/s)", "2×C", func(r *overloadResult) string {
		return fmt.Sprintf("%.0f (%d due, %d skipped at the bench's bound)", r.Flood.OfferedPerSec, r.Flood.Scheduled, r.Flood.Skipped)
	}, nil},
	{"goodput ÷ C (whole window)", "≥ 0.8", func(r *overloadResult) string {
		return fmt.Sprintf("%.2f (%.0f/s)", r.Flood.Ratio, r.Flood.Goodput)
	}, func(r *overloadResult) *bool { return boolp(r.C > 0 && r.Flood.Ratio >= 0.8) }},
	{"goodput ÷ C after the burst; worst second", "", func(r *overloadResult) string {
		return fmt.Sprintf("%.2f; %.2f (s %d)", r.Flood.RatioAfterBurst, r.Flood.WorstSecondRatio, r.Flood.WorstSecondAt)
	}, nil},
	{"cycles failed (by code)", "", func(r *overloadResult) string { return fmtCounts(r.Flood.Failed) }, nil},
	{"cycle latency from due time p50 / p99 / max ms", "", func(r *overloadResult) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f", r.Flood.Latency.P50, r.Flood.Latency.P99, r.Flood.Latency.Max)
	}, nil},
	{"elections during the run", "0", func(r *overloadResult) string {
		return fmt.Sprintf("%d (leaders elected per the logs: %d; terms started in the window: %d; leader changes seen: %d)", elections(r), len(r.ElectionsLog), r.Monitor.TermsStarted, r.Monitor.LeaderChanges)
	}, func(r *overloadResult) *bool { return boolp(elections(r) == 0 && r.Monitor.LeaderChanges == 0) }},
	{"sessions lost (keepalive-only)", "0", func(r *overloadResult) string {
		return fmt.Sprintf("%d of %d", r.Sessions.Lost, r.Sessions.Sessions)
	}, func(r *overloadResult) *bool { return boolp(r.Sessions.Lost == 0) }},
	{"leases lost despite renews sent in time", "0", func(r *overloadResult) string {
		return fmt.Sprintf("%d of %d holders (all losses: %d %s; renews the bench sent late: %d)", r.Holders.LostTimely, r.Holders.Holders,
			r.Holders.Lost, fmtCounts(r.Holders.LostBy), r.Holders.SentLate)
	}, func(r *overloadResult) *bool { return boolp(r.Holders.LostTimely == 0) }},
	{"renews acknowledged after their lease ran out", "0", func(r *overloadResult) string {
		return fmt.Sprintf("%d of %d acknowledged (latest %.0f ms after expiry)", r.Holders.LateAcks, r.Holders.Acked, r.Holders.LateMaxMs)
	}, func(r *overloadResult) *bool { return boolp(r.Holders.LateAcks == 0) }},
	{"keepalive latency p50 / p99 / max ms", "p99 < 1000", func(r *overloadResult) string {
		l := r.Sessions.Latency
		return fmt.Sprintf("%.1f / %.1f / %.1f (%d)", l.P50, l.P99, l.Max, l.Count)
	}, func(r *overloadResult) *bool {
		return boolp(r.Sessions.Latency.Count > 0 && r.Sessions.Latency.P99 < 1000)
	}},
	{"the leader's own time per request, keepalive; renew: p50 / p99 / slowest bucket ms", "", func(r *overloadResult) string {
		k, okK := r.ServerLatency["keepalive"]
		n, okN := r.ServerLatency["renew"]
		if !okK && !okN {
			return "not measured"
		}
		return fmt.Sprintf("%.1f / %.1f / ≤ %.0f (%d); %.1f / %.1f / ≤ %.0f (%d)", k.P50Ms, k.P99Ms, k.MaxBucketMs, k.Count,
			n.P50Ms, n.P99Ms, n.MaxBucketMs, n.Count)
	}, nil},
	{"refusals: overloaded / resource_exhausted / no_leader / other", "", func(r *overloadResult) string {
		a, b, c, d := rejections(r.All)
		return fmt.Sprintf("%d / %d / %d / %d", a, b, c, d)
	}, nil},
	{"refusals without Retry-After", "0", func(r *overloadResult) string {
		return fmt.Sprintf("%d", r.All.RetryAfter.Missing)
	}, func(r *overloadResult) *bool {
		if slices.Contains(r.NotMeasured, notMeasuredRetryAfter) {
			return nil
		}
		return boolp(r.All.RetryAfter.Missing == 0)
	}},
	{"Retry-After min / p50 / max ms", "", func(r *overloadResult) string {
		ra := r.All.RetryAfter
		if ra.Count == 0 {
			return "none seen"
		}
		return fmt.Sprintf("%.0f / %.0f / %.0f (%d)", ra.MinMs, ra.P50Ms, ra.MaxMs, ra.Count)
	}, nil},
	{"retries (requests sent again after a refusal or a cut)", "", func(r *overloadResult) string {
		return fmt.Sprintf("%d (%s)", r.All.Retries, fmtRoleRetries(r.Roles))
	}, nil},
	{"connections cut by the server: internal frames / all", "0 internal", func(r *overloadResult) string {
		i, a := internalCuts(r.All)
		return fmt.Sprintf("%d / %d", i, a)
	}, func(r *overloadResult) *bool {
		if slices.Contains(r.NotMeasured, notMeasuredCuts) {
			return nil
		}
		i, _ := internalCuts(r.All)
		return boolp(i == 0)
	}},
	{"burst: waits queued at the end (leader) / sent", "", func(r *overloadResult) string {
		b := r.Burst
		return fmt.Sprintf("%d / %d in %.2f s (resent after cuts %d, after refusals %d; granted %d; ended %s)", b.Queued, b.Sent, b.SendSeconds,
			b.Resent, b.Retried, b.Granted, fmtCounts(b.Ended))
	}, nil},
	{"leader RSS MiB: window start / highest sample (at s) / peak (VmHWM) / end", "", func(r *overloadResult) string {
		m := r.Monitor
		return fmt.Sprintf("%.0f / %.0f (%.1f) / %.0f / %.0f", m.LeaderRSSStart, m.LeaderRSSMax, m.LeaderRSSMaxAt, m.LeaderHWM, m.LeaderRSSEnd)
	}, nil},
	{"leader commits/s: baseline / window / worst interval (at s)", "", func(r *overloadResult) string {
		m := r.Monitor
		return fmt.Sprintf("%.0f / %.0f / %.0f (%.1f)", m.CommitsBefore, m.CommitsWindow, m.CommitsMin, m.CommitsMinAt)
	}, nil},
}

const (
	notMeasuredRetryAfter = "Retry-After: etcd refuses with gRPC errors that carry no delay"
	notMeasuredCuts       = "connections cut: etcd's clients multiplex gRPC streams over a few connections the client re-dials itself"
)

func fmtCounts(cs []codeCount) string {
	if len(cs) == 0 {
		return "none"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %d", c.Code, c.Count))
	}
	return strings.Join(parts, ", ")
}

func fmtRoleRetries(rs []roleSummary) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %d", r.Role, r.Retries))
	}
	return strings.Join(parts, ", ")
}

func writeOverloadMarkdown(w io.Writer, rep *overloadReport) {
	c := rep.Config
	fmt.Fprintf(w, "Overload run: %d members; baseline C from %d closed-loop workers over %.0f s (after %.1f s warm-up); then %.0f s of %s open-loop acquire+release cycles (bound %d s each), a burst of %d waits over %d sessions on %d held locks at +%.0f s, %d keepalive-only sessions (TTL %d ms, keepalive every third) and %d holders renewing a %d ms lease every %d ms; lockd %s.\n\n",
		c.Members, c.Workers, c.BaselineSeconds, c.WarmupSeconds, c.DurationSeconds, offeredText(c), c.OpTimeoutMs/1000, c.Burst, c.BurstConns, c.BurstLocks,
		c.BurstAtSeconds, c.Sessions, c.SessionTTLms, c.Holders, c.HolderTTLms, c.RenewEveryMs, rep.Host.LockdCommit)
	fmt.Fprint(w, "| measure | goal |")
	for _, r := range rep.Results {
		fmt.Fprintf(w, " %s |", r.System)
	}
	fmt.Fprint(w, "\n|---|---|")
	for range rep.Results {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, row := range overloadRows {
		fmt.Fprintf(w, "| %s | %s |", row.measure, row.goal)
		for _, r := range rep.Results {
			v := row.value(r)
			if row.met != nil && row.goal != "" {
				if m := row.met(r); m != nil {
					v += " " + yesNo(*m)
				}
			}
			fmt.Fprintf(w, " %s |", v)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(w, "**%s stopped early:** %s\n\n", r.System, r.Error)
		}
		if len(r.Roles) > 0 {
			fmt.Fprintf(w, "%s, by client role:\n\n", r.System)
			fmt.Fprintln(w, "| role | error answers | retries | Retry-After min / p50 / max ms (refusals without) | connections cut by the server | reconnects |")
			fmt.Fprintln(w, "|---|---|--:|---|---|--:|")
			for _, s := range r.Roles {
				ra := "–"
				if s.RetryAfter.Count > 0 {
					ra = fmt.Sprintf("%.0f / %.0f / %.0f", s.RetryAfter.MinMs, s.RetryAfter.P50Ms, s.RetryAfter.MaxMs)
				}
				fmt.Fprintf(w, "| %s | %s | %d | %s (%d) | %s | %d |\n", s.Role, fmtCounts(s.Codes), s.Retries, ra, s.RetryAfter.Missing, fmtCounts(s.Cuts), s.Reconnects)
			}
			fmt.Fprintln(w)
			msgs := map[string]string{}
			for _, s := range r.Roles {
				for k, v := range s.Messages {
					if _, ok := msgs[k]; !ok {
						msgs[k] = v
					}
				}
			}
			if len(msgs) > 0 {
				codes := slices.Sorted(maps.Keys(msgs))
				fmt.Fprintf(w, "%s, first message of each error code:", r.System)
				for _, k := range codes {
					fmt.Fprintf(w, " %s: %q;", k, msgs[k])
				}
				fmt.Fprint(w, "\n\n")
			}
		}
		if len(r.ElectionsLog) > 0 {
			fmt.Fprintf(w, "%s elections after start-up (from the members' logs):", r.System)
			for _, e := range r.ElectionsLog {
				fmt.Fprintf(w, " %s %s term %d ready after %.3f s;", e.At, e.Member, e.Term, e.ReadyAfter)
			}
			fmt.Fprintln(w)
			fmt.Fprintln(w)
		}
		if len(r.Monitor.MaxRSS) > 0 {
			ids := make([]string, 0, len(r.Monitor.MaxRSS))
			for id := range r.Monitor.MaxRSS {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			var parts []string
			for _, id := range ids {
				parts = append(parts, fmt.Sprintf("%s %.0f", id, r.Monitor.MaxRSS[id]))
			}
			fmt.Fprintf(w, "%s highest RSS per member over the run (MiB): %s. Goodput per second of the window: %v.\n\n", r.System, strings.Join(parts, ", "), r.Flood.PerSecond)
		}
		for _, n := range r.NotMeasured {
			fmt.Fprintf(w, "%s, not measured: %s.  \n", r.System, n)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "%s: %s  \n", r.System, n)
		}
	}
}

func offeredText(c overloadConfig) string {
	if c.Rate > 0 {
		return fmt.Sprintf("%.0f/s", c.Rate)
	}
	return fmt.Sprintf("%.3g×C", c.Offered)
}

func yesNo(b bool) string {
	if b {
		return "✔"
	}
	return "✘"
}
