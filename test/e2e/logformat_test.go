package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// TestJSONLogsOnly: with --log-format json, everything a member writes to
// stderr (and stdout) through a bootstrap election, a join, a leadership
// transfer (a second election) and a graceful stop is one JSON object a
// line, hashicorp/raft's own lines included (they carry "component":
// "raft..." and lockd's level names).
func TestJSONLogsOnly(t *testing.T) {
	base := t.TempDir()
	pc := &procCluster{t: t, procs: map[string]*proc{}}
	flags := []string{"--log-format", "json", "--log-level", "debug", "--raft-log-level", "debug"}
	for _, id := range []string{"n1", "n2"} {
		pc.procs[id] = &proc{id: id, dir: filepath.Join(base, id), httpAddr: freePort(t), raftAddr: freePort(t),
			log: filepath.Join(base, id+".log"), extra: flags}
		pc.order = append(pc.order, id)
	}
	t.Cleanup(func() {
		for _, id := range pc.order {
			pc.kill(id)
		}
		if t.Failed() {
			for _, id := range pc.order {
				b, _ := os.ReadFile(pc.procs[id].log)
				t.Logf("--- log of %s ---\n%s", id, b)
			}
		}
	})
	pc.start("n1") // a one-member cluster of its own: an election
	pc.waitReady("n1", 30*time.Second)
	pc.start("n2", "--join", pc.procs["n1"].url())
	pc.waitReady("n2", 30*time.Second)
	testutil.WaitFor(t, 15*time.Second, "n2 to be a voter", func() bool {
		var c struct {
			Members []struct {
				ID    string `json:"id"`
				Voter bool   `json:"voter"`
			} `json:"members"`
		}
		_ = json.Unmarshal([]byte(testutil.Get(pc.procs["n1"].url()+"/api/v1/cluster").Raw), &c)
		for _, m := range c.Members {
			if m.ID == "n2" && m.Voter {
				return true
			}
		}
		return false
	})
	if r := testutil.Post(pc.procs["n1"].url()+"/api/v1/cluster/transfer-leadership", map[string]any{"to": "n2"}); r.Status != 200 {
		t.Fatalf("transfer-leadership: %d %s", r.Status, r.Raw)
	}
	testutil.WaitFor(t, 15*time.Second, "n2 to lead", func() bool {
		return testutil.Get(pc.procs["n2"].url()+"/readyz").Status == 200 &&
			testutil.Get(pc.procs["n2"].url()+"/api/v1/cluster").Str("leader_id") == "n2"
	})
	for _, id := range []string{"n1", "n2"} {
		p := pc.procs[id]
		pc.signal(id, syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v after SIGTERM", id, err)
			}
			p.cmd = nil
		case <-time.After(15 * time.Second):
			t.Fatalf("%s did not stop on SIGTERM", id)
		}
	}

	for _, id := range pc.order {
		f, err := os.Open(pc.procs[id].log)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		n, raft := 0, 0
		msgs := map[string]bool{}
		for sc.Scan() {
			n++
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("%s line %d is not one JSON object: %q", id, n, sc.Text())
				continue
			}
			for _, k := range []string{"time", "level", "msg"} {
				if _, ok := m[k]; !ok {
					t.Errorf("%s line %d has no %q: %q", id, n, k, sc.Text())
				}
			}
			if c, _ := m["component"].(string); strings.HasPrefix(c, "raft") {
				raft++
			}
			msg, _ := m["msg"].(string)
			msgs[msg] = true
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		// The lines the test went through: raft's election, lockd's own.
		want := []string{"entering leader state", "became leader", "member stopped"}
		if id == "n2" {
			want = append(want, "joined the cluster")
		}
		for _, w := range want {
			if !msgs[w] {
				t.Errorf("%s logged no %q line", id, w)
			}
		}
		if raft == 0 {
			t.Errorf("%s: none of %d lines came from hashicorp/raft", id, n)
		}
		t.Logf("%s: %d lines, all JSON, %d of them hashicorp/raft's", id, n, raft)
	}
}
