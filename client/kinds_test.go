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

// The lock kinds against the fake: shared mode, semaphores, AcquireMany,
// lock-delay, revocation and values. kinds_cluster_test.go runs the same
// against lockd itself.

type acquiredMany struct {
	ls  []*client.Lock
	err error
}

// acquireManyAsync runs AcquireMany in a goroutine the test waits for at
// cleanup.
func acquireManyAsync(t *testing.T, c *client.Client, names []string, opts ...client.AcquireOption) <-chan acquiredMany {
	ch := make(chan acquiredMany, 1)
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	go func() {
		defer close(done)
		defer cancel()
		ls, err := c.AcquireMany(ctx, names, opts...)
		ch <- acquiredMany{ls, err}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func waitAcquiredMany(t *testing.T, ch <-chan acquiredMany, within time.Duration) []*client.Lock {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("AcquireMany: %v", a.err)
		}
		return a.ls
	case <-time.After(within):
		t.Fatalf("no grant within %v", within)
	}
	return nil
}

func notYet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered early: %+v", what, r)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestSharedHoldersCoexistAndWritersDoNotStarve(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	r1 := newClient(t, f, client.Config{ClientID: "r1"})
	r2 := newClient(t, f, client.Config{ClientID: "r2"})
	w := newClient(t, f, client.Config{ClientID: "w"})
	r3 := newClient(t, f, client.Config{ClientID: "r3"})
	ctx := t.Context()

	l1, err := r1.Acquire(ctx, "rw", client.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	l2, err := r2.TryAcquire(ctx, "rw", client.WithShared())
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if l1.Mode() != api.ModeShared || l2.Mode() != api.ModeShared || l2.Token() <= l1.Token() {
		t.Fatalf("modes %s/%s tokens %d/%d", l1.Mode(), l2.Mode(), l1.Token(), l2.Token())
	}
	if st := f.Status("rw"); st.Mode != api.ModeShared || len(st.Holders) != 2 {
		t.Fatalf("status %+v", st)
	}
	if _, err := w.TryAcquire(ctx, "rw"); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("writer's try on a read-held lock: %v", err)
	}
	gw := acquireAsync(t, w, "rw")
	testutil.WaitFor(t, 2*time.Second, "w queued", func() bool { return equal(f.Waiters("rw"), []string{"w"}) })
	// A reader that comes after a waiting writer waits behind it.
	g3 := acquireAsync(t, r3, "rw", client.WithShared())
	testutil.WaitFor(t, 2*time.Second, "r3 queued", func() bool { return equal(f.Waiters("rw"), []string{"w", "r3"}) })
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	notYet(t, gw, "the writer's acquire while r2 reads")
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lw := waitAcquired(t, gw, 2*time.Second)
	if lw.Mode() != api.ModeExclusive {
		t.Fatalf("writer's mode %q", lw.Mode())
	}
	notYet(t, g3, "the reader's acquire while w writes")
	if err := lw.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitAcquired(t, g3, 2*time.Second)
}

func TestSemaphoreLimit(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	ctx := t.Context()
	var cs []*client.Client
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		cs = append(cs, newClient(t, f, client.Config{ClientID: id}))
	}
	l1, err := cs[0].Acquire(ctx, "sem", client.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].TryAcquire(ctx, "sem"); err != nil { // joins the lock's limit
		t.Fatalf("second permit: %v", err)
	}
	if _, err := cs[2].TryAcquire(ctx, "sem", client.WithLimit(2)); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("third permit of two: %v", err)
	}
	_, err = cs[3].TryAcquire(ctx, "sem", client.WithLimit(3))
	var se *client.ServerError
	if !errors.Is(err, client.ErrLimitMismatch) || !errors.As(err, &se) || se.API.Code != api.CodeLimitMismatch {
		t.Fatalf("another limit: %v, want ErrLimitMismatch", err)
	}
	if st := f.Status("sem"); st.Limit != 2 || len(st.Holders) != 2 || st.Mode != api.ModeExclusive {
		t.Fatalf("status %+v", st)
	}
	g3 := acquireAsync(t, cs[2], "sem", client.WithLimit(2))
	testutil.WaitFor(t, 2*time.Second, "s3 queued", func() bool { return equal(f.Waiters("sem"), []string{"s3"}) })
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l3 := waitAcquired(t, g3, 2*time.Second); l3.Token() <= l1.Token() {
		t.Fatalf("token %d", l3.Token())
	}
}

func TestOptionsCheckedBeforeSending(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{})
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"shared semaphore", func() error { _, err := c.Acquire(ctx, "x", client.WithShared(), client.WithLimit(2)); return err }},
		{"limit 0 given", func() error { _, err := c.Acquire(ctx, "x", client.WithLimit(-1)); return err }},
		{"limit too big", func() error { _, err := c.Acquire(ctx, "x", client.WithLimit(api.MaxLimit+1)); return err }},
		{"delay too long", func() error { _, err := c.Acquire(ctx, "x", client.WithLockDelay(2*time.Minute)); return err }},
		{"value too long", func() error {
			_, err := c.Acquire(ctx, "x", client.WithValue(strings.Repeat("v", api.MaxValueBytes+1)))
			return err
		}},
		{"value not UTF-8", func() error { _, err := c.Acquire(ctx, "x", client.WithValue("\xff")); return err }},
		{"many: twice", func() error { _, err := c.AcquireMany(ctx, []string{"a", "b", "a"}); return err }},
		{"many: none", func() error { _, err := c.AcquireMany(ctx, nil); return err }},
		{"many: empty", func() error { _, err := c.AcquireMany(ctx, []string{"a", ""}); return err }},
		{"many: semaphore", func() error { _, err := c.AcquireMany(ctx, []string{"a", "b"}, client.WithLimit(2)); return err }},
	} {
		if err := tc.call(); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if n := f.Requests(api.OpAcquire); n != 0 {
		t.Fatalf("%d acquires sent", n)
	}
}

// AcquireMany is all-or-nothing: a refused try takes nothing and names the
// blocking lock; a wait is granted whole; the grants come in name order.
func TestAcquireManyAllOrNothing(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	o := newClient(t, f, client.Config{ClientID: "o"})
	m := newClient(t, f, client.Config{ClientID: "m"})
	ctx := t.Context()
	lb, err := o.Acquire(ctx, "acct/b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.TryAcquireMany(ctx, []string{"acct/b", "acct/a"})
	var se *client.ServerError
	if !errors.Is(err, client.ErrLockHeld) || !errors.As(err, &se) || se.Lock != "acct/b" || se.Holder != "o" {
		t.Fatalf("TryAcquireMany = %v (%+v), want ErrLockHeld naming acct/b held by o", err, se)
	}
	if st := f.Status("acct/a"); st.Held || st.Waiters != 0 {
		t.Fatalf("acct/a after a refused multi try: %+v", st)
	}
	g := acquireManyAsync(t, m, []string{"acct/b", "acct/a"}, client.WithWaitTimeout(5*time.Second))
	testutil.WaitFor(t, 2*time.Second, "m queued on both", func() bool {
		return equal(f.Waiters("acct/a"), []string{"m"}) && equal(f.Waiters("acct/b"), []string{"m"})
	})
	if st := f.Status("acct/a"); st.Held {
		t.Fatalf("a waiting multi-acquire holds acct/a: %+v", st)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ls := waitAcquiredMany(t, g, 2*time.Second)
	if len(ls) != 2 || ls[0].Name() != "acct/a" || ls[1].Name() != "acct/b" || ls[0].Token() == ls[1].Token() {
		t.Fatalf("locks %v %v", ls[0].Name(), ls[1].Name())
	}
	for _, l := range ls {
		if h, tok, _ := f.Holder(l.Name()); h != "m" || tok != l.Token() {
			t.Fatalf("%s held by %s/%d", l.Name(), h, tok)
		}
	}
	// Each is released on its own; the other stays held.
	if err := ls[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if isClosed(ls[1].Lost()) {
		t.Fatalf("releasing one lock ended the other: %v", ls[1].Err())
	}
	if err := ls[1].Renew(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := ls[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Losing one lock of an AcquireMany closes Lost on all of them, with that
// cause, and the client releases the others.
func TestAcquireManySharesLost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lose  func(f *lockdtest.Cluster, c *client.Client)
		cause error
	}{
		{"expired", func(f *lockdtest.Cluster, _ *client.Client) { f.ExpireLock("x") }, client.ErrLockExpired},
		{"revoked", func(_ *lockdtest.Cluster, c *client.Client) {
			if _, err := c.Revoke(context.Background(), "x", 0); err != nil {
				panic(err)
			}
		}, client.ErrRevoked},
		{"session ended", func(f *lockdtest.Cluster, c *client.Client) { f.ExpireSession(c.SessionID()) }, client.ErrSessionExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, lockdtest.Options{})
			c := newClient(t, f, client.Config{ClientID: "m"})
			ls, err := c.AcquireMany(t.Context(), []string{"z", "x", "y"}, client.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			tc.lose(f, c)
			for _, l := range ls {
				waitClosed(t, l.Lost(), 2*time.Second, "Lost of "+l.Name())
				if !errors.Is(l.Err(), tc.cause) {
					t.Fatalf("%s: Err = %v, want %v", l.Name(), l.Err(), tc.cause)
				}
			}
			testutil.WaitFor(t, 2*time.Second, "the others released", func() bool {
				for _, n := range []string{"x", "y", "z"} {
					if _, _, held := f.Holder(n); held {
						return false
					}
				}
				return true
			})
		})
	}
}

// A multi-acquire waiting across a dropped connection is re-sent once
// and keeps its place; held multi-locks are re-checked on resume.
func TestAcquireManyAcrossReconnect(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	o := newClient(t, f, client.Config{ClientID: "o"})
	m := newClient(t, f, client.Config{ClientID: "m"})
	n := newClient(t, f, client.Config{ClientID: "n"})
	ctx := t.Context()
	lo, err := o.Acquire(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	gm := acquireManyAsync(t, m, []string{"p", "q"})
	testutil.WaitFor(t, 2*time.Second, "m queued", func() bool { return equal(f.Waiters("p"), []string{"m"}) })
	gn := acquireManyAsync(t, n, []string{"q", "p"})
	testutil.WaitFor(t, 2*time.Second, "n queued", func() bool { return equal(f.Waiters("q"), []string{"m", "n"}) })
	sent := f.Requests(api.OpAcquire)
	_, resumed := f.Hellos()
	f.DropConnections()
	testutil.WaitFor(t, 3*time.Second, "three resumes", func() bool { _, r := f.Hellos(); return r >= resumed+3 && f.Conns() == 3 })
	testutil.WaitFor(t, 2*time.Second, "two resends", func() bool { return f.Requests(api.OpAcquire) >= sent+2 })
	if got := f.Requests(api.OpAcquire); got != sent+2 {
		t.Fatalf("%d acquires re-sent, want one per waiting multi-acquire", got-sent)
	}
	if !equal(f.Waiters("p"), []string{"m", "n"}) || !equal(f.Waiters("q"), []string{"m", "n"}) {
		t.Fatalf("queues after resume: p %v q %v", f.Waiters("p"), f.Waiters("q"))
	}
	if err := lo.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ls := waitAcquiredMany(t, gm, 2*time.Second)
	notYet(t, gn, "n's AcquireMany while m holds both")

	// Lost while away: the "lost" push never arrives; the check after the
	// resume finds p gone, and q goes with it.
	f.Partition(true)
	f.DropGrant("p")
	f.DropConnections()
	f.Partition(false)
	for _, l := range ls {
		waitClosed(t, l.Lost(), 5*time.Second, "Lost of "+l.Name()+" after the resume check")
		if !errors.Is(l.Err(), client.ErrNotHolder) {
			t.Fatalf("%s: Err = %v", l.Name(), l.Err())
		}
	}
	waitAcquiredMany(t, gn, 5*time.Second)
}

// A given-up AcquireMany is withdrawn from every queue it waited in (one
// cancel naming all its locks); the next call with the same names queues
// anew, and a try of one of its names is free to go.
func TestAcquireManyWithdrawsAbandonedWait(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	o := newClient(t, f, client.Config{ClientID: "o"})
	m := newClient(t, f, client.Config{ClientID: "m"})
	ctx := t.Context()
	lo, err := o.Acquire(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = m.AcquireMany(actx, []string{"u", "v"}, client.WithWaitTimeout(time.Minute))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireMany = %v", err)
	}
	testutil.WaitFor(t, 2*time.Second, "withdrawn from both queues", func() bool {
		return len(f.Waiters("u")) == 0 && len(f.Waiters("v")) == 0
	})
	// The withdrawn wait's answer reaches the client a moment after the
	// server dropped it; then the name is free for this client again.
	var lv *client.Lock
	testutil.WaitFor(t, 2*time.Second, "a try of a name of the withdrawn multi-wait", func() bool {
		lv, err = m.TryAcquire(ctx, "v")
		if err != nil && !errors.Is(err, client.ErrHeldByThisClient) {
			t.Fatalf("TryAcquire of a name of a withdrawn multi-wait: %v", err)
		}
		return err == nil
	})
	if err := lv.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := acquireManyAsync(t, m, []string{"v", "u"})
	testutil.WaitFor(t, 2*time.Second, "queued again", func() bool { return equal(f.Waiters("u"), []string{"m"}) })
	if err := lo.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitAcquiredMany(t, g, 2*time.Second)
}

// A grant of a TTL multi-acquire after a long wait is confirmed by
// renewing each lock, so its local leases are not already spent.
func TestAcquireManyLateGrantIsRefreshed(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	o := newClient(t, f, client.Config{ClientID: "o"})
	m := newClient(t, f, client.Config{ClientID: "m"})
	lo, err := o.Acquire(t.Context(), "late2")
	if err != nil {
		t.Fatal(err)
	}
	g := acquireManyAsync(t, m, []string{"late1", "late2"}, client.WithTTL(400*time.Millisecond))
	testutil.WaitFor(t, 2*time.Second, "m queued", func() bool { return equal(f.Waiters("late2"), []string{"m"}) })
	renews := f.Requests(api.OpRenew)
	time.Sleep(300 * time.Millisecond)
	if err := lo.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	ls := waitAcquiredMany(t, g, 2*time.Second)
	for _, l := range ls {
		if left := time.Until(l.Deadline()); left < 200*time.Millisecond {
			t.Fatalf("%s: only %v of the lease left after the grant", l.Name(), left)
		}
	}
	if n := f.Requests(api.OpRenew) - renews; n < 2 {
		t.Fatalf("%d renews confirmed the leases, want one per lock", n)
	}
}

func TestRevoke(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	h := newClient(t, f, client.Config{ClientID: "h"})
	w := newClient(t, f, client.Config{ClientID: "w"})
	admin := newClient(t, f, client.Config{ClientID: "admin"})
	ctx := t.Context()
	l, err := h.Acquire(ctx, "rv")
	if err != nil {
		t.Fatal(err)
	}
	gw := acquireAsync(t, w, "rv")
	testutil.WaitFor(t, 2*time.Second, "w queued", func() bool { return equal(f.Waiters("rv"), []string{"w"}) })
	got, err := admin.Revoke(ctx, "rv", 0)
	if err != nil || len(got) != 1 || got[0] != l.Token() {
		t.Fatalf("Revoke = %v, %v; want [%d]", got, err, l.Token())
	}
	waitClosed(t, l.Lost(), 2*time.Second, "Lost after a revocation")
	if !errors.Is(l.Err(), client.ErrRevoked) || errors.Is(l.Err(), client.ErrLockExpired) {
		t.Fatalf("Err = %v, want ErrRevoked", l.Err())
	}
	lw := waitAcquired(t, gw, 2*time.Second)
	if err := l.Release(ctx); !errors.Is(err, client.ErrRevoked) {
		t.Fatalf("Release of a revoked lock = %v", err)
	}

	// One grant of a semaphore by token; a token no grant has.
	s1, err := h.Acquire(ctx, "rvs", client.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := w.Acquire(ctx, "rvs")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := admin.Revoke(ctx, "rvs", s1.Token()); err != nil || len(got) != 1 || got[0] != s1.Token() {
		t.Fatalf("Revoke by token = %v, %v", got, err)
	}
	waitClosed(t, s1.Lost(), 2*time.Second, "Lost of the revoked permit")
	if isClosed(s2.Lost()) {
		t.Fatalf("the other permit was lost too: %v", s2.Err())
	}
	if _, err := admin.Revoke(ctx, "rvs", s1.Token()); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("Revoke of a gone token = %v, want ErrNotHolder", err)
	}
	if got, err := admin.Revoke(ctx, "never-held", 0); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Revoke of a free lock = %v, %v; want []", got, err)
	}
	_ = lw
}

// A grant with a lock-delay that ends without a release keeps the lock
// from everyone until the delay has passed; a release applies none.
func TestLockDelay(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	h := newClient(t, f, client.Config{ClientID: "h"})
	w := newClient(t, f, client.Config{ClientID: "w"})
	ctx := t.Context()
	const delay = 400 * time.Millisecond
	if _, err := h.Acquire(ctx, "ld", client.WithLockDelay(delay), client.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	gw := acquireAsync(t, w, "ld")
	testutil.WaitFor(t, 2*time.Second, "w queued", func() bool { return equal(f.Waiters("ld"), []string{"w"}) })
	start := time.Now()
	f.ExpireLock("ld")
	if st := f.Status("ld"); st.Held || st.DelayedUntil == "" || st.Waiters != 1 {
		t.Fatalf("status during the delay: %+v", st)
	}
	waitAcquired(t, gw, 2*time.Second)
	if d := time.Since(start); d < delay-20*time.Millisecond {
		t.Fatalf("granted %v after the expiry, before the %v lock-delay", d, delay)
	}

	l, err := h.Acquire(ctx, "ld2", client.WithLockDelay(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryAcquire(ctx, "ld2"); err != nil {
		t.Fatalf("after a release: %v (no lock-delay applies)", err)
	}
}

func TestValues(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "h"})
	ctx := t.Context()
	l, err := c.Acquire(ctx, "val", client.WithValue("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if st := f.Status("val"); st.Value != "v1" || l.Value() != "v1" {
		t.Fatalf("status value %q, Lock.Value %q", st.Value, l.Value())
	}
	if err := l.SetValue(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if st := f.Status("val"); st.Value != "v2" || st.Holders[0].Value != "v2" || l.Value() != "v2" {
		t.Fatalf("after SetValue: %+v, Lock.Value %q", st, l.Value())
	}
	if err := l.SetValue(ctx, strings.Repeat("x", api.MaxValueBytes+1)); err == nil {
		t.Fatal("a value over 4 KiB was accepted")
	}
	if err := l.SetValue(ctx, strings.Repeat("x", api.MaxValueBytes)); err != nil {
		t.Fatalf("a value of 4 KiB: %v", err)
	}
	f.DropGrant("val")
	if err := l.SetValue(ctx, "v3"); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("SetValue of a lost lock = %v", err)
	}
	if !isClosed(l.Lost()) {
		t.Fatal("not_holder did not close Lost")
	}
}

func TestNewSentinels(t *testing.T) {
	for code, want := range map[string]error{
		api.CodeLimitMismatch:     client.ErrLimitMismatch,
		api.CodeResourceExhausted: client.ErrResourceExhausted,
	} {
		err := &client.ServerError{API: api.Error{Code: code}}
		if !errors.Is(err, want) {
			t.Errorf("%s does not match %v", code, want)
		}
	}
	err := &client.ServerError{API: api.Error{Code: api.CodeLockHeld, Message: "m"}, Lock: "b", Holder: "o"}
	if got := err.Error(); got != "lockd: lock_held: m (lock b held by o)" {
		t.Errorf("Error() = %q", got)
	}
}
