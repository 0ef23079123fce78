package leader

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	events  [][]locktable.Event // each log entry's
	pending []fakeEffect        // applied, not yet handed to the timers

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
	f.events = append(f.events, res.AllEvents())
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
	tm.Start(1)
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
	tm.Start(1)
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
	tm.Start(1)
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
	tm.Start(1)
	defer tm.Stop()
	ctx := context.Background()
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 300})
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "c", SessionID: "s"})
	// Keepalives hold the session past several TTLs. The TTL counts from
	// the time the last keepalive carries, not from when this goroutine
	// next runs (on a loaded machine, much later).
	var last time.Time
	for i := 0; i < 6; i++ {
		time.Sleep(100 * time.Millisecond)
		last = time.Now()
		if ttl, err := tm.Keepalive("s", last); err != nil || ttl != 300 {
			t.Fatalf("keepalive: %d %v", ttl, err)
		}
	}
	if !f.held("l").Held {
		t.Fatal("a kept-alive session's lock was released")
	}
	freed := waitUntil(t, 3*time.Second, "session expiry", func() bool { return !f.held("l").Held })
	if d := freed.Sub(last.Truncate(time.Millisecond)); d < 300*time.Millisecond { // whole milliseconds
		t.Fatalf("session expired %s after the last keepalive, before its TTL", d)
	}
	if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 0 {
		t.Fatalf("keepalive of an expired session: %d %v", ttl, err)
	}
}

func TestWaiterTimesOut(t *testing.T) {
	f, tm := newRig(100 * time.Millisecond)
	tm.Start(1)
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
	tm.Start(1)
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
	tm.Start(1)
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
	tm.Start(1)
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

// flaky wraps a proposer: fail decides, per command, whether it fails and
// how (before it reaches the log, or after: applied, reply lost), and
// delay holds it first.
type flaky struct {
	*fakeRaft
	fail  func(cmd locktable.Command) (before, after bool)
	delay func(cmd locktable.Command) time.Duration
}

var errInjected = errors.New("injected proposal failure")

func (f flaky) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	if f.delay != nil {
		if d := f.delay(cmd); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return locktable.Result{}, ctx.Err()
			}
		}
	}
	var before, after bool
	if f.fail != nil {
		before, after = f.fail(cmd)
	}
	if before {
		return locktable.Result{}, errInjected
	}
	res, err := f.fakeRaft.Propose(ctx, cmd)
	if after {
		return locktable.Result{}, errInjected
	}
	return res, err
}

func sessionExists(f *fakeRaft, id string) bool {
	ok := false
	f.View(func(tab *locktable.Table) { _, ok = tab.Session(id) })
	return ok
}

// Review finding 1: a session due while the timers are busy (a slow
// proposal holding the round) must still expire after a keepalive that
// arrives in between moved its deadline out. The old design popped the
// session's heap item, queued a job, and the worker dropped the job as
// "not due" when it finally ran: nothing ever expired the session.
func TestSessionDueWhileBusyStillExpiresAfterKeepalive(t *testing.T) {
	f := &fakeRaft{table: locktable.New()}
	slow := flaky{fakeRaft: f, delay: func(cmd locktable.Command) time.Duration {
		if cmd.Op == locktable.OpExpireLock {
			return 350 * time.Millisecond // the timers are busy with this until ~500ms
		}
		return 0
	}}
	tm := New(Config{Proposer: slow, Viewer: f, Grace: 10 * time.Millisecond, Retry: 20 * time.Millisecond})
	f.timers = tm
	tm.Start(1)
	defer tm.Stop()
	ctx := context.Background()
	// A lock whose expiry will be slow to propose, due just before the
	// session.
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "busy", ClientID: "x", TTLms: 150})
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 300})
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "c", SessionID: "s"})
	// The session's deadline passes while the round is held; one
	// keepalive then, and none after.
	time.Sleep(350 * time.Millisecond)
	last := time.Now()
	if ttl, err := tm.Keepalive("s", last); err != nil || ttl != 300 {
		t.Fatalf("keepalive: %d %v", ttl, err)
	}
	freed := waitUntil(t, 3*time.Second, "the session to expire after its last keepalive", func() bool { return !sessionExists(f, "s") })
	// Deadlines are whole milliseconds: the keepalive's arrival counts
	// from its millisecond.
	if d := freed.Sub(last.Truncate(time.Millisecond)); d < 300*time.Millisecond {
		t.Fatalf("expired %s after the keepalive, before its TTL", d)
	}
	if f.held("l").Held {
		t.Fatal("the session's lock outlived the session")
	}
}

// Review finding 2: a session expiry whose proposal fails is proposed again
// (and keepalives stay refused meanwhile), however quiet the rest is.
func TestFailedSessionExpiryIsRetried(t *testing.T) {
	f := &fakeRaft{table: locktable.New()}
	var fails atomic.Int32
	fl := flaky{fakeRaft: f, fail: func(cmd locktable.Command) (bool, bool) {
		if cmd.Op == locktable.OpExpireSession && fails.Add(1) <= 2 {
			return true, false
		}
		return false, false
	}}
	tm := New(Config{Proposer: fl, Viewer: f, Grace: 10 * time.Millisecond, Retry: 30 * time.Millisecond})
	f.timers = tm
	tm.Start(1)
	defer tm.Stop()
	ctx := context.Background()
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "s", ClientID: "c", TTLms: 200})
	f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "l", ClientID: "c", SessionID: "s"})
	start := time.Now()
	waitUntil(t, 2*time.Second, "the first expiry attempt", func() bool { return fails.Load() >= 1 })
	if ttl, err := tm.Keepalive("s", time.Now()); err != nil || ttl != 0 {
		t.Fatalf("keepalive while the expiry is being retried: %d %v, want refused", ttl, err)
	}
	freed := waitUntil(t, 2*time.Second, "the retried expiry to commit", func() bool { return !f.held("l").Held })
	if n := fails.Load(); n < 3 {
		t.Fatalf("%d expiry proposals, want the two failures and a retry", n)
	}
	if d := freed.Sub(start); d > time.Second {
		t.Fatalf("expired %s after creation (TTL 200ms, retry 30ms)", d)
	}
}

// A session created after office whose TTL sorts before sessions already
// claimed (behind the cursor through the state's TTL order) still expires.
func TestSessionCreatedBehindTheCursorExpires(t *testing.T) {
	f, tm := newRig(10 * time.Millisecond)
	ctx := context.Background()
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "long", ClientID: "c", TTLms: 200})
	tm.Start(1)
	defer tm.Stop()
	// Keep "long" alive so the cursor passes it, then create a shorter one.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				tm.Keepalive("long", time.Now())
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	// Taken before the proposal: its TTL counts from the time the command
	// carries, which a loaded machine may stamp well before Propose returns.
	created := time.Now()
	f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: "short", ClientID: "c", TTLms: 100})
	freed := waitUntil(t, 2*time.Second, "the short session to expire", func() bool { return !sessionExists(f, "short") })
	// Deadlines are whole milliseconds: the TTL counts from the
	// millisecond the command carries.
	if d := freed.Sub(created.Truncate(time.Millisecond)); d < 100*time.Millisecond {
		t.Fatalf("expired %s after creation, before its TTL", d)
	}
	if !sessionExists(f, "long") {
		t.Fatal("the kept-alive session expired")
	}
}

// Taking office reads nothing but an index: a table of many held locks
// costs Start nothing, and the timers still find what comes due.
func TestStartDoesNotWalkTheTable(t *testing.T) {
	f, tm := newRig(50 * time.Millisecond)
	now := time.Now().UnixMilli()
	const n = 200_000
	for i := 0; i < n; i++ {
		f.table.Apply(locktable.Command{Op: locktable.OpAcquire, Lock: fmt.Sprintf("l%06d", i), ClientID: "c", TTLms: 3_600_000, Now: now})
	}
	f.table.Apply(locktable.Command{Op: locktable.OpAcquire, Lock: "soon", ClientID: "c", TTLms: 300, Now: now})
	// What a walk of the table costs here and now (the machine may be
	// loaded): Start must cost a small part of it.
	walkStart := time.Now()
	held := 0
	f.table.ForEachHolder(func(string, locktable.Holder) { held++ })
	walk := time.Since(walkStart)
	start := time.Now()
	tm.Start(1)
	took := time.Since(start)
	defer tm.Stop()
	if held != n+1 || took*4 > walk {
		t.Fatalf("Start took %s with %d locks; a walk of them takes %s", took, held, walk)
	}
	waitUntil(t, 3*time.Second, "the one due lock to expire", func() bool { return !f.held("soon").Held })
	if !f.held("l000000").Held {
		t.Fatal("a lock not due expired")
	}
}

// A leader's timers stamp their term; entries of another term refuse them
// (locktable), and the loop neither spins nor acts until restarted in the
// new term.
func TestTimersOfAnEndedTermAreRefused(t *testing.T) {
	f := &fakeRaft{table: locktable.New()}
	var term atomic.Uint64
	term.Store(5)
	termed := termRaft{fakeRaft: f, term: &term, stale: &atomic.Int64{}}
	tm := New(Config{Proposer: termed, Viewer: f, Grace: 10 * time.Millisecond, Retry: 20 * time.Millisecond})
	f.timers = tm
	ctx := context.Background()
	termed.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "a", ClientID: "c", TTLms: 100})
	tm.Start(4) // a leader of term 4 whose term has ended: the log is at 5
	time.Sleep(400 * time.Millisecond)
	if !f.held("a").Held {
		t.Fatal("a timer of an ended term expired a lock")
	}
	if n := termed.stale.Load(); n == 0 || n > 30 {
		t.Fatalf("%d stale proposals in 400ms: want some, retried with a pause, not a spin", n)
	}
	tm.Stop()
	tm.Start(5)
	defer tm.Stop()
	waitUntil(t, 2*time.Second, "the current term's timers to expire the lock", func() bool { return !f.held("a").Held })
}

// termRaft applies entries in the current term, as Raft stamps them.
type termRaft struct {
	*fakeRaft
	term  *atomic.Uint64
	stale *atomic.Int64
}

func (r termRaft) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	f := r.fakeRaft
	f.mu.Lock()
	cmd.Now = time.Now().UnixMilli()
	res := f.table.ApplyEntry(f.index()+1, r.term.Load(), cmd)
	f.log = append(f.log, cmd)
	f.events = append(f.events, res.AllEvents())
	f.pending = append(f.pending, fakeEffect{f.index(), res.AllEvents()})
	f.mu.Unlock()
	if res.Code == locktable.CodeStale && r.stale != nil {
		r.stale.Add(1)
	}
	f.deliver.Lock()
	defer f.deliver.Unlock()
	f.mu.Lock()
	effs := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, e := range effs {
		f.timers.Observe(e.index, e.events)
	}
	return res, nil
}

// TestTimersAgainstAModel drives keepalives, renewals, waits and expiries
// concurrently while proposals fail at random (before they reach the log,
// or after, the reply lost) and are delayed, and checks every outcome
// against what the clients were told: a session never ends before the last
// keepalive it was acknowledged plus its TTL, and always ends within that
// plus a bound once the keepalives stop; a TTL lock never expires before
// its replicated expiry and always within a bound after; a waiter always
// times out within a bound of its deadline. A due item that any path
// could lose — a busy loop, a failed proposal, a keepalive racing the
// decision — shows up as a liveness failure here.
func TestTimersAgainstAModel(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := struct {
		sync.Mutex
		r *rand.Rand
	}{r: rand.New(rand.NewPCG(uint64(seed), 7))}
	intn := func(n int) int {
		rng.Lock()
		defer rng.Unlock()
		return rng.r.IntN(n)
	}
	f := &fakeRaft{table: locktable.New()}
	fl := flaky{fakeRaft: f,
		fail: func(cmd locktable.Command) (bool, bool) {
			switch cmd.Op {
			case locktable.OpExpireLock, locktable.OpTimeoutWaiter, locktable.OpExpireSession, locktable.OpEndDelay:
				k := intn(100)
				return k < 25, k >= 25 && k < 35
			}
			return false, false
		},
		delay: func(locktable.Command) time.Duration { return time.Duration(intn(30)) * time.Millisecond },
	}
	tm := New(Config{Proposer: fl, Viewer: f, Grace: 20 * time.Millisecond, Retry: 20 * time.Millisecond, MaxRound: 4})
	f.timers = tm
	tm.Start(1)
	defer tm.Stop()
	ctx := context.Background()
	const slack = 800 * time.Millisecond // retries with 35% failures and delays, on a loaded machine

	type sessionRun struct {
		id      string
		ttl     int64
		created int64
		acks    []int64 // received times of acknowledged keepalives
	}
	type lockRun struct {
		name      string
		expiresAt int64 // the last grant or renewal's
	}
	type waitRun struct {
		name     string
		deadline int64
	}
	var (
		mu       sync.Mutex
		sessions []*sessionRun
		locks    []*lockRun
		waits    []*waitRun
		wg       sync.WaitGroup
	)
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(intn(300)) * time.Millisecond)
			s := &sessionRun{id: fmt.Sprintf("s%d", i), ttl: int64(150 + intn(250))}
			res, _ := f.Propose(ctx, locktable.Command{Op: locktable.OpCreateSession, SessionID: s.id, ClientID: "c", TTLms: s.ttl})
			s.created = res.Events[0].ExpiresAt - s.ttl
			f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: "sl-" + s.id, ClientID: "c", SessionID: s.id})
			for k := intn(10); k > 0; k-- {
				time.Sleep(time.Duration(s.ttl/4+int64(intn(int(s.ttl/4)))) * time.Millisecond)
				now := time.Now()
				if ttl, err := tm.Keepalive(s.id, now); err == nil && ttl > 0 {
					s.acks = append(s.acks, now.UnixMilli())
				}
			}
			mu.Lock()
			sessions = append(sessions, s)
			mu.Unlock()
		}()
	}
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(intn(300)) * time.Millisecond)
			l := &lockRun{name: fmt.Sprintf("t%d", i)}
			ttl := int64(100 + intn(200))
			res, _ := f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: l.name, ClientID: "c", TTLms: ttl})
			l.expiresAt = res.ExpiresAt
			for k := intn(5); k > 0; k-- {
				time.Sleep(time.Duration(ttl/2) * time.Millisecond)
				r, _ := f.Propose(ctx, locktable.Command{Op: locktable.OpRenew, Lock: l.name, ClientID: "c", Token: res.Token})
				if r.Code != locktable.OK {
					break // expired meanwhile (the renewal came late)
				}
				l.expiresAt = r.ExpiresAt
			}
			mu.Lock()
			locks = append(locks, l)
			mu.Unlock()
		}()
	}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(intn(300)) * time.Millisecond)
			w := &waitRun{name: fmt.Sprintf("w%d", i)}
			f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: w.name, ClientID: "h", TTLms: 3_600_000})
			res, _ := f.Propose(ctx, locktable.Command{Op: locktable.OpAcquire, Lock: w.name, ClientID: "w", TTLms: 1000, WaitMs: int64(100 + intn(300))})
			for _, ev := range res.Events {
				if ev.Kind == locktable.EvQueued {
					w.deadline = ev.Deadline
				}
			}
			mu.Lock()
			waits = append(waits, w)
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Let everything that is due end, then read when each ended from the log.
	waitUntil(t, 10*time.Second, "every session, TTL lock and wait to end", func() bool {
		done := true
		f.View(func(tab *locktable.Table) {
			for _, s := range sessions {
				if _, ok := tab.Session(s.id); ok {
					done = false
				}
			}
			for _, l := range locks {
				done = done && !tab.Get(l.name).Held
			}
			for _, w := range waits {
				done = done && tab.Get(w.name).Waiters == 0
			}
		})
		return done
	})
	ended := map[string]int64{} // session id, lock name or "wait:"+name -> Now of the entry that ended it
	f.mu.Lock()
	for i, cmd := range f.log {
		for _, ev := range f.events[i] {
			switch {
			case ev.Kind == locktable.EvSessionEnded:
				ended[ev.SessionID] = cmd.Now
			case ev.Kind == locktable.EvLost && ev.Reason == locktable.ReasonExpired:
				ended[ev.Lock] = cmd.Now
			case ev.Kind == locktable.EvWaitEnded:
				ended["wait:"+ev.Lock] = cmd.Now
			}
		}
	}
	f.mu.Unlock()
	for _, s := range sessions {
		last := s.created
		for _, a := range s.acks {
			last = max(last, a)
		}
		at, ok := ended[s.id]
		switch {
		case !ok:
			t.Errorf("session %s (ttl %d, %d keepalives): no expiry in the log", s.id, s.ttl, len(s.acks))
		case at < last+s.ttl:
			t.Errorf("session %s expired at %d, %d ms before its last acknowledged keepalive + TTL", s.id, at, last+s.ttl-at)
		case time.Duration(at-last-s.ttl)*time.Millisecond > slack:
			t.Errorf("session %s expired %d ms after its last keepalive + TTL", s.id, at-last-s.ttl)
		}
	}
	for _, l := range locks {
		at, ok := ended[l.name]
		switch {
		case !ok:
			t.Errorf("lock %s: no expiry in the log", l.name)
		case at < l.expiresAt:
			t.Errorf("lock %s expired %d ms early", l.name, l.expiresAt-at)
		case time.Duration(at-l.expiresAt)*time.Millisecond > slack:
			t.Errorf("lock %s expired %d ms late", l.name, at-l.expiresAt)
		}
	}
	for _, w := range waits {
		at, ok := ended["wait:"+w.name]
		switch {
		case !ok:
			t.Errorf("wait on %s: no timeout in the log", w.name)
		case at < w.deadline:
			t.Errorf("wait on %s timed out %d ms early", w.name, w.deadline-at)
		case time.Duration(at-w.deadline)*time.Millisecond > slack:
			t.Errorf("wait on %s timed out %d ms late", w.name, at-w.deadline)
		}
	}
	t.Logf("%d sessions (%d keepalives), %d TTL locks, %d waits, %d log entries", len(sessions),
		func() (n int) {
			for _, s := range sessions {
				n += len(s.acks)
			}
			return
		}(), len(locks), len(waits), len(f.log))
}
