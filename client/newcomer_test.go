package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// The rough edges a newcomer meets first: a dead endpoint, an http:// URL
// of an HTTPS member, a try of a lock the client holds, a stale read.

// TestNewDialTimeout: New with context.Background() against a member
// that never answers gives up after DialTimeout with ErrNoLeader, wrapping
// the last cause, and says how long it tried.
func TestNewDialTimeout(t *testing.T) {
	if client.DefaultDialTimeout != 10*time.Second {
		t.Fatalf("DefaultDialTimeout %v, documented as 10s", client.DefaultDialTimeout)
	}
	start := time.Now()
	c, err := client.New(context.Background(), client.Config{Endpoints: []string{"http://" + testutil.BlackholeAddr(t)},
		DialTimeout: 300 * time.Millisecond, AttemptTimeout: 100 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("New succeeded against a member that never answers")
	}
	t.Logf("New after %v: %v", took, err)
	if !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("error %v: want ErrNoLeader wrapping the attempt's timeout", err)
	}
	if !strings.Contains(err.Error(), "within 300ms") {
		t.Fatalf("error %q does not say how long it tried", err)
	}
	if took > 5*time.Second {
		t.Fatalf("New took %v with DialTimeout 300ms", took)
	}

	// The caller's ctx, when shorter, is what ends it.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = client.New(ctx, client.Config{Endpoints: []string{"http://" + testutil.BlackholeAddr(t)}, AttemptTimeout: 100 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "DialTimeout") {
		t.Fatalf("New with a 200ms ctx: %v", err)
	}
}

// TestNewFailsFastWhenEveryEndpointRefuses (issue 23, item 3): when every
// endpoint refuses the connection, New says so at once — it does not wait
// out DialTimeout (10 s by default) for something that cannot change —
// and the API's calls do too, as long as no member ever answered. One
// endpoint that may answer (here one that never does, within its
// attempt) keeps it retrying.
func TestNewFailsFastWhenEveryEndpointRefuses(t *testing.T) {
	dead1, dead2 := "http://"+testutil.DeadAddr(t), "http://"+testutil.DeadAddr(t)
	start := time.Now()
	c, err := client.New(context.Background(), client.Config{Endpoints: []string{dead1, dead2}})
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("New succeeded against dead endpoints")
	}
	t.Logf("New after %v: %v", took, err)
	if !errors.Is(err, client.ErrUnreachable) || !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v: want ErrUnreachable and ErrNoLeader wrapping the refused connections", err)
	}
	if !strings.Contains(err.Error(), strings.TrimPrefix(dead1, "http://")) || !strings.Contains(err.Error(), strings.TrimPrefix(dead2, "http://")) {
		t.Fatalf("error %q does not name each endpoint", err)
	}
	if took > time.Second {
		t.Fatalf("New took %v against endpoints that refuse: want at once", took)
	}

	a := newAPI(t, dead1)
	start = time.Now()
	_, err = a.Acquire(t.Context(), "x", "me", time.Minute, 5*time.Second)
	if !errors.Is(err, client.ErrUnreachable) || time.Since(start) > time.Second {
		t.Fatalf("API.Acquire against a refusing endpoint: %v after %v", err, time.Since(start))
	}

	// A member that might still answer: retried until the deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
	defer cancel()
	_, err = client.New(ctx, client.Config{Endpoints: []string{dead1, "http://" + testutil.BlackholeAddr(t)}, AttemptTimeout: 100 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if errors.Is(err, client.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("New with one endpoint that may answer: %v, want the deadline", err)
	}
}

// TestHTTPToHTTPSMember: an http:// endpoint of a member that serves HTTPS
// is named as such at once, by API calls and by New.
func TestHTTPToHTTPSMember(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a plain HTTP request reached the handler: %s %s", r.Method, r.URL)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the server logs each plain request
	srv.StartTLS()
	t.Cleanup(srv.Close)
	plain := "http://" + strings.TrimPrefix(srv.URL, "https://")

	a := newAPI(t, plain)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := a.Status(ctx, "x", false)
	if !errors.Is(err, client.ErrHTTPSRequired) || !strings.Contains(err.Error(), "this member speaks HTTPS: use an https:// endpoint") {
		t.Fatalf("Status over http:// to an HTTPS member: %v", err)
	}
	if _, err := a.MemberStatus(ctx, plain); !errors.Is(err, client.ErrHTTPSRequired) {
		t.Fatalf("MemberStatus: %v", err)
	}
	c, err := client.New(ctx, client.Config{Endpoints: []string{plain}})
	if err == nil {
		c.Close()
		t.Fatal("New succeeded")
	}
	if !errors.Is(err, client.ErrHTTPSRequired) {
		t.Fatalf("New over http:// to an HTTPS member: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v: the mismatch must be reported at once, not retried", d)
	}
}

// TestTryAcquireHeldByThisClient: a try of a lock the same Client holds,
// or is acquiring in another call, says so (and still matches
// ErrLockHeld); it does not claim another client holds it.
func TestTryAcquireHeldByThisClient(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	c := newClient(t, f, client.Config{ClientID: "me"})
	other := newClient(t, f, client.Config{ClientID: "other"})
	ctx := t.Context()
	l, err := c.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "x")
	if !errors.Is(err, client.ErrHeldByThisClient) || !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("second TryAcquire: %v, want ErrHeldByThisClient and ErrLockHeld", err)
	}
	want := `lock "x" is already held by this client (token ` + strconv.FormatUint(l.Token(), 10) + `)`
	if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "another client") {
		t.Fatalf("message %q; want %q and nothing about another client", msg, want)
	}
	_, err = c.TryAcquireMany(ctx, []string{"w", "x"})
	if !errors.Is(err, client.ErrHeldByThisClient) || !strings.Contains(err.Error(), `lock "x" is already held by this client`) {
		t.Fatalf("TryAcquireMany naming the held lock: %v", err)
	}

	// Pending in another call: "being acquired".
	if _, err := other.TryAcquire(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wctx, "y")
		waited <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(f.Waiters("y")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Acquire did not queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = c.TryAcquire(ctx, "y")
	wcancel()
	<-waited
	if !errors.Is(err, client.ErrHeldByThisClient) || !strings.Contains(err.Error(), `lock "y" is already being acquired by this client`) {
		t.Fatalf("TryAcquire of a lock another call waits for: %v", err)
	}
}

// TestStaleStatusAndMemberStatus: a stale read says it is one and which
// member gave it; MemberStatus reads each member's own view.
func TestStaleStatusAndMemberStatus(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 2})
	ctx := t.Context()
	a := newAPI(t, f.URL(1)) // a follower only
	if _, err := a.Acquire(ctx, "x", "w", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	a = newAPI(t, f.URL(1)) // the acquire taught a to go to the leader first
	st, member, err := a.StaleStatus(ctx, "x")
	if err != nil || !st.Stale || !st.Held || member != f.URL(1) {
		t.Fatalf("StaleStatus: %+v from %q, %v; want a stale read of a held lock from %s", st, member, err, f.URL(1))
	}
	if st, err := a.Status(ctx, "x", false); err != nil || st.Stale {
		t.Fatalf("linearizable Status: %+v, %v", st, err)
	}
	for i, want := range []struct{ id, state string }{{"node1", "Leader"}, {"node2", "Follower"}} {
		ns, err := a.MemberStatus(ctx, f.URL(i))
		if err != nil || ns.ID != want.id || ns.State != want.state || ns.LeaderID != "node1" || ns.LastToken != 1 {
			t.Fatalf("MemberStatus(%s): %+v, %v; want %s %s", f.URL(i), ns, err, want.id, want.state)
		}
	}
	if _, err := a.MemberStatus(ctx, "http://"+testutil.DeadAddr(t)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("MemberStatus of a dead member: %v", err)
	}
	if _, err := a.MemberStatus(ctx, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "not an http(s) URL") {
		t.Fatalf("MemberStatus of a URL without a scheme: %v", err)
	}
}

// TestFailFastOnTLSMistakes (issue 23, item 3): a TLS handshake that fails
// for a reason of the configuration — a certificate from a CA the client
// does not trust, a name the certificate does not cover, no client
// certificate where the member requires one — fails New and API calls at
// once, with the TLS error, instead of retrying to the deadline.
func TestFailFastOnTLSMistakes(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request reached the handler: %s %s", r.Method, r.URL)
	})
	quiet := log.New(io.Discard, "", 0) // the servers log each failed handshake
	plain := httptest.NewUnstartedServer(handler)
	plain.Config.ErrorLog = quiet
	plain.StartTLS()
	t.Cleanup(plain.Close)
	mtls := httptest.NewUnstartedServer(handler)
	mtls.Config.ErrorLog = quiet
	mtls.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	mtls.StartTLS()
	t.Cleanup(mtls.Close)
	trust := func(srv *httptest.Server) *tls.Config {
		return &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	}
	for _, tc := range []struct {
		name     string
		endpoint string
		tls      *tls.Config
		want     string
	}{
		{"unknown CA", plain.URL, &tls.Config{}, "certificate signed by unknown authority"},
		{"hostname mismatch", strings.Replace(plain.URL, "127.0.0.1", "localhost", 1), trust(plain), "localhost"},
		{"no client certificate", mtls.URL, trust(mtls), "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := client.New(context.Background(), client.Config{Endpoints: []string{tc.endpoint}, TLSConfig: tc.tls})
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			t.Logf("New after %v: %v", time.Since(start), err)
			if !errors.Is(err, client.ErrUnreachable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrUnreachable naming %q", err, tc.want)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("New took %v: want at once", d)
			}
			a, err := client.NewAPI(client.APIConfig{Endpoints: []string{tc.endpoint}, TLSConfig: tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			_, err = a.Acquire(t.Context(), "x", "me", time.Minute, 0)
			if !errors.Is(err, client.ErrUnreachable) || !strings.Contains(err.Error(), tc.want) || time.Since(start) > 2*time.Second {
				t.Fatalf("API.Acquire: %v after %v", err, time.Since(start))
			}
		})
	}
}
