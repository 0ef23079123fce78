package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCPUSecondsOfSelf(t *testing.T) {
	v, err := cpuSeconds(os.Getpid())
	if err != nil || v < 0 {
		t.Fatalf("cpuSeconds(self) = %v, %v", v, err)
	}
	if rss, _ := memKB(os.Getpid()); rss <= 0 {
		t.Fatalf("memKB(self) = %d", rss)
	}
}

func TestSnapshotAndElectionLogLines(t *testing.T) {
	dir := t.TempDir()
	log := `2026-11-29T09:21:23.000Z [INFO]  raft.n1: starting snapshot up to: index=39771
2026-11-29T09:21:23.010Z [INFO]  raft.n1: creating new snapshot: path=` + dir + `/snapshots/2-39771-1795944084329.tmp
time=2026-11-29T09:21:24.492Z level=INFO msg="snapshot taken" id=2-39771-1795944084329 bytes=47212455 locks=1000000 sessions=100 took=1.333s
2026-11-29T09:21:23.250Z [INFO]  raft.n1: snapshot complete up to: index=39771
time=2026-11-29T09:21:37.413Z level=INFO msg="became leader" id=n1 term=3 ready_after=3.482s
`
	if err := os.WriteFile(filepath.Join(dir, "n1.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	lc := &lockdCluster{dir: dir, members: []*lockdMember{{id: "n1"}}}
	evs := allSnapshots(lc)
	if len(evs) != 1 {
		t.Fatalf("snapshots: %+v", evs)
	}
	e := evs[0]
	if e.Index != 39771 || e.Locks != 1_000_000 || e.SizeBytes != 47212455 || math.Abs(e.Took-1.333) > 1e-9 || math.Abs(e.Persist-0.25) > 1e-6 {
		t.Fatalf("snapshot event: %+v", e)
	}
	el := electionsOf(lc)
	if len(el) != 1 || el[0].Term != 3 || el[0].Member != "n1" || math.Abs(el[0].ReadyAfter-3.482) > 1e-9 {
		t.Fatalf("elections: %+v", el)
	}
}

// The same lines once hashicorp/raft logs through lockd's slog logger.
func TestSnapshotLogLinesThroughSlog(t *testing.T) {
	dir := t.TempDir()
	log := `time=2026-11-29T09:21:23.000Z level=INFO msg="starting snapshot up to" component=raft index=39771
time=2026-11-29T09:21:23.010Z level=INFO msg="creating new snapshot" component=raft path=` + dir + `/snapshots/2-39771-1795944084329.tmp
time=2026-11-29T09:21:24.492Z level=INFO msg="snapshot taken" id=2-39771-1795944084329 bytes=47212455 locks=1000000 sessions=100 took=1.333s
time=2026-11-29T09:21:23.250Z level=INFO msg="snapshot complete up to" component=raft index=39771
time=2026-11-29T09:21:37.413Z level=INFO msg="became leader" id=n1 term=3 ready_after=3.482s
`
	if err := os.WriteFile(filepath.Join(dir, "n1.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	lc := &lockdCluster{dir: dir, members: []*lockdMember{{id: "n1"}}}
	evs := allSnapshots(lc)
	if len(evs) != 1 {
		t.Fatalf("snapshots: %+v", evs)
	}
	if e := evs[0]; e.Index != 39771 || e.Locks != 1_000_000 || e.SizeBytes != 47212455 || math.Abs(e.Took-1.333) > 1e-9 || math.Abs(e.Persist-0.25) > 1e-6 {
		t.Fatalf("snapshot event: %+v", e)
	}
	for _, l := range []string{
		`time=2026-11-29T09:30:01.120Z level=INFO msg="restored from snapshot" component=raft id=2-39771-1795944084329 last-index=39771 last-term=2 size-in-bytes=47212455`,
		`2026-11-29T09:30:01.120Z [INFO]  raft.n1: restored from snapshot: id=2-39771-1795944084329 last-index=39771 last-term=2 size-in-bytes=47212455`,
	} {
		g := reRestored.FindStringSubmatch(l)
		if g == nil || g[1] != "2026-11-29T09:30:01.120Z" || g[2] != "47212455" {
			t.Fatalf("restored line %q: %q", l, g)
		}
	}
}

func TestAggregateAndRatios(t *testing.T) {
	mk := func(sys, setup string, cycles int64, p50us int64) *runResult {
		r := &runResult{System: sys, Setup: setup, Clients: clientsPerWorker, Workload: "b", Seconds: 10, Cycles: cycles, ServerCPU: 1, acqH: newHist(), relH: newHist()}
		for i := 0; i < 100; i++ {
			r.acqH.RecordValue(p50us)
			r.relH.RecordValue(p50us)
		}
		r.finish()
		return r
	}
	runs := []*runResult{mk("lockd", setupLeader, 50000, 1000), mk("etcd", setupLeader, 10000, 4000),
		mk("lockd", setupLeader, 50000, 1000), mk("etcd", setupSpread, 5000, 8000)}
	sum := aggregate(runs)
	if len(sum) != 3 || sum[0].System != "lockd" || sum[0].Rounds != 2 || sum[0].CyclesPerSec != 5000 {
		t.Fatalf("summary: %+v", sum[0])
	}
	rs := ratios(sum, []workload{allWorkloads[1]}, "lockd", clientsPerWorker)
	if len(rs) != 1 || rs[0].Throughput != 5 || rs[0].ThroughputPeer != "etcd leader" || !rs[0].GoalMet || rs[0].AcquireP50 > 0.26 {
		t.Fatalf("ratios: %+v", rs)
	}
	// Spread only: no peer ran on its leader, and the report must still
	// encode (JSON has no NaN).
	spread := aggregate([]*runResult{mk("lockd", setupSpread, 100, 1000), mk("etcd", setupSpread, 50, 1000)})
	rs = ratios(spread, []workload{allWorkloads[1]}, "lockd", clientsPerWorker)
	if len(rs) != 1 || rs[0].ThroughputVsLeader != 0 || rs[0].Throughput != 2 {
		t.Fatalf("spread-only ratios: %+v", rs)
	}
	if _, err := json.Marshal(&report{Summary: spread, Ratios: rs}); err != nil {
		t.Fatalf("report does not encode: %v", err)
	}
	if rs := ratios(sum, []workload{allWorkloads[1]}, "lockd", clientsShared); len(rs) != 0 {
		t.Fatalf("ratios of a client setup that did not run: %+v", rs)
	}
}

// The best peer is chosen per metric: here ZooKeeper has more cycles/s but
// etcd the lower p50, so lockd is held against each where it is better.
func TestRatiosAgainstBestPeerPerMetric(t *testing.T) {
	mk := func(sys, setup string, cycles, cpu int64, p50us int64) *runResult {
		r := &runResult{System: sys, Setup: setup, Clients: clientsShared, Workload: "d", Seconds: 1, Cycles: cycles,
			ServerCPU: float64(cpu), acqH: newHist(), relH: newHist()}
		for i := 0; i < 100; i++ {
			r.acqH.RecordValue(p50us)
			r.relH.RecordValue(p50us)
		}
		r.finish()
		return r
	}
	sum := aggregate([]*runResult{
		mk("lockd", setupSpread, 6000, 1, 1000),
		mk("etcd", setupLeader, 2000, 2, 500),
		mk("zookeeper", setupLeader, 3000, 1, 2000),
		mk("zookeeper", setupSpread, 1500, 1, 100), // slower setup: not ZooKeeper's best
	})
	rs := ratios(sum, []workload{allWorkloads[3]}, "lockd", clientsShared)
	if len(rs) != 1 {
		t.Fatalf("ratios: %+v", rs)
	}
	r := rs[0]
	if r.Throughput != 2 || r.ThroughputPeer != "zookeeper leader" || r.ThroughputVsLeader != 2 || !r.GoalMet { // (d)'s goal: ≥ 2×
		t.Fatalf("throughput: %+v", r)
	}
	if math.Abs(r.AcquireP50-2) > 0.01 || r.AcquireP50Peer != "etcd leader" {
		t.Fatalf("p50: %+v", r)
	}
	// CPU per 1k cycles: lockd 1/6000, etcd 2/2000, zookeeper 1/3000.
	if math.Abs(r.CPUPer1k-0.5) > 0.01 || r.CPUPer1kPeer != "zookeeper leader" {
		t.Fatalf("cpu: %+v", r)
	}
}

func TestPickClients(t *testing.T) {
	for in, want := range map[string]string{
		"both":              "per-worker,shared",
		"shared":            "shared",
		"shared,per-worker": "per-worker,shared",
		"per-worker":        "per-worker",
	} {
		got, err := pickClients(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("pickClients(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	if _, err := pickClients("all"); err == nil {
		t.Error("pickClients(all): no error")
	}
}

func TestParseSrvr(t *testing.T) {
	out := `Zookeeper version: 3.8.0-debian--1, built on 2023-06-27 09:14 UTC
Latency min/avg/max: 0/0.4431/12
Received: 1034
Sent: 1033
Connections: 2
Outstanding: 0
Zxid: 0x100000051
Mode: leader
Node count: 12
Proposal sizes last/min/max: 48/36/92
`
	st, err := parseSrvr(out)
	if err != nil || st.mode != "leader" || st.version != "3.8.0-debian--1" {
		t.Fatalf("parseSrvr = %+v, %v", st, err)
	}
	if _, err := parseSrvr("This ZooKeeper instance is not currently serving requests\n"); err == nil {
		t.Fatal("a member without quorum parsed as serving")
	}
}

func TestZooCfg(t *testing.T) {
	cfg := zooCfg("/d/data", 2181, []string{"server.1=127.0.0.1:1:2", "server.2=127.0.0.1:3:4"})
	for _, want := range []string{"forceSync=yes\n", "clientPort=2181\n", "dataDir=/d/data\n", "maxClientCnxns=0\n",
		"4lw.commands.whitelist=srvr", "server.2=127.0.0.1:3:4\n"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("zoo.cfg lacks %q:\n%s", want, cfg)
		}
	}
}

// Workers sharing an etcd session take turns at one name and not across
// names.
func TestLocalGates(t *testing.T) {
	var g localGates
	ctx := context.Background()
	if err := g.enter(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := g.enter(ctx, "y"); err != nil {
		t.Fatalf("another name waits: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.enter(short, "x"); err == nil {
		t.Fatal("two workers at one name")
	}
	g.leave("x")
	if err := g.enter(ctx, "x"); err != nil {
		t.Fatal(err)
	}
}

func TestCommitBreakdownFromMetrics(t *testing.T) {
	parse := func(text string) []promSample {
		var out []promSample
		for _, l := range strings.Split(text, "\n") {
			if s, ok := parsePromLine(l); ok {
				out = append(out, s)
			}
		}
		return out
	}
	leader0 := parse(`# HELP x
lockd_raft_commit_duration_seconds_bucket{le="0.001"} 0
lockd_raft_commit_duration_seconds_bucket{le="0.0025"} 10
lockd_raft_commit_duration_seconds_bucket{le="+Inf"} 10
lockd_raft_commit_duration_seconds_sum 0.01
lockd_raft_commit_duration_seconds_count 10
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n2",le="0.0005"} 10
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n2",le="+Inf"} 10
lockd_raft_replication_append_entries_duration_seconds_sum{peer_id="n2"} 0.005
lockd_raft_replication_append_entries_duration_seconds_count{peer_id="n2"} 10
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n3",le="0.0005"} 10
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n3",le="+Inf"} 10
lockd_raft_replication_append_entries_duration_seconds_sum{peer_id="n3"} 0.005
lockd_raft_replication_append_entries_duration_seconds_count{peer_id="n3"} 10
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="0.001"} 0
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="0.002"} 0
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="+Inf"} 0
lockd_propose_duration_seconds_sum{op="acquire",outcome="ok"} 0
lockd_propose_duration_seconds_count{op="acquire",outcome="ok"} 0`)
	leader1 := parse(`lockd_raft_commit_duration_seconds_bucket{le="0.001"} 0
lockd_raft_commit_duration_seconds_bucket{le="0.0025"} 20
lockd_raft_commit_duration_seconds_bucket{le="+Inf"} 20
lockd_raft_commit_duration_seconds_sum 0.03
lockd_raft_commit_duration_seconds_count 20
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n2",le="0.0005"} 20
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n2",le="+Inf"} 20
lockd_raft_replication_append_entries_duration_seconds_sum{peer_id="n2"} 0.01
lockd_raft_replication_append_entries_duration_seconds_count{peer_id="n2"} 20
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n3",le="0.0005"} 20
lockd_raft_replication_append_entries_duration_seconds_bucket{peer_id="n3",le="+Inf"} 20
lockd_raft_replication_append_entries_duration_seconds_sum{peer_id="n3"} 0.01
lockd_raft_replication_append_entries_duration_seconds_count{peer_id="n3"} 20
lockd_raft_thread_saturation_ratio{thread="fsm"} 0.5
lockd_raft_thread_saturation_ratio{thread="main"} 0.25
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="0.001"} 50
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="0.002"} 100
lockd_propose_duration_seconds_bucket{op="acquire",outcome="ok",le="+Inf"} 100
lockd_propose_duration_seconds_sum{op="acquire",outcome="ok"} 0.1
lockd_propose_duration_seconds_count{op="acquire",outcome="ok"} 100`)
	t0 := time.Unix(0, 0)
	a := &lockdSnapshot{at: t0, leader: "n1", members: map[string][]promSample{"n1": leader0}}
	b := &lockdSnapshot{at: t0.Add(10 * time.Second), leader: "n1", members: map[string][]promSample{"n1": leader1}}
	bd := breakdown(a, b)
	if bd == nil {
		t.Fatal("no breakdown")
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("commit mean", bd.Commit.Mean, 2)
	near("commit per sec", bd.Commit.PerSec, 1)
	near("commit p50", bd.Commit.P50, 1.75)
	near("commit p99", bd.Commit.P99, 2.485)
	near("AE mean", bd.AppendEntriesRTT.Mean, 0.5)
	near("AE p50 (peers pooled)", bd.AppendEntriesRTT.P50, 0.25)
	near("raft main saturation", bd.MainSaturation, 0.25)
	near("propose acquire mean", bd.ProposeAcquire.Mean, 1)
	near("propose acquire p50", bd.ProposeAcquire.P50, 1)
	near("propose acquire p99", bd.ProposeAcquire.P99, 1.98)
	b.leader = "n2"
	if breakdown(a, b) != nil {
		t.Error("a breakdown across a leader change")
	}
}

func TestCompactPerf(t *testing.T) {
	in := "# Samples: 3K of event 'cpu-clock:ppp'\n# Children      Self  Symbol          IPC   [IPC Coverage]\n# ........  ........  .........\n#\n    74.31%     0.00%  [.] runtime.goexit.abi0                 -      -            \n\n"
	want := "# Samples: 3K of event 'cpu-clock:ppp'\n#\n74.31% 0.00% [.] runtime.goexit.abi0\n"
	if got := string(compactPerf([]byte(in))); got != want {
		t.Errorf("compactPerf = %q, want %q", got, want)
	}
}

func TestLeaderEventsInLogLines(t *testing.T) {
	for name, lines := range map[string][]string{
		"hclog": {
			`2026-11-29T09:21:36.100Z [WARN]  raft.n2: heartbeat timeout reached, starting election: last-leader-addr=127.0.0.1:21001 last-leader-id=n3`,
			`2026-11-29T09:21:36.902Z [INFO]  raft.n2: entering leader state: leader="Node at 127.0.0.1:21002 [Leader]"`,
			`time=2026-11-29T09:21:37.413Z level=INFO msg="became leader" id=n2 term=3 ready_after=511ms`,
		},
		"slog": {
			`time=2026-11-29T09:21:36.902Z level=INFO msg="entering leader state" component=raft leader="Node at 127.0.0.1:21002 [Leader]"`,
			`time=2026-11-29T09:21:37.413Z level=INFO msg="became leader" id=n2 term=3 ready_after=511ms`,
			`time=2026-11-29T09:21:39.000Z level=INFO msg="became leader" id=n2 term=4 ready_after=9s`,
		},
	} {
		entered, became, ready := leaderEvents(lines)
		want := time.Date(2026, 11, 29, 9, 21, 36, 902_000_000, time.UTC)
		if !entered.Equal(want) || !became.Equal(want.Add(511*time.Millisecond)) || ready != "511ms" {
			t.Errorf("%s: entered %v, became %v, ready %q", name, entered, became, ready)
		}
	}
	if e, b, r := leaderEvents([]string{`2026-11-29T09:21:36.100Z [INFO]  raft.n2: entering candidate state: node="Node at x [Candidate]" term=3`}); !e.IsZero() || !b.IsZero() || r != "" {
		t.Errorf("a candidate line read as leadership: %v %v %q", e, b, r)
	}
}

func TestHandoverOfShutdownLines(t *testing.T) {
	for want, lines := range map[string][]string{
		"transferred": {`time=2026-12-02T01:44:50.001Z level=INFO msg="leadership transferred before shutdown"`,
			`time=2026-12-02T01:44:50.010Z level=INFO msg="member stopped" id=n2`},
		"failed: timed out enqueuing operation": {`time=2026-12-02T01:44:50.001Z level=INFO msg="leadership transfer before shutdown failed" err="timed out enqueuing operation"`},
		"":                                      {`time=2026-12-02T01:44:50.010Z level=INFO msg="member stopped" id=n2`},
	} {
		if got := handoverOf(lines); got != want {
			t.Errorf("handoverOf(%q) = %q, want %q", lines, got, want)
		}
	}
}
