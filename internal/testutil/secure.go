package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// AuthFile writes a token file (auth's JSON format) to a temp dir and loads
// it; the path lets a test rewrite it and reload.
func AuthFile(t testing.TB, tokensJSON string) (string, *auth.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(path, []byte(tokensJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, store
}

// Secure is an Options.Modify that turns everything on: HTTPS with client
// certificates required on the client API and mutual TLS between members
// (each member gets a member certificate of its cluster from ca, for both),
// bearer tokens from store, and peerToken for the members' calls to each
// other.
func Secure(ca *CA, store *auth.Store, peerToken string) func(*server.Config) {
	return func(cfg *server.Config) {
		cluster := cfg.ClusterID
		if cluster == "" {
			cluster = tlsfiles.DefaultCluster
		}
		cert, key := ca.IssueMember(cluster, cfg.ID)
		cfg.TLS = &tlsfiles.Files{Cert: cert, Key: key, CA: ca.CertPEM}
		cfg.PeerTLS = &tlsfiles.Files{Cert: cert, Key: key, CA: ca.CertPEM}
		cfg.Auth = store
		cfg.PeerToken = peerToken
	}
}
