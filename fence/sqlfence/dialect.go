package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockd/lockd/fence"
)

// Dialect is the SQL a Fence speaks.
type Dialect int

// The dialects.
const (
	// Postgres: PostgreSQL 9.5 or later (INSERT ... ON CONFLICT).
	Postgres Dialect = iota + 1
	// SQLite: SQLite 3.24 or later (upsert).
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// updatedAtLayout is how both dialects render updated_at for Get.
const updatedAtLayout = "2006-01-02T15:04:05.000Z"

// maxToken is 2^64-1 in decimal: 20 digits.
const maxToken = "18446744073709551615"

// statements are a dialect's SQL for one table.
type statements struct {
	create []string // Migrate, in order
	probe  string   // fails unless the table has the columns this package uses
	// insertRow makes the key's row if missing, returning a row only when
	// it did (PostgreSQL, to lock a row that exists); "" where the write
	// lock is taken by BEGIN (SQLite).
	insertRow string
	// selectRow reads guard_lock and the token as text, locking the row.
	selectRow string
	// upsert stores guard_lock and the token (as encodeToken makes it).
	upsert    string
	deleteRow string
	// get reads the row, updated_at as updatedAtLayout in UTC.
	get string
}

func newStatements(d Dialect, table string) statements {
	r := strings.NewReplacer("{t}", table, "{max}", maxToken)
	var s statements
	switch d {
	case Postgres:
		s = statements{
			create: []string{`CREATE TABLE IF NOT EXISTS {t} (
	resource_key  text PRIMARY KEY,
	guard_lock    text NOT NULL DEFAULT '',
	highest_token numeric(20,0) NOT NULL CHECK (highest_token >= 0 AND highest_token <= {max}),
	updated_at    timestamptz NOT NULL DEFAULT now()
)`},
			probe:     `SELECT resource_key, guard_lock, highest_token, updated_at FROM {t} WHERE false`,
			insertRow: `INSERT INTO {t} (resource_key, guard_lock, highest_token, updated_at) VALUES ($1, '', 0, now()) ON CONFLICT (resource_key) DO NOTHING RETURNING true`,
			selectRow: `SELECT guard_lock, highest_token::text FROM {t} WHERE resource_key = $1 FOR UPDATE`,
			upsert:    `UPDATE {t} SET guard_lock = $2, highest_token = $3::numeric, updated_at = now() WHERE resource_key = $1`,
			deleteRow: `DELETE FROM {t} WHERE resource_key = $1`,
			get:       `SELECT guard_lock, highest_token::text, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') FROM {t} WHERE resource_key = $1`,
		}
	case SQLite:
		// highest_token: 20 digits, zero-padded, so that text order is
		// numeric order over the whole uint64 range (INTEGER is signed).
		s = statements{
			create: []string{`CREATE TABLE IF NOT EXISTS {t} (
	resource_key  TEXT NOT NULL PRIMARY KEY,
	guard_lock    TEXT NOT NULL DEFAULT '',
	highest_token TEXT NOT NULL CHECK (length(highest_token) = 20 AND highest_token NOT GLOB '*[^0-9]*' AND highest_token <= '{max}'),
	updated_at    TEXT NOT NULL
) WITHOUT ROWID`},
			probe:     `SELECT resource_key, guard_lock, highest_token, updated_at FROM {t} WHERE 0`,
			selectRow: `SELECT guard_lock, highest_token FROM {t} WHERE resource_key = ?`,
			upsert: `INSERT INTO {t} (resource_key, guard_lock, highest_token, updated_at)
	VALUES (?1, ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
	ON CONFLICT (resource_key) DO UPDATE SET guard_lock = excluded.guard_lock,
		highest_token = excluded.highest_token, updated_at = excluded.updated_at`,
			deleteRow: `DELETE FROM {t} WHERE resource_key = ?`,
			get:       `SELECT guard_lock, highest_token, updated_at FROM {t} WHERE resource_key = ?`,
		}
	}
	for i := range s.create {
		s.create[i] = r.Replace(s.create[i])
	}
	for _, p := range []*string{&s.probe, &s.insertRow, &s.selectRow, &s.upsert, &s.deleteRow, &s.get} {
		*p = r.Replace(*p)
	}
	return s
}

// encodeToken is a token as the dialect stores it (see newStatements).
func encodeToken(d Dialect, tok uint64) string {
	if d == SQLite {
		return fmt.Sprintf("%020d", tok)
	}
	return strconv.FormatUint(tok, 10)
}

// decodeToken reads a stored token back; anything but decimal digits of a
// uint64 (20 of them in SQLite) is fence.ErrCorrupt.
func decodeToken(d Dialect, key, s string) (uint64, error) {
	ok := s != "" && (d != SQLite || len(s) == 20)
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= '0' && s[i] <= '9'
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("%w: key %q: highest_token %q is not a uint64", fence.ErrCorrupt, key, s)
	}
	return n, nil
}

// Record is the guard row of a key.
type Record struct {
	// Token is the highest token admitted for the key; 0 when none was.
	Token uint64
	// Lock is the lock the key is bound to; "" while unbound.
	Lock string
	// UpdatedAt is when the row last changed, by the database's clock;
	// zero for a key without a row.
	UpdatedAt time.Time
}

// lockRow takes the key's row lock inside tx and returns the row (the zero
// Record for a key without one) and whether it existed before.
func (f *Fence) lockRow(ctx context.Context, q querier, key string) (rec fence.Record, existed bool, err error) {
	existed = true
	if f.stmts.insertRow != "" {
		var inserted bool
		switch err := q.QueryRowContext(ctx, f.stmts.insertRow, key).Scan(&inserted); {
		case errors.Is(err, sql.ErrNoRows): // it was there
		case err != nil:
			return rec, false, err
		default:
			existed = false
		}
	}
	var tok string
	switch err := q.QueryRowContext(ctx, f.stmts.selectRow, key).Scan(&rec.Lock, &tok); {
	case errors.Is(err, sql.ErrNoRows):
		if f.stmts.insertRow != "" {
			// Inserted or found a moment ago, in this transaction: only a
			// DELETE from outside could have removed it since.
			return rec, false, fmt.Errorf("sqlfence: the row of %q in %s vanished under its row lock", key, f.table)
		}
		return fence.Record{}, false, nil
	case err != nil:
		return rec, false, err
	}
	rec.Token, err = decodeToken(f.dialect, key, tok)
	return rec, existed, err
}

// store writes the key's row.
func (f *Fence) store(ctx context.Context, q querier, key string, rec fence.Record) error {
	_, err := q.ExecContext(ctx, f.stmts.upsert, key, rec.Lock, encodeToken(f.dialect, rec.Token))
	return err
}
