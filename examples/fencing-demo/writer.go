//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
)

// writerEnv carries client A's configuration (JSON) to the re-executed
// demo binary. Its presence makes the process client A.
const writerEnv = "FENCING_DEMO_WRITER"

// writerConfig is what client A needs to know.
type writerConfig struct {
	Endpoints  []string      `json:"endpoints"`
	Fencestore string        `json:"fencestore"`
	Lock       string        `json:"lock"`
	Key        string        `json:"key"`
	ClientID   string        `json:"client_id"`
	TTL        time.Duration `json:"ttl"`
	Values     [2]string     `json:"values"` // the first and the second write
}

// event is one line client A writes on its stdout for the demo to narrate
// and check.
type event struct {
	Ev     string `json:"ev"`
	Token  uint64 `json:"token,omitempty"`
	Proof  bool   `json:"proof,omitempty"`
	N      int    `json:"n,omitempty"` // which write
	Value  string `json:"value,omitempty"`
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`
	LeftMs int64  `json:"left_ms,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	Err    string `json:"err,omitempty"`
}

// writerMain is client A, run as its own process so that the demo can
// freeze it for real. It takes the lock, writes, checks its lease, stops
// itself with SIGSTOP between that check and its second write, and when it
// is continued writes with the token it still believes in.
func writerMain() int {
	var cfg writerConfig
	if err := json.Unmarshal([]byte(os.Getenv(writerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fencing-demo writer: bad configuration:", err)
		return 2
	}
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(e event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(e)
	}
	fail := func(format string, args ...any) int {
		emit(event{Ev: "fail", Err: fmt.Sprintf(format, args...)})
		return 1
	}
	// A bound on the whole life of A, should the demo vanish.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c, err := client.New(ctx, client.Config{Endpoints: cfg.Endpoints, ClientID: cfg.ClientID})
	if err != nil {
		return fail("connect to lockd: %v", err)
	}
	defer c.Close()
	lock, err := c.Acquire(ctx, cfg.Lock, client.WithTTL(cfg.TTL), client.WithAutoRenew(),
		client.WithWaitTimeout(30*time.Second))
	if err != nil {
		return fail("acquire %q: %v", cfg.Lock, err)
	}
	emit(event{Ev: "acquired", Pid: os.Getpid(), Token: lock.Token(), Proof: lock.Proof() != ""})

	status, body, err := fencedPut(ctx, cfg.Fencestore, cfg.Key, cfg.Values[0], lock.Fence)
	if err != nil {
		return fail("first write: %v", err)
	}
	emit(event{Ev: "put", N: 1, Token: lock.Token(), Value: cfg.Values[0], Status: status, Body: body})

	// The careful part every lock tutorial recommends: check that the
	// lease is still ours right before writing.
	select {
	case <-lock.Lost():
		return fail("lost the lock before the pause: %v", lock.Err())
	default:
	}
	emit(event{Ev: "lease", LeftMs: time.Until(lock.Deadline()).Milliseconds()})

	// ...and here the process freezes, between the check and the write:
	// what a stop-the-world GC pause, heavy swapping or a suspended VM do.
	// SIGSTOP stops every thread at once; nothing of A runs (no
	// keepalive, no renewal, no timer) until the demo sends SIGCONT.
	// Stopping itself lets A freeze at exactly this point, every run.
	//
	// A signal sent to the own process is delivered asynchronously: kill()
	// may return, and this goroutine run on, before every thread is
	// stopped. So A also waits to see the SIGCONT that the demo sends only
	// once the kernel reported A stopped (wait4 WUNTRACED): nothing after
	// this point can run before the freeze.
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	emit(event{Ev: "stopping", Pid: os.Getpid()})
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		return fail("SIGSTOP: %v", err)
	}
	select {
	case <-cont:
	case <-ctx.Done():
		return fail("never continued")
	}
	signal.Stop(cont)
	// Continued. A does not look at its lease again: it checked a moment
	// ago, as far as it can tell.
	emit(event{Ev: "resumed"})
	status, body, err = fencedPut(ctx, cfg.Fencestore, cfg.Key, cfg.Values[1], lock.Fence)
	if err != nil {
		return fail("second write: %v", err)
	}
	emit(event{Ev: "put", N: 2, Token: lock.Token(), Value: cfg.Values[1], Status: status, Body: body})

	// Its client library finds out soon after: the local lease ran out
	// during the pause, and lockd pushed "lost" when the TTL expired.
	select {
	case <-lock.Lost():
	case <-time.After(5 * time.Second):
	}
	lerr := lock.Err()
	msg := "the client library still reports the lock as held"
	switch {
	case errors.Is(lerr, client.ErrLockExpired):
		msg = "lock lost: lockd expired its TTL"
	case errors.Is(lerr, client.ErrLeaseExpired):
		msg = "lock lost: its local lease ran out"
	case lerr != nil:
		msg = "lock lost: " + lerr.Error()
	}
	emit(event{Ev: "lock_state", Err: msg})
	return 0
}

// fencedPut writes value to key in fencestore with fence setting the
// fencing headers, and returns the status and the body (trimmed).
func fencedPut(ctx context.Context, base, key, value string, fence func(*http.Request)) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, objectURL(base, key), strings.NewReader(value))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	fence(req)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := readBody(resp)
	return resp.StatusCode, strings.TrimSpace(b), err
}
