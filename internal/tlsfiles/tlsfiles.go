// Package tlsfiles is one TLS identity read from PEM files (certificate, key
// and an optional CA) that can be re-read while serving, so certificates
// rotate without a restart. lockd's client API and Raft transport and
// fencestore all use it. On the Raft transport it also checks who the other
// side is: a member of this cluster, named by a URI SAN (see MemberURI and
// Peers), never a client certificate.
package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of one TLS identity. Reload re-reads them,
// so certificates rotate without a restart (lockd and fencestore do it on
// SIGHUP); each new handshake uses what was last loaded.
type Files struct {
	Cert, Key string
	// CA verifies the other side: client certificates on the client API
	// (mTLS, optional), both directions on the Raft transport (required).
	CA string
	// Check, when set, vets each certificate Reload reads before it is used
	// (lockd: the peer certificate must name this member); on error the
	// previous files stay in use.
	Check func(leaf *x509.Certificate) error

	mu   sync.RWMutex
	cert *tls.Certificate
	pool *x509.CertPool
}

// Enabled reports whether a certificate is configured.
func (f *Files) Enabled() bool { return f != nil && f.Cert != "" }

// Reload reads the files; on error the previous ones stay in use.
func (f *Files) Reload() error {
	if f.Cert == "" || f.Key == "" {
		return errors.New("a certificate needs both the cert and the key file")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return fmt.Errorf("load certificate %s: %w", f.Cert, err)
	}
	if f.Check != nil {
		leaf := cert.Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
				return fmt.Errorf("certificate %s: %w", f.Cert, err)
			}
		}
		if err := f.Check(leaf); err != nil {
			return fmt.Errorf("certificate %s: %w", f.Cert, err)
		}
	}
	var pool *x509.CertPool
	if f.CA != "" {
		b, err := os.ReadFile(f.CA)
		if err != nil {
			return fmt.Errorf("read CA %s: %w", f.CA, err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("CA %s holds no PEM certificate", f.CA)
		}
	}
	f.mu.Lock()
	f.cert, f.pool = &cert, pool
	f.mu.Unlock()
	return nil
}

func (f *Files) current() (*tls.Certificate, *x509.CertPool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.cert, f.pool
}

// ServerConfig serves the certificate; with a CA, it requires and verifies
// client certificates.
func (f *Files) ServerConfig() *tls.Config {
	return f.serverConfig(nil)
}

// serverConfig verifies client certificates (with a CA) in VerifyConnection,
// against the CA loaded at the time of each handshake, then applies extra.
// Not in VerifyPeerCertificate: Go skips that on a resumed session, so a
// session ticket issued before a CA rotation would let a certificate of the
// old CA back in. VerifyConnection runs on every handshake, resumed or not,
// with the certificates the session was opened with.
func (f *Files) serverConfig(extra func(leaf *x509.Certificate) error) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _ := f.current()
			return c, nil
		},
	}
	if f.CA != "" {
		cfg.ClientAuth = tls.RequireAnyClientCert
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			_, pool := f.current()
			if err := verifyChain(rawCerts(cs), pool, x509.ExtKeyUsageClientAuth); err != nil {
				return err
			}
			if extra != nil {
				return extra(cs.PeerCertificates[0])
			}
			return nil
		}
	}
	return cfg
}

// ClientConfig presents the certificate and verifies the server (named
// host) against the CA, or the system roots when no CA is set.
func (f *Files) ClientConfig(host string) *tls.Config {
	return f.clientConfig(host, nil)
}

// clientConfig is ClientConfig, then extra on the verified server
// certificate.
func (f *Files) clientConfig(host string, extra func(leaf *x509.Certificate) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: host,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := f.current()
			return c, nil
		},
		// Verified below against the current pool, with the host name.
		InsecureSkipVerify: f.CA != "",
		VerifyConnection: func(cs tls.ConnectionState) error {
			// Without a CA, the standard verification against the system
			// roots already ran. With one, a pool that is not loaded yet
			// fails in verifyChain: never skip verification.
			if f.CA != "" {
				_, pool := f.current()
				if err := verifyChain(rawCerts(cs), pool, x509.ExtKeyUsageServerAuth); err != nil {
					return err
				}
				// Go sends no SNI for an IP address, so cs.ServerName may be
				// empty: check the name we dialed.
				if err := cs.PeerCertificates[0].VerifyHostname(host); err != nil {
					return err
				}
			}
			if extra != nil {
				return extra(cs.PeerCertificates[0])
			}
			return nil
		},
	}
}

func rawCerts(cs tls.ConnectionState) [][]byte {
	raw := make([][]byte, len(cs.PeerCertificates))
	for i, c := range cs.PeerCertificates {
		raw[i] = c.Raw
	}
	return raw
}

func verifyChain(raw [][]byte, pool *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(raw) == 0 {
		return errors.New("no certificate presented")
	}
	if pool == nil {
		return errors.New("no CA configured to verify the certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return err
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: time.Now()})
	return err
}

// DialTLS is an http.Transport DialTLSContext that verifies each member's
// certificate for the host it dials, against the current CA.
func (f *Files) DialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	raw, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	c := tls.Client(raw, f.ClientConfig(host))
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// Dialer wraps a dial function (nil: plain TCP) with a mutual-TLS handshake
// verifying the dialed host. It checks no member identity: the Raft
// transport uses PeerDialer.
func (f *Files) Dialer(base func(string, time.Duration) (net.Conn, error)) func(string, time.Duration) (net.Conn, error) {
	return f.dialer(base, func(addr string) *tls.Config {
		host, _, _ := net.SplitHostPort(addr)
		return f.ClientConfig(host)
	})
}

// dialer wraps base with a TLS handshake, configured per dialed address.
func (f *Files) dialer(base func(string, time.Duration) (net.Conn, error), config func(addr string) *tls.Config) func(string, time.Duration) (net.Conn, error) {
	if base == nil {
		base = func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, timeout)
		}
	}
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		raw, err := base(addr, timeout)
		if err != nil {
			return nil, err
		}
		c := tls.Client(raw, config(addr))
		_ = c.SetDeadline(time.Now().Add(timeout))
		if err := c.Handshake(); err != nil {
			raw.Close()
			return nil, fmt.Errorf("raft TLS handshake with %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}
