package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/testutil"
)

// Minimal reproductions of server bugs the chaos runs found. Each test
// fails until the bug is fixed; the run that found it is described in the
// test's comment.

// TestWaitingAcquireGetsAReplyOnShutdown: an HTTP acquire waiting in the
// queue when the leader is stopped gracefully (SIGTERM) is answered
// "200 OK" with an empty body. Found by the chaos nemesis's term-leader
// fault (seed 4, 3 members: 13 such replies in 5 graceful stops).
//
// Cause: Server.Close cancels the base context of every request before
// shutting the HTTP server down; awaitGrant (internal/httpapi/handler.go)
// takes its r.Context().Done() branch, which assumes the client left, and
// returns without writing — so net/http sends an implicit 200 with no body.
// A client that checks the status (curl -f, most scripts) takes that for a
// grant it does not have. With one member there is no leadership transfer
// to race with, so this reproduces every time; with several members it
// happens whenever the cancel wins the race with the leadership-lost
// notification.
func TestWaitingAcquireGetsAReplyOnShutdown(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Members: 1, Seed: 1})
	base := c.slots[0].url()
	ctx := context.Background()
	st, b, err := c.post(ctx, http.MethodPost, base+"/api/v1/locks/x/acquire", map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if err != nil || st != 200 {
		t.Fatalf("holder's acquire: %d %s %v", st, b, err)
	}
	done := c.postAsync(ctx, base+"/api/v1/locks/x/acquire",
		map[string]any{"client_id": "waiter", "ttl_ms": 5000, "wait_timeout_ms": 30000})
	testutil.WaitFor(t, 10*time.Second, "the waiter in the queue", func() bool {
		var ls api.LockStatus
		code, err := c.getJSON(ctx, base+"/api/v1/locks/x", &ls)
		return err == nil && code == 200 && ls.Waiters == 1
	})
	if !c.Term(0, 20*time.Second) {
		t.Fatal("lockd did not exit within 20 s of SIGTERM")
	}
	r := <-done
	if r.err != nil {
		return // the connection closed without a reply: fine, the outcome is unknown to the client
	}
	var ar api.AcquireReply
	if r.status == 200 && (json.Unmarshal(r.body, &ar) != nil || !ar.Acquired || ar.FencingToken == 0) {
		t.Fatalf("a waiting acquire was answered %d %q when the member stopped: a success status without a grant "+
			"(want 503 no_leader: the wait's outcome is unknown, its queue place kept)", r.status, r.body)
	}
	if r.status != 200 && r.status != http.StatusServiceUnavailable {
		t.Fatalf("a waiting acquire was answered %d %q when the member stopped (want 503 no_leader)", r.status, r.body)
	}
}

// TestPausedLeaderDoesNotDenyAGrantedWait: an HTTP acquire waiting on a
// leader that is frozen (SIGSTOP) while the rest of the cluster elects a
// new leader, which grants the wait before its deadline, is answered
// "409 wait_timeout" when the old leader wakes up — though the lock is the
// waiter's. Found by the chaos soak (seed 2027, 5 members, run
// 20261129-094759: lock e17-l1, op #25434 h4-430 told wait_timeout at
// 180.756 s while reads from 180.560 s on show it holding token 2407;
// pause-leader n5 177.971–180.755 s).
//
// Cause: awaitGrant's fallback timer (internal/httpapi/handler.go, the
// `case <-fallback.C` branch) fires deadline + 2 s after the request
// started. On a member that was frozen past that moment it fires as soon as
// the process runs again, before Raft has noticed the newer term, and it
// decides from the member's local, stale table (View: the old holder still
// holds) that the wait ended ungranted. That is a definite refusal for a
// wait that the new leader granted: the client walks away believing it
// does not hold a lock that stays held for its whole TTL.
//
// The frozen leader's Raft links are cut before it wakes up, so its table
// stays stale until the fallback has answered. On waking, the fallback
// races with the lease check that makes the old leader step down (which
// answers 503, correctly): a round shows the bug about 4 times in 5, so the
// test plays up to three rounds. A correct reply is the grant, or 503
// (outcome unknown).
func TestPausedLeaderDoesNotDenyAGrantedWait(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Members: 3, Seed: 3})
	ctx := context.Background()
	checked := 0
	for round := 1; round <= 3; round++ {
		if err := c.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		old, err := c.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		status, body, ok := pausedLeaderRound(t, c, old, fmt.Sprintf("x%d", round))
		c.HealNet()
		if !ok {
			continue
		}
		checked++
		if status == 409 {
			t.Fatalf("round %d: the new leader granted the wait before its deadline, yet the frozen old leader answered %d %s "+
				"(want the grant, or 503 no_leader: it cannot know the outcome)", round, status, body)
		}
		t.Logf("round %d: the old leader answered %d %s", round, status, body)
	}
	if checked == 0 {
		t.Skip("setup: no round had the wait granted by the new leader before its deadline (slow elections)")
	}
}

// pausedLeaderRound plays one round on lock name with leader old: a holder
// with a short TTL, a waiter queued on old, old frozen and cut off, the
// new leader hands the lock to the waiter, old wakes after the waiter's
// fallback moment. It returns old's reply to the waiter (status -1: no
// reply) and whether the new leader was seen granting the wait in time.
func pausedLeaderRound(t *testing.T, c *Cluster, old int, name string) (int, string, bool) {
	t.Helper()
	ctx := context.Background()
	base := c.slots[old].url()
	const waitMs = 3000
	st, b, err := c.post(ctx, http.MethodPost, base+"/api/v1/locks/"+name+"/acquire",
		map[string]any{"client_id": "holder-" + name, "ttl_ms": 1500})
	if err != nil || st != 200 {
		t.Fatalf("holder's acquire: %d %s %v", st, b, err)
	}
	sent := time.Now()
	done := c.postAsync(ctx, base+"/api/v1/locks/"+name+"/acquire",
		map[string]any{"client_id": "waiter-" + name, "ttl_ms": 60000, "wait_timeout_ms": waitMs})
	lockAt := func(url string) (api.LockStatus, bool) {
		var ls api.LockStatus
		code, err := c.getJSON(ctx, url+"/api/v1/locks/"+name, &ls)
		return ls, err == nil && code == 200
	}
	testutil.WaitFor(t, time.Second-time.Since(sent), "the waiter in the queue", func() bool {
		ls, ok := lockAt(base)
		return ok && ls.Waiters == 1
	})
	c.Pause(old)
	var rest []int
	for _, i := range c.Members() {
		if i != old {
			rest = append(rest, i)
		}
	}
	c.Isolate([]int{old}, rest)
	// The new leader expires the holder (TTL 1.5 s) and hands the lock to
	// the waiter, whose wait (3 s) has not run out.
	granted := false
	for time.Since(sent) < waitMs*time.Millisecond && !granted {
		if l := c.Leader(ctx); l >= 0 && l != old {
			ls, ok := lockAt(c.slots[l].url())
			granted = ok && ls.Held && ls.ClientID == "waiter-"+name
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Wake the old leader once its fallback timer (deadline + 2 s) is due.
	time.Sleep(time.Until(sent.Add(waitMs*time.Millisecond + 2*time.Second + 300*time.Millisecond)))
	c.Resume(old)
	var r postResult
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		c.HealNet()
		r = <-done
	}
	if r.err != nil {
		return -1, r.err.Error(), granted
	}
	var ar api.AcquireReply
	if r.status == 200 && (json.Unmarshal(r.body, &ar) != nil || !ar.Acquired || ar.FencingToken == 0) {
		t.Fatalf("a 200 that is not a grant: %s", r.body)
	}
	return r.status, strings.TrimSpace(string(r.body)), granted
}

// postResult is the outcome of a POST sent by postAsync.
type postResult struct {
	status int
	body   []byte
	err    error
}

// postAsync POSTs body in the background (a waiting acquire) and delivers
// the outcome on the returned channel.
func (c *Cluster) postAsync(ctx context.Context, url string, body any) <-chan postResult {
	done := make(chan postResult, 1)
	go func() {
		st, b, err := c.post(ctx, http.MethodPost, url, body)
		done <- postResult{st, b, err}
	}()
	return done
}

// TestWatchOnDeposedLeaderIsNotStale: a WebSocket watch asked of a leader
// that was frozen (SIGSTOP) and cut off while the rest of the cluster
// elected a new leader and moved an election on starts from the old
// leader's stale table: its first frame shows the previous leader ("a",
// token 1) at an older index to an observer that already saw the new one
// ("b") — leaders out of token order, which is what the chaos suite's
// leader-order checker flags across an observer's reconnect. Found while
// building that checker (the 10-minute soak, seed 849351, did not happen
// on it: the window is the moment a woken leader runs before its lease
// check); this test shows it in 4 runs out of 4, within three rounds.
//
// Cause: wsConn.watch (internal/httpapi/ws.go) reads the initial state
// (initialState: View of the local table) on a member whose Ready() —
// a local belief that it leads — still holds, without confirming its
// leadership with a quorum, unlike a linearizable GET (readable:
// ReadIndex), a blocking query, and a keepalive (SPEC semantics 10). The
// watch request was sent on a connection the old leader accepted (hello
// done) before it froze, so it is read the moment the member runs again.
// A correct member confirms its leadership (ReadIndex) before reading a
// watch's first state, or answers not_leader.
func TestWatchOnDeposedLeaderIsNotStale(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Members: 3, Seed: 5})
	ctx := context.Background()
	served := 0
	for round := 1; round <= 3; round++ {
		if err := c.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		old, err := c.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("elect-stale-%d", round)
		stale, newIdx, frame, ok := staleWatchRound(t, c, old, name)
		c.HealNet()
		if !ok {
			continue
		}
		served++
		if stale {
			t.Fatalf("round %d: the new leader moved %s to index %d (seen before the watch was sent); the frozen old leader, on waking, "+
				"started the watch from its stale table: %s", round, name, newIdx, frame)
		}
		t.Logf("round %d: the old leader answered the watch with %s", round, frame)
	}
	if served == 0 {
		t.Skip("setup: no round had a new leader move the election in time")
	}
}

// staleWatchRound plays one round on election name with leader old: a
// leader "a" elected through old; a WebSocket connection to old with
// hello done; old frozen and cut off; the new leader sees "a" resign and
// "b" elected; the watch request sent to old; old woken. It returns
// whether the watch's first frame was older than what the new leader
// showed, that index, the frame (or the reply), and whether the round
// could be played.
func staleWatchRound(t *testing.T, c *Cluster, old int, name string) (stale bool, newIdx uint64, frame string, ok bool) {
	t.Helper()
	ctx := context.Background()
	base := c.slots[old].url()
	st, b, err := c.post(ctx, http.MethodPost, base+"/api/v1/locks/"+name+"/acquire",
		map[string]any{"client_id": "a", "ttl_ms": 60000, "value": "a#0"})
	var ar api.AcquireReply
	if err != nil || st != 200 || json.Unmarshal(b, &ar) != nil {
		t.Fatalf("a's campaign: %d %s %v", st, b, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, wsURL(base), nil)
	if err != nil {
		t.Fatalf("dial %s: %v", base, err)
	}
	defer conn.CloseNow()
	ttl := int64(10000)
	hello, _ := json.Marshal(api.WSRequest{ID: 1, Op: api.OpHello, ClientID: "observer", SessionTTLms: &ttl})
	if err := conn.Write(dctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	if _, hb, err := conn.Read(dctx); err != nil || !strings.Contains(string(hb), `"hello"`) {
		t.Fatalf("hello: %s %v", hb, err)
	}
	c.Pause(old)
	var rest []int
	for _, i := range c.Members() {
		if i != old {
			rest = append(rest, i)
		}
	}
	c.Isolate([]int{old}, rest)
	// A new leader: a resigns, b is elected.
	var nl int
	testutil.WaitFor(t, 10*time.Second, "a new leader", func() bool {
		nl = c.Leader(ctx)
		return nl >= 0 && nl != old
	})
	nb := c.slots[nl].url()
	if st, b, err := c.post(ctx, http.MethodPost, nb+"/api/v1/locks/"+name+"/release",
		map[string]any{"client_id": "a", "fencing_token": ar.FencingToken}); err != nil || st != 200 {
		t.Logf("a's resignation on the new leader: %d %s %v", st, b, err)
		c.Resume(old)
		return false, 0, "", false
	}
	if st, b, err := c.post(ctx, http.MethodPost, nb+"/api/v1/locks/"+name+"/acquire",
		map[string]any{"client_id": "b", "ttl_ms": 60000, "value": "b#0"}); err != nil || st != 200 {
		t.Logf("b's campaign on the new leader: %d %s %v", st, b, err)
		c.Resume(old)
		return false, 0, "", false
	}
	var ls api.LockStatus
	if code, err := c.getJSON(ctx, nb+"/api/v1/locks/"+name, &ls); err != nil || code != 200 || ls.ClientID != "b" {
		t.Logf("the new leader's status: %d %+v %v", code, ls, err)
		c.Resume(old)
		return false, 0, "", false
	}
	newIdx = ls.Index
	watch, _ := json.Marshal(api.WSRequest{ID: 2, Op: api.OpWatch, Lock: name})
	if err := conn.Write(dctx, websocket.MessageText, watch); err != nil {
		c.Resume(old)
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the frame is in old's socket buffer
	c.Resume(old)
	for {
		_, fb, err := conn.Read(dctx)
		if err != nil {
			return false, newIdx, "no frame: " + err.Error(), true
		}
		var m api.WSMessage
		if json.Unmarshal(fb, &m) != nil {
			continue
		}
		switch {
		case m.Type == api.TypeChanged && m.Status != nil:
			return m.Index < newIdx || m.Status.ClientID != "b", newIdx, string(fb), true
		case m.Type == api.TypeError || m.Type == api.TypeResync:
			return false, newIdx, string(fb), true
		}
	}
}
