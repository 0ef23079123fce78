package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// serve accepts TLS connections with cfg until the test ends: each one that
// completes its handshake gets "ok" and is held until the client hangs up.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				if _, err := c.Write([]byte("ok")); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// attempt connects with cfg and reads the server's "ok": the refusal of a
// client certificate arrives as a handshake error (TLS 1.2) or as an alert
// on the first read (TLS 1.3).
func attempt(addr string, cfg *tls.Config) (resumed bool, err error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil {
		return c.ConnectionState().DidResume, err
	}
	if string(b) != "ok" {
		return false, errors.New("unexpected reply")
	}
	return c.ConnectionState().DidResume, nil
}

// TestRotatedCARefusesResumedSessions: after the CA is rotated (the file
// rewritten and reloaded, as on SIGHUP), a client whose certificate came
// from the old CA is refused even when it resumes a TLS session it opened
// before the rotation — on the client API and fencestore (ServerConfig)
// and on the Raft port (PeerServerConfig), in TLS 1.2 and 1.3.
func TestRotatedCARefusesResumedSessions(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, port := range []string{"api", "raft"} {
			t.Run(tls.VersionName(version)+"/"+port, func(t *testing.T) {
				oldCA, newCA := testutil.NewCA(t, "old-ca"), testutil.NewCA(t, "new-ca")
				caFile := filepath.Join(t.TempDir(), "ca.pem")
				copyFile(t, oldCA.CertPEM, caFile)
				srvCert, srvKey := oldCA.IssueMember("c1", "n1")
				files := &tlsfiles.Files{Cert: srvCert, Key: srvKey, CA: caFile}
				if err := files.Reload(); err != nil {
					t.Fatal(err)
				}
				var cfg *tls.Config
				var clientCert, clientKey string
				if port == "api" {
					cfg = files.ServerConfig()
					clientCert, clientKey = oldCA.Issue("user")
				} else {
					cfg = files.PeerServerConfig(tlsfiles.Peers{Cluster: "c1",
						Members: func() []tlsfiles.Member { return []tlsfiles.Member{{ID: "n1"}, {ID: "n2"}} }})
					clientCert, clientKey = oldCA.IssueMember("c1", "n2")
				}
				cfg.MinVersion, cfg.MaxVersion = version, version
				addr := serve(t, cfg)
				kp, err := tls.LoadX509KeyPair(clientCert, clientKey)
				if err != nil {
					t.Fatal(err)
				}
				client := &tls.Config{Certificates: []tls.Certificate{kp}, InsecureSkipVerify: true,
					ClientSessionCache: tls.NewLRUClientSessionCache(8), MinVersion: version, MaxVersion: version}

				if _, err := attempt(addr, client); err != nil {
					t.Fatalf("a certificate of the CA in force was refused: %v", err)
				}
				resumed, err := attempt(addr, client)
				if err != nil {
					t.Fatalf("second connection before the rotation: %v", err)
				}
				// The client API resumes sessions (so this test exercises
				// resumption); the Raft port issues no tickets at all.
				if port == "api" && !resumed {
					t.Fatal("the client API did not resume the session: this test would prove nothing")
				}
				if port == "raft" && resumed {
					t.Error("the Raft port resumed a session; it should issue no tickets")
				}

				copyFile(t, newCA.CertPEM, caFile)
				if err := files.Reload(); err != nil {
					t.Fatal(err)
				}
				if resumed, err := attempt(addr, client); err == nil {
					t.Fatalf("a certificate of the rotated-out CA got in (resumed session: %v)", resumed)
				}
				// The client with a fresh cache (a full handshake) is refused too.
				client.ClientSessionCache = nil
				if _, err := attempt(addr, client); err == nil {
					t.Fatal("a certificate of the rotated-out CA got in with a full handshake")
				}
			})
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
