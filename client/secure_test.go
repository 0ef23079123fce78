package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

const (
	tokenTeamA  = "token-for-team-a-0001"
	tokenViewer = "token-for-viewers-0001"
	tokenAdmin  = "token-for-members-0001"
)

// newSecureCluster starts 3 members with HTTPS and client certificates
// required on the client API, mutual TLS between members, and bearer tokens
// (team-a: lock on a/; viewer: read; members: admin). It returns the
// cluster and a client TLS config with a certificate from the same CA.
func newSecureCluster(t *testing.T) (*testutil.Cluster, *tls.Config) {
	t.Helper()
	ca := testutil.NewCA(t, "client-test-ca")
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "team-a", "token": "`+tokenTeamA+`", "permissions": [{"prefix": "a/", "access": "lock"}]},
	  {"name": "viewer", "token": "`+tokenViewer+`", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "members", "token": "`+tokenAdmin+`", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`)
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: testutil.Secure(ca, store, tokenAdmin)})
	pem, err := os.ReadFile(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	certFile, keyFile := ca.Issue("client")
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}}
}

// TestSecureCluster runs the client against a real cluster with HTTPS,
// client certificates and tokens: a session over wss:// takes and releases
// a lock; wrong tokens and prefixes are refused with the sentinels, at once;
// backups need the admin token.
func TestSecureCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, tc := newSecureCluster(t)
	eps := c.URLsFollowersFirst()
	for _, e := range eps {
		if !strings.HasPrefix(e, "https://") {
			t.Fatalf("endpoint %s is not https", e)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := func(token string) client.Config {
		return client.Config{Endpoints: append([]string(nil), eps...), TLSConfig: tc, Token: token, ClientID: "secure-" + token[:10]}
	}

	t.Run("session over wss", func(t *testing.T) {
		cl, err := client.New(ctx, cfg(tokenTeamA))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		l, err := cl.Acquire(ctx, "a/x")
		if err != nil {
			t.Fatal(err)
		}
		st, err := cl.API().Status(ctx, "a/x", false)
		// Held by this client; status never shows the session id (a
		// capability).
		if err != nil || !st.Held || st.FencingToken != l.Token() || st.SessionID != "" {
			t.Fatalf("status %+v, %v; want held with token %d and no session id", st, err, l.Token())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.API().Status(ctx, "a/x", false); err != nil || st.Held {
			t.Fatalf("after release: %+v, %v", st, err)
		}
		// The token's prefix is enforced on the WebSocket too.
		_, err = cl.TryAcquire(ctx, "b/x")
		if !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("a/ token acquiring b/x over the WebSocket: %v", err)
		}
	})

	t.Run("wrong token", func(t *testing.T) {
		start := time.Now()
		cl, err := client.New(ctx, cfg("not-a-token-at-all-000"))
		if cl != nil {
			cl.Close()
		}
		if !errors.Is(err, client.ErrUnauthenticated) {
			t.Fatalf("New with a wrong token: %v", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("New took %v to give up: a refused token must not be retried", d)
		}
		a, err := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: tc})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Acquire(ctx, "a/y", "w", time.Minute, 0); !errors.Is(err, client.ErrUnauthenticated) {
			t.Fatalf("API without a token: %v", err)
		}
	})

	t.Run("prefix", func(t *testing.T) {
		a, err := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: tc, Token: tokenTeamA})
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Acquire(ctx, "b/x", "w", time.Minute, 0)
		var se *client.ServerError
		if !errors.Is(err, client.ErrPermissionDenied) || !errors.As(err, &se) || se.Status != 403 {
			t.Fatalf("a/ token on b/x: %v", err)
		}
		rep, err := a.Acquire(ctx, "a/http", "w", time.Minute, 0)
		if err != nil || !rep.Acquired {
			t.Fatalf("a/ token on a/http: %+v, %v", rep, err)
		}
	})

	// A read token's client has no session: it watches (and observes
	// elections), and its acquires are refused.
	t.Run("read-only", func(t *testing.T) {
		writer, err := client.New(ctx, cfg(tokenTeamA))
		if err != nil {
			t.Fatal(err)
		}
		defer writer.Close()
		cl, err := client.New(ctx, cfg(tokenViewer))
		if err != nil {
			t.Fatalf("a read token's client: %v", err)
		}
		defer cl.Close()
		if !cl.ReadOnly() || cl.SessionID() != "" || writer.ReadOnly() {
			t.Fatalf("ReadOnly %v (writer %v), session %q: want a read-only client without a session", cl.ReadOnly(), writer.ReadOnly(), cl.SessionID())
		}
		if _, err := cl.TryAcquire(ctx, "a/ro"); !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("a read-only client's acquire: %v", err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		ch, err := cl.WatchPrefix(wctx, "a/")
		if err != nil {
			t.Fatal(err)
		}
		obs, err := client.NewElection(cl, "a/leader").Observe(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.NewElection(writer, "a/leader").Campaign(ctx, "http://writer:1"); err != nil {
			t.Fatal(err)
		}
		for ev := range ch {
			if ev.Lock == "a/leader" && ev.Status.Held {
				break
			}
		}
		if li := <-obs; li.Value != "http://writer:1" {
			t.Fatalf("observed leader %+v", li)
		}
		select {
		case <-cl.Done():
			t.Fatal("the read-only client's Done closed before Close")
		default:
		}
		if err := cl.Close(); err != nil {
			t.Fatalf("Close of a read-only client: %v", err)
		}
		<-cl.Done()
	})

	t.Run("no client certificate", func(t *testing.T) {
		bare := &tls.Config{RootCAs: tc.RootCAs}
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		defer scancel()
		a, _ := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: bare, Token: tokenTeamA})
		if _, err := a.Status(sctx, "a/x", true); err == nil {
			t.Fatal("a caller without a client certificate was served")
		}
	})

	t.Run("backup", func(t *testing.T) {
		a, _ := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: tc, Token: tokenTeamA})
		if _, err := a.SnapshotSave(ctx, &bytes.Buffer{}); !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("backup with a lock token: %v", err)
		}
		admin, _ := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: tc, Token: tokenAdmin})
		var buf bytes.Buffer
		n, err := admin.SnapshotSave(ctx, &buf)
		if err != nil || n == 0 || n != int64(buf.Len()) {
			t.Fatalf("backup: %d bytes, %v", n, err)
		}
		// Through a follower (a fresh API starts there): the body reaches the
		// leader whole, which refuses it only because the cluster holds
		// state.
		admin2, _ := client.NewAPI(client.APIConfig{Endpoints: eps, TLSConfig: tc, Token: tokenAdmin})
		err = admin2.SnapshotRestore(ctx, bytes.NewReader(buf.Bytes()), false)
		var se *client.ServerError
		if !errors.As(err, &se) || se.Status != 400 || !strings.Contains(se.API.Message, "already holds state") {
			t.Fatalf("restore into a cluster with state, without force: %v", err)
		}
	})
}

// TestWatchEndedByReload: a reload that takes the token's read access away
// ends the client's watch on the server (an error push with its watch_id);
// the client keeps the consumer's channel and asks again later, so once
// the access is back the watch delivers again, from the lock's latest
// state.
func TestWatchEndedByReload(t *testing.T) {
	const (
		reader = "token-for-reader-0001"
		writer = "token-for-writer-0001"
	)
	with := `{"tokens": [
	  {"name": "reader", "token": "` + reader + `", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "writer", "token": "` + writer + `", "permissions": [{"prefix": "", "access": "lock"}]}]}`
	without := `{"tokens": [
	  {"name": "reader", "token": "` + reader + `", "permissions": [{"prefix": "other/", "access": "read"}]},
	  {"name": "writer", "token": "` + writer + `", "permissions": [{"prefix": "", "access": "lock"}]}]}`
	path, store := testutil.AuthFile(t, with)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) { cfg.Auth = store }})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg := func(token string) client.Config {
		return client.Config{Endpoints: []string{l.URL()}, Token: token, ClientID: token[:12], MaxBackoff: 200 * time.Millisecond}
	}
	w, err := client.New(ctx, cfg(writer))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := client.New(ctx, cfg(reader))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ch, err := r.Watch(ctx, "jobs/x")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.Status.Held {
		t.Fatalf("first picture: %+v", ev)
	}
	reload := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := l.Srv.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	reload(without)
	lk, err := w.Acquire(ctx, "jobs/x", client.WithValue("v1"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		t.Fatalf("a change reached a watch whose token lost read access: %+v", ev)
	case <-time.After(500 * time.Millisecond):
	}
	reload(with)
	if err := lk.SetValue(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	for ev := range ch {
		if ev.Status.Value == "v2" {
			return
		}
	}
	t.Fatalf("the watch did not come back with the access: %v", ctx.Err())
}
