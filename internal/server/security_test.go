package server_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestRaftMutualTLS: members with certificates from the cluster CA form a
// cluster; a process with a certificate from another CA can neither join
// nor move the cluster with raw Raft traffic.
func TestRaftMutualTLS(t *testing.T) {
	good := testutil.NewCA(t, "cluster-ca")
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.PeerTLS = memberTLS(good, cfg.ID)
		cfg.CatchUpTimeout = 2 * time.Second
	}})
	l := c.WaitLeader(15 * time.Second)
	if r := testutil.Post(lockURL(l, "tls", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("acquire on a TLS cluster: %s", r.Raw)
	}
	term := l.Srv.Node().Term()

	// Raw connections to the leader's Raft port: a wrong certificate fails
	// the handshake; plain TCP garbage is dropped.
	evil := testutil.NewCA(t, "evil-ca")
	cert, key := evil.Issue("rogue")
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(good.CertPEM)
	pool.AppendCertsFromPEM(pem)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", l.RaftAddr,
		&tls.Config{Certificates: []tls.Certificate{kp}, RootCAs: pool, ServerName: "127.0.0.1"})
	if err == nil {
		// TLS 1.3 reports the server's refusal on first use.
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = conn.Write([]byte{0, 1, 2, 3})
		_, rerr := conn.Read(make([]byte, 1))
		conn.Close()
		// The refusal is the server's TLS alert, not a timeout or a close
		// (a server that took the certificate would also drop 4 bytes of
		// garbage).
		if rerr == nil || !strings.Contains(rerr.Error(), "remote error: tls") {
			t.Fatalf("the Raft port did not refuse a certificate from another CA with a TLS alert: %v", rerr)
		}
	}
	plain, err := net.DialTimeout("tcp", l.RaftAddr, 2*time.Second)
	if err == nil {
		plain.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = plain.Write(bytes.Repeat([]byte{0x01, 0xff}, 512)) // not a TLS handshake
		b, _ := io.ReadAll(plain)
		plain.Close()
		// At most a TLS alert record (type 21) comes back, never Raft.
		if len(b) > 0 && b[0] != 21 {
			t.Fatalf("the Raft port answered plain TCP with %d bytes starting %#x", len(b), b[0])
		}
	}

	// A member with the wrong certificate tries to join through the API: the
	// leader cannot replicate to it, so it is never promoted and is taken out.
	rogue := c.AddMember("rogue", l.URL(), func(cfg *server.Config) { cfg.PeerTLS = memberTLS(evil, "rogue") })
	// It is added as a non-voter, never catches up, and is removed again.
	sawNonvoter := false
	testutil.WaitFor(t, 10*time.Second, "the rogue to be taken out of the configuration", func() bool {
		servers, err := l.Srv.Node().Servers()
		if err != nil {
			return false
		}
		for _, s := range servers {
			if s.ID == "rogue" {
				if s.Voter {
					t.Fatal("a member with a certificate from another CA became a voter")
				}
				sawNonvoter = true
				return false
			}
		}
		return sawNonvoter
	})
	var li locktable.LockInfo
	rogue.Srv.View(func(tab *locktable.Table) { li = tab.Get("tls") })
	if li.Held {
		t.Fatal("the rogue member received replicated state")
	}
	c.Kill("rogue")
	if got := c.WaitLeader(5 * time.Second).Srv.Node().Term(); got != term {
		t.Fatalf("the term moved from %d to %d: rogue traffic disturbed the cluster", term, got)
	}
}

func call(t *testing.T, client *http.Client, method, url, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// TestTokensAndTLSOnTheClientAPI: HTTPS with mTLS on the client API, bearer
// tokens with per-prefix permissions, members calling each other with the
// peer token, and a token file reload.
func TestTokensAndTLSOnTheClientAPI(t *testing.T) {
	ca := testutil.NewCA(t, "api-ca")
	tokens := `{"tokens": [
	  {"name": "team-a", "token": "token-for-team-a-0001", "permissions": [{"prefix": "a/", "access": "lock"}]},
	  {"name": "viewer", "token": "token-for-viewers-0001", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "members", "token": "token-for-members-0001", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`
	path, store := testutil.AuthFile(t, tokens)
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: testutil.Secure(ca, store, "token-for-members-0001")})
	l := c.WaitLeader(15 * time.Second)
	if !strings.HasPrefix(l.URL(), "https://") {
		t.Fatalf("leader URL %s is not https", l.URL())
	}
	// Followers publish their addresses through the leader with the peer
	// token: every member becomes ready.
	testutil.WaitFor(t, 10*time.Second, "every member ready", func() bool {
		for _, m := range c.Up() {
			if ok, _ := m.Srv.Readyz(); !ok {
				return false
			}
		}
		return true
	})

	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(ca.CertPEM)
	pool.AppendCertsFromPEM(pem)
	cert, key := ca.Issue("client")
	kp, _ := tls.LoadX509KeyPair(cert, key)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}}}}

	// Without a client certificate the TLS handshake is refused.
	bare := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if _, err := bare.Get(l.URL() + "/api/v1/locks/a%2Fx"); err == nil {
		t.Fatal("client API accepted a caller without a client certificate")
	}

	acq := func(name, token string) (int, map[string]any) {
		return call(t, client, "POST", l.URL()+"/api/v1/locks/"+name+"/acquire", token, map[string]any{"client_id": "w", "ttl_ms": 60000})
	}
	if st, body := acq("a%2Fx", ""); st != 401 || errCode(body) != "unauthenticated" {
		t.Fatalf("no token: %d %v", st, body)
	}
	if st, body := acq("a%2Fx", "not-a-token-at-all-000"); st != 401 {
		t.Fatalf("unknown token: %d %v", st, body)
	}
	if st, body := acq("b%2Fx", "token-for-team-a-0001"); st != 403 || errCode(body) != "permission_denied" {
		t.Fatalf("prefix a/ token on b/x: %d %v", st, body)
	}
	if st, body := acq("a%2Fx", "token-for-team-a-0001"); st != 200 {
		t.Fatalf("prefix a/ token on a/x: %d %v", st, body)
	}
	if st, body := acq("a%2Fy", "token-for-viewers-0001"); st != 403 {
		t.Fatalf("read-only token acquired: %d %v", st, body)
	}
	if st, body := call(t, client, "GET", l.URL()+"/api/v1/locks/a%2Fx", "token-for-viewers-0001", nil); st != 200 || body["client_id"] != "w" {
		t.Fatalf("read-only token reading: %d %v", st, body)
	}
	if st, _ := call(t, client, "POST", l.URL()+"/api/v1/cluster/transfer-leadership", "token-for-team-a-0001", map[string]any{}); st != 403 {
		t.Fatalf("lock token on a cluster operation: %d", st)
	}
	// Through a follower: the redirect keeps the token (same client).
	for _, m := range c.Up() {
		if m.ID != l.ID {
			if st, body := call(t, client, "POST", m.URL()+"/api/v1/locks/a%2Fz/acquire", "token-for-team-a-0001",
				map[string]any{"client_id": "w", "ttl_ms": 60000}); st != 200 {
				t.Fatalf("acquire through follower: %d %v", st, body)
			}
			break
		}
	}

	// Rotate: team-a's token is replaced; after a reload the old one is refused.
	rotated := strings.Replace(tokens, "token-for-team-a-0001", "token-for-team-a-0002", 1)
	if err := os.WriteFile(path, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if st, _ := acq("a%2Fq", "token-for-team-a-0001"); st != 401 {
		t.Fatalf("old token after rotation: %d", st)
	}
	if st, _ := acq("a%2Fq", "token-for-team-a-0002"); st != 200 {
		t.Fatalf("new token after rotation: %d", st)
	}
	// A broken file is refused and the rules in force stay.
	os.WriteFile(path, []byte(`{"tokens": [`), 0o600)
	if err := l.Srv.Reload(); err == nil {
		t.Fatal("a broken token file was accepted")
	}
	if st, _ := acq("a%2Fr", "token-for-team-a-0002"); st != 200 {
		t.Fatalf("token after a failed reload: %d", st)
	}
}
