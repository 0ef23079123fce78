package server_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/testutil/walfault"
)

// TestCorruptFollowerLogFailsReadiness: a byte flipped on a follower's disk
// in an entry of its Raft log (its default wal) is found at the next
// checkpoint: that member counts it in /metrics and reports not ready, the
// others stay ready with nothing counted.
func TestCorruptFollowerLogFailsReadiness(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	const name = "corrupt-me-51d0e2"
	if r := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	var f *testutil.Member
	for _, m := range c.Up() {
		if m.ID != l.ID {
			f = m
			break
		}
	}
	target := l.Srv.Node().AppliedIndex()
	testutil.WaitFor(t, 10*time.Second, "the follower to store the entry", func() bool {
		return f.Srv.Node().AppliedIndex() >= target
	})
	if s := f.Srv.Node().LogStore(); s != "wal" {
		t.Fatalf("a new data dir got %q", s)
	}
	walfault.FlipInWAL(t, filepath.Join(f.Dir, "wal"), name)
	if _, err := l.Srv.Node().Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the follower to find the corruption", func() bool {
		return f.Srv.Node().LogCheck().Mismatches > 0
	})
	if ok, why := f.Srv.Readyz(); ok || !strings.Contains(why, "differs from what the leader wrote") {
		t.Fatalf("readiness of the corrupt member: %v %q", ok, why)
	}
	if r := testutil.Get(f.URL() + "/readyz"); r.Status != 503 {
		t.Fatalf("/readyz of the corrupt member: %d %s", r.Status, r.Raw)
	}
	if m := testutil.Get(f.URL() + "/metrics"); !strings.Contains(m.Raw, "lockd_raft_wal_verifier_mismatches_total 1\n") {
		t.Fatalf("/metrics of the corrupt member lacks the mismatch:\n%s", grepLines(m.Raw, "verifier"))
	}
	for _, m := range c.Up() {
		if m == f {
			continue
		}
		testutil.WaitFor(t, 10*time.Second, m.ID+" to check the range", func() bool {
			return m.Srv.Node().LogCheck().Verified > 0
		})
		if lc := m.Srv.Node().LogCheck(); lc.Mismatches != 0 {
			t.Fatalf("%s: %+v", m.ID, lc)
		}
		if ok, why := m.Srv.Readyz(); !ok {
			t.Fatalf("%s not ready: %s", m.ID, why)
		}
		if r := testutil.Get(m.URL() + "/metrics"); !strings.Contains(r.Raw, "lockd_raft_wal_verifier_mismatches_total 0\n") {
			t.Fatalf("/metrics of %s:\n%s", m.ID, grepLines(r.Raw, "verifier"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
