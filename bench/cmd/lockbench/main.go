// Command lockbench measures lockd against etcd's lock
// (clientv3/concurrency.Mutex) and ZooKeeper's (go-zookeeper's lock recipe)
// on the same machine in the same run.
//
//	lockbench [flags]          the side-by-side benchmark (workloads a–e)
//	lockbench scale [flags]    the scale benchmark (1M held locks, 100k waiters)
//	lockbench overload [flags] SPEC 15 under overload: 2×C open-loop, a burst of waits, kept promises
//	lockbench amplify [flags]  what one client can make the leader hold (SPEC 16)
//	lockbench disk [flags]     the disk's floor: a small write + fsync, p50/p99
//
// It starts a lockd cluster (the real lockd binary, built from ../cmd/lockd),
// an etcd cluster (go.etcd.io/etcd/server/v3/embed, each member a
// re-executed `lockbench etcd-member` process) and a ZooKeeper ensemble (one
// JVM per member, from the system's ZooKeeper install) on loopback with data
// on disk, runs every workload on every system in turn, with one client per
// worker and with one client shared by the workers, and writes a markdown
// table to stdout and results.json, results.md and chart.png to --out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/internal/version"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "etcd-member":
			os.Exit(etcdMemberMain(os.Args[2:]))
		case "scale":
			os.Exit(scaleMain(os.Args[2:]))
		case "overload":
			os.Exit(overloadMain(os.Args[2:]))
		case "overload-probes":
			os.Exit(overloadProbesMain(os.Args[2:]))
		case "amplify":
			os.Exit(amplifyMain(os.Args[2:]))
		case "disk":
			os.Exit(diskMain(os.Args[2:]))
		case "run":
			os.Exit(benchMain(os.Args[2:]))
		case "version", "-version", "--version":
			fmt.Println("lockbench", version.String())
			os.Exit(0)
		}
	}
	os.Exit(benchMain(os.Args[1:]))
}

// common flags of both modes.
type commonFlags struct {
	members  int
	out      string
	repo     string
	lockdBin string
	keep     bool
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&c.members, "members", 3, "members per cluster (3 or 5)")
	fs.StringVar(&c.out, "out", "bench-results", "directory for results.json, results.md, chart.png")
	fs.StringVar(&c.repo, "repo", "", "root of the lockd repository (default: found upwards from the working directory)")
	fs.StringVar(&c.lockdBin, "lockd-bin", "", "a prebuilt lockd binary (default: build ./cmd/lockd of --repo)")
	fs.BoolVar(&c.keep, "keep", false, "keep the clusters' data directories and logs")
}

// prepare builds lockd and makes the work directory. done removes the
// directory when the run ends (with --keep it stays, and prepare says where).
func (c *commonFlags) prepare() (repo, bin, dir string, done func(), err error) {
	if err = os.MkdirAll(c.out, 0o755); err != nil {
		return
	}
	dir, err = os.MkdirTemp("", "lockbench-")
	if err != nil {
		return
	}
	defer func() {
		switch {
		case err != nil:
			os.RemoveAll(dir)
		case c.keep:
			done = func() {}
			fmt.Fprintln(os.Stderr, "data and logs in", dir)
		default:
			done = func() { os.RemoveAll(dir) }
		}
	}()
	bin = c.lockdBin
	if bin == "" || c.repo != "" {
		repo, err = findRepo(c.repo)
		if err != nil {
			return
		}
	}
	if bin == "" {
		fmt.Fprintf(os.Stderr, "building lockd from %s ...\n", repo)
		bin, err = buildLockd(repo, dir)
	}
	return
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func benchMain(args []string) int {
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	quick := fs.Bool("quick", false, "a smoke run: 1 s per run, 1 round, leader setup only, 15 s ZooKeeper warm-up")
	duration := fs.Duration("duration", 10*time.Second, "measured time per run")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured time at the start of each run")
	rounds := fs.Int("rounds", 2, "runs per system per workload and setup (A B A B ...)")
	wlFlag := fs.String("workloads", "a,b,c,d,e", "workloads to run, from a,b,c,d,e")
	setupsFlag := fs.String("setups", "leader,spread", "client setups: leader (clients on the leader), spread (client i on member i mod N; lockd clients get all endpoints)")
	systemsFlag := fs.String("systems", "lockd,lockd-bolt,etcd,zookeeper", "systems: lockd (client package, WebSocket sessions; the default log store, raft-wal), lockd-bolt (the same on a second cluster with --log-store bolt), etcd, zookeeper (skipped with a note when not installed), lockd-http (plain HTTP API)")
	clientsFlag := fs.String("clients", "both", "whether the workers of a run share a client: per-worker (every worker its own client and session), shared (one client and one session for all), both")
	zkClasspath := fs.String("zk-classpath", "", "java classpath of the ZooKeeper server (default: Debian's "+debianZKJar+")")
	zkHeap := fs.String("zk-heap", "256m", "heap of each ZooKeeper JVM (-Xmx)")
	zkWarmup := fs.Duration("zk-warmup", time.Minute, "lock cycles through every ZooKeeper member before the first measured run, so the JVMs have compiled the request path (its rate per fifth is printed, to show whether it levelled off)")
	sessionTTL := fs.Duration("session-ttl", 10*time.Second, "session TTL of every client of every system (keepalives every third)")
	lockdFlags := fs.String("lockd-flags", "", "extra lockd flags for every member, space-separated (e.g. \"--log-store bolt\")")
	etcdConns := fs.Int("etcd-clients", 1, "with --clients per-worker: clientv3 clients (gRPC connections) the etcd workers of one run share, each with its own session; at least one per member in the spread setup (default 1, as etcd advises: one client per process)")
	opTimeout := fs.Duration("op-timeout", 30*time.Second, "bound of one acquire or release")
	cpuProfile := fs.String("cpuprofile", "", "write a pprof CPU profile of lockbench itself (the clients) to this file")
	perf := fs.String("perf", "", "workloads (e.g. b) during whose measured windows `perf record` samples each system's leader; reports go to --out")
	pprofWLs := fs.String("pprof", "", "workloads (e.g. b,c) during whose measured windows a Go CPU profile of each lockd leader is fetched (the members run with --pprof); profiles and `go tool pprof -top` go to --out")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	setFlags := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { setFlags[f.Name] = true })
	if *quick {
		if !setFlags["duration"] {
			*duration = time.Second
		}
		if !setFlags["warmup"] {
			*warmup = 300 * time.Millisecond
		}
		if !setFlags["rounds"] {
			*rounds = 1
		}
		if !setFlags["setups"] {
			*setupsFlag = setupLeader
		}
		if !setFlags["zk-warmup"] {
			*zkWarmup = 15 * time.Second
		}
	}
	wls, err := pickWorkloads(*wlFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 2
	}
	setups := splitList(*setupsFlag)
	for _, s := range setups {
		if s != setupLeader && s != setupSpread {
			fmt.Fprintf(os.Stderr, "lockbench: unknown setup %q\n", s)
			return 2
		}
	}
	clientModes, err := pickClients(*clientsFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 2
	}
	sysNames := splitList(*systemsFlag)
	for _, n := range sysNames {
		if !slices.Contains(knownSystems, n) {
			fmt.Fprintf(os.Stderr, "lockbench: unknown system %q\n", n)
			return 2
		}
	}
	var zkInst *zkInstall
	var skipped []string
	if slices.Contains(sysNames, "zookeeper") {
		zkInst, err = findZooKeeper(*zkClasspath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockbench: skipping zookeeper:", err)
			skipped = append(skipped, "zookeeper: "+err.Error())
			sysNames = slices.DeleteFunc(sysNames, func(n string) bool { return n == "zookeeper" })
		}
	}
	if len(sysNames) == 0 {
		fmt.Fprintln(os.Stderr, "lockbench: no systems to run")
		return 2
	}
	if cf.members < 1 || *rounds < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "lockbench: --members, --rounds and --duration must be positive")
		return 2
	}

	ctx, cancel := signalContext()
	defer cancel()
	repo, bin, dir, done, err := cf.prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer done()

	rep := &report{Started: time.Now(), Workloads: wls, Skipped: skipped}
	rep.Host = describeHost(repo)
	rep.Config = benchConfig{Members: cf.members, Duration: duration.String(), Warmup: warmup.String(), Rounds: *rounds,
		Setups: setups, Clients: clientModes, Systems: sysNames, SessionTTL: sessionTTL.String(), EtcdConns: *etcdConns, Quick: *quick,
		LockdFlags: strings.Fields(*lockdFlags)}
	if *pprofWLs != "" && !slices.Contains(rep.Config.LockdFlags, "--pprof") {
		rep.Config.LockdFlags = append(rep.Config.LockdFlags, "--pprof")
	}
	if zkInst != nil {
		rep.Config.ZooKeeper = &zkConfig{Classpath: zkInst.classpath, Heap: *zkHeap, Warmup: zkWarmup.String(), ForceSync: true}
	}

	fmt.Fprintf(os.Stderr, "starting %d-member clusters (%s) in %s ...\n", cf.members, strings.Join(sysNames, ", "), dir)
	// Only the clusters of the systems asked for run: an idle cluster still
	// takes CPU (heartbeats) from the measured ones.
	var lc *lockdCluster
	if slices.Contains(sysNames, "lockd") || slices.Contains(sysNames, "lockd-http") {
		lc, err = startLockd(ctx, bin, filepath.Join(dir, "lockd"), cf.members, rep.Config.LockdFlags)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockbench:", err)
			return 1
		}
		defer lc.stop()
	}
	var ec *etcdCluster
	if slices.Contains(sysNames, "etcd") {
		ec, err = startEtcd(ctx, filepath.Join(dir, "etcd"), cf.members)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockbench:", err)
			return 1
		}
		defer ec.stop()
	}

	var lw *lockdCluster // the raft-boltdb cluster, only when asked for
	if slices.Contains(sysNames, "lockd-bolt") {
		lw, err = startLockd(ctx, bin, filepath.Join(dir, "lockd-bolt"), cf.members, append(slices.Clone(rep.Config.LockdFlags), "--log-store", "bolt"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockbench:", err)
			return 1
		}
		defer lw.stop()
	}

	var zc *zkCluster
	if zkInst != nil {
		zc, err = startZooKeeper(ctx, zkInst, filepath.Join(dir, "zookeeper"), cf.members, *zkHeap)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockbench:", err)
			return 1
		}
		defer zc.stop()
		rep.Host.ZooKeeperVersion = zc.version
		rep.Host.JavaVersion = javaVersion(zkInst.java)
		if *zkWarmup > 0 {
			fmt.Fprintf(os.Stderr, "warming up ZooKeeper %s (JIT) for %v ...\n", zc.version, *zkWarmup)
			rates, err := warmZooKeeper(ctx, zc, *zkWarmup, *sessionTTL)
			if err != nil {
				fmt.Fprintln(os.Stderr, "lockbench:", err)
				return 1
			}
			rep.Config.ZooKeeper.WarmupRates = rates
			fmt.Fprintf(os.Stderr, "ZooKeeper warm-up, cycles/s per fifth: %s\n", fmtRates(rates))
		}
	}

	var systems []system
	for _, n := range sysNames {
		switch n {
		case "lockd":
			systems = append(systems, &lockdSystem{c: lc, sessionTTL: *sessionTTL})
		case "lockd-bolt":
			systems = append(systems, &lockdSystem{c: lw, sessionTTL: *sessionTTL, label: "lockd-bolt"})
		case "lockd-http":
			systems = append(systems, &lockdHTTPSystem{lockdSystem{c: lc, sessionTTL: *sessionTTL}})
		case "etcd":
			systems = append(systems, &etcdSystem{c: ec, sessionTTL: *sessionTTL, conns: *etcdConns})
		case "zookeeper":
			systems = append(systems, &zkSystem{c: zc, sessionTTL: *sessionTTL})
		}
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}

	total := 0
	for _, wl := range wls {
		for _, cm := range clientModes {
			if cm == clientsPerWorker || runsShared(wl) {
				total += len(setups) * *rounds * len(systems)
			}
		}
	}
	prog := newProgress(total)
	o := runOpts{warmup: *warmup, duration: *duration, opTimeout: *opTimeout, prog: prog}
	if *perf != "" || *pprofWLs != "" {
		o.hook = profileHook(cf.out, splitList(*perf), splitList(*pprofWLs), prog)
	}
	var runErr error
loop:
	for _, wl := range wls {
		for _, setup := range setups {
			for _, cm := range clientModes {
				if cm == clientsShared && !runsShared(wl) {
					continue
				}
				for round := 1; round <= *rounds; round++ {
					for _, sys := range systems {
						r, err := runOne(ctx, sys, wl, setup, cm, round, o)
						if err != nil {
							runErr = err
							break loop
						}
						rep.Runs = append(rep.Runs, r)
						if r.Errors > 0 {
							prog.note("%s %s %s %s r%d: %d errors, first: %s", wl.Key, setup, cm, sys.name(), round, r.Errors, r.FirstError)
						}
						if r.Cycles == 0 {
							prog.note("%s %s %s %s r%d: no cycle completed inside the measured window", wl.Key, setup, cm, sys.name(), round)
						}
						time.Sleep(300 * time.Millisecond) // let the closed sessions settle
					}
				}
			}
		}
	}
	prog.close()
	rep.Finished = time.Now()
	rep.Summary = aggregate(rep.Runs)
	for _, cm := range clientModes {
		for _, n := range []string{"lockd", "lockd-bolt", "lockd-http"} {
			rep.Ratios = append(rep.Ratios, ratios(rep.Summary, wls, n, cm)...)
		}
	}

	var md strings.Builder
	writeMarkdown(&md, rep, wls)
	writeOutputs(cf.out, "results", md.String(), rep)
	if len(rep.Summary) > 0 {
		if err := writeChart(filepath.Join(cf.out, "chart.png"), rep, wls); err != nil {
			fmt.Fprintln(os.Stderr, "lockbench: chart:", err)
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s/results.json, results.md, chart.png (%s)\n", cf.out, rep.Finished.Sub(rep.Started).Round(time.Second))
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "lockbench: stopped early:", runErr)
		return 1
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// knownSystems are the names --systems takes.
var knownSystems = []string{"lockd", "lockd-bolt", "lockd-http", "etcd", "zookeeper"}

// pickClients parses --clients.
func pickClients(s string) ([]string, error) {
	var out []string
	for _, k := range splitList(s) {
		switch k {
		case "both":
			out = append(out, clientsPerWorker, clientsShared)
		case clientsPerWorker, clientsShared:
			out = append(out, k)
		default:
			return nil, fmt.Errorf("unknown client setup %q (want per-worker, shared or both)", k)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil, errors.New("no client setup")
	}
	return out, nil
}

func fmtRates(rs []float64) string {
	var b []string
	for _, r := range rs {
		b = append(b, fmt.Sprintf("%.0f", r))
	}
	return strings.Join(b, " → ")
}

// javaVersion is the first line of `java -version`, for the record.
func javaVersion(java string) string {
	b, err := exec.Command(java, "-version").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

func pickWorkloads(s string) ([]workload, error) {
	var out []workload
	for _, k := range splitList(s) {
		found := false
		for _, wl := range allWorkloads {
			if wl.Key == k {
				out = append(out, wl)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown workload %q (want a,b,c,d,e)", k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no workloads")
	}
	return out, nil
}

func describeHost(repo string) hostInfo {
	h := hostInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), LockdCommit: "unknown"}
	if repo != "" {
		h.LockdCommit = gitDescribe(repo)
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.Index(l, ":"); i >= 0 {
					h.CPUModel = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		h.LoadAvg = strings.TrimSpace(string(b))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "go.etcd.io/etcd/server/v3" {
				h.EtcdVersion = d.Version
			}
		}
	}
	return h
}

// profileHook samples the leader of each system with `perf record` during
// the measured window of the workloads in perfWLs, and fetches a Go CPU
// profile from lockd leaders (served with --pprof) during those in
// pprofWLs; it writes the top of each report next to the results, named
// <kind>-<system>-<workload>-<setup>-<clients>.
func profileHook(out string, perfWLs, pprofWLs []string, prog *progress) func(ctx context.Context, sys system, wl workload, setup, clients string, pid int, d time.Duration) {
	return func(ctx context.Context, sys system, wl workload, setup, clients string, pid int, d time.Duration) {
		tag := fmt.Sprintf("%s-%s-%s-%s", sys.name(), wl.Key, setup, clients)
		var wg sync.WaitGroup
		if slices.Contains(perfWLs, wl.Key) && pid != 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				perfRecord(ctx, filepath.Join(out, "perf-"+tag), pid, d, prog)
			}()
		}
		if slices.Contains(pprofWLs, wl.Key) {
			if ls, ok := sys.(*lockdSystem); ok {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lockdPprof(ctx, filepath.Join(out, "pprof-"+tag), ls, d, prog)
				}()
			}
		}
		wg.Wait()
	}
}

// perfRecord samples pid with `perf record` for d and writes the top of
// `perf report` (self and inclusive) as base-self.txt and base-children.txt.
func perfRecord(ctx context.Context, base string, pid int, d time.Duration, prog *progress) {
	cctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	rec := exec.CommandContext(cctx, "perf", "record", "-F", "499", "-g", "-p", fmt.Sprint(pid), "-o", base+".data",
		"--", "sleep", fmt.Sprintf("%.1f", d.Seconds()))
	if b, err := rec.CombinedOutput(); err != nil {
		prog.note("perf record: %v %s", err, b)
		return
	}
	// perf record ended with the window, so the report's CPU is not measured.
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer rcancel()
	for _, mode := range []struct{ suffix, flags string }{
		{"-self.txt", "--no-children"},
		{"-children.txt", "--children"},
	} {
		args := append([]string{"report", "-i", base + ".data", "--stdio", "--sort", "symbol", "-g", "none", "--percent-limit", "0.5"}, strings.Fields(mode.flags)...)
		b, err := exec.CommandContext(rctx, "perf", args...).Output()
		if err == nil {
			_ = os.WriteFile(base+mode.suffix, compactPerf(b), 0o644)
		}
	}
}

// compactPerf drops the padding of `perf report --stdio` (its symbol column
// is as wide as the longest symbol) and the empty IPC columns.
func compactPerf(b []byte) []byte {
	var out strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "# ....") || strings.Contains(l, "IPC") {
				continue
			}
			out.WriteString(strings.TrimRight(l, " ") + "\n")
			continue
		}
		f := strings.Fields(l)
		for len(f) > 0 && f[len(f)-1] == "-" {
			f = f[:len(f)-1]
		}
		if len(f) == 0 {
			continue
		}
		out.WriteString(strings.Join(f, " ") + "\n")
	}
	return []byte(out.String())
}

// lockdPprof fetches a Go CPU profile of lockd's leader over d (the member
// must run with --pprof) as base.pb.gz and writes `go tool pprof -top`,
// inclusive (base-cum.txt) and by self time (base-flat.txt).
func lockdPprof(ctx context.Context, base string, ls *lockdSystem, d time.Duration, prog *progress) {
	l, err := ls.c.leader(ctx)
	if err != nil {
		prog.note("pprof: %v", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", l.httpURL, max(int(d.Round(time.Second).Seconds()), 1))
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		prog.note("pprof: %v", err)
		return
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		prog.note("pprof: %s: %v %s (is lockd running with --pprof?)", resp.Status, err, b)
		return
	}
	if err := os.WriteFile(base+".pb.gz", b, 0o644); err != nil {
		prog.note("pprof: %v", err)
		return
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	for _, mode := range []struct{ suffix, flag string }{{"-cum.txt", "-cum"}, {"-flat.txt", "-flat"}} {
		out, err := exec.CommandContext(rctx, "go", "tool", "pprof", "-top", mode.flag, "-nodecount", "120", base+".pb.gz").Output()
		if err == nil {
			_ = os.WriteFile(base+mode.suffix, out, 0o644)
		}
	}
}
