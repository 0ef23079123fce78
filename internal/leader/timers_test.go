package leader

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd/lockd/internal/locktable"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRaft applies proposals to a real table at once, stamping the real
// clock, and feeds the events back to the timers as the server does.
type fakeRaft struct {
	mu     sync.Mutex
	table  *locktable.Table
	timers *Timers
	log    []locktable.Command
}

func (f *fakeRaft) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	f.mu.Lock()
	cmd.Now = time.Now().UnixMilli()
	res := f.table.Apply(cmd)
	f.log = append(f.log, cmd)
	f.mu.Unlock()
	if f.timers != nil {
		f.timers.Observe(res.Events)
	}
	return res, nil
}

func (f *fakeRaft) View(fn func(t *locktable.Table)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.table)
}

func (f *fakeRaft) held(name string) locktable.LockInfo {
	var li locktable.LockInfo
	f.View(func(t *locktable.Table) { li = t.Get(name) })
	return li
}

func newRig(grace time.Duration) (*fakeRaft, *Timers) {
	f := &fakeRaft{table: locktable.New()}
	t := New(Config{Proposer: f, Viewer: f, Grace: grace, Retry: 20 * time.Millisecond})
	f.timers = t
	return f, t
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return time.Now()
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
	return time.Time{}
}

func TestLockExpiresAtItsTTLNotBefore(t *testing.T) {
	f, tm := newRig(200 * time.Millisecond)
	tm.Start()
	defer tm.Stop()
	res, _ := f.Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire, Lock: "a", ClientID: "c", TTLms: 300})
	expires := time.UnixMilli(res.ExpiresAt)
	freed := waitUntil(t, 3*time.Second, "expiry", func() bool { return !f.held("a").Held })
	if freed.Before(expires) {
		t.Fatalf("expired %s before its expiry", expires.Sub(freed))
	}
	if late := freed.Sub(expires); late > 150*time.Millisecond {
		t.Fatalf("expired %s late", late)
	}
}

func TestRenewMovesTheTimer(t *testing.T) {
	f, tm := newRig(200 * time.Millisecond)
	tm.Start()
	defer tm.Stop()
	res, _ := f.Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire, Lock: "a", ClientID: "c", TTLms: 200})
	time.Sleep(100 * time.Millisecond)
	rn, _ := f.Propose(context.Background(), locktable.Command{Op: locktable.OpRenew, Lock: "a", ClientID: "c", Token: res.Token, TTLms: 500})
	time.Sleep(250 * time.Millisecond) // past the first expiry
	if !f.held("a").Held {
		t.Fatal("a renewed lock expired at its old deadline")
	}
	freed := waitUntil(t, 3*time.Second, "expiry after renew", func() bool { return !f.held("a").Held })
	if freed.Before(time.UnixMilli(rn.ExpiresAt)) {
		t.Fatal("expired before the renewed deadline")
	}
}

// A new leader gives locks already due one grace period, never more, and
// never expires one before its replicated expiry.
func TestRebuildGivesBoundedGrace(t *testing.T) {
	f, tm := newRig(300 * time.Millisecond)
	// State written by a previous leader: one lock due now, one due later.
	now := time.Now().UnixMilli()
	f.table.Apply(locktable.Command{Op: locktable.OpAcquire, Lock: "due", ClientID: "c", TTLms: 100, Now: now - 100})
	f.table.Apply(locktable.Command{Op: locktable.OpAcquire, Lock: "later", ClientID: "c", TTLms: 1000, Now: now})
	start := time.Now()
	tm.Start()
	defer tm.Stop()
	freed := waitUntil(t, 3*time.Second, "due lock to expire", func() bool { return !f.held("due").Held })
	if d := freed.Sub(start); d < 250*time.Millisecond || d > 800*time.Millisecond {
		t.Fatalf("a due lock expired %s after taking office; want about one grace (300ms)", d)
	}
	if !f.held("later").Held {
		t.Fatal("a lock not yet due expired early")
	}
	freed = waitUntil(t, 3*time.Second, "later lock to expire", func() bool { return !f.held("later").Held })
	if freed.Before(time.UnixMilli(now + 1000)) {
		t.Fatal("later lock expired before its replicated expiry")
	}
}

func TestSessionKeepaliveAndExpiry(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	tm.Start()
	defer tm.Stop()
	ctx := context.Background()
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 300})
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "c", SessionID: "s"})
	// Keepalives hold the session past several TTLs.
	for i := 0; i < 6; i++ {
		time.Sleep(100 * time.Millisecond)
		if ttl, err := tm.Keepalive("s"); err != nil || ttl != 300 {
			t.Fatalf("keepalive: %d %v", ttl, err)
		}
	}
	if !f.held("l").Held {
		t.Fatal("a kept-alive session's lock was released")
	}
	last := time.Now()
	freed := waitUntil(t, 3*time.Second, "session expiry", func() bool { return !f.held("l").Held })
	if d := freed.Sub(last); d < 300*time.Millisecond {
		t.Fatalf("session expired %s after the last keepalive, before its TTL", d)
	}
	if ttl, err := tm.Keepalive("s"); err != nil || ttl != 0 {
		t.Fatalf("keepalive of an expired session: %d %v", ttl, err)
	}
}

func TestWaiterTimesOut(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	tm.Start()
	defer tm.Stop()
	ctx := context.Background()
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "h", TTLms: 10000})
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "w", TTLms: 1000, WaitMs: 200})
	waitUntil(t, 3*time.Second, "waiter timeout", func() bool { return f.held("l").Waiters == 0 })
	if f.held("l").ClientID != "h" {
		t.Fatal("holder changed")
	}
}

func TestStopDropsTimers(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	tm.Start()
	f.Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire, Lock: "a", ClientID: "c", TTLms: 100})
	tm.Stop()
	time.Sleep(300 * time.Millisecond)
	if !f.held("a").Held {
		t.Fatal("a stopped timer set still expired a lock")
	}
	if _, err := tm.Keepalive("x"); err != ErrNotRunning {
		t.Fatalf("keepalive on stopped timers: %v", err)
	}
}
