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

// A Release whose answer never comes may have released the lock: Lost
// closes (Err says the outcome is unknown), and a later Acquire of the
// same name does not wait for a lock the client no longer tracks.
func TestReleaseWithUnknownOutcomeEndsTheLock(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "a"})
	l, err := c.Acquire(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	f.DropReplies(api.OpRelease, true)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	err = l.Release(ctx)
	cancel()
	if !errors.Is(err, client.ErrUnknownOutcome) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release = %v, want ErrUnknownOutcome and the ctx's deadline", err)
	}
	if _, _, held := f.Holder("r"); held {
		t.Fatal("the fake did not apply the release: the test proves nothing")
	}
	if !isClosed(l.Lost()) {
		t.Fatal("Lost open after a Release of unknown outcome")
	}
	if !errors.Is(l.Err(), client.ErrUnknownOutcome) {
		t.Fatalf("Err = %v, want ErrUnknownOutcome", l.Err())
	}
	f.DropReplies(api.OpRelease, false)

	actx, acancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer acancel()
	l2, err := c.Acquire(actx, "r")
	if err != nil {
		t.Fatalf("a later Acquire of the name: %v", err)
	}
	if holder, tok, ok := f.Holder("r"); !ok || holder != "a" || tok != l2.Token() {
		t.Fatalf("server holder %s/%d (held %v), want a/%d", holder, tok, ok, l2.Token())
	}
	if isClosed(l2.Lost()) {
		t.Fatalf("new lock lost: %v", l2.Err())
	}
}

// The background release of a lock whose Release had no answer must not
// end a later grant of the same name: the server answers the later Acquire
// with the same grant (same token) while that release may still be on its
// way, so the Acquire waits for it.
func TestBackgroundReleaseDoesNotEndALaterGrant(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "a", SessionTTL: 10 * time.Second})
	l, err := c.Acquire(t.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	f.Partition(true) // the release and its first retry are lost on the way
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	err = l.Release(ctx)
	cancel()
	if !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("Release = %v, want ErrUnknownOutcome", err)
	}
	testutil.WaitFor(t, 2*time.Second, "the background release lost too", func() bool { return f.LostRequests(api.OpRelease) >= 2 })
	f.Partition(false)
	actx, acancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer acancel()
	l2, err := c.Acquire(actx, "g")
	if err != nil {
		t.Fatal(err)
	}
	// After a reconnect, a release still pending would be re-sent.
	_, resumed := f.Hellos()
	f.DropConnections()
	testutil.WaitFor(t, 3*time.Second, "the session resumed", func() bool { _, r := f.Hellos(); return r > resumed })
	if err := l2.Renew(t.Context(), time.Minute); err != nil {
		t.Fatalf("the later grant was ended under its caller: Renew = %v", err)
	}
	if holder, tok, ok := f.Holder("g"); !ok || holder != "a" || tok != l2.Token() {
		t.Fatalf("server holder %s/%d (held %v), want a/%d", holder, tok, ok, l2.Token())
	}
}

// On every resume the client asks the leader whether it still holds each
// lock it believes it holds, and closes Lost of those it does not: the
// "lost" push, or the release, may have gone by while it was away.
func TestResumeRechecksHeldLocks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(f *lockdtest.Cluster)
	}{
		{"same leader", func(f *lockdtest.Cluster) { f.DropConnections() }},
		{"new leader", func(f *lockdtest.Cluster) { f.SetLeader(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, lockdtest.Options{Members: 2})
			a := newClient(t, f, client.Config{ClientID: "a"})
			b := newClient(t, f, client.Config{ClientID: "b"})
			ctx := t.Context()
			// Checked in name order: "kept" comes between the two others.
			freed, err := a.Acquire(ctx, "freed")
			if err != nil {
				t.Fatal(err)
			}
			kept, err := a.Acquire(ctx, "kept", client.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			taken, err := a.Acquire(ctx, "taken")
			if err != nil {
				t.Fatal(err)
			}
			gb := acquireAsync(t, b, "taken")
			testutil.WaitFor(t, 2*time.Second, "b queued", func() bool { return equal(f.Waiters("taken"), []string{"b"}) })
			f.DropGrant("freed") // freed, a not told
			f.DropGrant("taken") // handed to b, a not told
			waitAcquired(t, gb, 2*time.Second)
			if isClosed(freed.Lost()) || isClosed(taken.Lost()) {
				t.Fatal("the fake told the holder: the test proves nothing")
			}

			tc.fault(f)
			waitClosed(t, freed.Lost(), 5*time.Second, "Lost of a lock freed while away")
			waitClosed(t, taken.Lost(), 5*time.Second, "Lost of a lock taken over while away")
			for _, l := range []*client.Lock{freed, taken} {
				if !errors.Is(l.Err(), client.ErrNotHolder) {
					t.Fatalf("%s: Err = %v, want ErrNotHolder", l.Name(), l.Err())
				}
			}
			if isClosed(kept.Lost()) {
				t.Fatalf("a lock still held was declared lost: %v", kept.Err())
			}
			if err := kept.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The resume check also takes an earlier expiry the server reports (a
// renew whose answer never reached the client cut the TTL): the local
// lease moves earlier by as much, so Lost still closes first.
func TestResumeRecheckTakesAnEarlierExpiry(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "a", SessionTTL: 10 * time.Second})
	l, err := c.Acquire(t.Context(), "e", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Same client ID and token: to the server this is the client's own
	// renew, whose answer the client never saw.
	if _, err := c.API().Renew(t.Context(), "e", "a", l.Token(), 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	serverExpiry := f.LockExpires("e")
	f.DropConnections()
	waitClosed(t, l.Lost(), 5*time.Second, "Lost of a lock whose TTL the server cut")
	if lostAt := time.Now(); !lostAt.Before(serverExpiry) {
		t.Fatalf("Lost closed %v after the server's expiry (%v)", lostAt.Sub(serverExpiry), l.Err())
	}
	if !errors.Is(l.Err(), client.ErrLeaseExpired) {
		t.Fatalf("Err = %v, want ErrLeaseExpired", l.Err())
	}
}

// A lock held with the session only, which the resume check finds with a
// TTL this client never set (another client with the same ID renewed it),
// has a lease nothing tells the end of: it is lost.
func TestResumeRecheckLosesALockWithAnUnknownTTL(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "a", SessionTTL: 10 * time.Second})
	l, err := c.Acquire(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.API().Renew(t.Context(), "s", "a", l.Token(), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	serverExpiry := f.LockExpires("s")
	f.DropConnections()
	waitClosed(t, l.Lost(), 5*time.Second, "Lost of a session lock the server gave a TTL")
	if lostAt := time.Now(); !lostAt.Before(serverExpiry) {
		t.Fatalf("Lost closed %v after the server's expiry (%v)", lostAt.Sub(serverExpiry), l.Err())
	}
	if !errors.Is(l.Err(), client.ErrLeaseExpired) {
		t.Fatalf("Err = %v, want ErrLeaseExpired", l.Err())
	}
}

// A Renew whose answer never comes may have cut the TTL: the local lease
// must count with the shorter one.
func TestUnconfirmedRenewShortensLease(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{SessionTTL: 10 * time.Second})
	l, err := c.Acquire(t.Context(), "u", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	f.DropReplies(api.OpRenew, true)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	err = l.Renew(ctx, time.Second)
	cancel()
	if err == nil {
		t.Fatal("Renew without an answer returned nil")
	}
	serverExpiry := f.LockExpires("u")
	if serverExpiry.IsZero() || time.Until(serverExpiry) > 2*time.Second {
		t.Fatalf("the fake did not apply the renew (expiry in %v): the test proves nothing", time.Until(serverExpiry))
	}
	waitClosed(t, l.Lost(), 3*time.Second, "Lost after an unconfirmed shorter renew")
	if lostAt := time.Now(); !lostAt.Before(serverExpiry) {
		t.Fatalf("Lost closed %v after the server's expiry (%v)", lostAt.Sub(serverExpiry), l.Err())
	}
	if !errors.Is(l.Err(), client.ErrLeaseExpired) {
		t.Fatalf("Err = %v, want ErrLeaseExpired", l.Err())
	}
}

// The default margin grows with the TTL: clocks drift apart at a rate, so a
// fixed margin is not enough for a long lease.
func TestLeaseMarginCoversClockDrift(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{SessionTTL: time.Hour})
	ttl := 30 * time.Minute
	start := time.Now()
	l, err := c.Acquire(t.Context(), "long", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if got, limit := l.Deadline().Sub(start), ttl-ttl/1000; got > limit {
		t.Fatalf("local lease of a %v TTL ends %v after the acquire was sent, want at most %v", ttl, got, limit)
	}
}

// Two Clients of one process with default client IDs are two clients to
// the server: the second's acquire of a lock the first holds is refused,
// not a re-grant of the first's lock.
func TestDefaultClientIDsAreUnique(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{})
	b := newClient(t, f, client.Config{})
	if a.ClientID() == b.ClientID() {
		t.Fatalf("both clients have ID %q", a.ClientID())
	}
	for _, c := range []*client.Client{a, b} {
		if !strings.HasPrefix(c.ClientID(), client.DefaultClientID()+":") || len(c.ClientID()) > api.MaxClientID {
			t.Fatalf("client ID %q: want %q, a suffix, at most %d bytes", c.ClientID(), client.DefaultClientID()+":", api.MaxClientID)
		}
	}
	la, err := a.Acquire(t.Context(), "one")
	if err != nil {
		t.Fatal(err)
	}
	if lb, err := b.TryAcquire(t.Context(), "one"); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("b.TryAcquire of a's lock = %v, %v; want ErrLockHeld", lb, err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// The resume check against lockd itself, whose lock status shows no session
// ids: a lock released while the client was cut off (here by a release with
// its client ID and token, as an unanswered one of its own would be) is
// lost once the session resumes; a lock still held is kept.
func TestResumeRecheckOnARealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	p, err := testutil.NewProxy("127.0.0.1:0", strings.TrimPrefix(url, "http://"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := newClient(t, nil, client.Config{Endpoints: []string{"http://" + p.Addr()}, ClientID: "a", SessionTTL: 20 * time.Second})
	direct, err := client.NewAPI(client.APIConfig{Endpoints: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Checked in name order: the kept lock first.
	kept, err := c.Acquire(ctx, "a-kept", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	freed, err := c.Acquire(ctx, "b-freed")
	if err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if err := direct.Release(ctx, "b-freed", "a", freed.Token()); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	waitClosed(t, freed.Lost(), 10*time.Second, "Lost of a lock released while cut off")
	if !errors.Is(freed.Err(), client.ErrNotHolder) {
		t.Fatalf("Err = %v, want ErrNotHolder", freed.Err())
	}
	if isClosed(kept.Lost()) {
		t.Fatalf("a lock still held was declared lost: %v", kept.Err())
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
