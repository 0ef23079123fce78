package main

import (
	"time"

	gometrics "github.com/armon/go-metrics"
	gmprom "github.com/armon/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// raftMetricsAllowed are the hashicorp/raft (and raft-boltdb) metrics
// bridged to /metrics; every other one is dropped before it reaches the
// sink. Each sample the sink takes costs a key build, a map update and a
// summary observation; raft emits about ten per AppendEntries on every
// member (five of them the transport's per-RPC decode/enqueue/respond
// timings), and under load that bookkeeping was 12 % of a follower's CPU.
// What stays answers the operator's questions: is the disk slow (the
// leader's and the followers' log writes), is commit slow, is the cluster
// electing, are snapshots slow, is the raft goroutine saturated.
var raftMetricsAllowed = []string{
	"lockd.raft.apply",
	"lockd.raft.barrier",
	"lockd.raft.commitTime",
	"lockd.raft.fsm.apply",
	"lockd.raft.fsm.restore",
	"lockd.raft.fsm.snapshot",
	"lockd.raft.fsm.lastRestoreDuration",
	"lockd.raft.snapshot.",
	"lockd.raft.restore",
	"lockd.raft.compactLogs",
	"lockd.raft.state.",
	"lockd.raft.transition.",
	"lockd.raft.candidate.",
	"lockd.raft.peers",
	"lockd.raft.thread.",
	"lockd.raft.leader.dispatchLog",
	"lockd.raft.leader.lastContact",
	"lockd.raft.leader.oldestLogAge",
	"lockd.raft.replication.appendEntries.rpc",
	"lockd.raft.replication.heartbeat",
	"lockd.raft.replication.installSnapshot",
	"lockd.raft.rpc.appendEntries.storeLogs",
	"lockd.raft.rpc.installSnapshot",
	"lockd.raft.rpc.requestVote",
	"lockd.raft.boltdb.",
	"lockd.raft.wal.", // raft-wal's counters and gauges (--log-store wal)
}

// raftMetricsBlocked carves per-entry or per-batch samples out of the
// prefixes above (the longest matching prefix decides).
var raftMetricsBlocked = []string{
	"lockd.raft.fsm.applyBatch", // also applyBatchNum
	"lockd.raft.boltdb.logSize", // one sample per log entry
	"lockd.raft.boltdb.logBatchSize",
	"lockd.raft.boltdb.writeCapacity",
}

// bridgeRaftMetrics sends hashicorp/raft's own metrics (commit time, FSM
// apply time, snapshot create/persist, leader contact, ...) to the
// Prometheus registry the server exposes on /metrics. hashicorp/raft
// reports through go-metrics' process-wide sink, so this is done once per
// process, here, and not in the server package (which must stay free of
// globals so several members can share one test process).
func bridgeRaftMetrics(reg prometheus.Registerer) error {
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{
		Registerer: reg,
		Expiration: 10 * time.Minute,
	})
	if err != nil {
		return err
	}
	cfg := gometrics.DefaultConfig("lockd")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false // the Go collector already covers these
	cfg.EnableServiceLabel = false
	cfg.FilterDefault = false
	cfg.AllowedPrefixes = raftMetricsAllowed
	cfg.BlockedPrefixes = raftMetricsBlocked
	_, err = gometrics.NewGlobal(cfg, sink)
	return err
}
