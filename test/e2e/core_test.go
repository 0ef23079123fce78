package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// TestKillLeaderAnswersWithin2s kills the leader with SIGKILL three times
// (restarting it each time) and checks the service answers a write again
// within 2 s, and that held locks survive with their tokens.
func TestKillLeaderAnswersWithin2s(t *testing.T) {
	pc := startCluster(t, 3)
	held := testutil.Post(pc.procs["n1"].url()+"/api/v1/locks/held/acquire", map[string]any{"client_id": "keeper", "ttl_ms": 120000})
	if held.Status != 200 {
		t.Fatalf("acquire: %s", held.Raw)
	}
	var times []time.Duration
	for round := 0; round < 3; round++ {
		l := pc.leader(10 * time.Second)
		var survivor string
		for _, id := range pc.up() {
			if id != l {
				survivor = id
			}
		}
		start := time.Now()
		pc.kill(l)
		ok := false
		for time.Since(start) < 5*time.Second {
			r := testutil.Post(pc.procs[survivor].url()+"/api/v1/locks/after/acquire",
				map[string]any{"client_id": fmt.Sprintf("x%d", round), "ttl_ms": 1000})
			if r.Status == 200 {
				ok = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		d := time.Since(start)
		if !ok {
			t.Fatalf("round %d: no write succeeded within 5 s of killing %s", round, l)
		}
		times = append(times, d)
		t.Logf("round %d: killed leader %s, service answered after %s", round, l, d.Round(time.Millisecond))
		s := testutil.Get(pc.procs[survivor].url() + "/api/v1/locks/held")
		if s.Str("client_id") != "keeper" || s.Uint("fencing_token") != held.Uint("fencing_token") {
			t.Fatalf("lock 'held' lost or changed after failover: %s", s.Raw)
		}
		pc.start(l)
		pc.waitReady(l, 30*time.Second)
	}
	t.Logf("failover (kill -9 leader → first successful write): median %s of %v", median(times), times)
	if m := median(times); m > 2*time.Second {
		t.Fatalf("median failover %s > 2 s", m)
	}
}

// TestFullClusterCrashLosesNothing kills every member at once with SIGKILL,
// restarts them, and checks every acknowledged lock is still held with its
// token and that the next token is larger than every token issued before.
func TestFullClusterCrashLosesNothing(t *testing.T) {
	pc := startCluster(t, 3)
	tokens := map[string]uint64{}
	var maxTok uint64
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("job-%d", i)
		id := pc.order[i%3]
		r := testutil.Post(pc.procs[id].url()+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "c" + name, "ttl_ms": 600000})
		if r.Status != 200 {
			t.Fatalf("acquire %s: %s", name, r.Raw)
		}
		tokens[name] = r.Uint("fencing_token")
		maxTok = max(maxTok, tokens[name])
	}
	// Release a few: acknowledged releases must not be undone either.
	for i := 0; i < 30; i += 5 {
		name := fmt.Sprintf("job-%d", i)
		r := testutil.Post(pc.procs["n2"].url()+"/api/v1/locks/"+name+"/release", map[string]any{"client_id": "c" + name, "fencing_token": tokens[name]})
		if r.Status != 200 {
			t.Fatalf("release %s: %s", name, r.Raw)
		}
	}
	for _, id := range pc.order {
		pc.kill(id)
	}
	for _, id := range pc.order {
		pc.start(id)
	}
	for _, id := range pc.order {
		pc.waitReady(id, 30*time.Second)
	}
	l := pc.leader(10 * time.Second)
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("job-%d", i)
		s := testutil.Get(pc.procs[l].url() + "/api/v1/locks/" + name)
		if i%5 == 0 {
			if s.Body["held"] != false {
				t.Fatalf("released lock %s is held again after restart: %s", name, s.Raw)
			}
			continue
		}
		if s.Str("client_id") != "c"+name || s.Uint("fencing_token") != tokens[name] {
			t.Fatalf("lock %s after full restart: %s (want holder c%s token %d)", name, s.Raw, name, tokens[name])
		}
	}
	r := testutil.Post(pc.procs[l].url()+"/api/v1/locks/fresh/acquire", map[string]any{"client_id": "z", "ttl_ms": 1000})
	if r.Status != 200 || r.Uint("fencing_token") <= maxTok {
		t.Fatalf("token after full restart %d must exceed %d: %s", r.Uint("fencing_token"), maxTok, r.Raw)
	}
}
