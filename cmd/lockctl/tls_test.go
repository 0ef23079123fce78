package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// readCert reads a PEM certificate file.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestTLSFiles: tls init and tls cert write a CA and certificates with the
// identities lockd checks, keys 0600, and refuse to replace files.
func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	code, out, _ := cli(t, nil, "tls", "init", "--dir", dir, "--cluster-id", "prod")
	if code != exitOK || !strings.Contains(out, "ca.pem") {
		t.Fatalf("tls init: %d %q", code, out)
	}
	ca := readCert(t, filepath.Join(dir, "ca.pem"))
	if !ca.IsCA || ca.NotAfter.Before(time.Now().AddDate(9, 11, 0)) {
		t.Fatalf("CA: IsCA %v, valid until %v; want a CA for 10 years", ca.IsCA, ca.NotAfter)
	}
	if k, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Fatalf("CA key %T, want ECDSA P-256", ca.PublicKey)
	}
	if m := mode(t, filepath.Join(dir, "ca-key.pem")); m != 0o600 {
		t.Fatalf("ca-key.pem mode %v", m)
	}
	if code, _, errs := cli(t, nil, "tls", "init", "--dir", dir); code != exitError || !strings.Contains(errs, "--force") {
		t.Fatalf("tls init over a CA: %d %q", code, errs)
	}

	// A member: the cluster id comes from the CA; hosts as SANs.
	code, out, _ = cli(t, nil, "tls", "cert", "member", "--dir", dir, "--id", "n1", "--host", "127.0.0.1,lockd1.example", "-o", "json")
	var rep tlsReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("tls cert member: %d %q", code, out)
	}
	want := tlsfiles.MemberURI("prod", "n1").String()
	if rep.ClusterID != "prod" || rep.URI != want || rep.Cert != filepath.Join(dir, "member-n1.pem") {
		t.Fatalf("member reply %+v, want cluster prod and URI %s", rep, want)
	}
	m := readCert(t, rep.Cert)
	if id, err := tlsfiles.MemberID(m, "prod"); err != nil || id != "n1" {
		t.Fatalf("MemberID = %q, %v", id, err)
	}
	if len(m.IPAddresses) != 1 || !m.IPAddresses[0].Equal([]byte{127, 0, 0, 1}) || !slices.Equal(m.DNSNames, []string{"lockd1.example"}) {
		t.Fatalf("SANs %v %v", m.IPAddresses, m.DNSNames)
	}
	if !slices.Contains(m.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(m.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Fatalf("member EKU %v: want server and client auth", m.ExtKeyUsage)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := m.Verify(x509.VerifyOptions{Roots: pool, DNSName: "lockd1.example"}); err != nil {
		t.Fatalf("member certificate does not verify against the CA: %v", err)
	}
	if mode(t, rep.Key) != 0o600 {
		t.Fatalf("member key mode %v", mode(t, rep.Key))
	}
	if _, err := tls.LoadX509KeyPair(rep.Cert, rep.Key); err != nil {
		t.Fatalf("member pair: %v", err)
	}

	// A client: the client marker, client auth only; another cluster id on
	// the command line wins over the CA's.
	code, out, _ = cli(t, nil, "tls", "cert", "client", "--dir", dir, "--name", "alice", "--cluster-id", "other", "-o", "json")
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.URI != tlsfiles.ClientURI("other", "alice").String() {
		t.Fatalf("tls cert client: %d %q", code, out)
	}
	c := readCert(t, rep.Cert)
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || len(c.IPAddresses)+len(c.DNSNames) != 0 {
		t.Fatalf("client certificate EKU %v, SANs %v %v", c.ExtKeyUsage, c.IPAddresses, c.DNSNames)
	}
	if _, err := tlsfiles.MemberID(c, "other"); err == nil {
		t.Fatal("a client certificate passes as a member")
	}

	// Refusals.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tls", "cert", "member", "--dir", dir, "--id", "n1"}, exitError, "exists"},
		{[]string{"tls", "cert", "member", "--dir", t.TempDir(), "--id", "n1"}, exitError, "tls init"},
		{[]string{"tls", "cert", "member", "--dir", dir, "--id", "a/b"}, exitUsage, "no slashes"},
		{[]string{"tls", "cert", "member", "--dir", dir, "--id", "n2", "--host", "http://x:1"}, exitUsage, "without scheme or port"},
		{[]string{"tls", "init", "--dir", t.TempDir(), "--cluster-id", "a b"}, exitUsage, "--cluster-id"},
		{[]string{"tls", "cert", "client", "--dir", dir, "--name", "bob", "--days", "0"}, exitUsage, "--days 0"},
	} {
		code, _, errs := cli(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	if code, _, _ := cli(t, nil, "tls", "cert", "member", "--dir", dir, "--id", "n1", "--force"); code != exitOK {
		t.Fatalf("--force: %d", code)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 6 {
		t.Fatalf("files in the dir: %d, want 6 (no temporary files left)", len(ents))
	}
}

// TestTLSCluster: certificates made by lockctl tls run a real 3-member
// cluster with HTTPS, required client certificates and peer mTLS (a leader
// is elected only if the members accept each other's certificates), and
// lockctl reaches it with --cacert and a client certificate from
// lockctl tls cert client.
func TestTLSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		if code, _, errs := cli(t, nil, args...); code != exitOK {
			t.Fatalf("lockctl %v: %d %s", args, code, errs)
		}
	}
	run("tls", "init", "--dir", dir, "--cluster-id", "walk")
	for _, id := range []string{"n1", "n2", "n3"} {
		run("tls", "cert", "member", "--dir", dir, "--id", id, "--host", "127.0.0.1")
	}
	run("tls", "cert", "client", "--dir", dir, "--name", "alice")
	caFile := filepath.Join(dir, "ca.pem")
	c := testutil.NewCluster(t, 3, testutil.Options{Modify: func(cfg *server.Config) {
		cert, key := filepath.Join(dir, "member-"+cfg.ID+".pem"), filepath.Join(dir, "member-"+cfg.ID+"-key.pem")
		cfg.ClusterID = "walk"
		cfg.TLS = &tlsfiles.Files{Cert: cert, Key: key, CA: caFile}
		cfg.PeerTLS = &tlsfiles.Files{Cert: cert, Key: key, CA: caFile}
	}})
	eps := strings.Join(c.URLsFollowersFirst(), ",")
	if !strings.HasPrefix(eps, "https://") {
		t.Fatalf("endpoints %s", eps)
	}
	env := map[string]string{"LOCKD_ENDPOINTS": eps, "LOCKD_CACERT": caFile,
		"LOCKD_CERT": filepath.Join(dir, "client-alice.pem"), "LOCKD_KEY": filepath.Join(dir, "client-alice-key.pem")}
	code, out, errs := cli(t, env, "acquire", "tls/x", "--client-id", "alice", "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || !rep.Acquired {
		t.Fatalf("acquire over HTTPS with the client certificate: %d %q %q", code, out, errs)
	}
	code, out, _ = cli(t, env, "endpoint", "status")
	if code != exitOK || strings.Count(out, " yes") != 3 || !strings.Contains(out, "leader") || strings.Count(out, "follower") != 2 {
		t.Fatalf("endpoint status: %d\n%s", code, out)
	}
	// Without the client certificate the member refuses the handshake.
	code, _, errs = cli(t, map[string]string{"LOCKD_ENDPOINTS": eps, "LOCKD_CACERT": caFile}, "status", "tls/x", "--timeout", "1s")
	if code != exitNoLeader || !strings.Contains(errs, "TLS failure") {
		t.Fatalf("without a client certificate: %d %q", code, errs)
	}
}
