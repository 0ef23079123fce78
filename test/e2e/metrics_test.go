package e2e

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// TestMetricsListedInDocsAreServed reads every metric name docs/METRICS.md
// lists for lockd itself and checks that a member of a running 3-member
// cluster serves it on /metrics (some exist only on a leader with
// followers, some only on a follower). The series translated from
// hashicorp/raft (listed after them; some appear only after rare events
// or with one log store) are checked against their table by
// internal/raftmetrics' tests, and on a live member by
// TestMonitoringOnLiveMembers as far as the dashboard and alerts use them.
func TestMetricsListedInDocsAreServed(t *testing.T) {
	doc, err := os.ReadFile("../../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	own, _, found := strings.Cut(string(doc), "\n## hashicorp/raft and the log store")
	if !found {
		t.Fatal("docs/METRICS.md has no section \"hashicorp/raft and the log store\"")
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile("`(lockd_[a-zA-Z_]+)[`{]").FindAllStringSubmatch(own, -1) {
		names[m[1]] = true
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in docs/METRICS.md", len(names))
	}

	pc := startCluster(t, 3, "--snapshot-threshold", "16", "--snapshot-interval", "200ms", "--trailing-logs", "8")
	url := pc.procs[pc.leader(15*time.Second)].url()
	// Exercise what the metrics count: grants, a refusal, releases, sessions,
	// and enough entries for a snapshot.
	for i := 0; i < 40; i++ {
		r := testutil.Post(url+"/api/v1/locks/m/acquire", map[string]any{"client_id": "c", "ttl_ms": 60000})
		testutil.Post(url+"/api/v1/locks/m/acquire", map[string]any{"client_id": "other"})
		testutil.Post(url+"/api/v1/locks/m/release", map[string]any{"client_id": "c", "fencing_token": r.Uint("fencing_token")})
	}
	testutil.Post(url+"/api/v1/sessions", map[string]any{"client_id": "s", "ttl_ms": 5000})

	var missing []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		served := map[string]bool{}
		for _, id := range pc.up() {
			resp, err := http.Get(pc.procs[id].url() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(string(body), "\n") {
				if strings.HasPrefix(line, "#") || line == "" {
					continue
				}
				name := line[:strings.IndexAny(line, "{ ")]
				served[name] = true
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					served[strings.TrimSuffix(name, suffix)] = true
				}
			}
		}
		missing = missing[:0]
		for n := range names {
			if !served[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics listed in docs/METRICS.md but not served: %v", missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
