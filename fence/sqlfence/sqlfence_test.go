package sqlfence_test

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// createNotes makes the table the tests' fenced writes go to: one row per
// admitted write, naming its token.
func createNotes(t *testing.T, b backend, db *sql.DB) {
	t.Helper()
	q := `CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL, token TEXT NOT NULL, note TEXT NOT NULL)`
	if b.dialect == sqlfence.Postgres {
		q = `CREATE TABLE notes (id bigserial PRIMARY KEY, k text NOT NULL, token text NOT NULL, note text NOT NULL)`
	}
	if _, err := db.Exec(q); err != nil {
		t.Fatal(err)
	}
}

// note writes a row of notes for an admitted write.
func note(b backend, key string, token uint64, text string) func(context.Context, sqlfence.Tx) error {
	return func(ctx context.Context, tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, sqlFor(b, `INSERT INTO notes (k, token, note) VALUES ($1, $2, $3)`),
			key, fmt.Sprintf("%020d", token), text)
		return err
	}
}

// notes returns the notes of key in the order they were written.
func notes(t *testing.T, db *sql.DB, b backend, key string) []string {
	t.Helper()
	rows, err := db.Query(sqlFor(b, `SELECT note FROM notes WHERE k = $1 ORDER BY id`), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantRecord(t *testing.T, f *sqlfence.Fence, key string, token uint64, lock string) {
	t.Helper()
	rec, err := f.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Token != token || rec.Lock != lock {
		t.Fatalf("record of %q = token %d lock %q, want %d %q", key, rec.Token, rec.Lock, token, lock)
	}
}

func wantStale(t *testing.T, err error, token, highest uint64) {
	t.Helper()
	var stale *fence.StaleTokenError
	if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &stale) {
		t.Fatalf("err = %v, want a *fence.StaleTokenError", err)
	}
	if stale.Token != token || stale.Highest != highest {
		t.Fatalf("stale error says token %d highest %d, want %d %d", stale.Token, stale.Highest, token, highest)
	}
}

// TestDoAdmitsAndRefuses: the token rule and the key's lock binding, and
// that a refused write's fn never runs and leaves nothing behind.
func TestDoAdmitsAndRefuses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		f, db := newFence(t, b, sqlfence.Config{})
		createNotes(t, b, db)
		refusedFn := func(context.Context, sqlfence.Tx) error {
			t.Error("fn ran for a refused write")
			return nil
		}
		cred := func(token uint64, lock string) fence.Credentials { return fence.Credentials{Token: token, Lock: lock} }

		wantRecord(t, f, "ledger", 0, "")
		if err := f.Do(ctx, "ledger", cred(5, "L"), note(b, "ledger", 5, "first")); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, f, "ledger", 5, "L")
		if err := f.Do(ctx, "ledger", cred(5, "L"), note(b, "ledger", 5, "again")); err != nil {
			t.Fatalf("the same holder writing again: %v", err)
		}
		wantStale(t, f.Do(ctx, "ledger", cred(4, "L"), refusedFn), 4, 5)
		err := f.Do(ctx, "ledger", cred(9, "M"), refusedFn)
		var mismatch *fence.LockMismatchError
		if !errors.As(err, &mismatch) || mismatch.Bound != "L" || mismatch.Lock != "M" {
			t.Fatalf("a write under another lock: %v, want a *fence.LockMismatchError", err)
		}
		if err := f.Do(ctx, "ledger", cred(9, ""), refusedFn); !errors.Is(err, fence.ErrLockMismatch) {
			t.Fatalf("a write naming no lock to a bound key: %v", err)
		}
		if err := f.Do(ctx, "ledger", cred(6, "L"), note(b, "ledger", 6, "newer")); err != nil {
			t.Fatal(err)
		}
		wantStale(t, f.Do(ctx, "ledger", cred(5, "L"), refusedFn), 5, 6)
		wantRecord(t, f, "ledger", 6, "L")
		if got := strings.Join(notes(t, db, b, "ledger"), ","); got != "first,again,newer" {
			t.Fatalf("notes = %s", got)
		}

		// Keys are independent; one that names no lock stays unbound.
		if err := f.Do(ctx, "other", cred(1, ""), note(b, "other", 1, "x")); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, f, "other", 1, "")
		if err := f.Do(ctx, "other", cred(2, "N"), note(b, "other", 2, "y")); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, f, "other", 2, "N")

		rec, err := f.Get(ctx, "ledger")
		if err != nil {
			t.Fatal(err)
		}
		if age := time.Since(rec.UpdatedAt); age < -time.Minute || age > time.Minute {
			t.Fatalf("updated_at %v is not about now", rec.UpdatedAt)
		}
	})
}

// TestTokensOverTheWholeUint64Range: the top half of the range (where a
// signed 64-bit column would turn negative) is stored exactly and compared
// as unsigned, by the fence and inside the database.
func TestTokensOverTheWholeUint64Range(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		f, db := newFence(t, b, sqlfence.Config{})
		noop := func(context.Context, sqlfence.Tx) error { return nil }
		do := func(token uint64) error { return f.Do(ctx, "k", fence.Credentials{Token: token, Lock: "L"}, noop) }
		for _, tok := range []uint64{math.MaxInt64, 1 << 63} {
			if err := do(tok); err != nil {
				t.Fatalf("token %d: %v", tok, err)
			}
		}
		wantStale(t, do(math.MaxInt64), math.MaxInt64, 1<<63)
		if err := do(math.MaxUint64); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, f, "k", math.MaxUint64, "L")
		wantStale(t, do(math.MaxUint64-1), math.MaxUint64-1, math.MaxUint64)
		wantStale(t, do(0), 0, math.MaxUint64)
		if err := do(math.MaxUint64); err != nil {
			t.Fatalf("the highest token again: %v", err)
		}

		// In SQL: ORDER BY and comparisons follow the unsigned order.
		tokens := map[string]uint64{"t0": 0, "t1": 1, "tmax63": math.MaxInt64, "t63": 1 << 63, "t63p1": 1<<63 + 1, "tmax": math.MaxUint64 - 1}
		for k, tok := range tokens {
			if err := f.Do(ctx, k, fence.Credentials{Token: tok}, noop); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := db.Query(`SELECT resource_key FROM lockd_fence WHERE resource_key LIKE 't%' AND highest_token > ` +
			map[sqlfence.Dialect]string{sqlfence.Postgres: "9223372036854775807", sqlfence.SQLite: "'09223372036854775807'"}[b.dialect] +
			` ORDER BY highest_token`)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			got = append(got, k)
		}
		rows.Close()
		if strings.Join(got, ",") != "t63,t63p1,tmax" {
			t.Fatalf("keys above 2^63-1 in token order = %v, want t63,t63p1,tmax", got)
		}
	})
}

// TestCheckAndWritesCommitTogether: a failing fn, a panicking fn and a
// context that ends before COMMIT leave neither the token nor fn's writes.
func TestCheckAndWritesCommitTogether(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		f, db := newFence(t, b, sqlfence.Config{})
		createNotes(t, b, db)
		if err := f.Do(ctx, "k", fence.Credentials{Token: 3, Lock: "L"}, note(b, "k", 3, "kept")); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		err := f.Do(ctx, "k", fence.Credentials{Token: 8, Lock: "L"}, func(ctx context.Context, tx sqlfence.Tx) error {
			if err := note(b, "k", 8, "failed")(ctx, tx); err != nil {
				return err
			}
			return fmt.Errorf("after writing: %w", boom)
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Do = %v, want fn's error", err)
		}
		wantRecord(t, f, "k", 3, "L")

		func() {
			defer func() {
				if r := recover(); r != "oops" {
					t.Fatalf("recovered %v, want fn's panic", r)
				}
			}()
			_ = f.Do(ctx, "k", fence.Credentials{Token: 9, Lock: "L"}, func(ctx context.Context, tx sqlfence.Tx) error {
				if err := note(b, "k", 9, "panicked")(ctx, tx); err != nil {
					return err
				}
				panic("oops")
			})
		}()
		wantRecord(t, f, "k", 3, "L")

		cctx, cancel := context.WithCancel(ctx)
		err = f.Do(cctx, "k", fence.Credentials{Token: 10, Lock: "L"}, func(ctx context.Context, tx sqlfence.Tx) error {
			if err := note(b, "k", 10, "cancelled")(ctx, tx); err != nil {
				return err
			}
			cancel()
			return nil
		})
		if err == nil {
			t.Fatal("Do committed after its context ended")
		}
		wantRecord(t, f, "k", 3, "L")
		if got := strings.Join(notes(t, db, b, "k"), ","); got != "kept" {
			t.Fatalf("notes = %s, want only kept", got)
		}
		// The connections the failed transactions used are fine (or were
		// dropped): the next write works.
		for i := 0; i < 3; i++ {
			if err := f.Do(ctx, "k", fence.Credentials{Token: 4, Lock: "L"}, note(b, "k", 4, "after")); err != nil {
				t.Fatal(err)
			}
		}
		wantRecord(t, f, "k", 4, "L")
	})
}

// TestProofs: with a verify key, the proof refusals of fencestore, in the
// same order (a stale token is stale first), and guards.
func TestProofs(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "sqlfence-proof-test-seed")
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	now := time.UnixMilli(1_800_000_000_000)
	live, past := now.Add(time.Hour).UnixMilli(), now.Add(-time.Millisecond).UnixMilli()
	signed := func(lock string, token uint64, exp int64) fence.Credentials {
		return fence.Credentials{Token: token, Lock: lock, Proof: fence.Sign(priv, lock, token, exp)}
	}
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		guards, err := fence.NewGuards(fence.Guard{Prefix: "acct/", Lock: "ledger"})
		if err != nil {
			t.Fatal(err)
		}
		f, db := newFence(t, b, sqlfence.Config{VerifyKey: pub, Guards: guards, Now: func() time.Time { return now }})
		createNotes(t, b, db)
		noop := func(context.Context, sqlfence.Tx) error { return nil }
		if err := f.Do(ctx, "acct/a", signed("ledger", 10, live), noop); err != nil {
			t.Fatal(err)
		}
		shared := fence.Credentials{Token: 11, Lock: "ledger",
			Proof: fence.SignGrant(priv, fence.Grant{Lock: "ledger", Token: 11, Mode: fence.ModeShared, ExpiresAt: live})}
		forged := signed("ledger", 11, live)
		forged.Token = 12
		for _, tc := range []struct {
			name string
			c    fence.Credentials
			want error
		}{
			{"missing proof", fence.Credentials{Token: 11, Lock: "ledger"}, fence.ErrMissingProof},
			{"proof without its lock", fence.Credentials{Token: 11, Proof: signed("ledger", 11, live).Proof}, fence.ErrLockMismatch},
			{"proof of another token", forged, fence.ErrBadProof},
			{"a reader's proof", shared, fence.ErrSharedProof},
			{"expired proof", signed("ledger", 11, past), fence.ErrExpiredProof},
			{"stale and expired: stale", signed("ledger", 9, past), fence.ErrStaleToken},
			{"valid proof of another lock", signed("other", 99, live), fence.ErrLockMismatch},
			{"invalid lock name", fence.Credentials{Token: 11, Lock: "no spaces"}, fence.ErrInvalidLock},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := f.Do(ctx, "acct/a", tc.c, noop); !errors.Is(err, tc.want) {
					t.Fatalf("Do = %v, want %v", err, tc.want)
				}
				wantRecord(t, f, "acct/a", 10, "ledger")
			})
		}
		// An unguarded key: a proof without its lock is ErrMissingLock.
		if err := f.Do(ctx, "free", fence.Credentials{Token: 11, Proof: signed("x", 11, live).Proof}, noop); !errors.Is(err, fence.ErrMissingLock) {
			t.Fatalf("Do = %v, want ErrMissingLock", err)
		}
		// A grant without expiry of its own (a session lock) never expires.
		if err := f.Do(ctx, "acct/a", signed("ledger", 12, 0), noop); err != nil {
			t.Fatal(err)
		}

		lenient, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, VerifyKey: pub, Guards: guards,
			Now: func() time.Time { return now }, AcceptExpiredProofs: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := lenient.Do(ctx, "acct/a", signed("ledger", 13, past), noop); err != nil {
			t.Fatalf("AcceptExpiredProofs: %v", err)
		}
		if err := lenient.Do(ctx, "acct/a", signed("ledger", 12, past), noop); !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("AcceptExpiredProofs still checks tokens: %v", err)
		}
		wantRecord(t, f, "acct/a", 13, "ledger")
	})
}

// TestFirstWriteBindingAndGuards: a guard wins over the lock a key was
// bound to by its first write, and replaces it.
func TestFirstWriteBindingAndGuards(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		noop := func(context.Context, sqlfence.Tx) error { return nil }
		f, db := newFence(t, b, sqlfence.Config{})
		if err := f.Do(ctx, "reports/q3", fence.Credentials{Token: 4, Lock: "old"}, noop); err != nil {
			t.Fatal(err)
		}
		guards, err := fence.NewGuards(fence.Guard{Prefix: "reports/", Lock: "reports"})
		if err != nil {
			t.Fatal(err)
		}
		g, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, Guards: guards})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Do(ctx, "reports/q3", fence.Credentials{Token: 5, Lock: "old"}, noop); !errors.Is(err, fence.ErrLockMismatch) {
			t.Fatalf("the old binding against a guard: %v", err)
		}
		if err := g.Do(ctx, "reports/q3", fence.Credentials{Token: 5, Lock: "reports"}, noop); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, g, "reports/q3", 5, "reports")
		// The binding the guard wrote stays without the guard.
		if err := f.Do(ctx, "reports/q3", fence.Credentials{Token: 6, Lock: "old"}, noop); !errors.Is(err, fence.ErrLockMismatch) {
			t.Fatalf("after the guard's write, the old lock: %v", err)
		}
	})
}

// TestReset: the operator's way out of a key blocked by the largest token.
func TestReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		noop := func(context.Context, sqlfence.Tx) error { return nil }
		f, db := newFence(t, b, sqlfence.Config{})
		if err := f.Do(ctx, "k", fence.Credentials{Token: math.MaxUint64, Lock: "L"}, noop); err != nil {
			t.Fatal(err)
		}
		wantStale(t, f.Do(ctx, "k", fence.Credentials{Token: 7, Lock: "L"}, noop), 7, math.MaxUint64)
		prev, err := f.Reset(ctx, "k", 7)
		if err != nil {
			t.Fatal(err)
		}
		if prev.Token != math.MaxUint64 || prev.Lock != "L" {
			t.Fatalf("Reset returned %+v", prev)
		}
		wantRecord(t, f, "k", 7, "")
		wantStale(t, f.Do(ctx, "k", fence.Credentials{Token: 6, Lock: "M"}, noop), 6, 7)
		if err := f.Do(ctx, "k", fence.Credentials{Token: 7, Lock: "M"}, noop); err != nil {
			t.Fatalf("after a reset the key is unbound: %v", err)
		}
		wantRecord(t, f, "k", 7, "M")

		if _, err := f.Reset(ctx, "never-written", 0); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRow(sqlFor(b, `SELECT count(*) FROM lockd_fence WHERE resource_key = $1`), "never-written").Scan(&n); err != nil || n != 0 {
			t.Fatalf("a reset to 0 of a key without a row stored %d rows (%v)", n, err)
		}
	})
}

// TestMigrate: idempotent, safe concurrently, in a table of one's own
// choosing, and it refuses a table of the same name that is something else.
func TestMigrate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db := b.open(t)
		f, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- f.Migrate(ctx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent Migrate: %v", err)
			}
		}
		if err := f.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		if err := f.Do(ctx, "k", fence.Credentials{Token: 1}, func(context.Context, sqlfence.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := f.Migrate(ctx); err != nil {
			t.Fatalf("Migrate over data: %v", err)
		}
		wantRecord(t, f, "k", 1, "")

		// A schema-qualified table in PostgreSQL, an attached database's
		// in SQLite: "main" is always there.
		table := "main.fenced"
		if b.dialect == sqlfence.Postgres {
			if _, err := db.Exec(`CREATE SCHEMA fencing`); err != nil {
				t.Fatal(err)
			}
			table = "fencing.fenced"
		}
		own, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := own.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := own.Do(ctx, "k", fence.Credentials{Token: 9}, func(context.Context, sqlfence.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, own, "k", 9, "")
		wantRecord(t, f, "k", 1, "")

		if _, err := db.Exec(`CREATE TABLE imposter (resource_key TEXT PRIMARY KEY, token INTEGER)`); err != nil {
			t.Fatal(err)
		}
		bad, err := sqlfence.New(db, sqlfence.Config{Dialect: b.dialect, Table: "imposter"})
		if err != nil {
			t.Fatal(err)
		}
		if err := bad.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "not a guard table") {
			t.Fatalf("Migrate over another table: %v", err)
		}
	})
}

// TestStoredForm: what the guard table holds, and that the database itself
// refuses a token that is not one.
func TestStoredForm(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		f, db := newFence(t, b, sqlfence.Config{})
		if err := f.Do(ctx, "k", fence.Credentials{Token: 42, Lock: "L"}, func(context.Context, sqlfence.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		var tok string
		q := map[sqlfence.Dialect]string{
			sqlfence.Postgres: `SELECT highest_token::text FROM lockd_fence WHERE resource_key = 'k'`,
			sqlfence.SQLite:   `SELECT highest_token FROM lockd_fence WHERE resource_key = 'k'`,
		}[b.dialect]
		if err := db.QueryRow(q).Scan(&tok); err != nil {
			t.Fatal(err)
		}
		want := map[sqlfence.Dialect]string{sqlfence.Postgres: "42", sqlfence.SQLite: "00000000000000000042"}[b.dialect]
		if tok != want {
			t.Fatalf("stored token %q, want %q", tok, want)
		}
		bad := map[sqlfence.Dialect][]string{
			sqlfence.Postgres: {"-1", "18446744073709551616"},
			sqlfence.SQLite:   {"'42'", "'0000000000000000004x'", "'18446744073709551616'", "42"},
		}[b.dialect]
		for _, v := range bad {
			if _, err := db.Exec(`INSERT INTO lockd_fence (resource_key, guard_lock, highest_token, updated_at) VALUES ('bad', '', ` +
				v + `, '2024-01-01T00:00:00.000Z')`); err == nil {
				t.Fatalf("the table took highest_token %s", v)
			}
		}
	})
}

// TestBadInput: bad keys, lock names and configurations get clear errors
// and change nothing.
func TestBadInput(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/x.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, cfg := range []sqlfence.Config{
		{},
		{Dialect: 9},
		{Dialect: sqlfence.SQLite, Table: "x; DROP TABLE y"},
		{Dialect: sqlfence.SQLite, Table: "1x"},
		{Dialect: sqlfence.SQLite, Table: "a.b.c"},
		{Dialect: sqlfence.SQLite, VerifyKey: make([]byte, 12)},
		{Dialect: sqlfence.SQLite, Isolation: sql.LevelReadCommitted},
		{Dialect: sqlfence.Postgres, MaxAttempts: -1},
	} {
		if _, err := sqlfence.New(db, cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
	if _, err := sqlfence.New(nil, sqlfence.Config{Dialect: sqlfence.SQLite}); err == nil {
		t.Error("New accepted a nil db")
	}

	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ran := false
	fn := func(context.Context, sqlfence.Tx) error { ran = true; return nil }
	for _, key := range []string{"", strings.Repeat("k", fence.MaxKeyBytes+1), "a\x00b", "\xff\xfe"} {
		if err := f.Do(ctx, key, fence.Credentials{Token: 1}, fn); !errors.Is(err, sqlfence.ErrInvalidKey) {
			t.Errorf("Do(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := f.Get(ctx, key); !errors.Is(err, sqlfence.ErrInvalidKey) {
			t.Errorf("Get(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	if err := f.Do(ctx, strings.Repeat("k", fence.MaxKeyBytes), fence.Credentials{Token: 1}, fn); err != nil || !ran {
		t.Fatalf("the longest key: %v", err)
	}
	if err := f.Do(ctx, "k", fence.Credentials{Token: 1}, nil); err == nil {
		t.Error("Do accepted a nil fn")
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM lockd_fence`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows = %d (%v), want only the longest key's", n, err)
	}

	// fn cannot reach the transaction's commit.
	_ = f.Do(ctx, "k", fence.Credentials{Token: 2}, func(_ context.Context, tx sqlfence.Tx) error {
		if _, ok := tx.(*sql.Tx); ok {
			t.Error("fn got the *sql.Tx")
		}
		if _, ok := tx.(*sql.Conn); ok {
			t.Error("fn got the *sql.Conn")
		}
		return nil
	})
}
