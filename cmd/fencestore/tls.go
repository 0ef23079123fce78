package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// tlsFiles is fencestore's server certificate and, optionally, the CA its
// clients' certificates must chain to. reload re-reads the files; each new
// handshake uses what was last loaded, so certificates rotate without a
// restart.
type tlsFiles struct {
	cert, key, ca string

	mu   sync.RWMutex
	kp   *tls.Certificate
	pool *x509.CertPool
}

// reload reads the files; on error the ones loaded before stay in use.
func (f *tlsFiles) reload() error {
	kp, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("TLS certificate %s / key %s: %w", f.cert, f.key, err)
	}
	var pool *x509.CertPool
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return fmt.Errorf("--client-ca: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--client-ca %s: no PEM certificate in the file", f.ca)
		}
	}
	f.mu.Lock()
	f.kp, f.pool = &kp, pool
	f.mu.Unlock()
	return nil
}

// config is the listener's TLS configuration: the current certificate and,
// with a client CA, client certificates required and verified against the
// current pool.
func (f *tlsFiles) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			f.mu.RLock()
			kp, pool := f.kp, f.pool
			f.mu.RUnlock()
			if kp == nil {
				return nil, errors.New("no certificate loaded")
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*kp}}
			if pool != nil {
				c.ClientCAs = pool
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}
