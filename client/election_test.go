package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// nextLeader waits for Observe's next leader.
func nextLeader(t *testing.T, ch <-chan client.LeaderInfo) client.LeaderInfo {
	t.Helper()
	select {
	case li, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		t.Logf("leader %+v", li)
		return li
	case <-time.After(10 * time.Second):
		t.Fatal("no leader observed within 10s")
	}
	return client.LeaderInfo{}
}

// campaignAsync runs Campaign in a goroutine the test waits for at
// cleanup.
func campaignAsync(t *testing.T, e *client.Election, value string) <-chan error {
	ch := make(chan error, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		ch <- e.Campaign(ctx, value)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

// Two candidates: the first leads until it resigns, the second is elected
// in that step; an observer sees each leader once, in token order, and the
// first leader's proclamation.
func TestElectionCampaignResignHandOver(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	ca := newClient(t, f, client.Config{ClientID: "a"})
	cb := newClient(t, f, client.Config{ClientID: "b"})
	co := newClient(t, f, client.Config{ClientID: "o"})
	ctx := t.Context()
	ea, eb, eo := client.NewElection(ca, "el"), client.NewElection(cb, "el"), client.NewElection(co, "el")

	if _, err := eo.Leader(ctx); !errors.Is(err, client.ErrElectionNoLeader) {
		t.Fatalf("Leader with none: %v", err)
	}
	if !isClosed(ea.Done()) || ea.Token() != 0 || !errors.Is(ea.Err(), client.ErrElectionNotLeader) {
		t.Fatal("a candidate never elected: Done must be closed, Token 0, Err ErrElectionNotLeader")
	}
	obs, err := eo.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ea.Campaign(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	if isClosed(ea.Done()) || ea.Err() != nil || ea.Token() == 0 {
		t.Fatalf("leader a: done %v err %v token %d", isClosed(ea.Done()), ea.Err(), ea.Token())
	}
	if li := nextLeader(t, obs); li.Value != "alpha" || li.ClientID != "a" || li.Token != ea.Token() {
		t.Fatalf("observed %+v, want alpha by a with token %d", li, ea.Token())
	}
	bres := campaignAsync(t, eb, "beta")
	testutil.WaitFor(t, 5*time.Second, "b to queue", func() bool { return equal(f.Waiters("el"), []string{"b"}) })
	if li, err := eo.Leader(ctx); err != nil || li.Value != "alpha" || li.Token != ea.Token() {
		t.Fatalf("Leader: %+v, %v", li, err)
	}
	if err := ea.Proclaim(ctx, "alpha-2"); err != nil {
		t.Fatal(err)
	}
	if li := nextLeader(t, obs); li.Value != "alpha-2" || li.Token != ea.Token() {
		t.Fatalf("observed %+v, want alpha's proclamation", li)
	}
	if err := eb.Proclaim(ctx, "nope"); !errors.Is(err, client.ErrElectionNotLeader) {
		t.Fatalf("Proclaim by a candidate: %v", err)
	}
	if err := ea.Campaign(ctx, "alpha-3"); err != nil { // while leading: a proclamation
		t.Fatal(err)
	}
	if li := nextLeader(t, obs); li.Value != "alpha-3" {
		t.Fatalf("observed %+v, want alpha-3", li)
	}

	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if !isClosed(ea.Done()) || !errors.Is(ea.Err(), client.ErrReleased) {
		t.Fatalf("after Resign: done %v err %v", isClosed(ea.Done()), ea.Err())
	}
	select {
	case err := <-bres:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b was not elected when a resigned")
	}
	li := nextLeader(t, obs)
	if li.Value != "beta" || li.ClientID != "b" || li.Token != eb.Token() || li.Token <= ea.Token() {
		t.Fatalf("observed %+v, want beta by b with token %d > %d", li, eb.Token(), ea.Token())
	}
	if err := ea.Proclaim(ctx, "again"); !errors.Is(err, client.ErrElectionNotLeader) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	if err := ea.Resign(ctx); err != nil {
		t.Fatalf("a second Resign: %v", err)
	}
	if v, _ := eo.Leader(ctx); v.Value != "beta" {
		t.Fatalf("Leader %+v, want beta", v)
	}
}

// A leader whose session ends loses the leadership: Done closes, Err says
// why; a Campaign whose ctx ends returns its error.
func TestElectionDoneOnLoss(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	ca := newClient(t, f, client.Config{ClientID: "a"})
	cb := newClient(t, f, client.Config{ClientID: "b"})
	ea, eb := client.NewElection(ca, "el"), client.NewElection(cb, "el")
	if err := ea.Campaign(t.Context(), "alpha"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := eb.Campaign(ctx, "beta"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign while another leads, ctx ends: %v", err)
	}
	done := ea.Done()
	f.ExpireSession(ca.SessionID())
	waitClosed(t, done, 5*time.Second, "Done after the session expired")
	if !errors.Is(ea.Err(), client.ErrSessionExpired) {
		t.Fatalf("Err %v, want ErrSessionExpired", ea.Err())
	}
	if err := ea.Resign(t.Context()); err != nil {
		t.Fatalf("Resign of a lost leadership: %v", err)
	}
}
