package server_test

import (
	"bufio"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// memberTLS is a member's peer TLS files: a member certificate of the
// default cluster from ca.
func memberTLS(ca *testutil.CA, id string) *tlsfiles.Files {
	cert, key := ca.IssueMember(tlsfiles.DefaultCluster, id)
	return &tlsfiles.Files{Cert: cert, Key: key, CA: ca.CertPEM}
}

func loadKeyPair(t *testing.T, cert, key string) tls.Certificate {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// raftHandshake opens a TLS connection to a Raft port with the given
// certificate and waits for the member's verdict: refused (a TLS alert:
// the error), or accepted (nothing comes back within a moment: nil). The
// connection is closed without a byte of Raft.
func raftHandshake(addr string, cfg *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err // TLS 1.2, or a server certificate the caller refused
	}
	defer c.Close()
	// TLS 1.3 reports the server's refusal of the client certificate on
	// first use.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return nil
	}
	return err
}

// TestRaftPortRefusesClientCertificates: with one CA for clients and members
// (as the operations guide allows), a certificate from that CA that is not
// a member certificate of this cluster and of a configured member is
// refused at the TLS handshake of the Raft port: an ordinary client
// certificate (the lockctl user's), one marked as a client, a member of
// another cluster, and a member not in the configuration. The member keeps
// running, the term does not move, and a member with a proper certificate
// still joins and becomes a voter.
func TestRaftPortRefusesClientCertificates(t *testing.T) {
	ca := testutil.NewCA(t, "one-ca-for-all")
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.PeerTLS = memberTLS(ca, cfg.ID)
	}})
	l := c.WaitLeader(15 * time.Second)
	if r := testutil.Post(lockURL(l, "held", "acquire"), map[string]any{"client_id": "alice", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("acquire: %s", r.Raw)
	}
	term := l.Srv.Node().Term()

	attempt := func(cert, key string) error {
		return raftHandshake(l.RaftAddr, &tls.Config{InsecureSkipVerify: true,
			Certificates: []tls.Certificate{loadKeyPair(t, cert, key)}})
	}
	refused := map[string]func() (string, string){
		"ordinary client certificate": func() (string, string) { return ca.Issue("mallory") },
		"marked client certificate": func() (string, string) {
			return ca.IssueClient(tlsfiles.DefaultCluster, "mallory")
		},
		"member of another cluster": func() (string, string) { return ca.IssueMember("other-cluster", "n2") },
		"member not in the configuration": func() (string, string) {
			return ca.IssueMember(tlsfiles.DefaultCluster, "mallory")
		},
	}
	for name, issue := range refused {
		err := attempt(issue())
		if err == nil || !strings.Contains(err.Error(), "remote error: tls") {
			t.Errorf("%s: the Raft port did not refuse it with a TLS alert: %v", name, err)
		}
	}
	// The check can tell: a configured member's certificate is accepted.
	if err := attempt(ca.IssueMember(tlsfiles.DefaultCluster, "n2")); err != nil {
		t.Fatalf("a configured member's certificate was refused: %v", err)
	}

	// Still serving, same leader, same term.
	if r := testutil.Post(lockURL(l, "after", "acquire"), map[string]any{"client_id": "alice", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("acquire after the refused handshakes: %s", r.Raw)
	}
	if got := c.WaitLeader(5 * time.Second); got.ID != l.ID || got.Srv.Node().Term() != term {
		t.Fatalf("leader %s term %d, was %s term %d", got.ID, got.Srv.Node().Term(), l.ID, term)
	}

	// A new member with a member certificate joins: the leader dials it
	// before it has any configuration, and it dials nobody until promoted.
	n4 := c.AddMember("n4", l.URL())
	testutil.WaitFor(t, 15*time.Second, "n4 to become a voter with the replicated state", func() bool {
		servers, err := l.Srv.Node().Servers()
		if err != nil {
			return false
		}
		voter := false
		for _, s := range servers {
			voter = voter || (s.ID == "n4" && s.Voter)
		}
		var li locktable.LockInfo
		n4.Srv.View(func(tab *locktable.Table) { li = tab.Get("held") })
		return voter && li.Held
	})
}

// TestRaftDialRefusesAnotherMember: when a member's Raft address answers
// with another member's certificate (same CA, same cluster), the leader's
// handshake fails and not a byte of Raft reaches the impostor.
func TestRaftDialRefusesAnotherMember(t *testing.T) {
	ca := testutil.NewCA(t, "one-ca-for-all")
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.PeerTLS = memberTLS(ca, cfg.ID)
	}})
	l := c.WaitLeader(15 * time.Second)
	var victim *testutil.Member
	for _, m := range c.Up() {
		if m.ID != l.ID {
			victim = m
		}
	}
	other := "n1"
	if l.ID == other || victim.ID == other {
		other = "n2"
		if l.ID == other || victim.ID == other {
			other = "n3"
		}
	}
	c.Kill(victim.ID)

	// The impostor holds a perfectly good member certificate — of another
	// member than the one configured at this address.
	cert, key := ca.IssueMember(tlsfiles.DefaultCluster, other)
	ln, err := tls.Listen("tcp", victim.RaftAddr, &tls.Config{Certificates: []tls.Certificate{loadKeyPair(t, cert, key)},
		ClientAuth: tls.RequireAnyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dials, received atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				if n, _ := conn.Read(make([]byte, 64)); n > 0 {
					received.Add(int64(n))
				}
			}()
		}
	}()
	testutil.WaitFor(t, 10*time.Second, "the leader to dial the impostor a few times", func() bool { return dials.Load() >= 3 })
	if n := received.Load(); n > 0 {
		t.Fatalf("the leader sent %d bytes of Raft to a member certificate of %q at %s's address", n, other, victim.ID)
	}
}

// TestCARotationRefusesResumedSessions: after the CA bundle is rotated and
// the member reloaded (SIGHUP), a client holding a TLS session from before,
// with a certificate of the old CA, is refused on the client API and on
// the Raft port, resumption or not.
func TestCARotationRefusesResumedSessions(t *testing.T) {
	oldCA, newCA := testutil.NewCA(t, "old-ca"), testutil.NewCA(t, "new-ca")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(oldCA.CertPEM, caFile)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cert, key := oldCA.IssueMember(tlsfiles.DefaultCluster, cfg.ID)
		cfg.TLS = &tlsfiles.Files{Cert: cert, Key: key, CA: caFile}
		cfg.PeerTLS = &tlsfiles.Files{Cert: cert, Key: key, CA: caFile}
	}})
	l := c.WaitLeader(15 * time.Second)
	host := strings.TrimPrefix(l.URL(), "https://")

	// The old certificates: a user's for the API, a member's for Raft.
	kp := func(cert, key string) tls.Certificate { return loadKeyPair(t, cert, key) }
	apiClient := &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(4),
		Certificates: []tls.Certificate{kp(oldCA.Issue("user"))}}
	raftClient := &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(4),
		Certificates: []tls.Certificate{kp(oldCA.IssueMember(tlsfiles.DefaultCluster, l.ID))}}
	healthz := func() (resumed bool, err error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", host, apiClient)
		if err != nil {
			return false, err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		req, _ := http.NewRequest("GET", "https://"+host+"/healthz", nil)
		if err := req.Write(conn); err != nil {
			return false, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return conn.ConnectionState().DidResume, err
		}
		resp.Body.Close()
		return conn.ConnectionState().DidResume, nil
	}

	if _, err := healthz(); err != nil {
		t.Fatalf("client API before the rotation: %v", err)
	}
	if resumed, err := healthz(); err != nil || !resumed {
		t.Fatalf("client API before the rotation: resumed %v, %v (the test needs a resumable session)", resumed, err)
	}
	if err := raftHandshake(l.RaftAddr, raftClient); err != nil {
		t.Fatalf("Raft port before the rotation: %v", err)
	}

	writeFile(newCA.CertPEM, caFile)
	if err := l.Srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if resumed, err := healthz(); err == nil {
		t.Fatalf("client API took a certificate of the rotated-out CA (resumed: %v)", resumed)
	}
	if err := raftHandshake(l.RaftAddr, raftClient); err == nil {
		t.Fatal("the Raft port took a certificate of the rotated-out CA")
	}
}
