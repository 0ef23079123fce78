package sqlfence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Tx is what fn writes through: the transaction in which Do checked the
// key's fence. Its methods are those of *sql.Tx (and of sqlc's DBTX), so
// code written for a *sql.Tx runs on it; committing and rolling back are
// Do's.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// querier runs the fence's own statements: a *sql.Tx (PostgreSQL) or the
// *sql.Conn a BEGIN IMMEDIATE was run on (SQLite).
type querier = Tx

// txOf hides the concrete *sql.Tx or *sql.Conn from fn, so that it cannot
// commit, roll back or begin behind the fence's back.
func txOf(q querier) Tx { return tx{q} }

type tx struct{ q querier }

func (t tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.q.ExecContext(ctx, query, args...)
}

func (t tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.q.QueryContext(ctx, query, args...)
}

func (t tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.q.QueryRowContext(ctx, query, args...)
}

func (t tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return t.q.PrepareContext(ctx, query)
}

// run runs body in a transaction, committed when body returns nil, and
// again on a retryable error, per the retry policy. A refusal is returned
// as the fence's own error, unwrapped from its marker.
func (f *Fence) run(ctx context.Context, what string, body func(context.Context, querier) error) error {
	for attempt := 1; ; attempt++ {
		err := f.once(ctx, body)
		if err == nil {
			return nil
		}
		var r refusal
		if errors.As(err, &r) {
			return r.error
		}
		if ctx.Err() != nil || !f.retry.retryable(err) {
			return err
		}
		if attempt >= f.retry.attempts {
			return fmt.Errorf("%w: %d attempts: %w", ErrRetriesExhausted, attempt, err)
		}
		wait := f.retry.backoff(attempt)
		f.log.Debug("retrying fenced transaction", "table", f.table, "key", what, "attempt", attempt,
			"backoff", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sqlfence: %w, waiting to retry after: %w", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// once runs body in one transaction of the dialect.
func (f *Fence) once(ctx context.Context, body func(context.Context, querier) error) error {
	if f.dialect == SQLite {
		return f.onceSQLite(ctx, body)
	}
	tx, err := f.db.BeginTx(ctx, &sql.TxOptions{Isolation: f.isolation})
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done { // an error or a panic in body
			_ = tx.Rollback()
		}
	}()
	if err := body(ctx, tx); err != nil {
		return err
	}
	done = true
	return tx.Commit()
}

// onceSQLite runs body between a raw BEGIN IMMEDIATE and COMMIT on a
// connection of its own (see the package documentation for why not
// BeginTx).
func (f *Fence) onceSQLite(ctx context.Context, body func(context.Context, querier) error) error {
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		if ctx.Err() != nil {
			// The BEGIN may have run before the context ended: never
			// pool a connection that may be inside a transaction.
			discard(conn)
		}
		return err
	}
	done := false
	defer func() {
		if !done { // an error or a panic in body, or a failed COMMIT
			rollback(conn)
		}
	}()
	if err := body(ctx, conn); err != nil {
		return err
	}
	// A COMMIT that fails (SQLITE_BUSY) leaves the transaction open: the
	// deferred ROLLBACK ends it.
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	done = true
	return nil
}

// rollback ends conn's transaction, with a context of its own (the
// caller's may be what ended it). If ROLLBACK fails, SQLite has already
// rolled back (after an interrupt, or an I/O or full-disk error) or the
// connection's state is unknown: it is closed rather than pooled.
func rollback(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		discard(conn)
	}
}

// discard closes conn's driver connection instead of returning it to the
// pool: database/sql drops a connection whose use reports ErrBadConn.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// retryPolicy says which failures to retry, how often and how long to wait.
type retryPolicy struct {
	attempts   int
	first, max time.Duration
	retryable  func(error) bool
}

// backoff is the wait after the attempt-th failure: half of its bound plus
// a random part of the other half, the bound doubling from first up to max.
func (p retryPolicy) backoff(attempt int) time.Duration {
	bound := p.max
	if attempt-1 < 32 {
		if d := p.first << (attempt - 1); d > 0 && d < p.max {
			bound = d
		}
	}
	half := bound / 2
	return half + rand.N(bound-half+1)
}

// defaultRetryable: PostgreSQL serialization failures and deadlocks (by
// SQLSTATE, which pgx's and lib/pq's errors report through SQLState()), and
// for SQLite a busy or locked database (by result code, which
// modernc.org/sqlite's errors report through Code(); the low byte is the
// primary code).
func defaultRetryable(d Dialect) func(error) bool {
	return func(err error) bool {
		var pg interface{ SQLState() string }
		if errors.As(err, &pg) {
			switch pg.SQLState() {
			case "40001", "40P01":
				return true
			}
			return false
		}
		if d == SQLite {
			var lite interface{ Code() int }
			if errors.As(err, &lite) {
				switch lite.Code() & 0xff {
				case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
					return true
				}
			}
		}
		return false
	}
}
