package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
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

func TestAggregateAndRatios(t *testing.T) {
	mk := func(sys, setup string, cycles int64, p50us int64) *runResult {
		r := &runResult{System: sys, Setup: setup, Workload: "b", Seconds: 10, Cycles: cycles, ServerCPU: 1, acqH: newHist(), relH: newHist()}
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
	rs := ratios(sum, []workload{allWorkloads[1]}, "lockd")
	if len(rs) != 1 || rs[0].Throughput != 5 || rs[0].EtcdSetup != setupLeader || !rs[0].GoalMet || rs[0].AcquireP50 > 0.26 {
		t.Fatalf("ratios: %+v", rs)
	}
}
