package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// aggResult merges the rounds of one (workload, system, setup, clients).
type aggResult struct {
	Workload       string  `json:"workload"`
	System         string  `json:"system"`
	Setup          string  `json:"setup"`
	Clients        string  `json:"clients"`
	Sessions       int     `json:"sessions"`
	Rounds         int     `json:"rounds"`
	Seconds        float64 `json:"seconds"`
	Cycles         int64   `json:"cycles"`
	CyclesPerSec   float64 `json:"cycles_per_sec"`
	Acquire        latency `json:"acquire"`
	Release        latency `json:"release"`
	ServerCPU      float64 `json:"server_cpu_seconds"`
	CPUPer1k       float64 `json:"server_cpu_seconds_per_1k_cycles"`
	LeaderCPUPer1k float64 `json:"leader_cpu_seconds_per_1k_cycles"`
	ClientCPUPer1k float64 `json:"client_cpu_seconds_per_1k_cycles"`
	Errors         int64   `json:"errors"`
	// OtherCPUShare is the share of the machine's CPU time that other
	// processes (not the servers, not the bench) used during the windows.
	OtherCPUShare float64 `json:"other_cpu_share"`

	// lockd's group commit, averaged over the rounds (see runResult).
	CommandsPerEntry float64 `json:"commands_per_raft_entry,omitempty"`
	EntriesPerStore  float64 `json:"raft_entries_per_store,omitempty"`
	StoresPerSec     float64 `json:"raft_stores_per_sec,omitempty"`
	// Breakdown: lockd's commit latency by stage, averaged over the rounds
	// that had one.
	Breakdown *commitBreakdown `json:"commit_breakdown,omitempty"`
	// The leader's system calls and context switches per cycle (/proc).
	LeaderReadsPerCycle  float64 `json:"leader_read_syscalls_per_cycle,omitempty"`
	LeaderWritesPerCycle float64 `json:"leader_write_syscalls_per_cycle,omitempty"`
	LeaderCtxSwPerCycle  float64 `json:"leader_context_switches_per_cycle,omitempty"`

	leaderReads, leaderWrites, leaderCtxSw int64
	leaderCPU, clientCPU, otherCPU         float64
	gcRuns, bdRuns                         int
	acqH, relH                             *hdr.Histogram
}

// ratio compares one lockd system with its best peer on one workload, in
// one client setup; a ratio of 0 was not measured. Every system is taken in its faster setup (more
// cycles/s); the best peer is, for each metric on its own, the better of
// the peers (etcd, ZooKeeper) there, and the ratio names which one it was.
type ratio struct {
	Workload    string `json:"workload"`
	Clients     string `json:"clients"`
	LockdSystem string `json:"lockd_system"`
	LockdSetup  string `json:"lockd_setup"`
	// Throughput is lockd cycles/s ÷ the best peer's (higher is better).
	Throughput     float64 `json:"throughput_ratio"`
	ThroughputPeer string  `json:"throughput_peer"` // "etcd leader": system and setup
	// ThroughputVsLeader: against the best peer's cycles/s with its
	// clients on its leader.
	ThroughputVsLeader float64 `json:"throughput_ratio_vs_peer_leader,omitempty"`
	AcquireP50         float64 `json:"acquire_p50_ratio"` // lockd ÷ best peer (lower is better)
	AcquireP50Peer     string  `json:"acquire_p50_peer"`
	AcquireP99         float64 `json:"acquire_p99_ratio"` // lockd ÷ best peer (lower is better)
	AcquireP99Peer     string  `json:"acquire_p99_peer"`
	CPUPer1k           float64 `json:"server_cpu_per_1k_ratio"` // lockd ÷ best peer (lower is better)
	CPUPer1kPeer       string  `json:"server_cpu_per_1k_peer"`
	Goal               string  `json:"goal"`
	GoalMet            bool    `json:"goal_met"`
	AcquireP99Met      bool    `json:"acquire_p99_goal_met"`
}

type report struct {
	Started   time.Time    `json:"started"`
	Finished  time.Time    `json:"finished"`
	Host      hostInfo     `json:"host"`
	Config    benchConfig  `json:"config"`
	Workloads []workload   `json:"workloads"`
	Runs      []*runResult `json:"runs"`
	Summary   []*aggResult `json:"summary"`
	Ratios    []ratio      `json:"ratios"`
	// Skipped lists systems asked for that could not run, and why.
	Skipped []string `json:"skipped,omitempty"`
}

type hostInfo struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"go_version"`
	LockdCommit string `json:"lockd_commit"`
	EtcdVersion string `json:"etcd_version"`
	// ZooKeeperVersion is what the leader's srvr says; JavaVersion the
	// first line of `java -version`.
	ZooKeeperVersion string `json:"zookeeper_version,omitempty"`
	JavaVersion      string `json:"java_version,omitempty"`
	LoadAvg          string `json:"loadavg_at_start"`
}

type benchConfig struct {
	Members    int       `json:"members"`
	Duration   string    `json:"duration"`
	Warmup     string    `json:"warmup"`
	Rounds     int       `json:"rounds"`
	Setups     []string  `json:"setups"`
	Clients    []string  `json:"clients"`
	Systems    []string  `json:"systems"`
	SessionTTL string    `json:"session_ttl"`
	EtcdConns  int       `json:"etcd_clients_per_run"`
	Quick      bool      `json:"quick"`
	LockdFlags []string  `json:"lockd_flags,omitempty"`
	ZooKeeper  *zkConfig `json:"zookeeper,omitempty"`
}

// zkConfig records how the ZooKeeper ensemble ran.
type zkConfig struct {
	Classpath string `json:"classpath"`
	Heap      string `json:"heap"`
	ForceSync bool   `json:"force_sync"`
	Warmup    string `json:"jit_warmup"`
	// WarmupRates are the warm-up's cycles/s in each fifth of it.
	WarmupRates []float64 `json:"jit_warmup_cycles_per_sec"`
}

func aggregate(runs []*runResult) []*aggResult {
	idx := map[string]*aggResult{}
	var out []*aggResult
	for _, r := range runs {
		k := r.Workload + "/" + r.System + "/" + r.Setup + "/" + r.Clients
		a := idx[k]
		if a == nil {
			a = &aggResult{Workload: r.Workload, System: r.System, Setup: r.Setup, Clients: r.Clients, Sessions: r.Sessions,
				acqH: newHist(), relH: newHist()}
			idx[k] = a
			out = append(out, a)
		}
		a.Rounds++
		a.Seconds += r.Seconds
		a.Cycles += r.Cycles
		a.ServerCPU += r.ServerCPU
		a.leaderCPU += r.LeaderCPU
		a.clientCPU += r.ClientCPU
		a.otherCPU += r.OtherCPU
		if r.CommandsPerEntry > 0 {
			a.gcRuns++
			a.CommandsPerEntry += r.CommandsPerEntry
			a.EntriesPerStore += r.EntriesPerStore
			a.StoresPerSec += r.StoresPerSec
		}
		if r.Breakdown != nil {
			if a.Breakdown == nil {
				a.Breakdown = &commitBreakdown{}
			}
			a.Breakdown.add(r.Breakdown, 1)
			a.bdRuns++
		}
		a.leaderReads += r.LeaderReads
		a.leaderWrites += r.LeaderWrites
		a.leaderCtxSw += r.LeaderCtxSw
		a.Errors += r.Errors
		if r.acqH != nil {
			a.acqH.Merge(r.acqH)
			a.relH.Merge(r.relH)
		}
	}
	for _, a := range out {
		a.CyclesPerSec = float64(a.Cycles) / a.Seconds
		a.Acquire, a.Release = summarize(a.acqH), summarize(a.relH)
		a.OtherCPUShare = a.otherCPU / (a.Seconds * float64(runtime.NumCPU()))
		if a.gcRuns > 0 {
			k := float64(a.gcRuns)
			a.CommandsPerEntry, a.EntriesPerStore, a.StoresPerSec = a.CommandsPerEntry/k, a.EntriesPerStore/k, a.StoresPerSec/k
		}
		if a.bdRuns > 1 {
			var m commitBreakdown
			m.add(a.Breakdown, 1/float64(a.bdRuns))
			a.Breakdown = &m
		}
		if a.Cycles > 0 {
			k := 1000 / float64(a.Cycles)
			a.CPUPer1k, a.LeaderCPUPer1k, a.ClientCPUPer1k = a.ServerCPU*k, a.leaderCPU*k, a.clientCPU*k
			c := float64(a.Cycles)
			a.LeaderReadsPerCycle, a.LeaderWritesPerCycle, a.LeaderCtxSwPerCycle = float64(a.leaderReads)/c, float64(a.leaderWrites)/c, float64(a.leaderCtxSw)/c
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Workload != out[j].Workload {
			return out[i].Workload < out[j].Workload
		}
		if out[i].Clients != out[j].Clients {
			return out[i].Clients < out[j].Clients // per-worker before shared
		}
		if out[i].System != out[j].System {
			return systemOrder[out[i].System] < systemOrder[out[j].System]
		}
		return out[i].Setup < out[j].Setup
	})
	return out
}

// systemOrder is the order of the systems in tables and charts.
var systemOrder = map[string]int{"lockd": 0, "lockd-bolt": 1, "lockd-http": 2, "etcd": 3, "zookeeper": 4}

// peerSystems are the lock services lockd is compared with.
var peerSystems = []string{"etcd", "zookeeper"}

// best is sys on workload wl with clients in its faster setup.
func best(sum []*aggResult, wl, sys, clients string) *aggResult {
	var b *aggResult
	for _, a := range sum {
		if a.Workload == wl && a.System == sys && a.Clients == clients && (b == nil || a.CyclesPerSec > b.CyclesPerSec) {
			b = a
		}
	}
	return b
}

func find(sum []*aggResult, wl, sys, setup, clients string) *aggResult {
	for _, a := range sum {
		if a.Workload == wl && a.System == sys && a.Setup == setup && a.Clients == clients {
			return a
		}
	}
	return nil
}

var goals = map[string]struct {
	text string
	met  func(r ratio) bool
}{
	"a": {"acquire p50 ≤ 0.7× best peer", func(r ratio) bool { return r.AcquireP50 <= 0.7 }},
	"b": {"≥ 2× best peer cycles/s", func(r ratio) bool { return r.Throughput >= 2 }},
	"c": {"≥ 1.5× best peer hand-offs/s", func(r ratio) bool { return r.Throughput >= 1.5 }},
	"d": {"≥ 2× best peer cycles/s", func(r ratio) bool { return r.Throughput >= 2 }},
	"e": {"acquire p99 ≤ best peer", func(r ratio) bool { return r.AcquireP99 <= 1 }},
}

// ratios compares lockdSys with the best peer on every workload, in one
// client setup. A workload no peer ran has no ratio.
func ratios(sum []*aggResult, wls []workload, lockdSys, clients string) []ratio {
	var out []ratio
	// 0 stands for "not measured" (JSON has no NaN): a peer with no run
	// on the leader, a window whose CPU was not read.
	div := func(a, b float64) float64 {
		if b == 0 || a == 0 {
			return 0
		}
		return a / b
	}
	label := func(a *aggResult) string { return a.System + " " + a.Setup }
	for _, wl := range wls {
		l := best(sum, wl.Key, lockdSys, clients)
		if l == nil {
			continue
		}
		var peers []*aggResult
		for _, p := range peerSystems {
			if a := best(sum, wl.Key, p, clients); a != nil && a.Cycles > 0 {
				peers = append(peers, a)
			}
		}
		if len(peers) == 0 {
			continue
		}
		// pick returns the peer with the best value of v (the highest when
		// higher is better, else the lowest).
		pick := func(v func(*aggResult) float64, higher bool) *aggResult {
			b := peers[0]
			for _, p := range peers[1:] {
				if (higher && v(p) > v(b)) || (!higher && v(p) < v(b)) {
					b = p
				}
			}
			return b
		}
		tp := pick(func(a *aggResult) float64 { return a.CyclesPerSec }, true)
		p50 := pick(func(a *aggResult) float64 { return a.Acquire.P50 }, false)
		p99 := pick(func(a *aggResult) float64 { return a.Acquire.P99 }, false)
		cpu := pick(func(a *aggResult) float64 { return a.CPUPer1k }, false)
		r := ratio{
			Workload: wl.Key, Clients: clients, LockdSystem: lockdSys, LockdSetup: l.Setup,
			Throughput: div(l.CyclesPerSec, tp.CyclesPerSec), ThroughputPeer: label(tp),
			AcquireP50: div(l.Acquire.P50, p50.Acquire.P50), AcquireP50Peer: label(p50),
			AcquireP99: div(l.Acquire.P99, p99.Acquire.P99), AcquireP99Peer: label(p99),
			CPUPer1k: div(l.CPUPer1k, cpu.CPUPer1k), CPUPer1kPeer: label(cpu),
		}
		var bestLeader float64
		for _, p := range peerSystems {
			if a := find(sum, wl.Key, p, setupLeader, clients); a != nil {
				bestLeader = max(bestLeader, a.CyclesPerSec)
			}
		}
		r.ThroughputVsLeader = div(l.CyclesPerSec, bestLeader)
		if g, ok := goals[wl.Key]; ok {
			r.Goal, r.GoalMet = g.text, g.met(r)
		}
		r.AcquireP99Met = r.AcquireP99 <= 1
		out = append(out, r)
	}
	return out
}

func f1(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// times prints a ratio, "–" for one not measured (0).
func times(v float64) string {
	if v == 0 {
		return "–"
	}
	return f1(v) + "×"
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

// writeMarkdown prints the results table and the ratios.
func writeMarkdown(w io.Writer, rep *report, wls []workload) {
	desc := map[string]string{}
	for _, wl := range wls {
		desc[wl.Key] = wl.Desc
	}
	versions := "lockd " + rep.Host.LockdCommit
	if slices.Contains(rep.Config.Systems, "etcd") {
		versions += ", etcd " + rep.Host.EtcdVersion
	}
	if rep.Host.ZooKeeperVersion != "" {
		versions += ", ZooKeeper " + rep.Host.ZooKeeperVersion
		if z := rep.Config.ZooKeeper; z != nil {
			versions += fmt.Sprintf(" (-Xmx%s, forceSync=yes; %s JIT warm-up before the first run, cycles/s per fifth: %s)", z.Heap, z.Warmup, fmtRates(z.WarmupRates))
		}
	}
	fmt.Fprintf(w, "%d members each; %s measured per run after %s warm-up, %d round(s) per system, A B A B; %d CPUs; %s.\n\n",
		rep.Config.Members, rep.Config.Duration, rep.Config.Warmup, rep.Config.Rounds, rep.Host.CPUs, versions)
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "Skipped: %s\n\n", s)
	}
	fmt.Fprintln(w, "clients: per-worker = every worker its own client and session; shared = the run's workers share one client and one session.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | clients | system | setup | cycles/s | acquire p50 / p99 / max ms | release p50 / p99 / max ms | server CPU s per 1k cycles (leader) | client CPU s per 1k | other load | errors |")
	fmt.Fprintln(w, "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, a := range rep.Summary {
		fmt.Fprintf(w, "| (%s) %s | %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s (%s) | %s | %.0f%% | %d |\n",
			a.Workload, desc[a.Workload], a.Clients, a.System, a.Setup, f1(a.CyclesPerSec),
			f1(a.Acquire.P50), f1(a.Acquire.P99), f1(a.Acquire.Max),
			f1(a.Release.P50), f1(a.Release.P99), f1(a.Release.Max),
			f1(a.CPUPer1k), f1(a.LeaderCPUPer1k), f1(a.ClientCPUPer1k), a.OtherCPUShare*100, a.Errors)
	}
	var gc []string
	for _, a := range rep.Summary {
		switch {
		case a.CommandsPerEntry > 0 && a.StoresPerSec > 0:
			gc = append(gc, fmt.Sprintf("(%s) %s %s %s: %.1f commands per Raft entry, %.1f entries per log write, %.0f log writes/s", a.Workload, a.System, a.Setup, a.Clients, a.CommandsPerEntry, a.EntriesPerStore, a.StoresPerSec))
		case a.CommandsPerEntry > 0: // a lockd whose log store reports no write metrics
			gc = append(gc, fmt.Sprintf("(%s) %s %s %s: %.1f commands per Raft entry", a.Workload, a.System, a.Setup, a.Clients, a.CommandsPerEntry))
		}
	}
	if len(gc) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "lockd group commit on the leader (from its /metrics): "+strings.Join(gc, "; ")+".")
	}
	writeBreakdown(w, rep)
	writeSyscalls(w, rep)
	if len(rep.Ratios) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "lockd ÷ best peer, in the same client setup, every system in its faster setup; the best peer is the better of etcd and ZooKeeper for each metric on its own, named next to the ratio (throughput: higher is better for lockd; latency and CPU: lower is better):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | clients | lockd | lockd setup | cycles/s ratio (vs best peer on leader) | acquire p50 ratio | acquire p99 ratio | server CPU/1k ratio | goal | met | acquire p99 ≤ best peer |")
	fmt.Fprintln(w, "|---|---|---|---|--:|--:|--:|--:|---|---|---|")
	for _, r := range rep.Ratios {
		fmt.Fprintf(w, "| (%s) | %s | %s | %s | %s %s (%s) | %s %s | %s %s | %s %s | %s | %s | %s |\n",
			r.Workload, r.Clients, r.LockdSystem, r.LockdSetup,
			times(r.Throughput), r.ThroughputPeer, times(r.ThroughputVsLeader),
			times(r.AcquireP50), r.AcquireP50Peer, times(r.AcquireP99), r.AcquireP99Peer,
			times(r.CPUPer1k), r.CPUPer1kPeer, r.Goal, yes(r.GoalMet), yes(r.AcquireP99Met))
	}
}

// writeOutputs prints the markdown report and writes it as base.md, with
// the raw results as base.json, into dir.
func writeOutputs(dir, base, md string, v any) {
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(dir, base+".md"), []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
	}
	if err := writeJSON(filepath.Join(dir, base+".json"), v); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// systemColors: lockd blues and purples, lockd-http green, etcd orange,
// ZooKeeper red; a shared client is drawn in a lighter shade.
var systemColors = map[string]color.RGBA{
	"lockd":      {R: 31, G: 119, B: 180, A: 255},
	"lockd-bolt": {R: 120, G: 60, B: 170, A: 255},
	"lockd-http": {R: 44, G: 160, B: 44, A: 255},
	"etcd":       {R: 230, G: 110, B: 20, A: 255},
	"zookeeper":  {R: 200, G: 30, B: 50, A: 255},
}

func seriesColor(sys, clients string) color.Color {
	c, ok := systemColors[sys]
	if !ok {
		c = color.RGBA{R: 128, G: 128, B: 128, A: 255}
	}
	if clients == clientsShared {
		light := func(v uint8) uint8 { return v + (255-v)/2 }
		c = color.RGBA{R: light(c.R), G: light(c.G), B: light(c.B), A: 255}
	}
	return c
}

// writeChart draws cycles/s and acquire p99 per workload for every (system,
// client setup), each system in its faster setup, into one PNG.
func writeChart(path string, rep *report, wls []workload) error {
	type key struct{ sys, clients string }
	var keys []key
	seen := map[key]bool{}
	for _, a := range rep.Summary {
		k := key{a.System, a.Clients}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].sys != keys[j].sys {
			return systemOrder[keys[i].sys] < systemOrder[keys[j].sys]
		}
		return keys[i].clients < keys[j].clients
	})
	var names []string
	for _, wl := range wls {
		names = append(names, fmt.Sprintf("(%s) %s", wl.Key, wl.Desc))
	}

	mk := func(title, ylabel string, val func(a *aggResult) float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = ylabel
		p.NominalX(names...)
		p.Legend.Top = true
		w := vg.Points(max(6, min(14, 100/float64(max(len(keys), 1)))))
		n := len(keys)
		for i, k := range keys {
			vals := make(plotter.Values, len(wls))
			var lbl plotter.XYLabels
			for j, wl := range wls {
				text := "" // no bar: the system did not run it (no shared run of (e))
				if a := best(rep.Summary, wl.Key, k.sys, k.clients); a != nil {
					vals[j], text = val(a), f1(val(a))
				}
				lbl.XYs = append(lbl.XYs, plotter.XY{X: float64(j), Y: vals[j]})
				lbl.Labels = append(lbl.Labels, text)
			}
			b, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return nil, err
			}
			b.Offset = vg.Length(float64(i)-float64(n-1)/2) * w
			b.Color = seriesColor(k.sys, k.clients)
			b.LineStyle.Width = 0
			p.Add(b)
			p.Legend.Add(k.sys+" ("+k.clients+" client)", b)
			l, err := plotter.NewLabels(lbl)
			if err == nil {
				for x := range l.TextStyle {
					l.TextStyle[x].Rotation = math.Pi / 2
					l.TextStyle[x].Font.Size = vg.Points(7)
					l.TextStyle[x].XAlign = draw.XLeft
					l.TextStyle[x].YAlign = draw.YCenter
				}
				l.Offset = vg.Point{X: b.Offset, Y: vg.Points(2)}
				p.Add(l)
			}
		}
		p.Y.Min = 0
		p.Y.Max *= 1.25 // room for the legend and the labels
		return p, nil
	}
	p1, err := mk("acquire+release cycles per second, each system in its faster setup (higher is better)", "cycles/s", func(a *aggResult) float64 { return a.CyclesPerSec })
	if err != nil {
		return err
	}
	p2, err := mk("acquire latency p99 (lower is better)", "ms", func(a *aggResult) float64 { return a.Acquire.P99 })
	if err != nil {
		return err
	}
	img := vgimg.New(vg.Points(1100), vg.Points(900))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(16)}
	cs := plot.Align([][]*plot.Plot{{p1}, {p2}}, tiles, dc)
	p1.Draw(cs[0][0])
	p2.Draw(cs[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}
