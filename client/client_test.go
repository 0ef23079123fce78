package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

func TestGrantIsPushed(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	ctx := t.Context()

	la, err := a.Acquire(ctx, "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(t, b, "jobs/nightly")
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("jobs/nightly"), []string{"b"}) })
	select {
	case r := <-got:
		t.Fatalf("b got the lock while a holds it: %+v", r)
	default:
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := waitAcquired(t, got, 2*time.Second)
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after %d: not increasing", lb.Token(), la.Token())
	}
	if !isClosed(la.Lost()) || !errors.Is(la.Err(), client.ErrReleased) {
		t.Fatalf("released lock: Lost closed=%v err=%v", isClosed(la.Lost()), la.Err())
	}
	if holder, tok, _ := f.Holder("jobs/nightly"); holder != "b" || tok != lb.Token() {
		t.Fatalf("server holder %s/%d, want b/%d", holder, tok, lb.Token())
	}
}

func TestFIFO(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	h := newClient(t, f, client.Config{ClientID: "holder"})
	l, err := h.Acquire(t.Context(), "q")
	if err != nil {
		t.Fatal(err)
	}
	var queued []string
	var chans []<-chan acquired
	for i := range 5 {
		id := fmt.Sprintf("w%d", i)
		c := newClient(t, f, client.Config{ClientID: id})
		chans = append(chans, acquireAsync(t, c, "q"))
		queued = append(queued, id)
		testutil.WaitFor(t, 2*time.Second, id+" queued", func() bool { return equal(f.Waiters("q"), queued) })
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	last := l.Token()
	for i, ch := range chans {
		li := waitAcquired(t, ch, 2*time.Second)
		if li.Token() <= last {
			t.Fatalf("w%d token %d not above %d", i, li.Token(), last)
		}
		last = li.Token()
		for j := i + 1; j < len(chans); j++ {
			select {
			case r := <-chans[j]:
				t.Fatalf("w%d granted before w%d: %+v", j, i, r)
			default:
			}
		}
		if err := li.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResumeAfterDropKeepsSessionAndQueuePlace(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	c := newClient(t, f, client.Config{ClientID: "c"})
	la, err := a.Acquire(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	gb := acquireAsync(t, b, "r")
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("r"), []string{"b"}) })
	gc := acquireAsync(t, c, "r")
	testutil.WaitFor(t, 2*time.Second, "c queued", func() bool { return equal(f.Waiters("r"), []string{"b", "c"}) })
	sa, sb := a.SessionID(), b.SessionID()
	_, resumed0 := f.Hellos()

	f.DropConnections()
	testutil.WaitFor(t, 3*time.Second, "three resumes", func() bool { _, r := f.Hellos(); return r >= resumed0+3 && f.Conns() == 3 })

	if a.SessionID() != sa || b.SessionID() != sb {
		t.Fatalf("sessions changed: %s→%s, %s→%s", sa, a.SessionID(), sb, b.SessionID())
	}
	if isClosed(la.Lost()) {
		t.Fatalf("lock lost across a reconnect: %v", la.Err())
	}
	if w := f.Waiters("r"); !equal(w, []string{"b", "c"}) {
		t.Fatalf("queue after resume %v, want [b c]", w)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	lb := waitAcquired(t, gb, 2*time.Second)
	if err := lb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitAcquired(t, gc, 2*time.Second)
}

func TestLeaderChangeResumesOnNewLeader(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 3})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	la, err := a.Acquire(t.Context(), "L")
	if err != nil {
		t.Fatal(err)
	}
	gb := acquireAsync(t, b, "L")
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("L"), []string{"b"}) })
	sa := a.SessionID()

	f.SetLeader(2)
	testutil.WaitFor(t, 5*time.Second, "both reconnected", func() bool { _, r := f.Hellos(); return r >= 2 && f.Conns() == 2 })
	if isClosed(la.Lost()) || a.SessionID() != sa {
		t.Fatalf("failover lost the lock (%v) or the session (%s→%s)", la.Err(), sa, a.SessionID())
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitAcquired(t, gb, 2*time.Second)
}

func TestFollowerPointsToLeader(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 2})
	f.SetLeader(1)
	c := newClient(t, f, client.Config{Endpoints: []string{f.URL(0)}})
	l, err := c.TryAcquire(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, tok, ok := f.Holder("x"); !ok || tok != l.Token() {
		t.Fatal("lock not held on the fake")
	}
}

func TestLostPushClosesLost(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	l, err := c.Acquire(t.Context(), "ttl", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	f.ExpireLock("ttl")
	waitClosed(t, l.Lost(), 2*time.Second, "Lost after a lost push")
	if !errors.Is(l.Err(), client.ErrLockExpired) {
		t.Fatalf("Err = %v, want ErrLockExpired", l.Err())
	}
	if isClosed(c.Done()) {
		t.Fatal("a lock's expiry ended the session")
	}
}

func TestSessionExpiredOnServer(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	other := newClient(t, f, client.Config{ClientID: "other"})
	l, err := c.Acquire(t.Context(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(t.Context(), "s2"); err != nil {
		t.Fatal(err)
	}
	pending := acquireAsync(t, c, "s2")
	testutil.WaitFor(t, 2*time.Second, "c queued", func() bool { return equal(f.Waiters("s2"), []string{"c"}) })
	old := c.SessionID()
	done := c.Done()

	f.ExpireSession(old)
	waitClosed(t, l.Lost(), 2*time.Second, "Lost after the session ended")
	waitClosed(t, done, time.Second, "Done after the session ended")
	if !errors.Is(l.Err(), client.ErrSessionExpired) || !errors.Is(c.Err(), client.ErrSessionExpired) {
		t.Fatalf("lock err %v, session err %v: want ErrSessionExpired", l.Err(), c.Err())
	}
	select {
	case r := <-pending:
		if !errors.Is(r.err, client.ErrSessionExpired) {
			t.Fatalf("pending acquire: %v, want ErrSessionExpired", r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("pending acquire not failed")
	}
	// A fresh session serves later calls.
	testutil.WaitFor(t, 3*time.Second, "a new session", func() bool { s := c.SessionID(); return s != old && !isClosed(c.Done()) })
	if _, err := c.TryAcquire(t.Context(), "s1"); err != nil {
		t.Fatal(err)
	}
}

// The conservative local lease: a client cut off from every member counts
// its session lost before the server expires it.
func TestLocalLeaseBeatsServerExpiry(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{SessionTTL: time.Second})
	l, err := c.Acquire(t.Context(), "cut")
	if err != nil {
		t.Fatal(err)
	}
	sid := c.SessionID()
	f.Partition(true)
	serverDeadline, ok := f.SessionDeadline(sid)
	if !ok {
		t.Fatal("session gone on the fake")
	}
	waitClosed(t, l.Lost(), 3*time.Second, "Lost while cut off")
	lostAt := time.Now()
	if !lostAt.Before(serverDeadline) {
		t.Fatalf("Lost closed at %v, %v after the server's session deadline", lostAt, lostAt.Sub(serverDeadline))
	}
	t.Logf("Lost closed %v before the server's deadline", serverDeadline.Sub(lostAt))
	if !errors.Is(l.Err(), client.ErrLeaseExpired) || !errors.Is(l.Err(), client.ErrSessionExpired) {
		t.Fatalf("Err = %v, want ErrLeaseExpired and ErrSessionExpired", l.Err())
	}
	if !isClosed(c.Done()) {
		t.Fatal("Done open after the session lease ran out")
	}
	endedAt := time.Time{}
	testutil.WaitFor(t, 3*time.Second, "server expires the session", func() bool { var ok bool; endedAt, ok = f.SessionEnded(sid); return ok })
	if !lostAt.Before(endedAt) {
		t.Fatalf("Lost at %v not before the server's expiry at %v", lostAt, endedAt)
	}
	f.Partition(false)
	testutil.WaitFor(t, 5*time.Second, "a new session after healing", func() bool { return c.SessionID() != sid && !isClosed(c.Done()) })
	if _, err := c.TryAcquire(t.Context(), "cut"); err != nil {
		t.Fatal(err)
	}
}

// A TTL lock not renewed is lost locally before the server's expiry. (A
// TTL of 1s gives a 50ms margin: a loaded machine has fired the lease
// timer 35ms late, more than the 15ms of a 300ms TTL.)
func TestLocalLeaseOfTTLLock(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{SessionTTL: 10 * time.Second})
	l, err := c.Acquire(t.Context(), "short", client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	serverExpiry := f.LockExpires("short")
	if serverExpiry.IsZero() {
		t.Fatal("no TTL on the fake")
	}
	waitClosed(t, l.Lost(), 2*time.Second, "Lost of an unrenewed TTL lock")
	if lostAt := time.Now(); !lostAt.Before(serverExpiry) {
		t.Fatalf("Lost %v after the server's expiry", lostAt.Sub(serverExpiry))
	}
	if !errors.Is(l.Err(), client.ErrLeaseExpired) {
		t.Fatalf("Err = %v", l.Err())
	}
	if isClosed(c.Done()) {
		t.Fatal("the session ended with the lock")
	}
}

func TestAutoRenew(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	l, err := c.Acquire(t.Context(), "renewed", client.WithTTL(300*time.Millisecond), client.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	first := f.LockExpires("renewed")
	testutil.WaitFor(t, 3*time.Second, "renewed well past the first TTL", func() bool {
		return f.LockExpires("renewed").After(first.Add(900 * time.Millisecond))
	})
	if isClosed(l.Lost()) {
		t.Fatalf("auto-renewed lock lost: %v", l.Err())
	}
	if !l.Deadline().After(time.Now()) {
		t.Fatal("local lease not moved by the renewals")
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestDoCancelsOnLoss(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	started := make(chan uint64, 1)
	res := make(chan error, 1)
	go func() {
		res <- c.Do(t.Context(), "do", func(ctx context.Context, token uint64) error {
			started <- token
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	var token uint64
	select {
	case token = <-started:
	case <-time.After(2 * time.Second):
		t.Fatal("fn not started")
	}
	if _, tok, _ := f.Holder("do"); tok != token {
		t.Fatalf("fn got token %d, server has %d", token, tok)
	}
	f.ExpireLock("do")
	select {
	case err := <-res:
		if !errors.Is(err, client.ErrLockExpired) {
			t.Fatalf("Do = %v, want the loss", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("fn's ctx not cancelled on loss")
	}
}

func TestDoReleases(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	ran := false
	if err := c.Do(t.Context(), "do2", func(ctx context.Context, token uint64) error { ran = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, held := f.Holder("do2"); held || !ran {
		t.Fatalf("ran=%v, still held=%v", ran, held)
	}
	boom := errors.New("boom")
	if err := c.Do(t.Context(), "do2", func(context.Context, uint64) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
}

func TestSentinelErrors(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	ctx := t.Context()
	la, err := a.Acquire(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ErrLockHeld", func(t *testing.T) {
		_, err := b.TryAcquire(ctx, "e")
		if !errors.Is(err, client.ErrLockHeld) {
			t.Fatalf("got %v", err)
		}
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeLockHeld {
			t.Fatalf("no api.Error lock_held in %v", err)
		}
	})
	t.Run("ErrWaitTimeout", func(t *testing.T) {
		start := time.Now()
		_, err := b.Acquire(ctx, "e", client.WithWaitTimeout(200*time.Millisecond))
		if !errors.Is(err, client.ErrWaitTimeout) {
			t.Fatalf("got %v", err)
		}
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Fatalf("gave up after %v", d)
		}
	})
	t.Run("ErrNotHolder", func(t *testing.T) {
		l, err := a.Acquire(ctx, "e2")
		if err != nil {
			t.Fatal(err)
		}
		f.DropGrant("e2")
		err = l.Renew(ctx, time.Second)
		if !errors.Is(err, client.ErrNotHolder) {
			t.Fatalf("renew: %v", err)
		}
		if !isClosed(l.Lost()) || !errors.Is(l.Err(), client.ErrNotHolder) {
			t.Fatalf("not_holder did not close Lost: %v", l.Err())
		}
	})
	t.Run("ErrSessionExpired", func(t *testing.T) {
		_, err := a.API().KeepAlive(ctx, "no-such-session")
		if !errors.Is(err, client.ErrSessionExpired) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("ErrNoLeader", func(t *testing.T) {
		f2 := newFake(t, lockdtest.Options{Members: 2})
		f2.SetLeader(-1)
		// The deadline must leave room for the members' first answers (a
		// loaded machine has taken over 300 ms), and must not fall where a
		// retry starts: the fake's no_leader says Retry-After: 1, and a
		// deadline that expires during a request, not during the wait
		// between requests, is a bare deadline without no_leader.
		cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		_, err := client.New(cctx, client.Config{Endpoints: f2.URLs()})
		if !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("New: %v", err)
		}
		api2, _ := client.NewAPI(client.APIConfig{Endpoints: f2.URLs()})
		hctx, hcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer hcancel()
		_, err = api2.Status(hctx, "x", false)
		if !errors.Is(err, client.ErrNoLeader) {
			t.Fatalf("Status: %v", err)
		}
	})
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

func TestCloseEndsSession(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	l, err := c.Acquire(t.Context(), "closing")
	if err != nil {
		t.Fatal(err)
	}
	sid := c.SessionID()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !isClosed(l.Lost()) || !errors.Is(l.Err(), client.ErrClosed) {
		t.Fatalf("Lost after Close: %v", l.Err())
	}
	if _, ok := f.SessionEnded(sid); !ok {
		t.Fatal("session still alive after Close")
	}
	if _, _, held := f.Holder("closing"); held {
		t.Fatal("lock still held after Close")
	}
	if _, err := c.Acquire(t.Context(), "closing"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// Goroutines of one client acquiring one lock take turns.
func TestSameClientTakesTurns(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	var mu sync.Mutex
	inside := 0
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.Do(t.Context(), "turns", func(ctx context.Context, _ uint64) error {
				mu.Lock()
				inside++
				n := inside
				mu.Unlock()
				defer func() { mu.Lock(); inside--; mu.Unlock() }()
				if n != 1 {
					return fmt.Errorf("%d holders at once", n)
				}
				time.Sleep(10 * time.Millisecond)
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A grant that comes after a long wait is refreshed, so the lock's local
// lease (counted from the request's send time) is not already spent.
func TestLateGrantOfTTLLockIsRefreshed(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	la, err := a.Acquire(t.Context(), "late")
	if err != nil {
		t.Fatal(err)
	}
	gb := acquireAsync(t, b, "late", client.WithTTL(400*time.Millisecond))
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("late"), []string{"b"}) })
	time.Sleep(300 * time.Millisecond) // let b's wait eat most of its TTL
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	lb := waitAcquired(t, gb, 2*time.Second)
	if left := time.Until(lb.Deadline()); left < 200*time.Millisecond {
		t.Fatalf("only %v of the lease left after the grant", left)
	}
}

func TestImplicitWaitFollowsCtx(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	if _, err := a.Acquire(t.Context(), "imp"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := b.Acquire(ctx, "imp")
	if !errors.Is(err, client.ErrWaitTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v", err)
	}
}

func TestFence(t *testing.T) {
	f := newFake(t, lockdtest.Options{Proofs: true})
	c := newClient(t, f, client.Config{})
	l, err := c.Acquire(t.Context(), "fenced")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPut, "http://store/v1/objects/k", nil)
	l.Fence(req)
	if req.Header.Get("Fencing-Token") != fmt.Sprint(l.Token()) || req.Header.Get("Fencing-Lock") != "fenced" || req.Header.Get("Fencing-Proof") != l.Proof() || l.Proof() == "" {
		t.Fatalf("headers %v, proof %q", req.Header, l.Proof())
	}
}

// A wait granted and lost while the client was cut off: after the
// reconnect, the re-sent acquire finds the lock with the next waiter, and
// the error says that an earlier send may have been granted (a history of
// grants must not count the attempt as refused).
func TestResentAcquireFindingLockHeldMayHaveBeenGranted(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	c := newClient(t, f, client.Config{ClientID: "c"})
	if _, err := a.Acquire(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	gb := acquireAsync(t, b, "m", client.WithWaitTimeout(2*time.Second))
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("m"), []string{"b"}) })
	gc := acquireAsync(t, c, "m")
	testutil.WaitFor(t, 2*time.Second, "c queued", func() bool { return equal(f.Waiters("m"), []string{"b", "c"}) })

	f.Partition(true)
	f.ExpireLock("m") // b is granted; the push is dropped
	if h, _, _ := f.Holder("m"); h != "b" {
		t.Fatalf("holder %q, want b", h)
	}
	f.ExpireLock("m") // b's grant ends unheard; c is granted
	// Drop the connections before healing, so the pushes queued while cut
	// off die with them.
	f.DropConnections()
	f.Partition(false)

	select {
	case r := <-gb:
		if !errors.Is(r.err, client.ErrMaybeGrantedLost) || !errors.Is(r.err, client.ErrWaitTimeout) {
			t.Fatalf("b's acquire: lock %v, err %v; want ErrMaybeGrantedLost and ErrWaitTimeout", r.l, r.err)
		}
	case <-time.After(6 * time.Second):
		t.Fatal("b's acquire not answered")
	}
	waitAcquired(t, gc, 5*time.Second)
}
