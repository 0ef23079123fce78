// Command fencestore is a resource server that accepts a write only with a
// fencing token not lower than the highest it has accepted for that key, so a
// lock holder that lost its lock cannot overwrite a newer holder's data.
// Values and tokens live in one bbolt file; see package fence for the API.
//
//	fencestore --addr 127.0.0.1:7090 --data-dir ./fencestore-data [--verify-key FILE]
package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lockd/lockd/fence"
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
		MaxValueBytes: cfg.MaxValueBytes,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir,
		"verify_proofs", pub != nil)

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
