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
	mu      sync.Mutex
	table   *locktable.Table
	timers  *Timers
	log     []locktable.Command
	pending []fakeEffect // applied, not yet handed to the timers

	deliver sync.Mutex // one deliverer at a time, so effects arrive in log order
}

type fakeEffect struct {
	index  uint64
	events []locktable.Event
}

// index is the log index of the last applied command.
func (f *fakeRaft) index() uint64 { return uint64(len(f.log)) }

func (f *fakeRaft) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	f.mu.Lock()
	cmd.Now = time.Now().UnixMilli()
	res := f.table.Apply(cmd)
	f.log = append(f.log, cmd)
	f.pending = append(f.pending, fakeEffect{f.index(), res.AllEvents()})
	f.mu.Unlock()
	// As the server's apply loop does: every entry's events, in log order,
	// and never while holding the state's lock.
	f.deliver.Lock()
	defer f.deliver.Unlock()
	f.mu.Lock()
	effs := f.pending
	f.pending = nil
	f.mu.Unlock()
	if f.timers != nil {
		for _, e := range effs {
			f.timers.Observe(e.index, e.events)
		}
	}
	return res, nil
}

func (f *fakeRaft) View(fn func(t *locktable.Table)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.table)
}

func (f *fakeRaft) ViewAt(fn func(t *locktable.Table, index uint64)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.table, f.index())
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
		if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 300 {
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
	if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 0 {
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
	if _, err := tm.Keepalive("x", time.Now()); err != ErrNotRunning {
		t.Fatalf("keepalive on stopped timers: %v", err)
	}
}

// holdExpiry delays session expiries until released: the window between the
// leader deciding to expire a session and the expiry committing.
type holdExpiry struct {
	*fakeRaft
	release chan struct{}
}

func (h holdExpiry) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	if cmd.Op == locktable.OpExpireSession {
		select {
		case <-h.release:
		case <-ctx.Done():
			return locktable.Result{}, ctx.Err()
		}
	}
	return h.fakeRaft.Propose(ctx, cmd)
}

// TestKeepaliveRefusedOnceExpiryDecided: once the leader has decided to
// expire a session, a keepalive is answered "unknown" (404) even before the
// expiry commits; acknowledging it would tell the client its lease grew
// while its locks are being freed.
func TestKeepaliveRefusedOnceExpiryDecided(t *testing.T) {
	f := &fakeRaft{table: locktable.New()}
	h := holdExpiry{fakeRaft: f, release: make(chan struct{})}
	tm := New(Config{Proposer: h, Viewer: f, Grace: 100 * time.Millisecond, Retry: 20 * time.Millisecond})
	f.timers = tm
	tm.Start()
	defer tm.Stop()
	if _, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond) // past the deadline: the expiry is proposed and held
	if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 0 {
		t.Fatalf("keepalive after the expiry was decided: ttl %d err %v, want 0", ttl, err)
	}
	close(h.release)
	waitUntil(t, 2*time.Second, "session expiry to commit", func() bool {
		ok := true
		f.View(func(tab *locktable.Table) { _, ok = tab.Session("s") })
		return !ok
	})
}

// TestNoOpSessionExpiryDropsTheTimer: a session that is already gone from
// the state when its timer fires (its end was never observed) must not keep
// a timer that answers keepalives.
func TestNoOpSessionExpiryDropsTheTimer(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	tm.Start()
	defer tm.Stop()
	if _, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 100}); err != nil {
		t.Fatal(err)
	}
	// The session ends without the timers hearing of it.
	f.mu.Lock()
	f.table.Apply(locktable.Command{Op: locktable.OpDeleteSession, SessionID: "s", Now: time.Now().UnixMilli()})
	f.mu.Unlock()
	// Polling with keepalives would keep it alive: wait past the TTL and
	// the retry, then ask once.
	time.Sleep(400 * time.Millisecond)
	if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 0 {
		t.Fatalf("keepalive for a session gone from the state: ttl %d err %v, want 0", ttl, err)
	}
}

// TestObserveFollowsIndexes: events of entries the rebuild already read
// from the state are not applied twice, and later ones are applied.
func TestObserveFollowsIndexes(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	res, _ := f.Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire, Lock: "a", ClientID: "c", TTLms: 60000})
	tm.Start()
	defer tm.Stop()
	// A replay of the grant's entry (index 1, already in the rebuilt state)
	// with a different expiry must be ignored.
	tm.Observe(1, []locktable.Event{{Kind: locktable.EvGranted, Lock: "a", ClientID: "c", Token: res.Token, ExpiresAt: 1}})
	tm.mu.Lock()
	got := tm.locks[res.Token].at
	tm.mu.Unlock()
	if got != res.ExpiresAt {
		t.Fatalf("timer at %d after a replayed entry, want %d", got, res.ExpiresAt)
	}
	// The release at index 2 is new.
	f.Propose(context.Background(), locktable.Command{Op: locktable.OpRelease, Lock: "a", ClientID: "c", Token: res.Token})
	tm.mu.Lock()
	_, still := tm.locks[res.Token]
	tm.mu.Unlock()
	if still {
		t.Fatal("the release did not drop the grant's timer")
	}
}
