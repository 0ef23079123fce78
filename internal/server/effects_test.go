package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/testutil"
)

// TestGrantWhoseProposerGaveUpStillExpires: the entry of an acquire commits
// although nobody waits for its result any more (the request's context
// ended mid-commit). Its expiry timer must still be armed — by the apply
// loop, not by the request — so the lock is freed at its TTL. Proposing
// through the Raft node directly is exactly a proposer that hands nothing
// on after the commit.
func TestGrantWhoseProposerGaveUpStillExpires(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	now := time.Now().UnixMilli()
	res, err := l.Srv.Node().Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire,
		Now: now, Lock: "orphan", ClientID: "gone", TTLms: 300})
	if err != nil || !res.Granted {
		t.Fatalf("acquire: %+v %v", res, err)
	}
	// expires_at + one election timeout + 1 s (SPEC semantics 9).
	bound := time.UnixMilli(res.ExpiresAt).Add(300*time.Millisecond + time.Second)
	testutil.WaitFor(t, time.Until(bound), "the orphaned grant to expire", func() bool {
		return testutil.Get(lockURL(l, "orphan", "")).Body["held"] == false
	})
}

// TestRenewRacingReleaseLeavesNoImmortalLock: a renew of token N and the
// release of N race while a waiter is queued; the release hands the lock to
// the waiter as N+1. Observed in the wrong order, N's renew overwrote N+1's
// expiry timer and N+1 never expired. Every lock must be free once its
// last holder stopped renewing, within expires_at + election timeout + 1 s.
func TestRenewRacingReleaseLeavesNoImmortalLock(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	const n = 60
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("race-%d", i)
			a := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "a", "ttl_ms": 5000})
			if a.Status != 200 {
				t.Errorf("acquire %s: %s", name, a.Raw)
				return
			}
			tok := a.Uint("fencing_token")
			waiter := make(chan testutil.Reply, 1)
			go func() {
				waiter <- testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "b", "ttl_ms": 200, "wait_timeout_ms": 10000})
			}()
			for i := 0; testutil.Get(lockURL(l, name, "")).Body["waiters"] != float64(1); i++ {
				if i > 500 {
					t.Errorf("the waiter on %s never queued", name)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			var race sync.WaitGroup
			race.Add(2)
			go func() {
				defer race.Done()
				testutil.Post(lockURL(l, name, "renew"), map[string]any{"client_id": "a", "fencing_token": tok, "ttl_ms": 5000})
			}()
			go func() {
				defer race.Done()
				testutil.Post(lockURL(l, name, "release"), map[string]any{"client_id": "a", "fencing_token": tok})
			}()
			race.Wait()
			if w := <-waiter; w.Status != 200 {
				t.Errorf("waiter on %s: %s", name, w.Raw)
			}
		}()
	}
	wg.Wait()
	// Nobody renews b's grants: every one must be gone within its TTL plus
	// one election timeout plus 1 s of the last grant.
	deadline := time.Now().Add(200*time.Millisecond + 300*time.Millisecond + time.Second)
	for time.Now().Before(deadline) {
		held := testutil.Get(l.URL() + "/api/v1/locks?prefix=race-").Body["locks"].([]any)
		if len(held) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	held := testutil.Get(l.URL() + "/api/v1/locks?prefix=race-").Body["locks"].([]any)
	t.Fatalf("%d of %d locks still held past their expiry + grace: %v", len(held), n, held)
}

// TestKeepaliveRefusedOnceExpiryDecided and the deposed-leader case live in
// internal/leader (the decision) and here (the quorum confirmation).

// TestIsolatedLeaderDoesNotAckKeepalives: a leader cut off from the rest
// still believes it leads for a moment; a keepalive it acknowledged then
// would stretch the client's lease past the new leader's deadline for the
// session. The keepalive must wait for a quorum to confirm leadership and
// so fail.
func TestIsolatedLeaderDoesNotAckKeepalives(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	s := testutil.Post(l.URL()+"/api/v1/sessions", map[string]any{"client_id": "k", "ttl_ms": 5000})
	sid := s.Str("session_id")
	if sid == "" {
		t.Fatalf("session: %s", s.Raw)
	}
	if r := testutil.Post(l.URL()+"/api/v1/sessions/"+sid+"/keepalive", nil); r.Status != 200 {
		t.Fatalf("keepalive on a healthy leader: %s", r.Raw)
	}
	var others []string
	for id := range c.Members {
		if id != l.ID {
			others = append(others, id)
		}
	}
	c.Net.Partition([]string{l.ID}, others)
	defer c.Net.Heal()
	// Straight away, while the isolated member may still call itself leader.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r := testutil.Call(ctx, http.MethodPost, l.URL()+"/api/v1/sessions/"+sid+"/keepalive", nil)
	if r.Status == 200 {
		t.Fatalf("an isolated leader acknowledged a keepalive: %s", r.Raw)
	}
}

// TestForcedRestoreUnderLoadNeverReissuesATokenAcked: acquires run while a
// forced restore of an old backup replaces the state. Every token
// acknowledged, before, during or after the restore, is unique (SPEC
// semantics 13).
func TestForcedRestoreUnderLoadNeverReissuesATokenAcked(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	if r := testutil.Post(lockURL(l, "seed", "acquire"), map[string]any{"client_id": "s", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("seed: %s", r.Raw)
	}
	resp, err := http.Get(l.URL() + "/api/v1/snapshot")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("backup: %v %v", err, resp)
	}
	backup, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	var mu sync.Mutex
	seen := map[uint64]string{}
	var dups []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("load-%d-%d", w, i)
				r := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "w", "ttl_ms": 60000})
				if r.Status != 200 {
					continue
				}
				tok := r.Uint("fencing_token")
				mu.Lock()
				if prev, ok := seen[tok]; ok {
					dups = append(dups, fmt.Sprintf("token %d acknowledged for %s and %s", tok, prev, name))
				}
				seen[tok] = name
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	for range 3 {
		rr, err := http.Post(l.URL()+"/api/v1/snapshot/restore?force=true", "application/octet-stream", bytes.NewReader(backup))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(rr.Body)
		rr.Body.Close()
		if rr.StatusCode != 200 {
			t.Fatalf("restore: %d %s", rr.StatusCode, body)
		}
		time.Sleep(150 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if len(seen) < 20 {
		t.Fatalf("only %d acquires succeeded: the load did not run", len(seen))
	}
	if len(dups) > 0 {
		t.Fatalf("%d tokens acknowledged twice: %v", len(dups), dups)
	}
}

// TestRestoreMinToken: an old backup restored into a fresh cluster cannot
// know the tokens issued after it was taken; min_token raises the counter.
func TestRestoreMinToken(t *testing.T) {
	src := testutil.NewCluster(t, 1, testutil.Options{})
	sl := src.WaitLeader(10 * time.Second)
	testutil.Post(lockURL(sl, "x", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000})
	resp, err := http.Get(sl.URL() + "/api/v1/snapshot")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("backup: %v %v", err, resp)
	}
	backup, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	dst := testutil.NewCluster(t, 1, testutil.Options{})
	dl := dst.WaitLeader(10 * time.Second)
	for _, bad := range []string{"-1", "x", "18446744073709551616"} {
		rr, err := http.Post(dl.URL()+"/api/v1/snapshot/restore?min_token="+bad, "application/octet-stream", bytes.NewReader(backup))
		if err != nil {
			t.Fatal(err)
		}
		rr.Body.Close()
		if rr.StatusCode != 400 {
			t.Fatalf("min_token=%s: status %d, want 400", bad, rr.StatusCode)
		}
	}
	rr, err := http.Post(dl.URL()+"/api/v1/snapshot/restore?min_token=5000", "application/octet-stream", bytes.NewReader(backup))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(rr.Body)
	rr.Body.Close()
	if rr.StatusCode != 200 {
		t.Fatalf("restore: %d %s", rr.StatusCode, body)
	}
	r := testutil.Post(lockURL(dl, "y", "acquire"), map[string]any{"client_id": "b", "ttl_ms": 60000})
	if tok := r.Uint("fencing_token"); tok != 5001 {
		t.Fatalf("first token after min_token=5000: %d (%s)", tok, r.Raw)
	}
}
