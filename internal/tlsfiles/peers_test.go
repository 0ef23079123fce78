package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/tlsfiles"
)

func loaded(t *testing.T, cert, key, ca string) *tlsfiles.Files {
	t.Helper()
	f := &tlsfiles.Files{Cert: cert, Key: key, CA: ca}
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	return f
}

func keyPair(t *testing.T, cert, key string) []tls.Certificate {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return []tls.Certificate{kp}
}

func members(ms ...tlsfiles.Member) func() []tlsfiles.Member {
	return func() []tlsfiles.Member { return ms }
}

// TestPeerServerConfigAcceptsOnlyMembers: the Raft listener takes a member
// certificate of its cluster naming a member in the configuration, and
// refuses every other certificate of the same CA — an ordinary client
// certificate, an explicitly marked one, a member of another cluster, a
// member not in the configuration — and a caller without one. With no
// configuration yet (a joining member) any member of the cluster gets in;
// a client certificate still does not.
func TestPeerServerConfigAcceptsOnlyMembers(t *testing.T) {
	ca := testutil.NewCA(t, "shared-ca")
	cert, key := ca.IssueMember("c1", "n1")
	files := loaded(t, cert, key, ca.CertPEM)
	configured := serve(t, files.PeerServerConfig(tlsfiles.Peers{Cluster: "c1",
		Members: members(tlsfiles.Member{ID: "n1"}, tlsfiles.Member{ID: "n2"})}))
	joining := serve(t, files.PeerServerConfig(tlsfiles.Peers{Cluster: "c1", Members: members()}))

	cases := []struct {
		name               string
		cert, key          string
		configured, joinOK bool
	}{
		{"member in the configuration", "", "", true, true},
		{"member not in the configuration", "", "", false, true},
		{"ordinary client certificate", "", "", false, false},
		{"marked client certificate", "", "", false, false},
		{"member of another cluster", "", "", false, false},
		{"no certificate", "", "", false, false},
	}
	cases[0].cert, cases[0].key = ca.IssueMember("c1", "n2")
	cases[1].cert, cases[1].key = ca.IssueMember("c1", "mallory")
	cases[2].cert, cases[2].key = ca.Issue("mallory")
	cases[3].cert, cases[3].key = ca.IssueClient("c1", "mallory")
	cases[4].cert, cases[4].key = ca.IssueMember("c2", "n2")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client := &tls.Config{InsecureSkipVerify: true}
			if c.cert != "" {
				client.Certificates = keyPair(t, c.cert, c.key)
			}
			for _, target := range []struct {
				addr string
				want bool
			}{{configured, c.configured}, {joining, c.joinOK}} {
				_, err := attempt(target.addr, client)
				if (err == nil) != target.want {
					t.Errorf("server with configuration %v: accepted = %v, want %v (%v)",
						target.addr == configured, err == nil, target.want, err)
				}
				if err != nil && !strings.Contains(err.Error(), "remote error: tls") {
					t.Errorf("refused without a TLS alert: %v", err)
				}
			}
		})
	}
}

// TestPeerDialerChecksTheMemberAtTheAddress: a member dialing a Raft
// address accepts only the member the configuration has there (any member
// in the configuration for an address it does not list; any member of the
// cluster while it has no configuration), and never a client certificate.
func TestPeerDialerChecksTheMemberAtTheAddress(t *testing.T) {
	ca := testutil.NewCA(t, "shared-ca")
	cert, key := ca.IssueMember("c1", "n1")
	files := loaded(t, cert, key, ca.CertPEM)
	answering := func(cert, key string) string {
		return serve(t, &tls.Config{Certificates: keyPair(t, cert, key), ClientAuth: tls.RequireAnyClientCert})
	}
	n2 := answering(ca.IssueMember("c1", "n2"))
	client := answering(ca.Issue("n2"))
	marked := answering(ca.IssueClient("c1", "n2"))
	foreign := answering(ca.IssueMember("c2", "n2"))

	cases := []struct {
		name    string
		addr    string
		members []tlsfiles.Member
		want    error // nil: connected
	}{
		{"the configured member", n2, []tlsfiles.Member{{"n1", "x:1"}, {"n2", n2}}, nil},
		{"another member at the address", n2, []tlsfiles.Member{{"n2", "x:1"}, {"n3", n2}}, tlsfiles.ErrWrongMember},
		{"address not configured, member known", n2, []tlsfiles.Member{{"n2", "x:1"}}, nil},
		{"address not configured, member unknown", n2, []tlsfiles.Member{{"n3", "x:1"}}, tlsfiles.ErrUnknownMember},
		{"no configuration", n2, nil, nil},
		{"ordinary client certificate", client, []tlsfiles.Member{{"n2", client}}, tlsfiles.ErrNotMember},
		{"ordinary client certificate, no configuration", client, nil, tlsfiles.ErrNotMember},
		{"marked client certificate", marked, []tlsfiles.Member{{"n2", marked}}, tlsfiles.ErrNotMember},
		{"member of another cluster", foreign, []tlsfiles.Member{{"n2", foreign}}, tlsfiles.ErrOtherCluster},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dial := files.PeerDialer(tlsfiles.Peers{Cluster: "c1", Members: members(c.members...)}, nil)
			conn, err := dial(c.addr, 5*time.Second)
			if err == nil {
				conn.Close()
			}
			if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("dial: %v, want %v", err, c.want)
			}
		})
	}
}

// TestPeersCheckOwnCertificate: a member refuses to load a peer
// certificate that does not name it in its cluster, and keeps the one it
// had.
func TestPeersCheckOwnCertificate(t *testing.T) {
	ca := testutil.NewCA(t, "ca")
	peers := tlsfiles.Peers{Cluster: "c1", Self: "n1"}
	good, goodKey := ca.IssueMember("c1", "n1")
	f := &tlsfiles.Files{Cert: good, Key: goodKey, CA: ca.CertPEM, Check: peers.Check}
	if err := f.Reload(); err != nil {
		t.Fatalf("own member certificate refused: %v", err)
	}
	for name, issue := range map[string]func() (string, string){
		"client":        func() (string, string) { return ca.Issue("n1") },
		"other member":  func() (string, string) { return ca.IssueMember("c1", "n2") },
		"other cluster": func() (string, string) { return ca.IssueMember("c2", "n1") },
	} {
		f.Cert, f.Key = issue()
		if err := f.Reload(); err == nil {
			t.Errorf("%s certificate loaded as member n1's", name)
		}
	}
	// The certificate in use is still the good one.
	f.Cert, f.Key = good, goodKey
	addr := serve(t, f.PeerServerConfig(peers))
	other, otherKey := ca.IssueMember("c1", "n2")
	dial := (&tlsfiles.Files{Cert: other, Key: otherKey, CA: ca.CertPEM})
	if err := dial.Reload(); err != nil {
		t.Fatal(err)
	}
	conn, err := dial.PeerDialer(tlsfiles.Peers{Cluster: "c1", Members: members(tlsfiles.Member{ID: "n1", Addr: addr})}, nil)(addr, 5*time.Second)
	if err != nil {
		t.Fatalf("the member's certificate after refused reloads: %v", err)
	}
	conn.Close()
}
