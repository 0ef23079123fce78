package raftmetrics

import (
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	gometrics "github.com/armon/go-metrics"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// TestRaftMetricsInPrometheusStyle drives the process-wide go-metrics sink
// as hashicorp/raft and raft-wal do and reads what the registry exports.
func TestRaftMetricsInPrometheusStyle(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := Install(reg); err != nil {
		t.Fatal(err)
	}
	// Before anything happened, counters and histograms are there at
	// zero; gauges, per-peer series and log-store series are not.
	before := gather(t, reg)
	for _, name := range []string{"lockd_raft_commit_duration_seconds", "lockd_raft_apply_total", "lockd_raft_state_changes_total",
		"lockd_raft_snapshot_persist_duration_seconds"} {
		if before[name] == nil {
			t.Errorf("%s missing before any sample", name)
		}
	}
	if n := len(before["lockd_raft_state_changes_total"].GetMetric()); n != 3 {
		t.Errorf("lockd_raft_state_changes_total has %d series before any election, want 3 (follower, candidate, leader)", n)
	}
	for _, name := range []string{"lockd_raft_peers", "lockd_raft_replication_append_entries_duration_seconds", "lockd_raft_wal_appends_total",
		"lockd_raft_boltdb_store_logs_duration_seconds", "lockd_raft_thread_saturation_ratio"} {
		if before[name] != nil {
			t.Errorf("%s exported before any sample", name)
		}
	}

	// As raft reports them: times in ms through MeasureSince.
	start := time.Now().Add(-250 * time.Millisecond)
	gometrics.MeasureSince([]string{"raft", "commitTime"}, start)
	gometrics.MeasureSinceWithLabels([]string{"raft", "replication", "appendEntries", "rpc"}, start,
		[]gometrics.Label{{Name: "peer_id", Value: "n2"}})
	gometrics.IncrCounter([]string{"raft", "state", "leader"}, 1)
	gometrics.IncrCounter([]string{"raft", "state", "leader"}, 1)
	gometrics.IncrCounter([]string{"raft", "apply"}, 1)
	gometrics.SetGauge([]string{"raft", "peers"}, 3)
	gometrics.AddSample([]string{"raft", "thread", "fsm", "saturation"}, 0.25)
	gometrics.SetGauge([]string{"raft", "leader", "oldestLogAge"}, 1500)
	walmetrics.NewGoMetricsCollector([]string{"raft", "wal"}, nil, nil).IncrementCounter("log_appends", 2)
	// Dropped: per-RPC transport timings, per-batch samples, per-entry sizes.
	gometrics.MeasureSinceWithLabels([]string{"raft", "net", "rpcDecode"}, start, []gometrics.Label{{Name: "rpcType", Value: "AppendEntries"}})
	gometrics.MeasureSince([]string{"raft", "rpc", "appendEntries"}, start)
	gometrics.AddSample([]string{"raft", "fsm", "applyBatchNum"}, 3)
	gometrics.AddSample([]string{"raft", "boltdb", "logSize"}, 100)

	got := gather(t, reg)
	commit := got["lockd_raft_commit_duration_seconds"].GetMetric()[0].GetHistogram()
	if commit.GetSampleCount() != 1 || commit.GetSampleSum() < 0.25 || commit.GetSampleSum() > 5 {
		t.Errorf("commit time: %d samples summing %v s, want one of about 0.25 s (ms turned into seconds)", commit.GetSampleCount(), commit.GetSampleSum())
	}
	repl := got["lockd_raft_replication_append_entries_duration_seconds"].GetMetric()
	if len(repl) != 1 || repl[0].GetLabel()[0].GetName() != "peer_id" || repl[0].GetLabel()[0].GetValue() != "n2" {
		t.Errorf("replication series: %v", repl)
	}
	for _, m := range got["lockd_raft_state_changes_total"].GetMetric() {
		want := 0.0
		if m.GetLabel()[0].GetValue() == "leader" {
			want = 2
		}
		if m.GetCounter().GetValue() != want {
			t.Errorf("state %s: %v, want %v", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue(), want)
		}
	}
	for name, want := range map[string]float64{"lockd_raft_apply_total": 1, "lockd_raft_peers": 3, "lockd_raft_thread_saturation_ratio": 0.25,
		"lockd_raft_leader_oldest_log_age_seconds": 1.5, "lockd_raft_wal_appends_total": 2} {
		mf := got[name]
		if mf == nil {
			t.Errorf("%s missing", name)
			continue
		}
		m := mf.GetMetric()[0]
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if math.Abs(v-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	for name := range got {
		if strings.Contains(name, "net") || strings.Contains(name, "applyBatch") || strings.Contains(name, "logSize") || name == "lockd_raft_rpc_appendEntries" {
			t.Errorf("%s exported, want it dropped", name)
		}
	}

	// What `promtool check metrics` checks, on every exported family.
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestFamiliesAreIdiomatic checks the table itself: snake_case names with
// the lockd_raft_ prefix, _total on counters only, seconds for scaled
// times, help that says more than the name, each key routed once.
func TestFamiliesAreIdiomatic(t *testing.T) {
	snake := regexp.MustCompile(`^lockd_raft_[a-z0-9]+(_[a-z0-9]+)*$`)
	names, keys := map[string]bool{}, map[string]bool{}
	for _, f := range Families {
		if !snake.MatchString(f.Name) || names[f.Name] {
			t.Errorf("%s: not snake_case lockd_raft_*, or twice", f.Name)
		}
		names[f.Name] = true
		if (f.Kind == Counter) != strings.HasSuffix(f.Name, "_total") {
			t.Errorf("%s: a %s; _total belongs to counters and only to them", f.Name, f.Kind)
		}
		if f.Scale == ms && !strings.HasSuffix(f.Name, "_seconds") {
			t.Errorf("%s: milliseconds are exported in seconds and named so", f.Name)
		}
		if f.Kind == Histogram && len(f.Buckets) == 0 {
			t.Errorf("%s: no buckets", f.Name)
		}
		if len(f.Help) < 30 || strings.Contains(f.Help, f.Name) {
			t.Errorf("%s: help %q does not explain", f.Name, f.Help)
		}
		if (f.Kind == Gauge || len(f.Labels) > 0) && !f.Lazy {
			t.Errorf("%s: a gauge or a family labelled from samples must be lazy", f.Name)
		}
		for _, s := range f.Sources {
			if keys[s.Key] {
				t.Errorf("%s routed twice", s.Key)
			}
			keys[s.Key] = true
		}
	}
}

// TestDocsListEveryFamily: docs/METRICS.md lists every family with its
// type, and its table of renamed series names every source key.
func TestDocsListEveryFamily(t *testing.T) {
	b, err := os.ReadFile("../../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, section, ok := strings.Cut(doc, "\n## hashicorp/raft and the log store\n")
	section, renamed, ok2 := strings.Cut(section, "\n## Renamed\n")
	if !ok || !ok2 {
		t.Fatal("docs/METRICS.md lacks the sections \"hashicorp/raft and the log store\" and \"Renamed\"")
	}
	listed := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(lockd_raft_[a-z0-9_]+)` \\| ([a-z]+) \\|").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = m[2]
	}
	for _, f := range Families {
		if listed[f.Name] != f.Kind.String() {
			t.Errorf("docs/METRICS.md lists %s as %q, want a row with type %s", f.Name, listed[f.Name], f.Kind)
		}
		delete(listed, f.Name)
		for _, s := range f.Sources {
			old := "`lockd_" + strings.ReplaceAll(s.Key, ".", "_") + "`"
			if !strings.Contains(renamed, "| "+old+" | `"+f.Name) && !strings.Contains(renamed, "| (not exported) | `"+f.Name) {
				t.Errorf("the Renamed table has no row from %s to %s", old, f.Name)
			}
		}
	}
	for name := range listed {
		t.Errorf("docs/METRICS.md lists %s, which is not exported", name)
	}
}
