package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/tlsfiles"
)

// CA is a throwaway certificate authority for TLS tests.
type CA struct {
	t       testing.TB
	dir     string
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM string // path of the CA certificate file
}

// NewCA creates a CA whose files live in a temp dir.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	tmpl := template(name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	key, der := sign(t, tmpl, nil, nil)
	cert, _ := x509.ParseCertificate(der)
	dir := t.TempDir()
	ca := &CA{t: t, dir: dir, cert: cert, key: key, CertPEM: filepath.Join(dir, "ca.pem")}
	writePEM(t, ca.CertPEM, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate for loopback (127.0.0.1, ::1, localhost),
// usable as server and client certificate, naming no lockd identity: an
// ordinary client certificate, which the Raft port refuses. It returns the
// cert and key file paths.
func (ca *CA) Issue(name string) (certFile, keyFile string) {
	ca.t.Helper()
	return ca.issue(name, name)
}

// IssueMember is Issue for a member: the certificate also carries the URI
// SAN spiffe://lockd/<cluster>/member/<id> that the Raft transport checks.
func (ca *CA) IssueMember(cluster, id string) (certFile, keyFile string) {
	ca.t.Helper()
	return ca.issue("member-"+cluster+"-"+id, id, tlsfiles.MemberURI(cluster, id))
}

// IssueClient is Issue with the explicit client marker
// spiffe://lockd/<cluster>/client/<name>.
func (ca *CA) IssueClient(cluster, name string) (certFile, keyFile string) {
	ca.t.Helper()
	return ca.issue("client-"+cluster+"-"+name, name, tlsfiles.ClientURI(cluster, name))
}

func (ca *CA) issue(file, name string, uris ...*url.URL) (certFile, keyFile string) {
	t := ca.t
	t.Helper()
	tmpl := template(name)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.URIs = uris
	key, der := sign(t, tmpl, ca.cert, ca.key)
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(ca.dir, file+".pem")
	keyFile = filepath.Join(ca.dir, file+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", kb)
	return certFile, keyFile
}

// template is a certificate valid from an hour ago for a day.
func template(name string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// sign makes a key and a certificate for tmpl, signed by parent (self-signed
// when parent is nil).
func sign(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
