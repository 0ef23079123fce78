package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"

	"github.com/lockd/lockd/internal/testutil"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// TestClientConfigNeverSkipsVerification: with a CA configured but not
// loaded yet, a server certificate is refused, not waved through.
func TestClientConfigNeverSkipsVerification(t *testing.T) {
	ca := testutil.NewCA(t, "ca")
	certFile, _ := ca.Issue("server")
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	state := tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}

	unloaded := &tlsfiles.Files{CA: ca.CertPEM}
	if err := unloaded.ClientConfig("127.0.0.1").VerifyConnection(state); err == nil {
		t.Fatal("a CA that was never loaded verified a certificate")
	}
	clientCert, clientKey := ca.Issue("client")
	loaded := &tlsfiles.Files{Cert: clientCert, Key: clientKey, CA: ca.CertPEM}
	if err := loaded.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := loaded.ClientConfig("127.0.0.1").VerifyConnection(state); err != nil {
		t.Fatalf("loaded CA refused its own certificate: %v", err)
	}
}
