package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// promSample is one line of a Prometheus text exposition.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parsePromLine parses `name{a="x",b="y"} value` (or `name value`); ok is
// false for comments, blank lines and what it cannot read.
func parsePromLine(l string) (s promSample, ok bool) {
	l = strings.TrimSpace(l)
	if l == "" || l[0] == '#' {
		return s, false
	}
	sp := strings.LastIndexByte(l, ' ')
	if sp < 0 {
		return s, false
	}
	v, err := strconv.ParseFloat(l[sp+1:], 64)
	if err != nil {
		return s, false
	}
	series := strings.TrimSpace(l[:sp])
	s.value = v
	br := strings.IndexByte(series, '{')
	if br < 0 {
		s.name = series
		return s, true
	}
	s.name = series[:br]
	body := strings.TrimSuffix(series[br+1:], "}")
	s.labels = map[string]string{}
	for body != "" {
		eq := strings.IndexByte(body, '=')
		if eq < 0 || eq+1 >= len(body) || body[eq+1] != '"' {
			return s, false
		}
		k := body[:eq]
		rest := body[eq+2:]
		end := strings.IndexByte(rest, '"') // lockd's label values carry no escaped quotes
		if end < 0 {
			return s, false
		}
		s.labels[k] = rest[:end]
		body = strings.TrimPrefix(rest[end+1:], ",")
	}
	return s, true
}

// scrape reads every sample of base's /metrics (nil on error).
func scrape(ctx context.Context, base string) []promSample {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []promSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if s, ok := parsePromLine(sc.Text()); ok {
			out = append(out, s)
		}
	}
	return out
}

// lockdSnapshot is every member's /metrics at one moment, and which member
// led.
type lockdSnapshot struct {
	at      time.Time
	leader  string
	members map[string][]promSample
}

// snapshotLockd scrapes every member of sys's cluster (nil for other
// systems or when there is no leader).
func snapshotLockd(ctx context.Context, sys system) *lockdSnapshot {
	var ls *lockdSystem
	switch s := sys.(type) {
	case *lockdSystem:
		ls = s
	case *lockdHTTPSystem:
		ls = &s.lockdSystem
	default:
		return nil
	}
	l, err := ls.c.leader(ctx)
	if err != nil {
		return nil
	}
	snap := &lockdSnapshot{at: time.Now(), leader: l.id, members: map[string][]promSample{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range ls.c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := scrape(ctx, m.httpURL)
			mu.Lock()
			snap.members[m.id] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(snap.members[l.id]) == 0 {
		return nil
	}
	return snap
}

// of returns the samples of the leader (leader true) or of the followers.
func (s *lockdSnapshot) of(leader bool) []promSample {
	var out []promSample
	for id, ss := range s.members {
		if (id == s.leader) == leader {
			out = append(out, ss...)
		}
	}
	return out
}

// sumOf adds the values of every sample called name whose labels match.
func sumOf(ss []promSample, name string, match map[string]string) (v float64, found bool) {
	for _, s := range ss {
		if s.name != name || !labelsMatch(s.labels, match) {
			continue
		}
		if !math.IsNaN(s.value) {
			v += s.value
			found = true
		}
	}
	return v, found
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// stageStat is one stage of lockd's commit path over one measured window,
// from a histogram (seconds): Mean and PerSec are exact over the window
// (from _sum and _count), P50 and P99 are interpolated from its bucket
// counts over the window. Several series (one per follower, say) are
// pooled. Milliseconds.
type stageStat struct {
	Mean   float64 `json:"mean_ms"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	PerSec float64 `json:"per_sec"`
}

// commitBreakdown is lockd's commit latency, stage by stage, over one
// measured window, from hashicorp/raft's metrics and lockd's own.
type commitBreakdown struct {
	// LeaderAppend: lockd_raft_leader_dispatch_log_duration_seconds on the
	// leader, its StoreLogs of one batch of entries (before it replicates
	// them).
	LeaderAppend stageStat `json:"leader_append"`
	// AppendEntriesRTT: lockd_raft_replication_append_entries_duration_seconds
	// on the leader, both followers: the round trip of one AppendEntries,
	// the follower's append included.
	AppendEntriesRTT stageStat `json:"append_entries_rtt"`
	// FollowerAppend: lockd_raft_rpc_append_entries_store_logs_duration_seconds
	// on the followers.
	FollowerAppend stageStat `json:"follower_append"`
	// Commit: lockd_raft_commit_duration_seconds on the leader, from
	// dispatch (before its own append) to commit.
	Commit stageStat `json:"commit"`
	// FSMApply: lockd_raft_fsm_apply_duration_seconds on the leader, one
	// entry.
	FSMApply stageStat `json:"fsm_apply"`
	// ProposeAcquire, ProposeRelease: lockd_propose_duration_seconds on the
	// leader, from a command's proposal (batcher included) to its commit
	// and apply: the server side of an acquire or release without the
	// WebSocket read and write.
	ProposeAcquire stageStat `json:"propose_acquire"`
	ProposeRelease stageStat `json:"propose_release"`
	// MainSaturation: lockd_raft_thread_saturation_ratio{thread="main"} on
	// the leader at the end of the window (its last second, 0–1).
	MainSaturation float64 `json:"raft_main_saturation"`
}

// breakdown computes the stages from snapshots at the start and end of a window.
func breakdown(a, b *lockdSnapshot) *commitBreakdown {
	if a == nil || b == nil || a.leader != b.leader {
		return nil // a leader change inside the window: nothing to attribute
	}
	sec := b.at.Sub(a.at).Seconds()
	la, lb := a.of(true), b.of(true)
	fa, fb := a.of(false), b.of(false)
	bd := &commitBreakdown{
		LeaderAppend:     histStage(la, lb, "lockd_raft_leader_dispatch_log_duration_seconds", nil, sec),
		AppendEntriesRTT: histStage(la, lb, "lockd_raft_replication_append_entries_duration_seconds", nil, sec),
		FollowerAppend:   histStage(fa, fb, "lockd_raft_rpc_append_entries_store_logs_duration_seconds", nil, sec),
		Commit:           histStage(la, lb, "lockd_raft_commit_duration_seconds", nil, sec),
		FSMApply:         histStage(la, lb, "lockd_raft_fsm_apply_duration_seconds", nil, sec),
		ProposeAcquire:   histStage(la, lb, "lockd_propose_duration_seconds", map[string]string{"op": "acquire"}, sec),
		ProposeRelease:   histStage(la, lb, "lockd_propose_duration_seconds", map[string]string{"op": "release"}, sec),
	}
	bd.MainSaturation, _ = sumOf(lb, "lockd_raft_thread_saturation_ratio", map[string]string{"thread": "main"})
	return bd
}

// histStage reads a Prometheus histogram (seconds) over the window, in ms.
func histStage(a, b []promSample, name string, match map[string]string, sec float64) stageStat {
	var st stageStat
	s0, _ := sumOf(a, name+"_sum", match)
	s1, _ := sumOf(b, name+"_sum", match)
	c0, _ := sumOf(a, name+"_count", match)
	c1, _ := sumOf(b, name+"_count", match)
	dc := c1 - c0
	if dc <= 0 {
		return st
	}
	st.Mean = (s1 - s0) / dc * 1000
	st.PerSec = dc / sec
	// Cumulative bucket counts over the window, by upper bound.
	cum := map[float64]float64{}
	for _, pass := range []struct {
		ss   []promSample
		sign float64
	}{{b, 1}, {a, -1}} {
		for _, s := range pass.ss {
			if s.name != name+"_bucket" || !labelsMatch(s.labels, match) {
				continue
			}
			le, err := strconv.ParseFloat(s.labels["le"], 64)
			if err != nil {
				continue
			}
			cum[le] += pass.sign * s.value
		}
	}
	var les []float64
	for le := range cum {
		les = append(les, le)
	}
	sort.Float64s(les)
	q := func(p float64) float64 {
		rank := p * dc
		prevLE, prevC := 0.0, 0.0
		for _, le := range les {
			c := cum[le]
			if c >= rank {
				if math.IsInf(le, 1) {
					return prevLE * 1000 // above the last bound: its lower edge
				}
				if c == prevC {
					return le * 1000
				}
				return (prevLE + (le-prevLE)*(rank-prevC)/(c-prevC)) * 1000
			}
			prevLE, prevC = le, c
		}
		return 0
	}
	st.P50, st.P99 = q(0.5), q(0.99)
	return st
}

// groupCommit derives commands per entry, entries per log write and log
// writes per second from the leader's counters over the window.
func groupCommit(a, b *lockdSnapshot, window float64) (cmdsPerEntry, entriesPerStore, storesPerSec float64) {
	if a == nil || b == nil {
		return
	}
	la, lb := a.members[a.leader], b.members[b.leader]
	d := func(k string) float64 {
		v0, _ := sumOf(la, k, nil)
		v1, _ := sumOf(lb, k, nil)
		return v1 - v0
	}
	if n := d("lockd_raft_entry_commands_count"); n > 0 {
		cmdsPerEntry = d("lockd_raft_entry_commands_sum") / n
	}
	if n := d("lockd_raft_boltdb_entries_per_batch_count"); n > 0 {
		entriesPerStore = d("lockd_raft_boltdb_entries_per_batch_sum") / n
		storesPerSec = n / window
	} else if n := d("lockd_raft_wal_appends_total"); n > 0 { // --log-store wal
		entriesPerStore = d("lockd_raft_wal_entries_written_total") / n
		storesPerSec = n / window
	}
	return
}

func (s *stageStat) add(o stageStat, k float64) {
	s.Mean += k * o.Mean
	s.P50 += k * o.P50
	s.P99 += k * o.P99
	s.PerSec += k * o.PerSec
}

// add adds k × o to b (the rounds' mean is add(r, 1/n) for each round r).
func (b *commitBreakdown) add(o *commitBreakdown, k float64) {
	b.LeaderAppend.add(o.LeaderAppend, k)
	b.AppendEntriesRTT.add(o.AppendEntriesRTT, k)
	b.FollowerAppend.add(o.FollowerAppend, k)
	b.Commit.add(o.Commit, k)
	b.FSMApply.add(o.FSMApply, k)
	b.ProposeAcquire.add(o.ProposeAcquire, k)
	b.ProposeRelease.add(o.ProposeRelease, k)
	b.MainSaturation += k * o.MainSaturation
}

// writeBreakdown prints lockd's commit latency by stage, per workload.
func writeBreakdown(w io.Writer, rep *report) {
	var rows []*aggResult
	for _, a := range rep.Summary {
		if a.Breakdown != nil {
			rows = append(rows, a)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "lockd commit latency by stage, from every member's /metrics over the measured windows (histograms, docs/METRICS.md), ms: p50 / p99 / mean, and events per second. Leader append = lockd_raft_leader_dispatch_log_duration_seconds (the leader's StoreLogs, before it replicates); AppendEntries RTT = lockd_raft_replication_append_entries_duration_seconds (both followers, their append included); follower append = lockd_raft_rpc_append_entries_store_logs_duration_seconds; commit = lockd_raft_commit_duration_seconds (dispatch to commit); FSM apply = lockd_raft_fsm_apply_duration_seconds (one entry); propose = lockd_propose_duration_seconds (proposal to commit and apply on the leader, the server side of a request without the WebSocket read and write).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | clients | system | setup | leader append | AppendEntries RTT | follower append | commit | FSM apply | propose acquire | propose release | raft main saturation |")
	fmt.Fprintln(w, "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	st := func(s stageStat) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f (%.0f/s)", s.P50, s.P99, s.Mean, s.PerSec)
	}
	for _, a := range rows {
		b := a.Breakdown
		fmt.Fprintf(w, "| (%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f |\n", a.Workload, a.Clients, a.System, a.Setup,
			st(b.LeaderAppend), st(b.AppendEntriesRTT), st(b.FollowerAppend), st(b.Commit), st(b.FSMApply),
			st(b.ProposeAcquire), st(b.ProposeRelease), b.MainSaturation)
	}
}

// writeSyscalls prints the leader's system calls and context switches per
// cycle (a cycle is an acquire and a release), every system.
func writeSyscalls(w io.Writer, rep *report) {
	var rows []*aggResult
	for _, a := range rep.Summary {
		if a.LeaderReadsPerCycle+a.LeaderWritesPerCycle+a.LeaderCtxSwPerCycle > 0 {
			rows = append(rows, a)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The leader's system calls and context switches per cycle (acquire + release), from /proc/<pid>/io (syscr, syscw: read- and write-family calls, sockets and files) and the ctxt_switches of its threads:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | clients | system | setup | read calls | write calls | context switches |")
	fmt.Fprintln(w, "|---|---|---|---|--:|--:|--:|")
	for _, a := range rows {
		fmt.Fprintf(w, "| (%s) | %s | %s | %s | %.2f | %.2f | %.2f |\n", a.Workload, a.Clients, a.System, a.Setup,
			a.LeaderReadsPerCycle, a.LeaderWritesPerCycle, a.LeaderCtxSwPerCycle)
	}
}
