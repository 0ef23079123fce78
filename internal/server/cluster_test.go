package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

func lockURL(m *testutil.Member, name, op string) string {
	u := m.URL() + "/api/v1/locks/" + name
	if op != "" {
		u += "/" + op
	}
	return u
}

// acquireRetrying retries an acquire on the running members until it gets a
// definite answer (200 or 409), as a client does across a failover.
func acquireRetrying(c *testutil.Cluster, name, client string, ttl, wait int64) testutil.Reply {
	body := map[string]any{"client_id": client, "ttl_ms": ttl, "wait_timeout_ms": wait}
	for i := 0; i < 200; i++ {
		up := c.Up()
		if len(up) > 0 {
			r := testutil.Post(lockURL(up[i%len(up)], name, "acquire"), body)
			if r.Status == 200 || r.Status == 409 {
				return r
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return testutil.Reply{}
}

func TestFailoverKeepsLocksFIFOAndExpiry(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			c := testutil.NewCluster(t, n, testutil.Options{})
			l := c.WaitLeader(10 * time.Second)

			held := testutil.Post(lockURL(l, "held", "acquire"), map[string]any{"client_id": "keeper", "ttl_ms": 60000})
			if held.Status != 200 {
				t.Fatalf("acquire held: %d %s", held.Status, held.Raw)
			}
			hq := testutil.Post(lockURL(l, "q", "acquire"), map[string]any{"client_id": "h", "ttl_ms": 60000})
			if hq.Status != 200 {
				t.Fatalf("acquire q: %d %s", hq.Status, hq.Raw)
			}
			// Three waiters queue in a known order.
			for i, w := range []string{"w1", "w2", "w3"} {
				go testutil.Post(lockURL(l, "q", "acquire"), map[string]any{"client_id": w, "ttl_ms": 60000, "wait_timeout_ms": 60000})
				testutil.WaitFor(t, 5*time.Second, w+" queued", func() bool {
					return int(testutil.Get(lockURL(l, "q", "")).Body["waiters"].(float64)) == i+1
				})
			}
			exp := testutil.Post(lockURL(l, "exp", "acquire"), map[string]any{"client_id": "e", "ttl_ms": 1500})
			if exp.Status != 200 {
				t.Fatalf("acquire exp: %s", exp.Raw)
			}

			killed := time.Now()
			c.Kill(l.ID)
			l2 := c.WaitLeader(10 * time.Second)
			t.Logf("new leader %s after %s", l2.ID, time.Since(killed))

			g := testutil.Get(lockURL(l2, "held", ""))
			if g.Str("client_id") != "keeper" || g.Uint("fencing_token") != held.Uint("fencing_token") {
				t.Fatalf("lock 'held' changed across failover: %s", g.Raw)
			}
			g = testutil.Get(lockURL(l2, "q", ""))
			if g.Str("client_id") != "h" || int(g.Body["waiters"].(float64)) != 3 {
				t.Fatalf("queue of q changed across failover: %s", g.Raw)
			}

			// The waiters' connections died with the old leader. They retry,
			// in reverse order, and must keep their places.
			type grant struct {
				who   string
				token uint64
			}
			grants := make(chan grant, 3)
			for _, w := range []string{"w3", "w2", "w1"} {
				go func() {
					r := acquireRetrying(c, "q", w, 60000, 60000)
					grants <- grant{w, r.Uint("fencing_token")}
				}()
			}
			time.Sleep(300 * time.Millisecond) // let the retries land (they only re-queue)
			if r := testutil.Post(lockURL(l2, "q", "release"), map[string]any{"client_id": "h", "fencing_token": hq.Uint("fencing_token")}); r.Status != 200 {
				t.Fatalf("release q: %s", r.Raw)
			}
			last := hq.Uint("fencing_token")
			for _, want := range []string{"w1", "w2", "w3"} {
				var got grant
				select {
				case got = <-grants:
				case <-time.After(10 * time.Second):
					t.Fatalf("no grant for %s", want)
				}
				if got.who != want || got.token <= last {
					t.Fatalf("grant order: got %s token %d, want %s with token > %d", got.who, got.token, want, last)
				}
				last = got.token
				leader := c.WaitLeader(5 * time.Second)
				if r := testutil.Post(lockURL(leader, "q", "release"), map[string]any{"client_id": got.who, "fencing_token": got.token}); r.Status != 200 {
					t.Fatalf("release by %s: %s", got.who, r.Raw)
				}
			}

			// Expiry still fires on the new leader, at most one grace late.
			testutil.WaitFor(t, 5*time.Second, "lock exp to expire on the new leader", func() bool {
				return testutil.Get(lockURL(l2, "exp", "")).Body["held"] == false
			})
		})
	}
}

func TestPartitionedLeaderGrantsNothing(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	old := c.WaitLeader(10 * time.Second)
	var others []string
	for _, m := range c.Up() {
		if m.ID != old.ID {
			others = append(others, m.ID)
		}
	}
	c.Net.Partition([]string{old.ID}, others)

	// The isolated leader cannot commit: its acquire must not succeed.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	r := testutil.Call(ctx, http.MethodPost, lockURL(old, "p", "acquire"), map[string]any{"client_id": "minority", "ttl_ms": 60000})
	cancel()
	if r.Status == 200 {
		t.Fatalf("minority side granted a lock: %s", r.Raw)
	}

	nl := c.WaitLeaderAmong(others, 10*time.Second)
	maj := testutil.Post(lockURL(nl, "p", "acquire"), map[string]any{"client_id": "majority", "ttl_ms": 60000})
	if maj.Status != 200 {
		t.Fatalf("majority acquire: %s", maj.Raw)
	}
	// The old leader must have stepped down.
	testutil.WaitFor(t, 5*time.Second, "old leader to step down", func() bool { return !c.Members[old.ID].Srv.Ready() })

	c.Net.Heal()
	testutil.WaitFor(t, 10*time.Second, "every member to agree on the holder", func() bool {
		for _, m := range c.Up() {
			var li locktable.LockInfo
			m.Srv.View(func(tab *locktable.Table) { li = tab.Get("p") })
			if li.ClientID != "majority" || li.Token != maj.Uint("fencing_token") {
				return false
			}
		}
		return true
	})
	if l := c.WaitLeader(10 * time.Second); l == nil {
		t.Fatal("no leader after heal")
	}
}

func TestMembershipChangesWhileServing(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	first := testutil.Post(lockURL(l, "m", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000})
	if first.Status != 200 {
		t.Fatal(first.Raw)
	}

	n4 := c.AddMember("n4", l.URL())
	testutil.WaitFor(t, 20*time.Second, "n4 to join as a voter and catch up", func() bool {
		cs := testutil.Get(l.URL() + "/api/v1/cluster")
		ms, _ := cs.Body["members"].([]any)
		voter := false
		for _, m := range ms {
			mm := m.(map[string]any)
			if mm["id"] == "n4" && mm["voter"] == true && mm["http_addr"] == n4.URL() {
				voter = true
			}
		}
		if !voter {
			return false
		}
		var li locktable.LockInfo
		n4.Srv.View(func(tab *locktable.Table) { li = tab.Get("m") })
		return li.ClientID == "a"
	})
	// A write through the new member follows the redirect to the leader.
	if r := testutil.Post(lockURL(n4, "m2", "acquire"), map[string]any{"client_id": "b", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("acquire through n4: %s", r.Raw)
	}

	// Remove a follower that is not the leader.
	var victim string
	for _, m := range c.Up() {
		if m.ID != l.ID && m.ID != "n4" {
			victim = m.ID
			break
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, l.URL()+"/api/v1/cluster/members/"+victim, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("remove %s: %v %v", victim, err, resp)
	}
	resp.Body.Close()
	c.Kill(victim)
	testutil.WaitFor(t, 10*time.Second, "3 members after removal", func() bool {
		ms, _ := testutil.Get(l.URL() + "/api/v1/cluster").Body["members"].([]any)
		return len(ms) == 3
	})
	r := testutil.Post(lockURL(l, "m3", "acquire"), map[string]any{"client_id": "c", "ttl_ms": 60000})
	if r.Status != 200 || r.Uint("fencing_token") <= first.Uint("fencing_token") {
		t.Fatalf("acquire after removal: %s", r.Raw)
	}
	// The cluster still survives losing one more member (3 voters).
	leader := c.WaitLeader(5 * time.Second)
	for _, m := range c.Up() {
		if m.ID != leader.ID {
			c.Kill(m.ID)
			break
		}
	}
	if r := acquireRetrying(c, "m4", "d", 60000, 0); r.Status != 200 {
		t.Fatalf("acquire with one of three down: %s", r.Raw)
	}
}

// TestBoltDataDirStaysBolt: a cluster made on raft-boltdb (the default
// before raft-wal) restarts with no --log-store on bolt, with its state,
// and its data dirs refuse the other store.
func TestBoltDataDirStaysBolt(t *testing.T) {
	store := "bolt"
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) { cfg.LogStore = store }})
	l := c.WaitLeader(10 * time.Second)
	r := testutil.Post(lockURL(l, "w", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000})
	if r.Status != 200 {
		t.Fatal(r.Raw)
	}
	store = "" // an upgrade: the flag's default is now "the data dir's store"
	c.Kill(l.ID)
	c.Restart(l.ID)
	if s := c.Members[l.ID].Srv.Node().LogStore(); s != "bolt" {
		t.Fatalf("a bolt data dir restarted on %q", s)
	}
	testutil.WaitFor(t, 10*time.Second, "restarted member to have the lock", func() bool {
		var li locktable.LockInfo
		c.Members[l.ID].Srv.View(func(tab *locktable.Table) { li = tab.Get("w") })
		return li.ClientID == "a" && li.Token == r.Uint("fencing_token")
	})
	m := c.Members[l.ID]
	c.Kill(l.ID)
	_, err := server.New(server.Config{ID: m.ID, DataDir: m.Dir, HTTPAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", LogStore: "wal"})
	if err == nil || !strings.Contains(err.Error(), "holds a bolt log") {
		t.Fatalf("a bolt data dir opened with wal: %v", err)
	}
}

// TestDataDirInUse: a second member on a running member's data dir fails at
// once, naming the cause, instead of waiting forever for the log's lock.
func TestDataDirInUse(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	raftLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = server.New(server.Config{ID: l.ID, DataDir: l.Dir, HTTPAddr: "127.0.0.1:0", RaftListener: raftLn})
	if err == nil || !strings.Contains(err.Error(), "another lockd") {
		t.Fatalf("a second member on a data dir in use: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refused after %v", d)
	}
	// The failed start let go of the Raft listener it was given (an open
	// one would time out here).
	_ = raftLn.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	if _, err := raftLn.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Raft listener still open after a failed start: %v", err)
	}
}

// TestReadAfterFullRestartFromSnapshot: every member restarts from a
// snapshot (the log before it compacted away) with a waiter queued and no
// writes coming: a linearizable read answers at once, not at the next write.
func TestReadAfterFullRestartFromSnapshot(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.SnapshotThreshold, cfg.SnapshotInterval, cfg.TrailingLogs = 8, 50*time.Millisecond, 2
	}})
	l := c.WaitLeader(10 * time.Second)
	for i := 0; i < 30; i++ {
		testutil.Post(lockURL(l, fmt.Sprintf("k%d", i), "acquire"), map[string]any{"client_id": "a", "ttl_ms": 600000})
	}
	go testutil.Post(lockURL(l, "k0", "acquire"), map[string]any{"client_id": "w", "ttl_ms": 600000, "wait_timeout_ms": 600000})
	testutil.WaitFor(t, 5*time.Second, "waiter queued", func() bool {
		return testutil.Get(lockURL(l, "k0", "")).Body["waiters"] == float64(1)
	})
	testutil.WaitFor(t, 10*time.Second, "a snapshot on every member", func() bool {
		for _, m := range c.Up() {
			if m.Srv.Node().Stats()["last_snapshot_index"] == "0" {
				return false
			}
		}
		return true
	})
	for _, m := range c.Up() {
		c.Kill(m.ID)
	}
	for id := range c.Members {
		c.Restart(id)
	}
	nl := c.WaitLeader(15 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r := testutil.Call(ctx, http.MethodGet, lockURL(nl, "k0", ""), nil)
	if r.Status != 200 || r.Str("client_id") != "a" || r.Body["waiters"] != float64(1) {
		t.Fatalf("read after a full restart from snapshots: %d %s", r.Status, r.Raw)
	}
}
