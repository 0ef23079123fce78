package main

import (
	"slices"
	"testing"
	"time"

	gometrics "github.com/armon/go-metrics"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// TestRaftMetricsFilter: the metrics an operator reads (commit time, log
// write times, elections) reach /metrics; raft's per-RPC transport timings
// and per-entry batch samples do not.
func TestRaftMetricsFilter(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := bridgeRaftMetrics(reg); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Millisecond)
	rpc := []gometrics.Label{{Name: "rpcType", Value: "AppendEntries"}}
	peer := []gometrics.Label{{Name: "peer_id", Value: "n2"}}
	gometrics.MeasureSince([]string{"raft", "commitTime"}, start)
	gometrics.MeasureSince([]string{"raft", "fsm", "apply"}, start)
	gometrics.MeasureSince([]string{"raft", "rpc", "appendEntries", "storeLogs"}, start)
	gometrics.MeasureSinceWithLabels([]string{"raft", "replication", "appendEntries", "rpc"}, start, peer)
	gometrics.MeasureSince([]string{"raft", "boltdb", "storeLogs"}, start)
	gometrics.IncrCounter([]string{"raft", "state", "leader"}, 1)
	// Through raft-wal's own collector, as the node sets it up: raft-wal
	// v0.4.2 emits through go-metrics' compat layer, which must land here.
	walmetrics.NewGoMetricsCollector([]string{"raft", "wal"}, nil, nil).IncrementCounter("log_appends", 1)
	// Dropped:
	gometrics.MeasureSinceWithLabels([]string{"raft", "net", "rpcDecode"}, start, rpc)
	gometrics.MeasureSince([]string{"raft", "rpc", "appendEntries"}, start)
	gometrics.MeasureSince([]string{"raft", "fsm", "applyBatch"}, start)
	gometrics.AddSample([]string{"raft", "fsm", "applyBatchNum"}, 3)
	gometrics.AddSample([]string{"raft", "boltdb", "logSize"}, 100)
	gometrics.MeasureSince([]string{"raft", "fsm", "enqueue"}, start)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	for _, want := range []string{"lockd_raft_commitTime", "lockd_raft_fsm_apply", "lockd_raft_rpc_appendEntries_storeLogs",
		"lockd_raft_replication_appendEntries_rpc", "lockd_raft_boltdb_storeLogs", "lockd_raft_state_leader",
		"lockd_raft_wal_log_appends"} {
		if !slices.Contains(got, want) {
			t.Errorf("%s missing from %v", want, got)
		}
	}
	for _, unwanted := range []string{"lockd_raft_net_rpcDecode", "lockd_raft_rpc_appendEntries", "lockd_raft_fsm_applyBatch",
		"lockd_raft_fsm_applyBatchNum", "lockd_raft_boltdb_logSize", "lockd_raft_fsm_enqueue"} {
		if slices.Contains(got, unwanted) {
			t.Errorf("%s bridged, want it dropped", unwanted)
		}
	}
}
