package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockd/lockd/internal/server"
)

// runConfig is one chaos run.
type runConfig struct {
	Members  int
	Duration time.Duration
	Seed     uint64
	Faults   []string
	Workload WorkloadOptions
	// RestoreRounds is how many forced restores the restore phase does
	// after the chaos (0: no restore phase).
	RestoreRounds int
	// Explicit: asked for on the command line (summary kept on disk).
	Explicit bool
}

// TestChaos runs the suite. Without flags it is the CI profile: a short
// run on 3 members and a shorter one on 5, each with part of the fault
// kinds (together they cover most; the seed picks the order). With
// -chaos.duration it is one run of that length on -chaos.members members
// with every fault kind.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs start real processes; skipped in -short")
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000)
	}
	if *flagDuration > 0 {
		members := *flagMembers
		if members == 0 {
			members = 5
		}
		cfg := runConfig{Members: members, Duration: *flagDuration, Seed: seed, Faults: faultKinds(nil), Explicit: true,
			RestoreRounds: 5,
			Workload: WorkloadOptions{HTTPWorkers: 5, ClientWorkers: 2, Readers: 2, FIFO: true, Keeper: true,
				Hasty: 2, Cancellers: 1, Scenarios: true, Probe: true,
				KindsHTTP: 2, KindsWS: 2, DelayRounds: true, Revoker: true, Withdraw: true,
				ElectWS: 2, ElectHTTP: 1, ElectClient: 1, PrefixWatchers: 2, LockWatchers: 1, Blockers: 2, ClientObserver: true,
				WSRetry: 2, Churners: 2, ChurnWatchers: 2}}
		if *flagOverload {
			cfg.Workload.Flood, cfg.Workload.FloodBurst = 4, true
		}
		t.Run(fmt.Sprintf("members=%d", members), func(t *testing.T) { runChaos(t, cfg) })
		return
	}
	small := WorkloadOptions{HTTPWorkers: 3, ClientWorkers: 1, Readers: 2, FIFO: true, Keeper: true,
		Hasty: 1, Cancellers: 1, Scenarios: true, Probe: true,
		KindsHTTP: 1, KindsWS: 1, DelayRounds: true, Revoker: true, Withdraw: true,
		ElectWS: 1, ElectHTTP: 1, ElectClient: 1, PrefixWatchers: 1, LockWatchers: 1, Blockers: 1, ClientObserver: true,
		WSRetry: 1, Churners: 2, ChurnWatchers: 1}
	t.Run("members=3", func(t *testing.T) {
		runChaos(t, runConfig{Members: 3, Duration: 30 * time.Second, Seed: seed, Workload: small, RestoreRounds: 3,
			Faults: faultKinds([]string{FaultKillLeader, FaultPauseLeader, FaultPartition, FaultOneWayLeader,
				FaultMembership, FaultCrashAll, FaultLossyNet, FaultBadMember})})
	})
	t.Run("members=5", func(t *testing.T) {
		runChaos(t, runConfig{Members: 5, Duration: 15 * time.Second, Seed: seed + 1, Workload: small, RestoreRounds: 2,
			Faults: faultKinds([]string{FaultKillFollower, FaultPauseFollower, FaultIsolateLeader,
				FaultOneWayRandom, FaultSlowNet, FaultKillLeaderFast, FaultTermLeader})})
	})
	// The overload phase: the same workload and checkers while a flood
	// offers far more than the cluster commits.
	flooded := small
	flooded.Flood, flooded.FloodBurst = 2, true
	t.Run("overload", func(t *testing.T) {
		runChaos(t, runConfig{Members: 3, Duration: 20 * time.Second, Seed: seed + 2, Workload: flooded,
			Faults: faultKinds([]string{FaultKillLeader, FaultPauseLeader, FaultPartition, FaultPauseFollower})})
	})
}

// reserve is the time a run keeps, after its chaos, to stop the clients,
// settle the locks, compare replicas, run the restore phase, write the
// history and check it.
const reserve = 90 * time.Second

// runBudget shortens a run that would not finish before cmd/go kills the
// test binary (its -timeout plus one minute).
func runBudget(t *testing.T, d time.Duration) time.Duration {
	if cmdGoKill.IsZero() {
		return d
	}
	left := time.Until(cmdGoKill) - reserve
	if left < d {
		t.Logf("NOTE: -chaos.duration %s does not fit before `go test` kills the binary (its -timeout + 1m); running %s. Pass -timeout 0 (or a larger -timeout) for the full length.",
			d, left.Round(time.Second))
		return max(left, 10*time.Second)
	}
	return d
}

func runChaos(t *testing.T, cfg runConfig) {
	binaries(t) // build before the clock starts
	if cfg.RestoreRounds > 0 {
		builds.Path(t, "lockctl")
	}
	begin := time.Now()
	rec := NewRecorder()
	sctx, stopStalls := context.WithCancel(context.Background())
	stalls := make(chan struct{})
	go func() {
		defer close(stalls)
		watchStalls(sctx, rec)
	}()
	defer func() { stopStalls(); <-stalls }()
	fence := StartFencestore(t)
	cluster := StartCluster(t, ClusterOptions{Members: cfg.Members, Spares: 1, Seed: cfg.Seed,
		Extra: append([]string{"--snapshot-threshold", "200", "--snapshot-interval", "1s", "--trailing-logs", "100",
			"--log-level", "info", "--raft-log-level", "warn"}, strings.Fields(*flagLockd)...)})
	startup := time.Since(begin)
	cfg.Duration = runBudget(t, cfg.Duration)
	t.Logf("chaos run: %d members, %s, seed %d, faults %s", cfg.Members, cfg.Duration, cfg.Seed, strings.Join(cfg.Faults, ","))

	et := lockdElectionTimeout()
	wopts := cfg.Workload
	wopts.ElectionTimeout = et
	wopts.Endpoints = cluster.Endpoints()
	wopts.Fence = fence.URL
	wopts.Seed = cfg.Seed
	if wopts.Epoch == 0 {
		wopts.Epoch = 10 * time.Second
	}
	if wopts.LocksPerEpoch == 0 {
		wopts.LocksPerEpoch = 3
	}
	w := NewWorkload(rec, wopts)
	defer w.StopObservers() // normally done below, after the final state was read
	wctx, stopWorkload := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		w.Run(wctx)
	}()

	nem := NewNemesis(cluster, rec, cfg.Seed, cfg.Faults)
	nctx, stopNemesis := context.WithTimeout(context.Background(), cfg.Duration)
	nem.Run(nctx)
	stopNemesis()
	chaosEnd := time.Now()
	// Let the clients see a healed cluster for a moment, then stop them.
	if err := cluster.WaitHealthy(20 * time.Second); err != nil {
		rec.Note("liveness: not healthy at the end: %v", err)
		nem.stuck = append(nem.stuck, "at the end: "+err.Error())
	}
	sleep(context.Background(), time.Second)
	stopWorkload()
	<-wdone
	// Every lock a client walked away from must come free: read each once
	// more after its expiry plus the grace.
	w.settle(context.Background(), "", "", 12*time.Second)
	// The elections end: every campaign over, one final leader holding.
	w.SettleElections(context.Background(), 20*time.Second)
	nem.RecordExits()
	divergence, final := compareReplicas(cluster, 15*time.Second)
	if divergence != "" {
		rec.Note("replicas differ: %s", divergence)
	}
	// The watchers must show the replicated final state within a bound
	// (checkWatchFinal): give them that long, then stop them.
	w.RecordFinal(final)
	if final != nil {
		sleep(context.Background(), watchFinalBound)
	}
	w.StopObservers()
	w.ReleaseFinal(context.Background())
	if cfg.RestoreRounds > 0 {
		restorePhase(t, cluster, rec, cfg.Seed, cfg.RestoreRounds, et)
		nem.RecordExits()
		if d, _ := compareReplicas(cluster, 15*time.Second); d != "" && divergence == "" {
			divergence = "after the restore phase: " + d
			rec.Note("replicas differ: %s", divergence)
		}
	}

	for _, p := range cluster.Panics() {
		now := rec.Now()
		slot, what, _ := strings.Cut(p, ": ")
		rec.Add(Op{Worker: "harness", Via: "nemesis", Kind: KindMemberPanic, Node: slot, Invoke: now, Return: now,
			Outcome: Fail, Err: what})
	}

	stopStalls()
	<-stalls
	h := rec.History()
	if cfg.Workload.Flood > 0 || cfg.Workload.FloodBurst {
		h.Flood = w.flood.report()
	}
	h.Seed, h.Members, h.Duration = cfg.Seed, cfg.Members, cfg.Duration.String()
	h.ElectionTimeoutMs = et.Milliseconds()
	// An explicit run writes its history before checking it: if the check
	// outlives the test binary, the history is still there for -chaos.replay.
	var dir string
	if cfg.Explicit || *flagKeep {
		var err error
		if dir, err = writeHistory(cfg, h, cluster, fence); err != nil {
			t.Errorf("writing the run to disk: %v", err)
		}
	}
	checkStart := time.Now()
	linTimeout := 2*time.Minute + cfg.Duration/4
	if !cmdGoKill.IsZero() {
		linTimeout = min(linTimeout, max(time.Until(cmdGoKill)-15*time.Second, 10*time.Second))
	}
	rep := Check(h, CheckOptions{LinTimeout: linTimeout, Visualize: true})
	checkTime := time.Since(checkStart)

	failed := len(rep.Violations) > 0 || len(nem.Stuck()) > 0 || divergence != ""
	summary := summarize(cfg, h, rep, nem, cluster, startup, checkStart.Sub(chaosEnd), checkTime, divergence)
	t.Log("\n" + summary)
	if failed && dir == "" {
		var err error
		if dir, err = writeHistory(cfg, h, cluster, fence); err != nil {
			t.Errorf("writing the run to disk: %v", err)
		}
	}
	if dir != "" {
		if err := writeResults(dir, h, rep, summary, !failed && !*flagKeep); err != nil {
			t.Errorf("writing the results: %v", err)
		}
		t.Logf("run written to %s", dir)
	}
	for _, v := range rep.Violations {
		what := "VIOLATION"
		if livenessCheckers[v.Checker] {
			what = "LIVENESS"
		}
		t.Errorf("%s [%s] %s", what, v.Checker, v.Msg)
		for _, id := range v.Ops[:min(len(v.Ops), 4)] {
			t.Errorf("    %s", h.Ops[id])
		}
	}
	for _, s := range nem.Stuck() {
		t.Errorf("LIVENESS: %s", s)
	}
	if divergence != "" {
		t.Errorf("REPLICAS DIFFER: %s", divergence)
	}
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// summarize renders the run's numbers.
func summarize(cfg runConfig, h History, rep *Report, nem *Nemesis, c *Cluster, startup, stopping, checking time.Duration,
	divergence string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary: %d members, seed %d, %s of faults (start %s, stop %s, check %s)\n",
		cfg.Members, cfg.Seed, cfg.Duration, startup.Round(100*time.Millisecond), stopping.Round(100*time.Millisecond),
		checking.Round(100*time.Millisecond))

	type counts struct{ ok, fail, unknown int }
	byKind := map[OpKind]*counts{}
	via := map[string]int{}
	for _, op := range h.Ops {
		c := byKind[op.Kind]
		if c == nil {
			c = &counts{}
			byKind[op.Kind] = c
		}
		switch op.Outcome {
		case Ok:
			c.ok++
		case Fail:
			c.fail++
		default:
			c.unknown++
		}
		via[op.Via]++
	}
	fmt.Fprintf(&b, "operations: %d (http %d, go client %d, websocket %d, nemesis %d)\n", len(h.Ops), via["http"], via["client"], via["ws"], via["nemesis"])
	if f := h.Flood; f != nil {
		refused := 0
		for _, op := range h.Ops {
			if refusedForNow(op) {
				refused++
			}
		}
		fmt.Fprintf(&b, "overload: the flood sent %d cycles, %d granted, answers %v; bursts granted %d waits; %d admission refusals without a retry delay, %d connections cut; the workers were refused for now %d times\n",
			f.Sent, f.Granted, f.Codes, f.Queued, f.NoRetry, f.Cuts, refused)
	}
	for _, k := range []OpKind{KindAcquire, KindMulti, KindCancel, KindRelease, KindRenew, KindRevoke, KindValue, KindRead, KindFence, KindKeepalive, KindLost,
		KindWatch, KindUnwatch, KindChanged, KindSynced, KindResync, KindFinal, KindWSClosed, KindMemberAdd, KindMemberExit, KindMemberPanic} {
		if c := byKind[k]; c != nil {
			fmt.Fprintf(&b, "  %-12s ok %7d  refused %7d  unknown %6d\n", k, c.ok, c.fail, c.unknown)
		}
	}
	b.WriteString(kindsSummary(h, rep))
	b.WriteString(electSummary(h, rep))
	b.WriteString(cancelSummary(rep))
	fmt.Fprintf(&b, "grants: %d acknowledged, %d with a non-empty safe interval checked for overlap; %d real-time token pairs ordered; %d releases acknowledged\n",
		rep.Grants, rep.Intervals, rep.OrderedPairs, rep.ReleasesAcked)
	fmt.Fprintf(&b, "fifo: %d rounds with waiters proven queued together, %d ordered pairs checked\n", rep.FIFORounds, rep.FIFOPairs)
	fmt.Fprintf(&b, "durability: %d probes read back after full restarts\n", rep.DurableChecked)
	fmt.Fprintf(&b, "fencestore: %d writes accepted, %d refused as stale\n", rep.FenceAccepted, rep.FenceRefused)
	fmt.Fprintf(&b, "linearizability (porcupine): %d ops in %d lock partitions: %s in %s\n",
		rep.LinOps, rep.LinPartitions, rep.LinResult, rep.LinTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "expiry: %d observations of held locks checked against expires_at + %s + 1s (%d made after expires_at)\n",
		rep.ExpiryChecked, electionTimeout(h), rep.ExpiryPast)
	fmt.Fprintf(&b, "waiters: %d waits checked for a grant visible a second before they were told; Go client: %d grants' Lost() compared with the next grant\n",
		rep.WaitsChecked, rep.LostChecked)
	fmt.Fprintf(&b, "websocket: %d retry rounds with both acquires of one wait compared; %d synced watches, %d frames after synced checked, %d (watch, lock) pictures compared with every other observation\n",
		rep.RetryRounds, rep.WatchesSynced, rep.SyncedFrames, rep.PicturesCompared)
	fmt.Fprintf(&b, "restores: %d forced restores with grants on both sides; keepalives: %d sent to a paused leader; bad member additions: %d sent\n",
		rep.RestoresChecked, rep.KeepalivesPaused, rep.MemberAdds)

	kinds := map[string]int{}
	var failovers, recoveries []time.Duration
	ferrs := 0
	for _, f := range h.Faults {
		kinds[f.Kind]++
		if f.Err != "" {
			ferrs++
		}
		if f.Failover > 0 {
			if f.Kind == FaultCrashAll {
				recoveries = append(recoveries, time.Duration(f.Failover))
			} else if leaderFaults[f.Kind] {
				failovers = append(failovers, time.Duration(f.Failover))
			}
		}
	}
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(ks)
	fmt.Fprintf(&b, "faults: %d (%s); %d reported a harness error\n", len(h.Faults), strings.Join(ks, " "), ferrs)
	fmt.Fprintf(&b, "failover (leader fault → first write answered): n=%d p50 %s max %s\n",
		len(failovers), pct(failovers, 0.5).Round(time.Millisecond), pct(failovers, 1).Round(time.Millisecond))
	if len(recoveries) > 0 {
		fmt.Fprintf(&b, "full-crash recovery (kill all → first write answered): n=%d p50 %s max %s\n",
			len(recoveries), pct(recoveries, 0.5).Round(time.Millisecond), pct(recoveries, 1).Round(time.Millisecond))
	}
	ns := c.NetStats()
	fmt.Fprintf(&b, "network: %d raft connections proxied, %d refused while cut, %d reset, %.1f MB forwarded, %.1f kB blackholed\n",
		ns.Accepted, ns.Refused, ns.Resets, float64(ns.Forwarded)/1e6, float64(ns.Discarded)/1e3)
	if s := nem.Stuck(); len(s) > 0 {
		fmt.Fprintf(&b, "liveness: %d problems: %s\n", len(s), strings.Join(s, "; "))
	} else {
		b.WriteString("liveness: the cluster recovered after every fault\n")
	}
	if divergence != "" {
		b.WriteString("replicas: DIFFER: " + divergence + "\n")
	} else {
		b.WriteString("replicas: identical lock tables and last tokens at the same applied index\n")
	}
	safety, liveness := rep.split()
	fmt.Fprintf(&b, "safety violations: %s\n", countsLine(safety))
	fmt.Fprintf(&b, "liveness violations: %s\n", countsLine(liveness))
	return b.String()
}

// countsLine renders violation counts by checker: "3 (expiry=2 waiter-told=1)".
func countsLine(counts map[string]int) string {
	total := 0
	var vs []string
	for k, n := range counts {
		total += n
		vs = append(vs, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(vs)
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(vs, " "))
}

// lockdElectionTimeout is the members' election timeout: lockd's default,
// or what -chaos.lockd-flags sets.
func lockdElectionTimeout() time.Duration {
	fs := strings.Fields(*flagLockd)
	for i, f := range fs {
		v, ok := strings.CutPrefix(f, "--election-timeout=")
		if !ok && f == "--election-timeout" && i+1 < len(fs) {
			v, ok = fs[i+1], true
		}
		if d, err := time.ParseDuration(v); ok && err == nil && d > 0 {
			return d
		}
	}
	return server.DefaultElectionTimeout
}

// writeHistory writes what a run recorded to runs/<time>-seed<N>-m<members>/:
// the history, the faults, the member logs.
func writeHistory(cfg runConfig, h History, c *Cluster, fs *Fencestore) (string, error) {
	dir := filepath.Join("runs", fmt.Sprintf("%s-seed%d-m%d", time.Now().Format("20060102-150405"), cfg.Seed, cfg.Members))
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return "", err
	}
	var faults strings.Builder
	for _, f := range h.Faults {
		fmt.Fprintf(&faults, "[%s, %s] %s %v %s failover=%s %s\n", ms(f.Start), ms(f.End), f.Kind, f.Targets, f.Detail,
			time.Duration(f.Failover).Round(time.Millisecond), f.Err)
	}
	for _, n := range h.Notes {
		fmt.Fprintf(&faults, "note: %s\n", n)
	}
	errs := []error{
		os.WriteFile(filepath.Join(dir, "faults.txt"), []byte(faults.String()), 0o644),
		h.WriteJSON(filepath.Join(dir, "history.json")),
		c.CopyLogs(filepath.Join(dir, "logs")),
	}
	if b, err := os.ReadFile(fs.logPath); err == nil {
		errs = append(errs, os.WriteFile(filepath.Join(dir, "logs", "fencestore.log"), b, 0o644))
	}
	return dir, errors.Join(errs...)
}

// writeResults adds the summary, the violations and porcupine's
// visualization of a bad partition. passed drops the bulky history and
// logs, keeping the summary.
func writeResults(dir string, h History, rep *Report, summary string, passed bool) error {
	if passed {
		_ = os.Remove(filepath.Join(dir, "history.json"))
		_ = os.RemoveAll(filepath.Join(dir, "logs"))
	}
	var vb strings.Builder
	for _, v := range rep.Violations {
		fmt.Fprintf(&vb, "[%s] %s\n", v.Checker, v.Msg)
		for _, id := range v.Ops {
			fmt.Fprintf(&vb, "    %s\n", h.Ops[id])
		}
	}
	errs := []error{
		os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(summary), 0o644),
		os.WriteFile(filepath.Join(dir, "violations.txt"), []byte(vb.String()), 0o644),
	}
	if rep.LinResult == porcupine.Illegal && rep.linVisual {
		errs = append(errs, porcupine.VisualizePath(rep.linModel, rep.LinInfo, filepath.Join(dir, "porcupine.html")))
	}
	return errors.Join(errs...)
}

// TestReplay re-checks a history written by a failed run:
//
//	go test ./test/chaos -run Replay -v -chaos.replay=runs/<run>/history.json
func TestReplay(t *testing.T) {
	if *flagReplay == "" {
		t.Skip("no -chaos.replay history given")
	}
	h, err := ReadHistory(*flagReplay)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(h, CheckOptions{LinTimeout: 10 * time.Minute})
	t.Logf("%d ops, %d faults; linearizability %s in %s; violations %d %v", len(h.Ops), len(h.Faults),
		rep.LinResult, rep.LinTime, rep.Total(), rep.Counts)
	for _, v := range rep.Violations {
		t.Errorf("VIOLATION [%s] %s", v.Checker, v.Msg)
		for _, id := range v.Ops {
			t.Errorf("    %s", h.Ops[id])
		}
	}
}
