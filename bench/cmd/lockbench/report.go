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

// aggResult merges the rounds of one (workload, system, setup).
type aggResult struct {
	Workload       string  `json:"workload"`
	System         string  `json:"system"`
	Setup          string  `json:"setup"`
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

	leaderCPU, clientCPU, otherCPU float64
	gcRuns                         int
	acqH, relH                     *hdr.Histogram
}

// ratio compares lockd and etcd on one workload, each in its best setup
// (the one with more cycles/s).
type ratio struct {
	Workload       string  `json:"workload"`
	LockdSystem    string  `json:"lockd_system"`
	LockdSetup     string  `json:"lockd_setup"`
	EtcdSetup      string  `json:"etcd_setup"`
	Throughput     float64 `json:"throughput_ratio"` // lockd cycles/s ÷ etcd
	ThroughputVsEL float64 `json:"throughput_ratio_vs_etcd_leader,omitempty"`
	AcquireP50     float64 `json:"acquire_p50_ratio"`       // lockd ÷ etcd (lower is better)
	AcquireP99     float64 `json:"acquire_p99_ratio"`       // lockd ÷ etcd (lower is better)
	CPUPer1k       float64 `json:"server_cpu_per_1k_ratio"` // lockd ÷ etcd (lower is better)
	Goal           string  `json:"goal"`
	GoalMet        bool    `json:"goal_met"`
	AcquireP99Met  bool    `json:"acquire_p99_goal_met"`
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
}

type hostInfo struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"go_version"`
	LockdCommit string `json:"lockd_commit"`
	EtcdVersion string `json:"etcd_version"`
	LoadAvg     string `json:"loadavg_at_start"`
}

type benchConfig struct {
	Members    int      `json:"members"`
	Duration   string   `json:"duration"`
	Warmup     string   `json:"warmup"`
	Rounds     int      `json:"rounds"`
	Setups     []string `json:"setups"`
	Systems    []string `json:"systems"`
	SessionTTL string   `json:"session_ttl"`
	EtcdConns  int      `json:"etcd_clients_per_run"`
	Quick      bool     `json:"quick"`
	LockdFlags []string `json:"lockd_flags,omitempty"`
}

func aggregate(runs []*runResult) []*aggResult {
	idx := map[string]*aggResult{}
	var out []*aggResult
	for _, r := range runs {
		k := r.Workload + "/" + r.System + "/" + r.Setup
		a := idx[k]
		if a == nil {
			a = &aggResult{Workload: r.Workload, System: r.System, Setup: r.Setup, acqH: newHist(), relH: newHist()}
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
		if a.Cycles > 0 {
			k := 1000 / float64(a.Cycles)
			a.CPUPer1k, a.LeaderCPUPer1k, a.ClientCPUPer1k = a.ServerCPU*k, a.leaderCPU*k, a.clientCPU*k
		}
	}
	order := map[string]int{"lockd": 0, "lockd-wal": 1, "lockd-http": 2, "etcd": 3}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Workload != out[j].Workload {
			return out[i].Workload < out[j].Workload
		}
		if out[i].System != out[j].System {
			return order[out[i].System] < order[out[j].System]
		}
		return out[i].Setup < out[j].Setup
	})
	return out
}

func best(sum []*aggResult, wl, sys string) *aggResult {
	var b *aggResult
	for _, a := range sum {
		if a.Workload == wl && a.System == sys && (b == nil || a.CyclesPerSec > b.CyclesPerSec) {
			b = a
		}
	}
	return b
}

func find(sum []*aggResult, wl, sys, setup string) *aggResult {
	for _, a := range sum {
		if a.Workload == wl && a.System == sys && a.Setup == setup {
			return a
		}
	}
	return nil
}

var goals = map[string]struct {
	text string
	met  func(r ratio) bool
}{
	"a": {"acquire p50 ≤ 0.5× etcd", func(r ratio) bool { return r.AcquireP50 <= 0.5 }},
	"b": {"≥ 5× etcd cycles/s", func(r ratio) bool { return r.Throughput >= 5 }},
	"c": {"≥ 4× etcd hand-offs/s", func(r ratio) bool { return r.Throughput >= 4 }},
	"d": {"≥ 3× etcd cycles/s", func(r ratio) bool { return r.Throughput >= 3 }},
	"e": {"acquire p99 ≤ etcd", func(r ratio) bool { return r.AcquireP99 <= 1 }},
}

func ratios(sum []*aggResult, wls []workload, lockdSys string) []ratio {
	var out []ratio
	div := func(a, b float64) float64 {
		if b == 0 {
			return math.NaN()
		}
		return a / b
	}
	for _, wl := range wls {
		l, e := best(sum, wl.Key, lockdSys), best(sum, wl.Key, "etcd")
		if l == nil || e == nil {
			continue
		}
		r := ratio{
			Workload: wl.Key, LockdSystem: lockdSys, LockdSetup: l.Setup, EtcdSetup: e.Setup,
			Throughput: div(l.CyclesPerSec, e.CyclesPerSec),
			AcquireP50: div(l.Acquire.P50, e.Acquire.P50),
			AcquireP99: div(l.Acquire.P99, e.Acquire.P99),
			CPUPer1k:   div(l.CPUPer1k, e.CPUPer1k),
		}
		if el := find(sum, wl.Key, "etcd", setupLeader); el != nil {
			r.ThroughputVsEL = div(l.CyclesPerSec, el.CyclesPerSec)
		}
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
	fmt.Fprintf(w, "%d members each; %s measured per run after %s warm-up, %d round(s) per system, A B A B; %d CPUs; lockd %s, etcd %s.\n\n",
		rep.Config.Members, rep.Config.Duration, rep.Config.Warmup, rep.Config.Rounds, rep.Host.CPUs, rep.Host.LockdCommit, rep.Host.EtcdVersion)
	fmt.Fprintln(w, "| workload | system | setup | cycles/s | acquire p50 / p99 / max ms | release p50 / p99 / max ms | server CPU s per 1k cycles (leader) | client CPU s per 1k | other load | errors |")
	fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, a := range rep.Summary {
		fmt.Fprintf(w, "| (%s) %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s (%s) | %s | %.0f%% | %d |\n",
			a.Workload, desc[a.Workload], a.System, a.Setup, f1(a.CyclesPerSec),
			f1(a.Acquire.P50), f1(a.Acquire.P99), f1(a.Acquire.Max),
			f1(a.Release.P50), f1(a.Release.P99), f1(a.Release.Max),
			f1(a.CPUPer1k), f1(a.LeaderCPUPer1k), f1(a.ClientCPUPer1k), a.OtherCPUShare*100, a.Errors)
	}
	var gc []string
	for _, a := range rep.Summary {
		switch {
		case a.CommandsPerEntry > 0 && a.StoresPerSec > 0:
			gc = append(gc, fmt.Sprintf("(%s) %s %s: %.1f commands per Raft entry, %.1f entries per log write, %.0f log writes/s", a.Workload, a.System, a.Setup, a.CommandsPerEntry, a.EntriesPerStore, a.StoresPerSec))
		case a.CommandsPerEntry > 0: // a lockd whose log store reports no write metrics
			gc = append(gc, fmt.Sprintf("(%s) %s %s: %.1f commands per Raft entry", a.Workload, a.System, a.Setup, a.CommandsPerEntry))
		}
	}
	if len(gc) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "lockd group commit on the leader (from its /metrics): "+strings.Join(gc, "; ")+".")
	}
	if len(rep.Ratios) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "lockd ÷ etcd, each system in its faster setup (throughput: higher is better for lockd; latency and CPU: lower is better):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | lockd | lockd setup | etcd setup | cycles/s ratio (vs etcd on leader) | acquire p50 ratio | acquire p99 ratio | server CPU/1k ratio | goal | met | acquire p99 ≤ etcd |")
	fmt.Fprintln(w, "|---|---|---|---|--:|--:|--:|--:|---|---|---|")
	for _, r := range rep.Ratios {
		fmt.Fprintf(w, "| (%s) | %s | %s | %s | %s× (%s×) | %s | %s | %s | %s | %s | %s |\n",
			r.Workload, r.LockdSystem, r.LockdSetup, r.EtcdSetup, f1(r.Throughput), f1(r.ThroughputVsEL), f1(r.AcquireP50), f1(r.AcquireP99),
			f1(r.CPUPer1k), r.Goal, yes(r.GoalMet), yes(r.AcquireP99Met))
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

// series colours: lockd blues, etcd oranges.
var seriesColors = map[string]color.Color{
	"lockd/leader":      color.RGBA{R: 31, G: 119, B: 180, A: 255},
	"lockd/spread":      color.RGBA{R: 120, G: 180, B: 225, A: 255},
	"lockd-wal/leader":  color.RGBA{R: 120, G: 60, B: 170, A: 255},
	"lockd-wal/spread":  color.RGBA{R: 190, G: 150, B: 220, A: 255},
	"lockd-http/leader": color.RGBA{R: 44, G: 160, B: 44, A: 255},
	"lockd-http/spread": color.RGBA{R: 150, G: 215, B: 140, A: 255},
	"etcd/leader":       color.RGBA{R: 230, G: 110, B: 20, A: 255},
	"etcd/spread":       color.RGBA{R: 250, G: 185, B: 120, A: 255},
}

func seriesLabel(sys, setup string) string {
	if setup == setupSpread {
		if strings.HasPrefix(sys, "lockd") {
			return sys + " (all endpoints)"
		}
		return sys + " (spread)"
	}
	return sys + " (leader)"
}

// writeChart draws cycles/s and acquire p99 per workload for every
// (system, setup) into one PNG.
func writeChart(path string, rep *report, wls []workload) error {
	type key struct{ sys, setup string }
	var keys []key
	seen := map[key]bool{}
	for _, a := range rep.Summary {
		k := key{a.System, a.Setup}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	order := map[string]int{"lockd/leader": 0, "lockd/spread": 1, "lockd-wal/leader": 2, "lockd-wal/spread": 3,
		"lockd-http/leader": 4, "lockd-http/spread": 5, "etcd/leader": 6, "etcd/spread": 7}
	sort.Slice(keys, func(i, j int) bool {
		return order[keys[i].sys+"/"+keys[i].setup] < order[keys[j].sys+"/"+keys[j].setup]
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
		w := vg.Points(14)
		n := len(keys)
		for i, k := range keys {
			vals := make(plotter.Values, len(wls))
			var lbl plotter.XYLabels
			for j, wl := range wls {
				if a := find(rep.Summary, wl.Key, k.sys, k.setup); a != nil {
					vals[j] = val(a)
				}
				lbl.XYs = append(lbl.XYs, plotter.XY{X: float64(j), Y: vals[j]})
				lbl.Labels = append(lbl.Labels, f1(vals[j]))
			}
			b, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return nil, err
			}
			b.Offset = vg.Length(float64(i)-float64(n-1)/2) * w
			b.Color = seriesColors[k.sys+"/"+k.setup]
			b.LineStyle.Width = 0
			p.Add(b)
			p.Legend.Add(seriesLabel(k.sys, k.setup), b)
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
	p1, err := mk("acquire+release cycles per second (higher is better)", "cycles/s", func(a *aggResult) float64 { return a.CyclesPerSec })
	if err != nil {
		return err
	}
	p2, err := mk("acquire latency p99 (lower is better)", "ms", func(a *aggResult) float64 { return a.Acquire.P99 })
	if err != nil {
		return err
	}
	img := vgimg.New(vg.Points(900), vg.Points(900))
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
