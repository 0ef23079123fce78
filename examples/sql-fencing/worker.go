//go:build unix

package main

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// workerEnv carries worker A's configuration (JSON) to the re-executed
// program. Its presence makes the process worker A.
const workerEnv = "SQL_FENCING_WORKER"

// workerConfig is what worker A needs to know.
type workerConfig struct {
	Lockd     []string          `json:"lockd"`
	DSN       string            `json:"dsn"`
	Lock      string            `json:"lock"`
	Run       string            `json:"run"`
	ClientID  string            `json:"client_id"`
	TTL       time.Duration     `json:"ttl"`
	VerifyKey ed25519.PublicKey `json:"verify_key,omitempty"`
	Unfenced  bool              `json:"unfenced,omitempty"`
}

// event is one line worker A writes on its stdout, for the demo to narrate
// and check.
type event struct {
	Ev      string `json:"ev"`
	Pid     int    `json:"pid,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Proof   bool   `json:"proof,omitempty"`
	Plan    *plan  `json:"plan,omitempty"`
	LeftMs  int64  `json:"left_ms,omitempty"`
	Stale   bool   `json:"stale,omitempty"`
	Highest uint64 `json:"highest,omitempty"`
	Err     string `json:"err,omitempty"`
}

// workerMain is worker A, a process of its own so that the demo can
// freeze it for real. It takes the lock, makes one transfer, reads the
// balances for a second, checks its lease, stops itself (SIGSTOP) between
// that check and its write, and when continued writes the balances it
// computed before the pause.
func workerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "sql-fencing worker: bad configuration:", err)
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
	// A bound on A's whole life, should the demo vanish.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	db, err := sql.Open("pgx", cfg.DSN)
	if err != nil {
		return fail("open the database: %v", err)
	}
	defer db.Close()
	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.Postgres, VerifyKey: cfg.VerifyKey})
	if err != nil {
		return fail("sqlfence: %v", err)
	}
	l := ledgerOf(db, f, cfg.Run)

	c, err := client.New(ctx, client.Config{Endpoints: cfg.Lockd, ClientID: cfg.ClientID})
	if err != nil {
		return fail("connect to lockd: %v", err)
	}
	defer c.Close()
	lock, err := c.Acquire(ctx, cfg.Lock, client.WithTTL(cfg.TTL), client.WithAutoRenew(), client.WithWaitTimeout(30*time.Second))
	if err != nil {
		return fail("acquire %q: %v", cfg.Lock, err)
	}
	emit(event{Ev: "acquired", Pid: os.Getpid(), Token: lock.Token(), Proof: lock.Proof() != ""})

	// The credentials are read from the lock at each write: the token
	// stays, the proof may be a fresher one.
	if err := l.transfer(ctx, sqlfence.CredentialsOf(lock), "A", "alice", "bob", 100); err != nil {
		return fail("transfer #1: %v", err)
	}
	emit(event{Ev: "transferred", Token: lock.Token()})

	// Transfer #2 computes the new balances from a read, then does
	// something slow before it writes them (a call to a payment provider,
	// say): the write depends on a read that is only right while A holds
	// the lock.
	p, err := l.planTransfer(ctx, "alice", "bob", 100)
	if err != nil {
		return fail("transfer #2: %v", err)
	}
	emit(event{Ev: "planned", Plan: &p})
	select {
	case <-lock.Lost():
		return fail("lost the lock before the pause: %v", lock.Err())
	default:
	}
	emit(event{Ev: "lease", LeftMs: time.Until(lock.Deadline()).Milliseconds()})

	// ...and here A freezes, between its lease check and its write: what
	// a stop-the-world GC pause, heavy swapping or a suspended VM do.
	// SIGSTOP stops every thread (no renewal, no keepalive) until the demo
	// sends SIGCONT, which it does only once the kernel reported A stopped;
	// A waits to see it, so nothing below runs before the freeze.
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
	emit(event{Ev: "resumed"})

	// A does not look at its lease again: it checked a moment ago, as far
	// as it can tell.
	err = l.apply(ctx, sqlfence.CredentialsOf(lock), "A", p, !cfg.Unfenced)
	var stale *fence.StaleTokenError
	switch {
	case err == nil:
		emit(event{Ev: "applied", Token: lock.Token()})
	case errors.As(err, &stale):
		emit(event{Ev: "refused", Token: lock.Token(), Stale: true, Highest: stale.Highest, Err: err.Error()})
	default:
		emit(event{Ev: "refused", Token: lock.Token(), Err: err.Error()})
	}

	// Its client library finds out soon after: the local lease ran out
	// during the pause, and lockd pushed "lost" when the TTL expired.
	select {
	case <-lock.Lost():
	case <-time.After(5 * time.Second):
	}
	msg := "the client library still reports the lock as held"
	switch lerr := lock.Err(); {
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
