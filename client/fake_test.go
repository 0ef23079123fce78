package client_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
)

// The fake lockd the tests run against lives in package lockdtest (so that
// cmd/lockctl's tests can use it too); these are the helpers around it.

// A real cluster (secure_test.go) leaves hashicorp/raft's readers of
// inbound connections from killed members, which its NetworkTransport does
// not close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"))
}

// newFake starts a fake cluster closed at the end of the test.
func newFake(t *testing.T, opts lockdtest.Options) *lockdtest.Cluster {
	t.Helper()
	opts.Logf = t.Logf
	f := lockdtest.New(opts)
	t.Cleanup(f.Close)
	return f
}

// tlog is a slog handler target that writes to the test log.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// newClient opens a client on the fake, closed at the end of the test.
func newClient(t *testing.T, f *lockdtest.Cluster, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.Endpoints == nil {
		cfg.Endpoints = f.URLs()
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = time.Second
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitClosed waits for ch to close.
func waitClosed(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

type acquired struct {
	l   *client.Lock
	err error
}

// acquireAsync runs Acquire in a goroutine the test waits for at cleanup.
func acquireAsync(t *testing.T, c *client.Client, name string, opts ...client.AcquireOption) <-chan acquired {
	ch := make(chan acquired, 1)
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	go func() {
		defer close(done)
		defer cancel()
		l, err := c.Acquire(ctx, name, opts...)
		ch <- acquired{l, err}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func waitAcquired(t *testing.T, ch <-chan acquired, within time.Duration) *client.Lock {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("acquire: %v", a.err)
		}
		return a.l
	case <-time.After(within):
		t.Fatalf("no grant within %v", within)
	}
	return nil
}

func equal(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}
