package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

func newAPI(t *testing.T, endpoints ...string) *client.API {
	t.Helper()
	a, err := client.NewAPI(client.APIConfig{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAPILocks(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 3})
	f.SetLeader(2)
	a := newAPI(t, f.URL(0)) // a follower: every write is redirected with its body
	ctx := t.Context()

	rep, err := a.Acquire(ctx, "jobs/nightly", "w1", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Acquired || rep.FencingToken == 0 || rep.ExpiresAt == "" || rep.Lock != "jobs/nightly" {
		t.Fatalf("acquire reply %+v", rep)
	}
	if a.Leader() != f.URL(2) {
		t.Fatalf("leader %q, want %q", a.Leader(), f.URL(2))
	}
	_, err = a.Acquire(ctx, "jobs/nightly", "w2", 0, 0)
	var se *client.ServerError
	if !errors.Is(err, client.ErrLockHeld) || !errors.As(err, &se) || se.Holder != "w1" || se.Status != 409 {
		t.Fatalf("second acquire: %v", err)
	}
	st, err := a.Status(ctx, "jobs/nightly", false)
	if err != nil || !st.Held || st.ClientID != "w1" || st.FencingToken != rep.FencingToken {
		t.Fatalf("status %+v, %v", st, err)
	}
	if _, err := a.Renew(ctx, "jobs/nightly", "w1", rep.FencingToken, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Renew(ctx, "jobs/nightly", "w2", rep.FencingToken, 0); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("renew by a stranger: %v", err)
	}
	list, err := a.List(ctx, "jobs/")
	if err != nil || len(list) != 1 || list[0].Lock != "jobs/nightly" {
		t.Fatalf("list %+v, %v", list, err)
	}
	if list, _ := a.List(ctx, "other"); len(list) != 0 {
		t.Fatalf("list other: %+v", list)
	}

	// A waiting acquire over HTTP is granted on release.
	got := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, "jobs/nightly", "w2", 0, 5*time.Second)
		got <- err
	}()
	testutil.WaitFor(t, 2*time.Second, "w2 queued", func() bool { return equal(f.Waiters("jobs/nightly"), []string{"w2"}) })
	if err := a.Release(ctx, "jobs/nightly", "w1", rep.FencingToken); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "jobs/nightly", "w1", rep.FencingToken); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("double release: %v", err)
	}
}

func TestAPISessionsAndCluster(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 2})
	a := newAPI(t, f.URLs()...)
	ctx := t.Context()
	s, err := a.CreateSession(ctx, "w", 5*time.Second)
	if err != nil || s.SessionID == "" || s.TTLms != 5000 {
		t.Fatalf("create %+v, %v", s, err)
	}
	if _, err := a.KeepAlive(ctx, s.SessionID); err != nil {
		t.Fatal(err)
	}
	rep, err := a.AcquireRequest(ctx, "sess-lock", api.AcquireRequest{ClientID: "w", SessionID: s.SessionID})
	if err != nil || rep.ExpiresAt != "" {
		t.Fatalf("session lock %+v, %v", rep, err)
	}
	if err := a.DeleteSession(ctx, s.SessionID); err != nil {
		t.Fatal(err)
	}
	if _, _, held := f.Holder("sess-lock"); held {
		t.Fatal("lock outlived its deleted session")
	}
	if err := a.DeleteSession(ctx, s.SessionID); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("second delete: %v", err)
	}

	cs, err := a.Cluster(ctx)
	if err != nil || cs.LeaderID != "node1" || len(cs.Members) != 2 {
		t.Fatalf("cluster %+v, %v", cs, err)
	}
	if err := a.AddMember(ctx, api.AddMemberRequest{ID: "node3", RaftAddr: "x:1", HTTPAddr: "x:2"}); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveMember(ctx, "node3"); err != nil {
		t.Fatal(err)
	}
	if err := a.TransferLeadership(ctx, "node2"); err != nil {
		t.Fatal(err)
	}
	if f.Leader() != 1 {
		t.Fatalf("leader %d after transfer", f.Leader())
	}
}

// A 503 no_leader is retried with backoff until a leader appears.
func TestAPIRetriesNoLeader(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 2})
	f.SetLeader(-1)
	a := newAPI(t, f.URLs()...)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, "later", "w", 0, 0)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("returned without a leader: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	f.SetLeader(1)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("not retried after the leader appeared")
	}
}

// TestAPIDeadlineDuringRetry: a call hears no_leader, retries, and its ctx
// ends while the retried request is in flight. A read still reports no
// leader; a write does not (its last request may have reached a leader).
func TestAPIDeadlineDuringRetry(t *testing.T) {
	var calls atomic.Int32
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%2 == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"no_leader","message":"no leader known"}}`)
			return
		}
		// The retry hangs past the caller's deadline. (The server need not
		// notice the caller hanging up, so the test ends it.)
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs first
	a := newAPI(t, srv.URL)

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := a.Status(ctx, "x", false)
	if !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("read: %v, want no leader", err)
	}

	ctx2, cancel2 := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel2()
	_, err = a.Acquire(ctx2, "x", "w", time.Second, 0)
	if err == nil || errors.Is(err, client.ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("write: %v, want a bare deadline (outcome unknown)", err)
	}
}

// A client's share of the member in use (429 resource_exhausted with
// Retry-After) is waited out and retried like overloaded; a quota's 429
// (no Retry-After) is not.
func TestAPIRetriesBudgetRefusals(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch n := calls.Add(1); {
		case strings.Contains(r.URL.Path, "quota"):
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"resource_exhausted","message":"quota max-locks (1) reached"}}`)
		case n == 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"resource_exhausted","message":"client c has 16 acquires in flight, its share"}}`)
		default:
			io.WriteString(w, `{"acquired":true,"lock":"x","client_id":"c","fencing_token":7,"expires_at":"2030-01-01T00:00:00.000Z"}`)
		}
	}))
	defer srv.Close()
	a := newAPI(t, srv.URL)
	start := time.Now()
	g, err := a.Acquire(context.Background(), "x", "c", time.Minute, 0)
	if err != nil || g.FencingToken != 7 || time.Since(start) < time.Second {
		t.Fatalf("through a budget refusal: %+v %v after %v", g, err, time.Since(start))
	}
	_, err = a.Acquire(context.Background(), "quota", "c", time.Minute, 0)
	if !errors.Is(err, client.ErrResourceExhausted) {
		t.Fatalf("a quota's refusal: %v", err)
	}
}
