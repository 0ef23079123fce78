// Command fencestore is a resource server that accepts a write only with a
// fencing token not lower than the highest it has accepted for that key, so a
// lock holder that lost its lock cannot overwrite a newer holder's data.
// Each key is bound to the lock that guards it (--guard PREFIX=LOCK, the
// longest matching prefix winning, else the Fencing-Lock of the key's first
// accepted write), and a write naming another lock is refused whatever its
// token. Values, tokens and bindings live in one bbolt file; see package
// fence for the API and cmd/fencestore/README.md for operations.
//
//	fencestore --addr 127.0.0.1:7090 --data-dir ./fencestore-data [--verify-key FILE]
//	           [--guard PREFIX=LOCK ...] [--admin-token-file FILE]
//	           [--tls-cert FILE --tls-key FILE [--client-ca FILE]]
//
// Without --verify-key, tokens are whatever clients send: one PUT with
// Fencing-Token 18446744073709551615 blocks a key for good. With
// --admin-token-file, DELETE /v1/objects/{key}/fence resets a key's token
// and binding.
//
// With --tls-cert and --tls-key it serves HTTPS; with --client-ca it also
// requires client certificates signed by that CA (mTLS). SIGHUP re-reads the
// three files; a file that fails to load is logged and the previous ones stay
// in use. Every flag may also come from FENCESTORE_<FLAG> in the environment
// (FENCESTORE_TLS_CERT, FENCESTORE_TLS_KEY, FENCESTORE_CLIENT_CA, ...).
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/tlsfiles"
	"github.com/lockd/lockd/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// run is main with its inputs passed in; it returns the exit code.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencestore:", err)
		return 2
	}
	if cfg.ShowVersion {
		fmt.Fprintln(os.Stdout, "fencestore", version.String())
		return 0
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("fencestore failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the server until ctx ends, then shuts down in order: stop
// accepting, let requests in flight finish, close the store.
func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	var pub ed25519.PublicKey
	if cfg.VerifyKey != "" {
		var err error
		if pub, err = fence.LoadPublicKey(cfg.VerifyKey); err != nil {
			return err
		}
	}
	guards, err := fence.NewGuards(cfg.Guards...)
	if err != nil {
		return err
	}
	var adminToken string
	if cfg.AdminTokenFile != "" {
		if adminToken, err = readAdminToken(cfg.AdminTokenFile); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return err
	}
	store, err := fence.OpenBoltStore(cfg.DBPath())
	if err != nil {
		return err
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
	}()
	handler, err := fence.NewServer(fence.ServerConfig{
		Store:         store,
		VerifyKey:     pub,
		Guards:        guards,
		AdminToken:    adminToken,
		MaxValueBytes: cfg.MaxValueBytes,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	var certs *tlsfiles.Files
	if cfg.TLS() {
		certs = &tlsfiles.Files{Cert: cfg.TLSCert, Key: cfg.TLSKey, CA: cfg.ClientCA}
		if err := certs.Reload(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	if certs != nil {
		ln = tls.NewListener(ln, certs.ServerConfig())
		// SIGHUP re-reads the certificate files (only with TLS: without it
		// SIGHUP keeps its default meaning).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		done := make(chan struct{})
		var wg sync.WaitGroup
		defer func() {
			signal.Stop(hup)
			close(done)
			wg.Wait()
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-hup:
					if err := certs.Reload(); err != nil {
						log.Error("TLS files not reloaded; the previous ones stay in use", "err", err)
					} else {
						log.Info("TLS files reloaded", "cert", cfg.TLSCert, "client_ca", cfg.ClientCA)
					}
				case <-done:
					return
				}
			}
		}()
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir,
		"verify_proofs", pub != nil, "guards", len(cfg.Guards), "admin_reset", adminToken != "",
		"tls", cfg.TLS(), "client_certs", cfg.ClientCA != "")
	for _, g := range guards.List() {
		log.Info("guard", "prefix", g.Prefix, "lock", g.Lock)
	}
	if pub == nil {
		log.Warn("no --verify-key: fencing tokens are not authenticated; any client can write any token, and one write with the largest token blocks its key until an admin reset")
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err // Serve never returns nil before Shutdown
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // cut the requests that did not finish in time
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}
