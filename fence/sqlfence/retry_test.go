package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// pgTwoWriters runs two fenced writes on two keys at once, each fn in two
// halves with both first halves done before either second half, on their
// first attempt only (a retry runs straight through). It returns how many
// times fn ran in all.
func pgTwoWriters(t *testing.T, f *sqlfence.Fence, firstHalf, secondHalf [2]string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var calls atomic.Int64
	var bothIn sync.WaitGroup
	bothIn.Add(2)
	errs := make(chan error, 2)
	for i, key := range []string{"k1", "k2"} {
		go func() {
			first := true
			errs <- f.Do(ctx, key, fence.Credentials{Token: 1, Lock: key}, func(ctx context.Context, tx sqlfence.Tx) error {
				calls.Add(1)
				if _, err := tx.ExecContext(ctx, firstHalf[i]); err != nil {
					return err
				}
				if first {
					first = false
					bothIn.Done()
					bothIn.Wait()
				}
				_, err := tx.ExecContext(ctx, secondHalf[i])
				return err
			})
		}()
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("a writer failed instead of being retried: %v", err)
		}
	}
	return calls.Load()
}

// TestRetriesDeadlock: two fenced transactions that lock two rows in
// opposite orders deadlock; PostgreSQL aborts one (40P01), which is run
// again and succeeds.
func TestRetriesDeadlock(t *testing.T) {
	retries := &countingHandler{}
	f, db := newFence(t, backends[1], sqlfence.Config{Logger: slog.New(retries)})
	if _, err := db.Exec(`CREATE TABLE acct (id text PRIMARY KEY, n int NOT NULL); INSERT INTO acct VALUES ('a', 0), ('b', 0)`); err != nil {
		t.Fatal(err)
	}
	// A short deadlock_timeout (this transaction only) finds it sooner.
	calls := pgTwoWriters(t, f,
		[2]string{`SET LOCAL deadlock_timeout = '50ms'; UPDATE acct SET n = n + 1 WHERE id = 'a'`, `SET LOCAL deadlock_timeout = '50ms'; UPDATE acct SET n = n + 1 WHERE id = 'b'`},
		[2]string{`UPDATE acct SET n = n + 1 WHERE id = 'b'`, `UPDATE acct SET n = n + 1 WHERE id = 'a'`})
	if calls != 3 || retries.n.Load() != 1 {
		t.Fatalf("fn ran %d times with %d retries, want 3 and 1", calls, retries.n.Load())
	}
	var a, b int
	if err := db.QueryRow(`SELECT (SELECT n FROM acct WHERE id = 'a'), (SELECT n FROM acct WHERE id = 'b')`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != 2 || b != 2 {
		t.Fatalf("acct a=%d b=%d, want both writers' updates exactly once: 2 and 2", a, b)
	}
}

// TestRetriesSerializationFailure: write skew under SERIALIZABLE — each
// transaction reads both rows and writes one — makes PostgreSQL fail one
// with 40001; it is run again and succeeds.
func TestRetriesSerializationFailure(t *testing.T) {
	retries := &countingHandler{}
	f, db := newFence(t, backends[1], sqlfence.Config{Isolation: sql.LevelSerializable, Logger: slog.New(retries)})
	if _, err := db.Exec(`CREATE TABLE oncall (id text PRIMARY KEY, on_duty bool NOT NULL); INSERT INTO oncall VALUES ('a', true), ('b', true)`); err != nil {
		t.Fatal(err)
	}
	// Each takes itself off duty if the other is on: only one may.
	off := `UPDATE oncall SET on_duty = false WHERE id = '%s' AND (SELECT count(*) FROM oncall WHERE on_duty) = 2`
	calls := pgTwoWriters(t, f,
		[2]string{`SELECT count(*) FROM oncall WHERE on_duty`, `SELECT count(*) FROM oncall WHERE on_duty`},
		[2]string{fmt.Sprintf(off, "a"), fmt.Sprintf(off, "b")})
	// At least one retry; SSI may abort more than the one it must.
	if calls < 3 || retries.n.Load() < 1 {
		t.Fatalf("fn ran %d times with %d retries, want a retry", calls, retries.n.Load())
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM oncall WHERE on_duty`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d on duty (%v), want 1: the retry saw the other's commit", n, err)
	}
}

// TestRetryIsBounded: a failure that stays retryable ends after
// MaxAttempts, and a context that ends while waiting to retry ends Do at
// once; both say what failed.
func TestRetryIsBounded(t *testing.T) {
	transient := errors.New("transient")
	isTransient := func(err error) bool { return errors.Is(err, transient) }
	fail := func(calls *int) func(context.Context, sqlfence.Tx) error {
		return func(context.Context, sqlfence.Tx) error { *calls++; return transient }
	}
	eachBackend(t, func(t *testing.T, b backend) {
		f, db := newFence(t, b, sqlfence.Config{Retryable: isTransient, MaxAttempts: 3, RetryBackoff: time.Millisecond})
		calls := 0
		err := f.Do(context.Background(), "k", fence.Credentials{Token: 1}, fail(&calls))
		if calls != 3 || !errors.Is(err, sqlfence.ErrRetriesExhausted) || !errors.Is(err, transient) {
			t.Fatalf("fn ran %d times, Do = %v; want 3 and ErrRetriesExhausted wrapping fn's error", calls, err)
		}
		wantRecord(t, f, "k", 0, "")

		slow, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, Retryable: isTransient, RetryBackoff: time.Hour, MaxBackoff: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		calls = 0
		start := time.Now()
		err = slow.Do(ctx, "k", fence.Credentials{Token: 1}, fail(&calls))
		if calls != 1 || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, transient) || time.Since(start) > 10*time.Second {
			t.Fatalf("fn ran %d times, Do = %v after %v; want 1, the deadline and fn's error, at once", calls, err, time.Since(start))
		}

		// A refusal is never retried, whatever Retryable says.
		always, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, Retryable: func(error) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		noop := func(context.Context, sqlfence.Tx) error { return nil }
		if err := always.Do(context.Background(), "k2", fence.Credentials{Token: 5}, noop); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := always.Do(context.Background(), "k2", fence.Credentials{Token: 4}, noop); !errors.Is(err, fence.ErrStaleToken) || errors.Is(err, sqlfence.ErrRetriesExhausted) {
			t.Fatalf("Do = %v, want a stale token refused once", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("a refusal was retried")
		}
	})
}

// TestSQLiteBusyIsRetried: without a busy timeout, a BEGIN IMMEDIATE while
// another connection writes fails at once with SQLITE_BUSY; Do waits and
// tries again until the writer is done.
func TestSQLiteBusyIsRetried(t *testing.T) {
	path := t.TempDir() + "/busy.db"
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	retries := &countingHandler{}
	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.SQLite, Logger: slog.New(retries), RetryBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { _, _ = conn.ExecContext(ctx, `COMMIT`) })
	start := time.Now()
	if err := f.Do(ctx, "k", fence.Credentials{Token: 1}, func(context.Context, sqlfence.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if retries.n.Load() == 0 || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("Do took %v with %d retries: it did not wait for the other writer", time.Since(start), retries.n.Load())
	}
	wantRecord(t, f, "k", 1, "")
}
