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

// Issue 23, item 6: one Client, fair and fast on one hot lock.

// queueUp starts n goroutines that Acquire name one after another, each
// once the one before has queued in c (so their arrival order is known),
// then Release it; grants gets the index of each grant in the order they
// came, with its lock.
type granted struct {
	i int
	l *client.Lock
}

func queueUp(t *testing.T, c *client.Client, name string, n int, hold func(i int, l *client.Lock)) <-chan granted {
	t.Helper()
	grants := make(chan granted, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(t.Context(), name)
			if err != nil {
				t.Errorf("goroutine %d: %v", i, err)
				grants <- granted{i: i}
				return
			}
			grants <- granted{i, l}
			hold(i, l)
		}()
		testutil.WaitFor(t, 2*time.Second, fmt.Sprintf("goroutine %d queued", i), func() bool { return c.QueueLen(name) == i+1 })
	}
	t.Cleanup(wg.Wait)
	return grants
}

// TestOneClientServesItsGoroutinesInOrder: 32 goroutines of one Client
// waiting for one lock get it in the order they asked, each with a grant
// of its own (a new, higher token); each release hands the lock to the
// next in one step (a release with a hand-off); the lock that was handed
// on is released (Lost closes with ErrReleased). Before, they were woken
// all at once and raced for it, and each hand-over was a release and an
// acquire in series.
func TestOneClientServesItsGoroutinesInOrder(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "proc"})
	first, err := c.Acquire(t.Context(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	released := make(chan struct{}, n)
	grants := queueUp(t, c, "hot", n, func(i int, l *client.Lock) {
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("goroutine %d: release: %v", i, err)
		}
		released <- struct{}{}
	})
	if f.Requests(api.OpAcquire) != 1 {
		t.Fatalf("%d acquires reached the server while the lock was held: only the head of the Client's queue may wait there", f.Requests(api.OpAcquire))
	}
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(first.Err(), client.ErrReleased) {
		t.Fatalf("the first lock after handing on: Err %v", first.Err())
	}
	last := first.Token()
	for want := range n {
		var g granted
		select {
		case g = <-grants:
		case <-time.After(5 * time.Second):
			t.Fatalf("grant %d did not come", want)
		}
		if g.i != want {
			t.Fatalf("grant %d went to goroutine %d: not in arrival order", want, g.i)
		}
		if g.l.Token() <= last {
			t.Fatalf("goroutine %d got token %d after %d: every grant needs a new token", g.i, g.l.Token(), last)
		}
		last = g.l.Token()
	}
	for range n {
		<-released
	}
	if _, _, held := f.Holder("hot"); held {
		t.Fatal("held after the last release")
	}
	if h := f.Handoffs(); h != n {
		t.Fatalf("%d releases handed the lock on, want %d (every one with a goroutine of the Client next)", h, n)
	}
	if a := f.Requests(api.OpAcquire); a != 1 {
		t.Fatalf("%d plain acquires: every later grant should have come with a hand-off", a)
	}
}

// TestHandOffKeepsFIFOAcrossClients: a hand-off between two goroutines of
// one Client does not jump the server's queue: another client that waited
// there first is served first.
func TestHandOffKeepsFIFOAcrossClients(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a"})
	b := newClient(t, f, client.Config{ClientID: "b"})
	l1, err := a.Acquire(t.Context(), "q")
	if err != nil {
		t.Fatal(err)
	}
	gb := acquireAsync(t, b, "q")
	testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("q"), []string{"b"}) })
	g2 := acquireAsync(t, a, "q")
	testutil.WaitFor(t, 2*time.Second, "a's second goroutine queued in a", func() bool { return a.QueueLen("q") == 1 })
	if err := l1.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	lb := waitAcquired(t, gb, 2*time.Second)
	if f.Handoffs() != 1 || !equal(f.Waiters("q"), []string{"a"}) {
		t.Fatalf("hand-offs %d, waiters %v: want the hand-off queued behind b", f.Handoffs(), f.Waiters("q"))
	}
	select {
	case r := <-g2:
		t.Fatalf("a's second goroutine got the lock while b holds it: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	if err := lb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	l2 := waitAcquired(t, g2, 2*time.Second)
	if l2.Token() <= lb.Token() || lb.Token() <= l1.Token() {
		t.Fatalf("tokens %d, %d, %d: want rising", l1.Token(), lb.Token(), l2.Token())
	}
}

// TestQueuedCallerThatGivesUpLeavesTheQueue: a goroutine whose ctx ends
// while it waits in the Client's own queue leaves it (nothing was sent for
// it); the ones behind it keep their order.
func TestQueuedCallerThatGivesUpLeavesTheQueue(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	l, err := c.Acquire(t.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "g")
		gaveUp <- err
	}()
	testutil.WaitFor(t, 2*time.Second, "queued", func() bool { return c.QueueLen("g") == 1 })
	next := acquireAsync(t, c, "g")
	testutil.WaitFor(t, 2*time.Second, "queued behind", func() bool { return c.QueueLen("g") == 2 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that gave up: %v", err)
	}
	if n := c.QueueLen("g"); n != 1 {
		t.Fatalf("queue length %d after a caller left, want 1", n)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	l2 := waitAcquired(t, next, 2*time.Second)
	if err := l2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f.Requests(api.OpCancel) != 0 {
		t.Fatal("a cancel was sent for a call that never reached the server")
	}

	// A TryAcquire while another call is queued says so at once.
	l3, err := c.Acquire(t.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	queued := acquireAsync(t, c, "g")
	testutil.WaitFor(t, 2*time.Second, "queued", func() bool { return c.QueueLen("g") == 1 })
	if _, err := c.TryAcquire(t.Context(), "g"); !errors.Is(err, client.ErrHeldByThisClient) {
		t.Fatalf("TryAcquire: %v", err)
	}
	_ = l3.Release(t.Context())
	_ = waitAcquired(t, queued, 2*time.Second).Release(t.Context())
}

// TestHandOffToAGoroutineThatGaveUp: the goroutine the lock is handed to
// gives up right away; its hand-off acquire is withdrawn (or its grant
// released), and the lock does not stay with the Client.
func TestHandOffToAGoroutineThatGaveUp(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	other := newClient(t, f, client.Config{ClientID: "o"})
	for range 10 {
		l, err := c.Acquire(t.Context(), "h")
		if err != nil {
			t.Fatal(err)
		}
		ho, err := other.Acquire(t.Context(), "o") // keeps the fake busy elsewhere
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			l2, err := c.Acquire(ctx, "h")
			if err == nil {
				err = l2.Release(t.Context())
			}
			done <- err
		}()
		testutil.WaitFor(t, 2*time.Second, "queued", func() bool { return c.QueueLen("h") == 1 })
		go cancel()
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		<-done
		testutil.WaitFor(t, 2*time.Second, "h free", func() bool { _, _, held := f.Holder("h"); return !held && len(f.Waiters("h")) == 0 })
		_ = ho.Release(t.Context())
	}
}

// TestOverloadedIsRetried (SPEC 15): an overloaded refusal is backed off
// and retried, as no_leader is — over the WebSocket (acquire, release,
// renew, keepalive) and over HTTP.
func TestOverloadedIsRetried(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	f.Overload(api.OpAcquire, 3)
	l, err := c.Acquire(ctx, "o", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("Acquire through 3 overloaded refusals: %v", err)
	}
	f.Overload(api.OpRenew, 2)
	if err := l.Renew(ctx, 0); err != nil {
		t.Fatalf("Renew through 2 overloaded refusals: %v", err)
	}
	f.Overload(api.OpKeepalive, 2)
	testutil.WaitFor(t, 3*time.Second, "two keepalives refused", func() bool { return f.Overloaded() == 7 })
	if err := l.Renew(ctx, 0); err != nil || l.Err() != nil || isClosed(c.Done()) {
		t.Fatalf("after refused keepalives: renew %v, lock %v, session %v", err, l.Err(), c.Err())
	}
	f.Overload(api.OpRelease, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release through 2 overloaded refusals: %v", err)
	}
	a := newAPI(t, f.URL(0))
	f.Overload(api.OpAcquire, 2)
	start := time.Now()
	if _, err := a.Acquire(ctx, "o", "h", time.Minute, 0); err != nil {
		t.Fatalf("HTTP acquire through 2 overloaded refusals: %v", err)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("retried after %v: the member's Retry-After (1s) was not waited", d)
	}
	if n := f.Overloaded(); n != 11 {
		t.Fatalf("%d refusals, want 11", n)
	}
	// An overloaded cluster that does not recover: the ctx ends the call,
	// and the error says what it waited for.
	f.Overload(api.OpAcquire, 1000)
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	if _, err := c.Acquire(sctx, "o2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire against a member that stays overloaded: %v", err)
	}
	sctx2, scancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel2()
	if _, err := a.Acquire(sctx2, "o2", "h", time.Minute, 0); !errors.Is(err, client.ErrOverloaded) {
		t.Fatalf("HTTP acquire against a member that stays overloaded: %v", err)
	}
	f.Overload(api.OpAcquire, 0)
}

// TestBudgetRefusalIsRetried (SPEC 15): a client over its share of the
// member is refused for now — 429 resource_exhausted with a retry delay —
// and backs off and retries as on overloaded, over the WebSocket (acquire,
// renew, release) and over HTTP, waiting the delay the member gives.
func TestBudgetRefusalIsRetried(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	f.ExhaustBudget(api.OpAcquire, 3)
	start := time.Now()
	l, err := c.Acquire(ctx, "b", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("Acquire through 3 budget refusals: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("granted after %v: the member's retry_after_ms (100) was not waited out three times", d)
	}
	f.ExhaustBudget(api.OpRenew, 2)
	if err := l.Renew(ctx, 0); err != nil {
		t.Fatalf("Renew through 2 budget refusals: %v", err)
	}
	f.ExhaustBudget(api.OpRelease, 2)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release through 2 budget refusals: %v", err)
	}
	if n := f.Overloaded(); n != 7 {
		t.Fatalf("%d refusals, want 7", n)
	}
	a := newAPI(t, f.URL(0))
	f.ExhaustBudget(api.OpAcquire, 1)
	start = time.Now()
	if _, err := a.Acquire(ctx, "b", "h", time.Minute, 0); err != nil {
		t.Fatalf("HTTP acquire through a budget refusal: %v", err)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("retried after %v: the member's Retry-After (1s) was not waited", d)
	}
	// A budget that stays exhausted: the ctx ends the call (the WebSocket
	// acquire), or the refusal does once ctx is spent (HTTP).
	f.ExhaustBudget(api.OpAcquire, 1000)
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	if _, err := c.Acquire(sctx, "b2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire over a budget that stays exhausted: %v", err)
	}
	sctx2, scancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel2()
	if _, err := a.Acquire(sctx2, "b2", "h", time.Minute, 0); !errors.Is(err, client.ErrResourceExhausted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("HTTP acquire over a budget that stays exhausted: %v", err)
	}
	f.ExhaustBudget(api.OpAcquire, 0)
}

// TestRenewKeepsTheFreshProof (issue 21, item 6): a renew brings a proof
// signed for the new expiry; Proof and Fence use it from then on, for
// Renew and for auto-renew alike.
func TestRenewKeepsTheFreshProof(t *testing.T) {
	f := newFake(t, lockdtest.Options{Proofs: true})
	c := newClient(t, f, client.Config{ClientID: "c"})
	l, err := c.Acquire(t.Context(), "p", client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := l.Proof()
	if first == "" {
		t.Fatal("no proof with the grant")
	}
	if err := l.Renew(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if p := l.Proof(); p == first || p != fmt.Sprintf("proof:p:%d:r1", l.Token()) {
		t.Fatalf("proof after a renew %q (grant's %q): want the renewal's", p, first)
	}
	req, _ := http.NewRequest(http.MethodPut, "http://x/", nil)
	l.Fence(req)
	if got := req.Header.Get(client.HeaderFencingProof); got != l.Proof() {
		t.Fatalf("Fence sent proof %q, want %q", got, l.Proof())
	}
	la, err := c.Acquire(t.Context(), "pa", client.WithTTL(300*time.Millisecond), client.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 3*time.Second, "an auto-renew's proof", func() bool {
		return la.Proof() == fmt.Sprintf("proof:pa:%d:r2", la.Token())
	})
}

// TestWaitTimeoutCountsInTheClientsQueue: WithWaitTimeout bounds the whole
// wait, the time spent behind this Client's own holder included.
func TestWaitTimeoutCountsInTheClientsQueue(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	l, err := c.Acquire(t.Context(), "wt")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	start := time.Now()
	_, err = c.Acquire(t.Context(), "wt", client.WithWaitTimeout(200*time.Millisecond))
	if !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("Acquire behind this client's own holder: %v", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > time.Second {
		t.Fatalf("gave up after %v, want about 200ms", d)
	}
	if n := c.QueueLen("wt"); n != 0 {
		t.Fatalf("queue length %d after it timed out", n)
	}
}

// TestHandOffRefusedFallsBack: a release with a hand-off that the member
// refuses before proposing anything (overloaded here; a member that takes
// no hand-off says invalid_argument) is sent again as a plain release, and
// the acquire it carried as a plain acquire once that is settled: the next
// goroutine still gets the lock, with a new token.
func TestHandOffRefusedFallsBack(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "c"})
	l, err := c.Acquire(t.Context(), "fb")
	if err != nil {
		t.Fatal(err)
	}
	next := acquireAsync(t, c, "fb")
	testutil.WaitFor(t, 2*time.Second, "queued", func() bool { return c.QueueLen("fb") == 1 })
	f.Overload(api.OpRelease, 1)
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l2 := waitAcquired(t, next, 3*time.Second)
	if l2.Token() <= l.Token() || f.Overloaded() != 1 || f.Handoffs() != 0 {
		t.Fatalf("token %d after %d, %d refused, %d hand-offs", l2.Token(), l.Token(), f.Overloaded(), f.Handoffs())
	}
}
