// Package raftmetrics exports what hashicorp/raft, raft-wal and
// raft-boltdb measure as Prometheus metrics in Prometheus' own style.
//
// Those libraries report through go-metrics' process-wide sink with
// camelCase keys (raft.commitTime), milliseconds for times, counters
// without a unit and, through go-metrics' Prometheus sink, summaries that
// cannot be aggregated across members. Sink is a go-metrics sink that
// translates each key it knows, by the table in Families, into a
// snake_case series with a unit: durations become histograms in seconds,
// counters end in _total, and every series has help text that says what
// it measures. A key not in the table is dropped at once (raft emits about
// ten samples per AppendEntries, most of them per-RPC transport timings).
//
// Series that count or time something appear from the start at zero.
// Gauges appear once set, series labelled by peer once that peer is seen,
// and the log store's series (raft-wal's, or raft-boltdb's) once the store
// is used, so a member shows only the store it runs.
package raftmetrics

import (
	"fmt"
	"strings"
	"sync"
	"time"

	gometrics "github.com/armon/go-metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Kind is the Prometheus type of a family.
type Kind int

// The kinds.
const (
	Counter Kind = iota
	Gauge
	Histogram
)

func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	}
	return "histogram"
}

// Source is one go-metrics key that feeds a family.
type Source struct {
	// Key is the go-metrics key, its parts joined with '.'
	// ("raft.commitTime"). lockd exported it before as "lockd_" + Key with
	// '.' as '_' (lockd_raft_commitTime).
	Key string
	// Const are label values this key fixes, in the order of the
	// family's Const label names ({"leader"} for raft.state.leader).
	Const []string
}

// Family is one exported metric family.
type Family struct {
	Name string
	Kind Kind
	Help string
	// Scale multiplies every value: 0.001 turns raft's milliseconds into
	// seconds; 0 means 1.
	Scale float64
	// Const names the labels that each Source fixes; Labels names those
	// copied from the go-metrics labels of each sample (peer_id).
	Const, Labels []string
	Buckets       []float64
	// Lazy families appear only once a sample arrives: gauges (a gauge
	// at zero before it was set would lie), series of one log store, and
	// families with labels taken from samples.
	Lazy    bool
	Sources []Source
}

var (
	// latency suits raft's per-entry and per-RPC times: 100 µs to 10 s.
	latency = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	// slow suits snapshots, restores and compactions: 1 ms to 2 min.
	slow = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
)

const ms = 0.001

func src(keys ...string) []Source {
	out := make([]Source, len(keys))
	for i, k := range keys {
		out[i] = Source{Key: k}
	}
	return out
}

// Families is the translation table: every series this package exports
// and the go-metrics keys it comes from. docs/METRICS.md lists it (a test
// keeps the two equal).
var Families = []Family{
	// Commit and apply.
	{Name: "lockd_raft_commit_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.commitTime"),
		Help: "Leader: time from appending a log entry to its commit (a quorum of members stored it)."},
	{Name: "lockd_raft_leader_dispatch_log_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.leader.dispatchLog"),
		Help: "Leader: time to write a batch of new entries to its own log (the leader's disk)."},
	{Name: "lockd_raft_rpc_append_entries_store_logs_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.rpc.appendEntries.storeLogs"),
		Help: "Follower: time to write the entries of one AppendEntries request to its log (the follower's disk)."},
	{Name: "lockd_raft_fsm_apply_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.fsm.apply"),
		Help: "Time to apply one committed entry to the lock table (the state machine)."},
	{Name: "lockd_raft_apply_total", Kind: Counter, Sources: src("raft.apply"),
		Help: "Leader: log entries this member proposed (one per group-committed entry, each carrying one or more commands)."},
	{Name: "lockd_raft_barriers_total", Kind: Counter, Sources: src("raft.barrier"),
		Help: "Leader: barriers issued (one after every election won, before the new leader serves)."},
	{Name: "lockd_raft_leadership_verifications_total", Kind: Counter, Sources: src("raft.verify_leader"),
		Help: "Leader: quorum rounds that confirmed this member still leads (linearizable reads, keepalives, watches)."},

	// Replication, by follower.
	{Name: "lockd_raft_replication_append_entries_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Labels: []string{"peer_id"}, Lazy: true,
		Sources: src("raft.replication.appendEntries.rpc"),
		Help:    "Leader: AppendEntries round trip to each follower (peer_id), the follower's log write included."},
	{Name: "lockd_raft_replication_heartbeat_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Labels: []string{"peer_id"}, Lazy: true,
		Sources: src("raft.replication.heartbeat"),
		Help:    "Leader: heartbeat round trip to each follower (peer_id)."},
	{Name: "lockd_raft_replication_install_snapshot_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Labels: []string{"peer_id"}, Lazy: true,
		Sources: src("raft.replication.installSnapshot"),
		Help:    "Leader: time to send a snapshot to a follower (peer_id) that was too far behind for the log."},
	{Name: "lockd_raft_leader_last_contact_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.leader.lastContact"),
		Help: "Leader: time since each follower last answered, sampled at every lease check; near the leader lease timeout the leader is about to step down."},
	{Name: "lockd_raft_leader_oldest_log_age_seconds", Kind: Gauge, Scale: ms, Lazy: true, Sources: src("raft.leader.oldestLogAge"),
		Help: "Leader: age of the oldest entry still in the log, i.e. how far back a follower can fall and still catch up from the log (set every 10 s while leading)."},
	{Name: "lockd_raft_peers", Kind: Gauge, Lazy: true, Sources: src("raft.peers"),
		Help: "Leader: members in the latest configuration, itself included (set on configuration changes while leading)."},

	// Elections.
	{Name: "lockd_raft_state_changes_total", Kind: Counter, Const: []string{"state"},
		Sources: []Source{{Key: "raft.state.follower", Const: []string{"follower"}}, {Key: "raft.state.candidate", Const: []string{"candidate"}},
			{Key: "raft.state.leader", Const: []string{"leader"}}},
		Help: "Times this member entered each Raft state (follower, candidate, leader): candidate counts elections it started, leader elections it won."},
	{Name: "lockd_raft_heartbeat_timeouts_total", Kind: Counter, Sources: src("raft.transition.heartbeat_timeout"),
		Help: "Times this member heard from no leader within the heartbeat timeout and started an election."},
	{Name: "lockd_raft_leader_lease_timeouts_total", Kind: Counter, Sources: src("raft.transition.leader_lease_timeout"),
		Help: "Times this leader stepped down because a quorum had not answered within the leader lease timeout."},
	{Name: "lockd_raft_candidate_elect_self_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.candidate.electSelf"),
		Help: "Candidate: time to vote for itself and send its vote requests."},
	{Name: "lockd_raft_candidate_pre_elect_self_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.candidate.preElectSelf"),
		Help: "Candidate: time to start a pre-vote round (asking whether it could win before raising the term)."},
	{Name: "lockd_raft_rpc_request_vote_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Sources: src("raft.rpc.requestVote"),
		Help: "Time to handle a vote or pre-vote request from a candidate."},

	// Snapshots and restores.
	{Name: "lockd_raft_snapshot_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.snapshot.takeSnapshot"),
		Help: "Time to take a snapshot, capture to close (attempts that fail or find nothing new to snapshot included)."},
	{Name: "lockd_raft_snapshot_create_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.snapshot.create"),
		Help: "Time to create a snapshot's file in the snapshot store."},
	{Name: "lockd_raft_snapshot_persist_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.snapshot.persist"),
		Help: "Time to write a snapshot to disk."},
	{Name: "lockd_raft_fsm_snapshot_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.fsm.snapshot"),
		Help: "Time to capture the lock table for a snapshot (applying the log waits meanwhile)."},
	{Name: "lockd_raft_fsm_restore_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.fsm.restore"),
		Help: "Time to load a snapshot into the lock table (at start, from the leader, or by a restore)."},
	{Name: "lockd_raft_fsm_last_restore_duration_seconds", Kind: Gauge, Scale: ms, Lazy: true, Sources: src("raft.fsm.lastRestoreDuration"),
		Help: "Time the last snapshot load into the lock table took."},
	{Name: "lockd_raft_rpc_install_snapshot_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.rpc.installSnapshot"),
		Help: "Follower: time to receive and install a snapshot sent by the leader."},
	{Name: "lockd_raft_user_snapshot_restores_total", Kind: Counter, Sources: src("raft.restore"),
		Help: "Leader: restores of the whole state from a backup (lockctl snapshot restore)."},
	{Name: "lockd_raft_user_snapshot_restore_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.restoreUserSnapshot"),
		Help: "Leader: time to install a backup as the new state."},
	{Name: "lockd_raft_compact_logs_duration_seconds", Kind: Histogram, Scale: ms, Buckets: slow, Sources: src("raft.compactLogs"),
		Help: "Time to delete the log entries a snapshot covers (beyond --trailing-logs)."},

	// Saturation of raft's goroutines.
	{Name: "lockd_raft_thread_saturation_ratio", Kind: Gauge, Const: []string{"thread"}, Lazy: true,
		Sources: []Source{{Key: "raft.thread.main.saturation", Const: []string{"main"}}, {Key: "raft.thread.fsm.saturation", Const: []string{"fsm"}}},
		Help:    "Share of the last second raft's main loop (thread=main) or its state machine loop (thread=fsm) was busy, 0 to 1; near 1 the member cannot keep up."},

	// raft-wal (--log-store wal, the default).
	{Name: "lockd_raft_wal_appends_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.log_appends"),
		Help: "raft-wal: writes of a batch of entries to the log (each one fsync)."},
	{Name: "lockd_raft_wal_entries_written_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.log_entries_written"),
		Help: "raft-wal: log entries written."},
	{Name: "lockd_raft_wal_written_bytes_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.log_entry_bytes_written"),
		Help: "raft-wal: bytes of log entries written, after encoding."},
	{Name: "lockd_raft_wal_entries_read_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.log_entries_read"),
		Help: "raft-wal: log entries read from the log."},
	{Name: "lockd_raft_wal_read_bytes_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.log_entry_bytes_read"),
		Help: "raft-wal: bytes of log entries read."},
	{Name: "lockd_raft_wal_segment_rotations_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.segment_rotations"),
		Help: "raft-wal: moves to a new segment file."},
	{Name: "lockd_raft_wal_head_truncated_entries_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.head_truncations"),
		Help: "raft-wal: entries removed from the start of the log (after a snapshot)."},
	{Name: "lockd_raft_wal_tail_truncated_entries_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.tail_truncations"),
		Help: "raft-wal: entries removed from the end of the log (a follower's conflicting entries)."},
	{Name: "lockd_raft_wal_stable_gets_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.stable_gets"),
		Help: "raft-wal: reads of Raft's stable store (term, vote)."},
	{Name: "lockd_raft_wal_stable_sets_total", Kind: Counter, Lazy: true, Sources: src("raft.wal.stable_sets"),
		Help: "raft-wal: writes of Raft's stable store (term, vote)."},
	{Name: "lockd_raft_wal_last_segment_age_seconds", Kind: Gauge, Lazy: true, Sources: src("raft.wal.last_segment_age_seconds"),
		Help: "raft-wal: age of the segment file sealed last, at the time it was sealed."},

	// raft-boltdb (--log-store bolt).
	{Name: "lockd_raft_boltdb_store_logs_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Lazy: true, Sources: src("raft.boltdb.storeLogs"),
		Help: "raft-boltdb: time to write a batch of entries to the bolt log (the disk)."},
	{Name: "lockd_raft_boltdb_get_log_duration_seconds", Kind: Histogram, Scale: ms, Buckets: latency, Lazy: true, Sources: src("raft.boltdb.getLog"),
		Help: "raft-boltdb: time to read one entry from the bolt log (entries still in the log cache are not read)."},
	{Name: "lockd_raft_boltdb_entries_per_batch", Kind: Histogram, Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, Lazy: true,
		Sources: src("raft.boltdb.logsPerBatch"),
		Help:    "raft-boltdb: entries written per batch."},
}

// Sink is a go-metrics sink that feeds the families of the table, and the
// Prometheus collector that exports them. It is safe for concurrent use.
type Sink struct {
	routes     map[string]route
	collectors []prometheus.Collector
}

type route struct {
	fam    *Family
	fixed  []string
	scale  float64
	counts *prometheus.CounterVec
	gauges *prometheus.GaugeVec
	hists  *prometheus.HistogramVec
}

// New builds a Sink for the families of the table.
func New() *Sink {
	s := &Sink{routes: map[string]route{}}
	for i := range Families {
		f := &Families[i]
		labels := append(append([]string(nil), f.Const...), f.Labels...)
		r := route{fam: f, scale: f.Scale}
		if r.scale == 0 {
			r.scale = 1
		}
		var c prometheus.Collector
		switch f.Kind {
		case Counter:
			r.counts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: f.Name, Help: f.Help}, labels)
			c = r.counts
		case Gauge:
			r.gauges = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: f.Name, Help: f.Help}, labels)
			c = r.gauges
		case Histogram:
			r.hists = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: f.Name, Help: f.Help, Buckets: f.Buckets}, labels)
			c = r.hists
		}
		s.collectors = append(s.collectors, c)
		for _, src := range f.Sources {
			if len(src.Const) != len(f.Const) {
				panic(fmt.Sprintf("raftmetrics: %s: source %s fixes %d labels, the family has %d", f.Name, src.Key, len(src.Const), len(f.Const)))
			}
			r.fixed = src.Const
			s.routes[src.Key] = r
			if !f.Lazy {
				// Present from the start, at zero.
				switch {
				case r.counts != nil:
					r.counts.WithLabelValues(src.Const...)
				case r.hists != nil:
					r.hists.WithLabelValues(src.Const...)
				}
			}
		}
	}
	return s
}

var installMu sync.Mutex

// Install makes a new Sink go-metrics' process-wide sink, and so the
// destination of every hashicorp/raft, raft-wal and raft-boltdb metric in
// this process, and registers it on reg. A process runs one member, so it
// installs once; a second Install replaces the first sink (whose series
// stop moving).
func Install(reg prometheus.Registerer) (*Sink, error) {
	installMu.Lock()
	defer installMu.Unlock()
	s := New()
	if err := reg.Register(s); err != nil {
		return nil, err
	}
	cfg := gometrics.DefaultConfig("") // no service prefix: keys are raft.*
	cfg.EnableHostname = false
	cfg.EnableHostnameLabel = false
	cfg.EnableServiceLabel = false
	cfg.EnableRuntimeMetrics = false // the Go collector covers these
	cfg.TimerGranularity = time.Millisecond
	cfg.FilterDefault = true // the sink drops what it does not know, without a prefix tree walk first
	if _, err := gometrics.NewGlobal(cfg, s); err != nil {
		reg.Unregister(s)
		return nil, err
	}
	return s, nil
}

// Describe and Collect implement prometheus.Collector.
func (s *Sink) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.collectors {
		c.Describe(ch)
	}
}

func (s *Sink) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.collectors {
		c.Collect(ch)
	}
}

// route finds the family of a key; ok is false for keys not exported.
func (s *Sink) route(key []string) (route, bool) {
	r, ok := s.routes[strings.Join(key, ".")]
	return r, ok
}

// values are the label values of one sample: the source's fixed ones, then
// those the family copies from the sample's labels ("" when missing).
func (r route) values(labels []gometrics.Label) []string {
	if len(r.fam.Labels) == 0 {
		return r.fixed
	}
	vals := append(make([]string, 0, len(r.fixed)+len(r.fam.Labels)), r.fixed...)
	for _, name := range r.fam.Labels {
		v := ""
		for _, l := range labels {
			if l.Name == name {
				v = l.Value
			}
		}
		vals = append(vals, v)
	}
	return vals
}

// record applies one value to the family, whatever go-metrics call it came
// through: the table, not the call, decides the type.
func (s *Sink) record(key []string, val float32, labels []gometrics.Label, set bool) {
	r, ok := s.route(key)
	if !ok {
		return
	}
	v := float64(val) * r.scale
	lv := r.values(labels)
	switch {
	case r.hists != nil:
		r.hists.WithLabelValues(lv...).Observe(v)
	case r.gauges != nil:
		r.gauges.WithLabelValues(lv...).Set(v)
	case r.counts != nil && !set && v >= 0:
		r.counts.WithLabelValues(lv...).Add(v)
	}
}

// The go-metrics MetricSink methods.

func (s *Sink) SetGauge(key []string, val float32) { s.record(key, val, nil, true) }
func (s *Sink) SetGaugeWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.record(key, val, labels, true)
}
func (s *Sink) EmitKey(key []string, val float32)     { s.record(key, val, nil, true) }
func (s *Sink) IncrCounter(key []string, val float32) { s.record(key, val, nil, false) }
func (s *Sink) IncrCounterWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.record(key, val, labels, false)
}
func (s *Sink) AddSample(key []string, val float32) { s.record(key, val, nil, false) }
func (s *Sink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.record(key, val, labels, false)
}
