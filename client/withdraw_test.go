package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// Issue 23, item 1 (SPEC 18): a wait whose caller gave up is withdrawn.

// TestAbandonedWaitIsWithdrawn: an Acquire, an AcquireMany and a Campaign
// whose ctx ends while they wait send a cancel: their waits leave the
// queue at once, and the lock goes to the next waiter, not to nobody.
// (Before, the wait stayed queued until its wait timeout, and a grant then
// sat with the session.)
func TestAbandonedWaitIsWithdrawn(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	c := newClient(t, f, client.Config{ClientID: "c"})
	ctx := t.Context()
	held := map[string]*client.Lock{}
	for _, n := range []string{"w", "m1", "m2", "e"} {
		l, err := a.Acquire(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		held[n] = l
	}
	giveUp := func(what string, call func(ctx context.Context) error, queues ...string) {
		t.Helper()
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- call(actx) }()
		testutil.WaitFor(t, 2*time.Second, what+" queued", func() bool {
			for _, q := range queues {
				if !equal(f.Waiters(q), []string{"b"}) {
					return false
				}
			}
			return true
		})
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: %v, want the ctx's error", what, err)
		}
		testutil.WaitFor(t, time.Second, what+" withdrawn", func() bool {
			for _, q := range queues {
				if len(f.Waiters(q)) != 0 {
					return false
				}
			}
			return true
		})
	}
	giveUp("Acquire", func(ctx context.Context) error {
		_, err := b.Acquire(ctx, "w", client.WithWaitTimeout(time.Minute))
		return err
	}, "w")
	giveUp("AcquireMany", func(ctx context.Context) error {
		_, err := b.AcquireMany(ctx, []string{"m2", "m1"})
		return err
	}, "m1", "m2")
	obs, err := client.NewElection(c, "e").Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	giveUp("Campaign", func(ctx context.Context) error {
		return client.NewElection(b, "e").Campaign(ctx, "b-value")
	}, "e")
	if n := f.Cancelled(); n != 3 {
		t.Fatalf("%d waits withdrawn by a cancel, want 3", n)
	}

	// The locks come free: nobody was left queued to get them.
	for n, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := f.Holder(n); ok {
			t.Fatalf("lock %s is held after its holder released it: %+v", n, f.Status(n))
		}
	}
	// The observer saw a lead, and never the candidate that gave up.
	deadline := time.After(300 * time.Millisecond)
	for {
		select {
		case li := <-obs:
			if li.ClientID == "b" {
				t.Fatalf("the withdrawn candidate led: %+v", li)
			}
			continue
		case <-deadline:
		}
		break
	}
}

// TestWithdrawAfterReconnect: the grant comes while the client is away,
// and the caller gives up meanwhile. The cancel goes out on the next
// connection, finds no wait (it was granted), and the client releases the
// grant it finds in the lock's status: the lock is not left to a session
// nobody uses it through.
func TestWithdrawAfterReconnect(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b", SessionTTL: 5 * time.Second})
	ctx := t.Context()
	if _, err := a.Acquire(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(actx, "r")
		done <- err
	}()
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("r"), []string{"b"}) })
	f.Partition(true)
	f.DropConnections()
	f.ExpireLock("r") // a's grant ends; b is granted while it is away
	if id, _, _ := f.Holder("r"); id != "b" {
		t.Fatalf("holder %q, want b", id)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v", err)
	}
	f.Partition(false)
	testutil.WaitFor(t, 5*time.Second, "b's unwanted grant released", func() bool { _, _, held := f.Holder("r"); return !held })
	if n := f.Requests(api.OpCancel); n == 0 {
		t.Fatal("no cancel was sent")
	}
	// The client goes on as usual.
	if _, err := b.TryAcquire(ctx, "r"); err != nil {
		t.Fatal(err)
	}
}

// TestCancelledByAnotherUserOfTheClientID: a cancel of this client's wait
// that this client did not send (another process with the same client ID,
// a person with lockctl or curl) ends the Acquire with ErrCancelled.
func TestCancelledByAnotherUserOfTheClientID(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	if _, err := a.Acquire(t.Context(), "x"); err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(t, b, "x", client.WithWaitTimeout(time.Minute))
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("x"), []string{"b"}) })
	ok, err := b.API().Cancel(t.Context(), "x", "b")
	if err != nil || !ok {
		t.Fatalf("Cancel = %v, %v", ok, err)
	}
	select {
	case r := <-got:
		if !errors.Is(r.err, client.ErrCancelled) {
			t.Fatalf("Acquire = %v, want ErrCancelled", r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the Acquire was not answered")
	}
	if ok, err := b.API().Cancel(t.Context(), "x", "b"); err != nil || ok {
		t.Fatalf("second Cancel = %v, %v, want false", ok, err)
	}
}

// TestAPIAcquireWithdrawsItsWait: an HTTP acquire whose ctx ends while it
// waits cancels its wait (POST .../cancel), and says whether it did.
func TestAPIAcquireWithdrawsItsWait(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newAPI(t, f.URL(0))
	ctx := t.Context()
	if _, err := a.Acquire(ctx, "h", "holder", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for _, multi := range []bool{false, true} {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		var err error
		if multi {
			_, err = a.AcquireMany(wctx, api.MultiAcquireRequest{ClientID: "w", Locks: []string{"h", "h2"}, WaitTimeoutMs: ptr(int64(60000))})
		} else {
			_, err = a.Acquire(wctx, "h", "w", time.Minute, time.Minute)
		}
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnknownOutcome) || !strings.Contains(err.Error(), "withdrawn") {
			t.Fatalf("multi=%v: %v, want the deadline and the wait withdrawn", multi, err)
		}
		if w := f.Waiters("h"); len(w) != 0 {
			t.Fatalf("multi=%v: waiters %v after the acquire gave up", multi, w)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestGrantRacingTheCancelIsReleased against lockd: a candidate gives up
// just as the lock is released to it; whichever comes first — the cancel
// or the grant — the lock ends up free or with the next candidate, never
// held by the client that gave up.
func TestGrantRacingTheCancelIsReleased(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	a := newClient(t, nil, client.Config{Endpoints: []string{url}, ClientID: "a"})
	b := newClient(t, nil, client.Config{Endpoints: []string{url}, ClientID: "b"})
	ctx := t.Context()
	for round := range 20 {
		name := "race-" + string(rune('a'+round))
		la, err := a.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() {
			l, err := b.Acquire(actx, name)
			if err == nil {
				err = l.Release(ctx) // it won: fine, give it back
			}
			got <- err
		}()
		testutil.WaitFor(t, 5*time.Second, "b queued", func() bool {
			st, err := a.API().Status(ctx, name, false)
			return err == nil && st.Waiters == 1
		})
		// Release and give up at about the same moment, staggered a little
		// differently each round.
		go func() {
			time.Sleep(time.Duration(round%5) * 300 * time.Microsecond)
			cancel()
		}()
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		<-got
		cancel()
		testutil.WaitFor(t, 5*time.Second, "the lock free", func() bool {
			st, err := a.API().Status(ctx, name, false)
			return err == nil && !st.Held && st.Waiters == 0
		})
	}
}

// TestAbandonedWaitOnARealCluster: against lockd, the waiter that gave up
// is gone from the status right away, and a new Acquire of the name waits
// as itself (its own options), not as the old wait.
func TestAbandonedWaitOnARealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	a := newClient(t, nil, client.Config{Endpoints: []string{url}, ClientID: "a"})
	b := newClient(t, nil, client.Config{Endpoints: []string{url}, ClientID: "b"})
	ctx := t.Context()
	la, err := a.Acquire(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = b.Acquire(actx, "w", client.WithTTL(time.Second), client.WithWaitTimeout(time.Minute))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first Acquire = %v, want the ctx's deadline", err)
	}
	testutil.WaitFor(t, time.Second, "the wait withdrawn", func() bool {
		st, err := a.API().Status(ctx, "w", false)
		return err == nil && st.Waiters == 0
	})
	gb := acquireAsync(t, b, "w") // no TTL: bound to the session
	testutil.WaitFor(t, 2*time.Second, "b queued again", func() bool {
		st, err := a.API().Status(ctx, "w", false)
		return err == nil && st.Waiters == 1
	})
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := waitAcquired(t, gb, 5*time.Second)
	st, err := a.API().Status(ctx, "w", false)
	if err != nil || st.ClientID != "b" || st.FencingToken != lb.Token() || st.ExpiresAt != "" || !lb.ExpiresAt().IsZero() {
		t.Fatalf("status %+v, %v: want b's grant bound to its session (no TTL)", st, err)
	}
}
