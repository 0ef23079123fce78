package main

import (
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/testutil"
)

// TestBinaryTLS runs fencestore with HTTPS and required client
// certificates (files from the environment and flags): a client with a
// certificate from the CA writes and reads; callers without one, with one
// from another CA, or speaking plain HTTP are refused; SIGHUP picks up a
// new certificate and survives a broken one. A restart without --client-ca
// serves HTTPS to any client that trusts the server.
func TestBinaryTLS(t *testing.T) {
	dir, bin := binaryTest(t)
	data := filepath.Join(dir, "data")
	ca := testutil.NewCA(t, "fencestore-ca")
	cert, key := ca.Issue("fencestore")
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	loadPair := func(cert, key string) tls.Certificate {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	writer := loadPair(ca.Issue("writer"))
	stranger := loadPair(testutil.NewCA(t, "other-ca").Issue("stranger"))

	p := startBinary(t, bin, []string{"FENCESTORE_TLS_CERT=" + cert, "FENCESTORE_TLS_KEY=" + key},
		"--addr", "127.0.0.1:0", "--data-dir", data, "--log-format", "json", "--client-ca", ca.CertPEM)
	if !strings.HasPrefix(p.base, "https://") {
		t.Fatalf("fencestore with TLS listens on %s", p.base)
	}
	p.tls = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{writer}}
	p.wantStatus(t, "PUT", "/v1/objects/x", "v1", map[string]string{fence.HeaderToken: "3"}, 200, "")
	p.wantObject(t, "x", "v1", 3)

	get := func(cfg *tls.Config, base string) (*http.Response, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg}}
		resp, err := c.Get(base + "/v1/objects/x")
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	if _, err := get(&tls.Config{RootCAs: pool}, p.base); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if _, err := get(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{stranger}}, p.base); err == nil {
		t.Fatal("a client with a certificate from another CA was served")
	}
	if resp, err := get(nil, "http://"+strings.TrimPrefix(p.base, "https://")); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP was served")
	}

	serial := func() *big.Int {
		t.Helper()
		resp, err := get(p.tls, p.base)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET over TLS: %v %v", resp, err)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber
	}
	waitLog := func(msg string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(p.logs.String(), msg) < n {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the logs:\n%s", msg, p.logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Rotation: a new certificate in the same files, then SIGHUP.
	old := serial()
	time.Sleep(time.Millisecond) // the test CA's serials are timestamps
	ca.Issue("fencestore")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(`"msg":"TLS files reloaded"`, 1)
	rotated := serial()
	if rotated.Cmp(old) == 0 {
		t.Fatal("SIGHUP did not pick up the new certificate")
	}
	// A broken file is refused; the loaded certificate stays in use.
	if err := os.WriteFile(cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(`"msg":"TLS files not reloaded; the previous ones stay in use"`, 1)
	if s := serial(); s.Cmp(rotated) != 0 {
		t.Fatalf("serving serial %v after a failed reload, want %v", s, rotated)
	}
	p.stop(t, syscall.SIGTERM)

	// HTTPS without client certificates, on the same data.
	cert, key = ca.Issue("fencestore")
	p = startBinary(t, bin, nil, "--addr", "127.0.0.1:0", "--data-dir", data, "--log-format", "json", "--tls-cert", cert, "--tls-key", key)
	p.tls = &tls.Config{RootCAs: pool}
	p.wantObject(t, "x", "v1", 3)
	p.wantStatus(t, "PUT", "/v1/objects/x", "v0", map[string]string{fence.HeaderToken: "2"}, 409, "stale_token")
	p.stop(t, syscall.SIGINT)
}

func TestBinaryTLSBadFiles(t *testing.T) {
	dir, bin := binaryTest(t)
	ca := testutil.NewCA(t, "fencestore-ca")
	cert, key := ca.Issue("fencestore")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", filepath.Join(dir, "missing.pem"), "--tls-key", key}, "missing.pem"},
		{[]string{"--tls-cert", cert, "--tls-key", key, "--client-ca", filepath.Join(dir, "noca.pem")}, "noca.pem"},
	} {
		out, err := runOnce(bin, append([]string{"--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "d")}, tc.args...)...)
		if code := exitCodeOf(err); code != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, output %q; want 1 naming %s", tc.args, code, out, tc.want)
		}
	}
}
