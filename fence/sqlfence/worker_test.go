package sqlfence_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// workerEnv carries the chaos test's holder configuration (JSON) to the
// test binary run again as that holder.
const workerEnv = "SQLFENCE_TEST_WORKER"

type workerConfig struct {
	Lockd     string            `json:"lockd"`
	DSN       string            `json:"dsn"`
	Lock      string            `json:"lock"`
	Key       string            `json:"key"`
	TTL       time.Duration     `json:"ttl"`
	VerifyKey ed25519.PublicKey `json:"verify_key"`
}

// workerEvent is a line the holder writes on its stdout.
type workerEvent struct {
	Ev      string `json:"ev"` // acquired, wrote, refused, fail
	Token   uint64 `json:"token,omitempty"`
	Proof   bool   `json:"proof,omitempty"`
	Stale   bool   `json:"stale,omitempty"`
	Highest uint64 `json:"highest,omitempty"`
	Err     string `json:"err,omitempty"`
}

// workerMain is the holder the chaos test freezes: it takes the lock (TTL,
// renewed automatically), then makes one fenced write to PostgreSQL per
// "write" line on its stdin, reporting each on stdout, until a write is
// refused or stdin ends.
func workerMain() int {
	enc := json.NewEncoder(os.Stdout)
	emit := func(e workerEvent) { _ = enc.Encode(e) }
	fail := func(format string, args ...any) int {
		emit(workerEvent{Ev: "fail", Err: fmt.Sprintf(format, args...)})
		return 1
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		return fail("configuration: %v", err)
	}
	// A bound on the holder's life, should the test vanish.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c, err := client.New(ctx, client.Config{Endpoints: []string{cfg.Lockd}, ClientID: "holder-a"})
	if err != nil {
		return fail("connect to lockd: %v", err)
	}
	defer c.Close()
	lock, err := c.Acquire(ctx, cfg.Lock, client.WithTTL(cfg.TTL), client.WithAutoRenew(), client.WithWaitTimeout(30*time.Second))
	if err != nil {
		return fail("acquire: %v", err)
	}
	db, err := sql.Open("pgx", cfg.DSN)
	if err != nil {
		return fail("open: %v", err)
	}
	defer db.Close()
	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.Postgres, VerifyKey: cfg.VerifyKey})
	if err != nil {
		return fail("sqlfence: %v", err)
	}
	emit(workerEvent{Ev: "acquired", Token: lock.Token(), Proof: lock.Proof() != ""})

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		err := f.Do(ctx, cfg.Key, sqlfence.CredentialsOf(lock), func(ctx context.Context, tx sqlfence.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO entries (writer, token) VALUES ('A', $1)`, lock.Token())
			return err
		})
		var stale *fence.StaleTokenError
		switch {
		case err == nil:
			emit(workerEvent{Ev: "wrote", Token: lock.Token()})
		case errors.As(err, &stale):
			emit(workerEvent{Ev: "refused", Token: lock.Token(), Stale: true, Highest: stale.Highest, Err: err.Error()})
			return 0
		default:
			emit(workerEvent{Ev: "refused", Token: lock.Token(), Err: err.Error()})
			return 0
		}
	}
	return 0
}
