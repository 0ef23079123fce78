package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testutil"
)

// The lock kinds against lockd itself (one in-process member): shared
// holders coexist, a semaphore admits its limit, AcquireMany is
// all-or-nothing with a shared Lost, a revocation ends a lock with
// ErrRevoked, a lock-delay holds the next waiter back, SetValue shows in
// the status.
func TestKindsOnARealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	cfg := func(id string) client.Config {
		return client.Config{Endpoints: []string{url}, ClientID: id, SessionTTL: 10 * time.Second}
	}
	a := newClient(t, nil, cfg("a"))
	b := newClient(t, nil, cfg("b"))
	c := newClient(t, nil, cfg("c"))
	status := func(t *testing.T, name string) *api.LockStatus {
		t.Helper()
		st, err := a.API().Status(t.Context(), name, false)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	waiters := func(t *testing.T, name string, n int) {
		t.Helper()
		testutil.WaitFor(t, 5*time.Second, "waiters", func() bool { return status(t, name).Waiters == n })
	}

	t.Run("shared", func(t *testing.T) {
		ctx := t.Context()
		la, err := a.Acquire(ctx, "rw", client.WithShared())
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.TryAcquire(ctx, "rw", client.WithShared())
		if err != nil {
			t.Fatalf("a second reader: %v", err)
		}
		if la.Mode() != api.ModeShared || lb.Mode() != api.ModeShared {
			t.Fatalf("modes %q %q", la.Mode(), lb.Mode())
		}
		if st := status(t, "rw"); st.Mode != api.ModeShared || len(st.Holders) != 2 {
			t.Fatalf("status %+v", st)
		}
		if _, err := c.TryAcquire(ctx, "rw"); !errors.Is(err, client.ErrLockHeld) {
			t.Fatalf("a writer's try: %v", err)
		}
		gc := acquireAsync(t, c, "rw")
		waiters(t, "rw", 1)
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lc := waitAcquired(t, gc, 5*time.Second)
		if lc.Mode() != api.ModeExclusive {
			t.Fatalf("writer's mode %q", lc.Mode())
		}
		if err := lc.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("semaphore", func(t *testing.T) {
		ctx := t.Context()
		la, err := a.Acquire(ctx, "sem", client.WithLimit(2))
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.TryAcquire(ctx, "sem")
		if err != nil {
			t.Fatalf("second permit: %v", err)
		}
		if _, err := c.TryAcquire(ctx, "sem", client.WithLimit(2)); !errors.Is(err, client.ErrLockHeld) {
			t.Fatalf("third permit of two: %v", err)
		}
		if _, err := c.TryAcquire(ctx, "sem", client.WithLimit(3)); !errors.Is(err, client.ErrLimitMismatch) {
			t.Fatalf("another limit: %v, want ErrLimitMismatch", err)
		}
		if st := status(t, "sem"); st.Limit != 2 || len(st.Holders) != 2 {
			t.Fatalf("status %+v", st)
		}
		gc := acquireAsync(t, c, "sem")
		waiters(t, "sem", 1)
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lc := waitAcquired(t, gc, 5*time.Second)
		for _, l := range []*client.Lock{lb, lc} {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("AcquireMany", func(t *testing.T) {
		ctx := t.Context()
		lb, err := b.Acquire(ctx, "acct/b")
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.TryAcquireMany(ctx, []string{"acct/b", "acct/a"})
		var se *client.ServerError
		if !errors.Is(err, client.ErrLockHeld) || !errors.As(err, &se) || se.Lock != "acct/b" {
			t.Fatalf("TryAcquireMany = %v, want ErrLockHeld naming acct/b", err)
		}
		if st := status(t, "acct/a"); st.Held || st.Waiters != 0 {
			t.Fatalf("acct/a after a refused multi try: %+v", st)
		}
		g := acquireManyAsync(t, a, []string{"acct/b", "acct/a"}, client.WithTTL(time.Minute))
		waiters(t, "acct/b", 1)
		if st := status(t, "acct/a"); st.Held {
			t.Fatalf("a waiting multi-acquire holds acct/a: %+v", st)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		ls := waitAcquiredMany(t, g, 5*time.Second)
		if ls[0].Name() != "acct/a" || ls[1].Name() != "acct/b" {
			t.Fatalf("names %s %s", ls[0].Name(), ls[1].Name())
		}
		// Revoking one loses both; the other is released.
		if _, err := c.Revoke(ctx, "acct/a", 0); err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			waitClosed(t, l.Lost(), 5*time.Second, "Lost of "+l.Name())
			if !errors.Is(l.Err(), client.ErrRevoked) {
				t.Fatalf("%s: Err = %v, want ErrRevoked", l.Name(), l.Err())
			}
		}
		testutil.WaitFor(t, 5*time.Second, "acct/b released", func() bool { return !status(t, "acct/b").Held })
	})

	t.Run("revoke", func(t *testing.T) {
		ctx := t.Context()
		l, err := a.Acquire(ctx, "rv")
		if err != nil {
			t.Fatal(err)
		}
		gb := acquireAsync(t, b, "rv")
		waiters(t, "rv", 1)
		got, err := c.Revoke(ctx, "rv", 0)
		if err != nil || len(got) != 1 || got[0] != l.Token() {
			t.Fatalf("Revoke = %v, %v; want [%d]", got, err, l.Token())
		}
		waitClosed(t, l.Lost(), 5*time.Second, "Lost after a revocation")
		if !errors.Is(l.Err(), client.ErrRevoked) {
			t.Fatalf("Err = %v, want ErrRevoked", l.Err())
		}
		lb := waitAcquired(t, gb, 5*time.Second)
		if _, err := c.Revoke(ctx, "rv", lb.Token()+1000); !errors.Is(err, client.ErrNotHolder) {
			t.Fatalf("Revoke of a token nobody has = %v, want ErrNotHolder", err)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("lock-delay", func(t *testing.T) {
		ctx := t.Context()
		const delay = time.Second
		if _, err := a.Acquire(ctx, "ld", client.WithLockDelay(delay)); err != nil {
			t.Fatal(err)
		}
		gb := acquireAsync(t, b, "ld")
		waiters(t, "ld", 1)
		start := time.Now()
		if _, err := c.Revoke(ctx, "ld", 0); err != nil {
			t.Fatal(err)
		}
		if st := status(t, "ld"); st.DelayedUntil == "" && st.ClientID != "b" {
			t.Fatalf("status during the lock-delay: %+v", st)
		}
		lb := waitAcquired(t, gb, 5*time.Second)
		if d := time.Since(start); d < delay-100*time.Millisecond {
			t.Fatalf("granted %v after the revocation, before the %v lock-delay", d, delay)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.TryAcquire(ctx, "ld"); err != nil {
			t.Fatalf("after a release: %v (no lock-delay applies)", err)
		}
	})

	t.Run("values", func(t *testing.T) {
		ctx := t.Context()
		l, err := a.Acquire(ctx, "val", client.WithValue("v1"))
		if err != nil {
			t.Fatal(err)
		}
		if st := status(t, "val"); st.Value != "v1" {
			t.Fatalf("status %+v", st)
		}
		if err := l.SetValue(ctx, "v2"); err != nil {
			t.Fatal(err)
		}
		if st := status(t, "val"); st.Value != "v2" || len(st.Holders) != 1 || st.Holders[0].Value != "v2" || l.Value() != "v2" {
			t.Fatalf("after SetValue: %+v", st)
		}
		if err := a.API().SetValue(ctx, "val", "b", l.Token(), "v3"); !errors.Is(err, client.ErrNotHolder) {
			t.Fatalf("SetValue by another client = %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("resume", func(t *testing.T) {
		// After a reconnect the client checks every lock it holds, in
		// name order: r1 (of an AcquireMany) and zz were released behind
		// its back while it was cut off, so they are lost, and r2 with
		// r1; the semaphore permit rsem, held beside another client's, is
		// found among the holders and kept.
		ctx := t.Context()
		p, err := testutil.NewProxy("127.0.0.1:0", url[len("http://"):], 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		d := newClient(t, nil, client.Config{Endpoints: []string{"http://" + p.Addr()}, ClientID: "d", SessionTTL: 20 * time.Second})
		ls, err := d.AcquireMany(ctx, []string{"r1", "r2"})
		if err != nil {
			t.Fatal(err)
		}
		sem, err := d.Acquire(ctx, "rsem", client.WithLimit(3))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Acquire(ctx, "rsem"); err != nil {
			t.Fatal(err)
		}
		zz, err := d.Acquire(ctx, "zz")
		if err != nil {
			t.Fatal(err)
		}
		sid := d.SessionID()
		p.Cut()
		for _, l := range []*client.Lock{ls[0], zz} {
			if err := a.API().Release(ctx, l.Name(), "d", l.Token()); err != nil {
				t.Fatal(err)
			}
		}
		p.Heal()
		for _, l := range append(ls, zz) {
			waitClosed(t, l.Lost(), 15*time.Second, "Lost of "+l.Name()+" after the resume check")
			if !errors.Is(l.Err(), client.ErrNotHolder) {
				t.Fatalf("%s: Err = %v", l.Name(), l.Err())
			}
		}
		if d.SessionID() != sid {
			t.Fatal("the session was not resumed")
		}
		if isClosed(sem.Lost()) {
			t.Fatalf("the semaphore permit was lost: %v", sem.Err())
		}
		if err := sem.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
