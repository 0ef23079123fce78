package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// Issue 23: lockctl rides through failovers, withdraws what it gives up,
// fails fast when nothing can answer, says when a watch is disconnected,
// and has a client ID that is the same from one command to the next.

// ctlProc is a lockctl process with its output.
type ctlProc struct {
	cmd *exec.Cmd
	out *testutil.SyncBuffer
}

func startCtl(t *testing.T, endpoints []string, args ...string) *ctlProc {
	t.Helper()
	p := &ctlProc{cmd: exec.Command(bin, args...), out: &testutil.SyncBuffer{}}
	p.cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+strings.Join(endpoints, ","))
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		t.Logf("lockctl %s:\n%s", strings.Join(args, " "), p.out.String())
	})
	return p
}

func newTestAPI(t *testing.T, f *lockdtest.Cluster) *client.API {
	t.Helper()
	a, err := client.NewAPI(client.APIConfig{Endpoints: f.URLs()})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAcquireWaitRidesThroughLeaderChange: a waiting `lockctl acquire`
// whose connection the leader drops (a crash) finds the new leader, sends
// its acquire again — it keeps its place — and gets the lock when the
// holder releases; it says on stderr what it waited for. (Before: exit 1
// with "POST .../acquire: EOF", and the wait left queued for a lockctl
// that was gone.)
func TestAcquireWaitRidesThroughLeaderChange(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Members: 2, Logf: t.Logf})
	defer f.Close()
	a := newTestAPI(t, f)
	ctx := t.Context()
	h, err := a.Acquire(ctx, "fo/a", "holder", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	me := "waiter"
	p := startCtl(t, f.URLs(), "acquire", "fo/a", "--ttl", "60s", "--wait", "20s", "--client-id", me)
	testutil.WaitFor(t, 5*time.Second, "lockctl queued", func() bool { return slicesEqual(f.Waiters("fo/a"), []string{me}) })
	f.SetLeader(-1)
	f.DropHTTPConnections() // the leader dies under the waiting request
	time.Sleep(300 * time.Millisecond)
	f.SetLeader(1)
	testutil.WaitFor(t, 5*time.Second, "the acquire sent again", func() bool {
		return strings.Contains(p.out.String(), "retrying") && slicesEqual(f.Waiters("fo/a"), []string{me})
	})
	if err := a.Release(ctx, "fo/a", "holder", h.FencingToken); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, p.cmd, 5*time.Second); code != exitOK {
		t.Fatalf("lockctl exit %d, want 0 (it got the lock after the failover)", code)
	}
	if id, tok, ok := f.Holder("fo/a"); !ok || id != me || !strings.Contains(p.out.String(), "token="+strconv.FormatUint(tok, 10)) {
		t.Fatalf("holder %q token %d; lockctl said %q", id, tok, p.out.String())
	}
}

// TestAcquireGivenUpWithdrawsItsWait: a `lockctl acquire --wait` stopped
// by SIGTERM or SIGINT, or whose own deadline passes with no answer,
// withdraws its wait before it exits: the lock's status shows no waiter
// right after.
func TestAcquireGivenUpWithdrawsItsWait(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Logf: t.Logf})
	defer f.Close()
	a := newTestAPI(t, f)
	if _, err := a.Acquire(t.Context(), "g", "holder", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p := startCtl(t, f.URLs(), "acquire", "g", "--wait", "30s", "--client-id", "w")
		testutil.WaitFor(t, 5*time.Second, "lockctl queued", func() bool { return slicesEqual(f.Waiters("g"), []string{"w"}) })
		start := time.Now()
		_ = p.cmd.Process.Signal(sig)
		code := exitOf(t, p.cmd, 5*time.Second)
		if w := f.Waiters("g"); len(w) != 0 {
			t.Fatalf("%v: waiters %v right after lockctl exited", sig, w)
		}
		if code != 128+int(sig) || time.Since(start) > 2*time.Second || !strings.Contains(p.out.String(), "the wait was withdrawn") {
			t.Fatalf("%v: exit %d after %v: %s", sig, code, time.Since(start), p.out.String())
		}
	}
	// Its own deadline: the cluster has no leader for longer than --timeout
	// + --wait; lockctl gives up (exit 6), withdrawing the wait on its way
	// out once a leader is back (the new leader's own timer may end the
	// wait first: either way nothing is left queued).
	p := startCtl(t, f.URLs(), "acquire", "g", "--wait", "1s", "--timeout", "1s", "--client-id", "w2")
	testutil.WaitFor(t, 5*time.Second, "lockctl queued", func() bool { return slicesEqual(f.Waiters("g"), []string{"w2"}) })
	f.SetLeader(-1)
	f.DropHTTPConnections()
	time.Sleep(2300 * time.Millisecond)
	f.SetLeader(0)
	if code := exitOf(t, p.cmd, 5*time.Second); code != exitNoLeader || !strings.Contains(p.out.String(), "no leader") {
		t.Fatalf("exit %d, want %d", code, exitNoLeader)
	}
	if w := f.Waiters("g"); len(w) != 0 {
		t.Fatalf("waiters %v after lockctl gave up", w)
	}
}

// TestLockctlFailsFastWhenNothingListens: against a port nobody listens
// on, every command says so at once (exit 6), instead of waiting out
// --timeout (10 s); one endpoint that may answer keeps it retrying, with a
// line on stderr saying what it waits for.
func TestLockctlFailsFastWhenNothingListens(t *testing.T) {
	dead := []string{"http://" + testutil.DeadAddr(t), "http://" + testutil.DeadAddr(t)}
	for _, args := range [][]string{
		{"status", "x"},
		{"acquire", "x", "--wait", "30s"},
		{"release", "x", "--token", "1"},
		{"run", "x", "--wait", "30s", "--", "true"},
		{"watch", "x"},
		{"elect", "e", "v"},
	} {
		start := time.Now()
		p := startCtl(t, dead, args...)
		code := exitOf(t, p.cmd, 5*time.Second)
		took := time.Since(start)
		if code != exitNoLeader || took > time.Second || !strings.Contains(p.out.String(), "connection refused") {
			t.Fatalf("lockctl %s: exit %d after %v: %s", strings.Join(args, " "), code, took, p.out.String())
		}
	}
	// A member that accepts and never answers is not a refusal: lockctl
	// retries until --timeout, and says what it waits for.
	hole := "http://" + testutil.BlackholeAddr(t)
	start := time.Now()
	p := startCtl(t, []string{dead[0], hole}, "status", "x", "--timeout", "1s")
	if code := exitOf(t, p.cmd, 5*time.Second); code != exitNoLeader || time.Since(start) < time.Second {
		t.Fatalf("exit %d after %v, want 6 after --timeout", code, time.Since(start))
	}
}

// TestAcquireThroughOverload: an overloaded refusal is waited out (the
// member's Retry-After) and the acquire sent again; lockctl says so.
func TestAcquireThroughOverload(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Logf: t.Logf})
	defer f.Close()
	f.Overload(api.OpAcquire, 1)
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	code, out, errs := cli(t, env, "acquire", "ov", "--client-id", "o")
	if code != exitOK || !strings.Contains(out, "ov acquired") || !strings.Contains(errs, "overloaded") || f.Overloaded() != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestDefaultClientIDIsStable: `lockctl acquire` then `lockctl release`,
// as the README shows them, without --client-id: the release finds the
// lock (the default ID is user@host, the same for both commands). A
// release with another ID is refused, and the message names the holder
// and the flag to pass.
func TestDefaultClientIDIsStable(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Logf: t.Logf})
	defer f.Close()
	eps := f.URLs()
	p := startCtl(t, eps, "acquire", "jobs/nightly", "--ttl", "30s", "-o", "json")
	if code := exitOf(t, p.cmd, 5*time.Second); code != exitOK {
		t.Fatalf("acquire: exit %d", code)
	}
	id, tok, _ := f.Holder("jobs/nightly")
	if want := userAtHost(); id != want || !strings.Contains(id, "@") {
		t.Fatalf("held by %q, want the default ID %q (user@host)", id, want)
	}
	// Another ID: refused, naming the holder and the flag.
	other := startCtl(t, eps, "release", "jobs/nightly", "--token", strconv.FormatUint(tok, 10), "--client-id", "someone-else")
	if code := exitOf(t, other.cmd, 5*time.Second); code != exitNotHolder {
		t.Fatalf("release as another client: exit %d", code)
	}
	msg := other.out.String()
	if !strings.Contains(msg, fmt.Sprintf("held by client %s (token %d)", id, tok)) || !strings.Contains(msg, "--client-id") {
		t.Fatalf("not_holder message %q: want the holder and a --client-id hint", msg)
	}
	// A wrong token of the right client says that too.
	code, _, errs := cli(t, map[string]string{"LOCKD_ENDPOINTS": eps[0]}, "renew", "jobs/nightly", "--token", strconv.FormatUint(tok+7, 10))
	if code != exitNotHolder || !strings.Contains(errs, fmt.Sprintf("by this client with token %d, not %d", tok, tok+7)) {
		t.Fatalf("renew with a wrong token: %d %q", code, errs)
	}
	rel := startCtl(t, eps, "release", "jobs/nightly", "--token", strconv.FormatUint(tok, 10))
	if code := exitOf(t, rel.cmd, 5*time.Second); code != exitOK {
		t.Fatalf("release with the default ID: exit %d", code)
	}
	if _, _, held := f.Holder("jobs/nightly"); held {
		t.Fatal("still held after the release")
	}
	code, _, errs = cli(t, map[string]string{"LOCKD_ENDPOINTS": eps[0]}, "release", "jobs/nightly", "--token", strconv.FormatUint(tok, 10))
	if code != exitNotHolder || !strings.Contains(errs, "it is free") {
		t.Fatalf("release of a free lock: %d %q", code, errs)
	}
}

// TestSessionCommandsAreOneClientPerProcess: two `lockctl run` of one lock
// at once, with the default client ID, are two clients: the second waits
// (a shared ID would hand it the first one's grant).
func TestSessionCommandsAreOneClientPerProcess(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Logf: t.Logf})
	defer f.Close()
	first := startCtl(t, f.URLs(), "run", "cron", "--", "sleep", "30")
	testutil.WaitFor(t, 5*time.Second, "the first run holds the lock", func() bool { _, _, ok := f.Holder("cron"); return ok })
	second := startCtl(t, f.URLs(), "run", "cron", "--", "true")
	if code := exitOf(t, second.cmd, 5*time.Second); code != exitNotAcquired {
		t.Fatalf("a second run of a held lock: exit %d, want %d", code, exitNotAcquired)
	}
	id, _, _ := f.Holder("cron")
	if want := userAtHost() + ":" + strconv.Itoa(first.cmd.Process.Pid); id != want {
		t.Fatalf("run's client ID %q, want %q", id, want)
	}
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	exitOf(t, first.cmd, 5*time.Second)
}

// TestWatchSaysWhenDisconnected: lockctl watch prints a line on stderr
// when its connection is lost and when it is back (with how many locks
// it caught up on), and exits within a second of SIGTERM, even while the
// cluster is unreachable.
func TestWatchSaysWhenDisconnected(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Logf: t.Logf})
	defer f.Close()
	a := newTestAPI(t, f)
	if _, err := a.Acquire(t.Context(), "wa/1", "h", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	p := startCtl(t, f.URLs(), "watch", "--prefix", "wa/")
	testutil.WaitFor(t, 5*time.Second, "the first picture", func() bool { return strings.Contains(p.out.String(), "wa/1 index=") })
	f.Partition(true)
	f.DropConnections()
	testutil.WaitFor(t, 5*time.Second, "the disconnect line", func() bool { return strings.Contains(p.out.String(), "disconnected from the cluster") })
	f.ExpireLock("wa/1")
	f.Partition(false)
	testutil.WaitFor(t, 5*time.Second, "the re-established line", func() bool {
		return strings.Contains(p.out.String(), "re-established on "+f.URL(0)+"; caught up 1 ")
	})
	// SIGTERM while cut off: out within a second all the same.
	f.Partition(true)
	f.DropConnections()
	testutil.WaitFor(t, 5*time.Second, "disconnected again", func() bool {
		return strings.Count(p.out.String(), "disconnected from the cluster") == 2
	})
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	code := exitOf(t, p.cmd, 5*time.Second)
	if took := time.Since(start); code != exitOK || took > time.Second {
		t.Fatalf("watch exited %d %v after SIGTERM, want 0 within 1s", code, took)
	}
	f.Partition(false)
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// TestReleaseRacedFindsEveryHolder: a grant made as lockctl gave up is
// given back even when lockctl's client is not among the 64 lowest tokens
// a semaphore's status lists (it pages the holders).
func TestReleaseRacedFindsEveryHolder(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{l.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	limit, ttl := int64(100), int64(60_000)
	for i := range 70 {
		if _, err := a.AcquireRequest(t.Context(), "sem", api.AcquireRequest{ClientID: fmt.Sprintf("h%02d", i), Limit: &limit, TTLms: &ttl}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.AcquireRequest(t.Context(), "sem", api.AcquireRequest{ClientID: "late", Limit: &limit, TTLms: &ttl}); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	e := &env{g: &globals{clientID: "late"}, stdout: io.Discard, stderr: &stderr}
	e.releaseRaced(a, []string{"sem"})
	page, err := a.Holders(t.Context(), "sem", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range page.Holders {
		if h.ClientID == "late" {
			t.Fatalf("the 71st holder's grant was not given back: %s", stderr.String())
		}
	}
	if page.HoldersTotal != 70 || !strings.Contains(stderr.String(), "released it") {
		t.Fatalf("holders_total %d; stderr %q", page.HoldersTotal, stderr.String())
	}
}
