//go:build unix

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// The ledger: accounts with balances, and a journal of every transfer. A
// run of the demo has accounts of its own (the run column), so runs can
// share a database.
const schema = `
CREATE TABLE IF NOT EXISTS sql_fencing_accounts (
	run     text   NOT NULL,
	name    text   NOT NULL,
	balance bigint NOT NULL,
	PRIMARY KEY (run, name)
);
CREATE TABLE IF NOT EXISTS sql_fencing_transfers (
	id            bigserial PRIMARY KEY,
	run           text NOT NULL,
	from_account  text NOT NULL,
	to_account    text NOT NULL,
	amount        bigint NOT NULL CHECK (amount > 0),
	worker        text NOT NULL,
	fencing_token numeric(20,0) NOT NULL,
	at            timestamptz NOT NULL DEFAULT now()
)`

// opening is every account's balance when a run starts.
const opening = 1000

var accounts = []string{"alice", "bob"}

// ledger is one run's accounts, fenced by one key of the guard table.
type ledger struct {
	db  *sql.DB
	f   *sqlfence.Fence
	run string
	key string // the resource key in lockd_fence
}

// openLedger creates the tables (if needed) and the run's accounts.
func openLedger(ctx context.Context, db *sql.DB, f *sqlfence.Fence, run string) (*ledger, error) {
	l := &ledger{db: db, f: f, run: run, key: "ledger/" + run}
	if err := f.Migrate(ctx); err != nil {
		return nil, err
	}
	// Two processes of one demo may both get here; the advisory lock
	// keeps concurrent CREATE TABLE IF NOT EXISTS from tripping.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('sql_fencing schema'))`); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("create the ledger's tables: %w", err)
	}
	for _, a := range accounts {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sql_fencing_accounts (run, name, balance) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
			run, a, opening); err != nil {
			return nil, err
		}
	}
	return l, tx.Commit()
}

// ledgerOf is the ledger of a run whose accounts exist (client A's).
func ledgerOf(db *sql.DB, f *sqlfence.Fence, run string) *ledger {
	return &ledger{db: db, f: f, run: run, key: "ledger/" + run}
}

var errFunds = errors.New("insufficient funds")

// transfer moves amount from one account to another the careful way: read,
// check and write in one fenced transaction.
func (l *ledger) transfer(ctx context.Context, c fence.Credentials, worker, from, to string, amount int64) error {
	return l.f.Do(ctx, l.key, c, func(ctx context.Context, tx sqlfence.Tx) error {
		var bal int64
		err := tx.QueryRowContext(ctx, `SELECT balance FROM sql_fencing_accounts WHERE run = $1 AND name = $2 FOR UPDATE`,
			l.run, from).Scan(&bal)
		if err != nil {
			return err
		}
		if bal < amount {
			return fmt.Errorf("%w: %s has %d", errFunds, from, bal)
		}
		for _, u := range []struct {
			name  string
			delta int64
		}{{from, -amount}, {to, amount}} {
			if _, err := tx.ExecContext(ctx, `UPDATE sql_fencing_accounts SET balance = balance + $3 WHERE run = $1 AND name = $2`,
				l.run, u.name, u.delta); err != nil {
				return err
			}
		}
		return l.journal(ctx, tx, c.Token, worker, from, to, amount)
	})
}

func (l *ledger) journal(ctx context.Context, tx sqlfence.Tx, token uint64, worker, from, to string, amount int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO sql_fencing_transfers (run, from_account, to_account, amount, worker, fencing_token)
		VALUES ($1, $2, $3, $4, $5, $6::numeric)`, l.run, from, to, amount, worker, fmt.Sprint(token))
	return err
}

// plan is a transfer computed from balances read earlier: the new balances
// to write. Written late, it is the lost update fencing exists for.
type plan struct {
	From, To         string
	Amount           int64
	NewFrom, NewTo   int64
	ReadFrom, ReadTo int64
}

// planTransfer reads the balances and computes a transfer's new balances.
func (l *ledger) planTransfer(ctx context.Context, from, to string, amount int64) (plan, error) {
	bals, err := l.balances(ctx)
	if err != nil {
		return plan{}, err
	}
	p := plan{From: from, To: to, Amount: amount, ReadFrom: bals[from], ReadTo: bals[to]}
	p.NewFrom, p.NewTo = p.ReadFrom-amount, p.ReadTo+amount
	if p.NewFrom < 0 {
		return p, fmt.Errorf("%w: %s has %d", errFunds, from, p.ReadFrom)
	}
	return p, nil
}

// apply writes a planned transfer's balances and its journal entry, fenced
// (in sqlfence's transaction) or, with fenced false, in a plain one.
func (l *ledger) apply(ctx context.Context, c fence.Credentials, worker string, p plan, fenced bool) error {
	write := func(ctx context.Context, tx sqlfence.Tx) error {
		for _, u := range []struct {
			name string
			bal  int64
		}{{p.From, p.NewFrom}, {p.To, p.NewTo}} {
			if _, err := tx.ExecContext(ctx, `UPDATE sql_fencing_accounts SET balance = $3 WHERE run = $1 AND name = $2`,
				l.run, u.name, u.bal); err != nil {
				return err
			}
		}
		return l.journal(ctx, tx, c.Token, worker, p.From, p.To, p.Amount)
	}
	if fenced {
		return l.f.Do(ctx, l.key, c, write)
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := write(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

// balances reads the run's balances.
func (l *ledger) balances(ctx context.Context) (map[string]int64, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT name, balance FROM sql_fencing_accounts WHERE run = $1`, l.run)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var n string
		var b int64
		if err := rows.Scan(&n, &b); err != nil {
			return nil, err
		}
		out[n] = b
	}
	return out, rows.Err()
}

// entry is one line of the journal.
type entry struct {
	From, To string
	Amount   int64
	Worker   string
	Token    string
}

// audit is the ledger at the end: the balances, the journal, and what the
// journal says the balances must be.
type audit struct {
	Balances map[string]int64
	Expected map[string]int64 // opening balances plus the journal
	Journal  []entry
}

func (l *ledger) audit(ctx context.Context) (*audit, error) {
	a := &audit{Expected: map[string]int64{}}
	var err error
	if a.Balances, err = l.balances(ctx); err != nil {
		return nil, err
	}
	for _, n := range accounts {
		a.Expected[n] = opening
	}
	rows, err := l.db.QueryContext(ctx, `SELECT from_account, to_account, amount, worker, fencing_token::text
		FROM sql_fencing_transfers WHERE run = $1 ORDER BY id`, l.run)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.From, &e.To, &e.Amount, &e.Worker, &e.Token); err != nil {
			return nil, err
		}
		a.Journal = append(a.Journal, e)
		a.Expected[e.From] -= e.Amount
		a.Expected[e.To] += e.Amount
	}
	return a, rows.Err()
}

// balanced says whether the money is all there: every balance is what the
// journal says, and the total is what the accounts opened with.
func (a *audit) balanced() error {
	var total int64
	var errs []error
	names := make([]string, 0, len(a.Balances))
	for n := range a.Balances {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		total += a.Balances[n]
		if a.Balances[n] != a.Expected[n] {
			errs = append(errs, fmt.Errorf("%s holds %d, but its journal says %d", n, a.Balances[n], a.Expected[n]))
		}
	}
	if want := int64(opening * len(accounts)); total != want {
		errs = append(errs, fmt.Errorf("the accounts hold %d in all, want %d", total, want))
	}
	return errors.Join(errs...)
}
