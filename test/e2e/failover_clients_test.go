package e2e

// Issue 23 (clients that ride through failover, withdraw what they give
// up, and share a hot lock fairly), black box: real lockd and lockctl
// processes.

import (
	"context"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testutil"
)

// TestLockctlWaitRidesThroughLeaderKill: a waiting `lockctl acquire` gets
// the lock across a kill -9 of the leader. (Before: it exited 1 with
// "POST .../acquire: EOF", and its wait stayed queued, so the lock went to
// the dead process for its whole TTL when the holder released.)
func TestLockctlWaitRidesThroughLeaderKill(t *testing.T) {
	pc := startCluster(t, 3)
	eps := pc.endpoints()
	h := pc.call("POST", "/api/v1/locks/fo%2Fa/acquire", map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if h.Status != 200 {
		t.Fatalf("holder: %s", h.Raw)
	}
	leader := pc.leader(10 * time.Second)
	// lockctl talks to the leader first: its waiting request is the one the
	// kill cuts.
	first := append([]string{pc.procs[leader].url()}, eps...)
	p := startLockctl(t, first, "acquire", "fo/a", "--ttl", "60s", "--wait", "50s", "--client-id", "waiter")
	pc.waitWaiters(t, "fo/a", 1)
	pc.kill(leader)
	newLeader := pc.leader(15 * time.Second)
	t.Logf("killed %s, %s leads", leader, newLeader)
	if r := pc.call("POST", "/api/v1/locks/fo%2Fa/release", map[string]any{"client_id": "holder", "fencing_token": h.Uint("fencing_token")}); r.Status != 200 {
		t.Fatalf("holder's release: %s", r.Raw)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("lockctl exit %d, want 0: %s", code, p.stderrText())
	}
	st := pc.lockStatus("fo/a")
	if st.Str("client_id") != "waiter" || st.Uint("fencing_token") <= h.Uint("fencing_token") {
		t.Fatalf("status after the failover: %s", st.Raw)
	}
	if !strings.Contains(p.stderrText(), "retrying") {
		t.Fatalf("lockctl said nothing of the failover on stderr: %q", p.stderrText())
	}
}

// TestLockctlGivenUpLeavesNoWaiter: a lockctl wait stopped by SIGINT
// (cancelled) or SIGTERM (abandoned) — acquire, run and elect — leaves no
// waiter behind: the lock's status shows waiters 0 right after it exits.
func TestLockctlGivenUpLeavesNoWaiter(t *testing.T) {
	pc := startCluster(t, 3)
	eps := pc.endpoints()
	for _, name := range []string{"gu/acq", "gu/run", "gu/elect"} {
		if r := pc.call("POST", "/api/v1/locks/"+strings.ReplaceAll(name, "/", "%2F")+"/acquire", map[string]any{"client_id": "holder", "ttl_ms": 120000}); r.Status != 200 {
			t.Fatalf("holder of %s: %s", name, r.Raw)
		}
	}
	for _, tc := range []struct {
		lock string
		sig  syscall.Signal
		args []string
	}{
		{"gu/acq", syscall.SIGINT, []string{"acquire", "gu/acq", "--wait", "60s", "--client-id", "w-int"}},
		{"gu/acq", syscall.SIGTERM, []string{"acquire", "gu/acq", "--wait", "60s", "--client-id", "w-term"}},
		{"gu/run", syscall.SIGTERM, []string{"run", "gu/run", "--wait", "60s", "--", "true"}},
		{"gu/elect", syscall.SIGINT, []string{"elect", "gu/elect", "candidate"}},
	} {
		p := startLockctl(t, eps, tc.args...)
		pc.waitWaiters(t, tc.lock, 1)
		_ = p.cmd.Process.Signal(tc.sig)
		code := p.wait(t, 10*time.Second)
		st := pc.lockStatus(tc.lock)
		if st.Uint("waiters") != 0 {
			t.Fatalf("lockctl %s, %v: exit %d; status right after: %s\n%s", strings.Join(tc.args, " "), tc.sig, code, st.Raw, p.stderrText())
		}
		t.Logf("lockctl %s, %v: exit %d, waiters 0", tc.args[0], tc.sig, code)
	}
}

// TestLockctlClosedPortFailsFast: against a port nobody listens on,
// lockctl says so in under a second (it used to wait out --timeout, 10 s).
func TestLockctlClosedPortFailsFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	for _, args := range [][]string{{"status", "x"}, {"acquire", "x", "--wait", "30s"}, {"run", "x", "--", "true"}} {
		p := startLockctl(t, []string{closed}, args...)
		code := p.wait(t, 10*time.Second)
		took := p.endAt.Sub(p.startedAt)
		if code != 6 || took >= time.Second || !strings.Contains(p.stderrText(), "connection refused") {
			t.Fatalf("lockctl %s: exit %d after %v: %s", strings.Join(args, " "), code, took, p.stderrText())
		}
		t.Logf("lockctl %s against a closed port: exit 6 after %v", args[0], took)
	}
}

// TestOneClientHotLockFIFOAndHandOffs: 32 goroutines of one Go Client
// waiting for one lock are granted in the order they asked, each with its
// own token, and each hand-off between them is one log entry
// (commit_index of /api/v1/status): the release and the next grant commit
// together.
func TestOneClientHotLockFIFOAndHandOffs(t *testing.T) {
	pc := startCluster(t, 1)
	url := pc.procs["n1"].url()
	c := newClient(t, []string{url}, "hot-proc", 15*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := c.Acquire(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	type grant struct {
		i     int
		token uint64
	}
	grants := make(chan grant, n)
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		asking := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			close(asking)
			l, err := c.Acquire(ctx, "hot")
			if err != nil {
				t.Errorf("goroutine %d: %v", i, err)
				return
			}
			grants <- grant{i, l.Token()}
			<-release
			if err := l.Release(ctx); err != nil {
				t.Errorf("goroutine %d: release: %v", i, err)
			}
		}()
		<-asking
		time.Sleep(30 * time.Millisecond) // its Acquire queues before the next one asks
	}
	commit := func() uint64 { return testutil.Get(url + "/api/v1/status").Uint("commit_index") }
	before := commit()
	close(release) // each goroutine releases as soon as it is granted
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := first.Token()
	for want := range n {
		select {
		case g := <-grants:
			if g.i != want || g.token <= last {
				t.Fatalf("grant %d went to goroutine %d with token %d (previous %d): want arrival order, new tokens", want, g.i, g.token, last)
			}
			last = g.token
		case <-time.After(20 * time.Second):
			t.Fatalf("grant %d did not come", want)
		}
	}
	wg.Wait()
	var after uint64
	testutil.WaitFor(t, 5*time.Second, "the last release committed", func() bool {
		st := pc.lockStatus("hot")
		after = commit()
		return st.Status == 200 && st.Body["held"] == false
	})
	// n+1 releases: n hand-offs (the first holder's and each goroutine's
	// but the last: release and grant in one entry each) and the last
	// goroutine's plain release. Two commits each, before.
	if d := after - before; d != n+1 {
		t.Fatalf("%d log entries for %d hand-offs and one release, want %d (one each)", d, n, n+1)
	}
	t.Logf("%d grants in arrival order, %d log entries", n, after-before)
}

// TestCampaignGivenUpNeverLeads: an Election's Campaign whose ctx ends
// withdraws its wait: when the leader resigns, the lock goes to the next
// candidate (or comes free), never to the one that gave up.
func TestCampaignGivenUpNeverLeads(t *testing.T) {
	pc := startCluster(t, 3)
	eps := pc.endpoints()
	lead := newClient(t, eps, "leader", 10*time.Second)
	quitter := newClient(t, eps, "quitter", 10*time.Second)
	next := newClient(t, eps, "next", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	el := client.NewElection(lead, "e/x")
	if err := el.Campaign(ctx, "L"); err != nil {
		t.Fatal(err)
	}
	qctx, qcancel := context.WithCancel(ctx)
	qdone := make(chan error, 1)
	go func() { qdone <- client.NewElection(quitter, "e/x").Campaign(qctx, "Q") }()
	pc.waitWaiters(t, "e/x", 1)
	ndone := make(chan error, 1)
	go func() { ndone <- client.NewElection(next, "e/x").Campaign(ctx, "N") }()
	pc.waitWaiters(t, "e/x", 2)
	qcancel()
	if err := <-qdone; err == nil {
		t.Fatal("the cancelled campaign succeeded")
	}
	testutil.WaitFor(t, 5*time.Second, "the quitter withdrawn", func() bool { return pc.lockStatus("e/x").Uint("waiters") == 1 })
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ndone; err != nil {
		t.Fatal(err)
	}
	if st := pc.lockStatus("e/x"); st.Str("client_id") != "next" || st.Str("value") != "N" {
		t.Fatalf("after the resignation: %s", st.Raw)
	}
}
