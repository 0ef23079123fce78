package sqlfence

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/lockd/lockd/fence"
)

// DefaultTable is the guard table's name unless Config.Table says otherwise.
const DefaultTable = "lockd_fence"

// Defaults of the retry of serialization failures, deadlocks and busy
// databases.
const (
	DefaultMaxAttempts  = 10
	DefaultRetryBackoff = 10 * time.Millisecond
	DefaultMaxBackoff   = time.Second
)

// Sentinel errors of this package; the refusals of a fenced write are the
// fence package's (see the package documentation).
var (
	// ErrInvalidKey: a resource key that is empty, longer than
	// fence.MaxKeyBytes, not UTF-8, or holds a NUL byte (which PostgreSQL
	// text cannot store).
	ErrInvalidKey = errors.New("sqlfence: invalid resource key")
	// ErrRetriesExhausted: the transaction failed with a retryable error
	// (a serialization failure, a deadlock, a busy database) on each of
	// Config.MaxAttempts attempts. The last error is wrapped too.
	ErrRetriesExhausted = errors.New("sqlfence: retries exhausted")
)

// Config configures a Fence.
type Config struct {
	// Dialect is the database's SQL dialect: Postgres or SQLite. Required.
	Dialect Dialect
	// Table is the guard table, optionally schema-qualified
	// ("fencing.lockd_fence"); DefaultTable when empty. Unquoted
	// identifiers: PostgreSQL folds them to lower case.
	Table string
	// Guards binds keys to locks by prefix, as fencestore's --guard: a
	// write to a guarded key must name the guard's lock. A key no guard
	// matches is bound to the lock of its first admitted write that names
	// one. Nil guards nothing.
	Guards *fence.Guards
	// VerifyKey, when set, makes every write carry a proof signed by the
	// lock service's matching private key (lockd --signing-key), of an
	// exclusive grant of the key's lock that has not expired.
	VerifyKey ed25519.PublicKey
	// AcceptExpiredProofs admits proofs whose expiry has passed; the token
	// and the key's lock are still checked. See fence.WithoutProofExpiry for
	// when that is worth its cost.
	AcceptExpiredProofs bool
	// Now is the clock proofs' expiries are compared with; nil is time.Now.
	Now func() time.Time
	// Isolation is the isolation level of Do's transactions in PostgreSQL;
	// the zero value is the database's default (READ COMMITTED unless
	// configured otherwise). SQLite transactions are serializable: for
	// SQLite only the zero value and sql.LevelSerializable are accepted.
	Isolation sql.IsolationLevel
	// MaxAttempts bounds the attempts of one Do (1: no retries);
	// DefaultMaxAttempts when 0.
	MaxAttempts int
	// RetryBackoff is the first wait before a retry, doubled for each
	// further one up to MaxBackoff, each wait drawn at random below its
	// bound; defaults DefaultRetryBackoff and DefaultMaxBackoff.
	RetryBackoff, MaxBackoff time.Duration
	// Retryable says whether an error is worth running the transaction
	// again. Nil: PostgreSQL SQLSTATE 40001 (serialization failure) and
	// 40P01 (deadlock), read through the SQLState() method of the driver's
	// error (pgx, lib/pq); for SQLite, SQLITE_BUSY and SQLITE_LOCKED, read
	// through a Code() int method (modernc.org/sqlite). A refusal is never
	// retried, whatever this says.
	Retryable func(error) bool
	// Logger gets an Info line per refused write and a Debug line per
	// retry. Nil discards.
	Logger *slog.Logger
}

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// Validate reports a Config New cannot work with.
func (c Config) Validate() error {
	if c.Dialect != Postgres && c.Dialect != SQLite {
		return fmt.Errorf("sqlfence: Config.Dialect is %v, want Postgres or SQLite", c.Dialect)
	}
	if c.Table != "" && !tableName.MatchString(c.Table) {
		return fmt.Errorf("sqlfence: Config.Table %q: want an identifier of [A-Za-z0-9_] (not starting with a digit), optionally schema.table", c.Table)
	}
	if c.VerifyKey != nil && len(c.VerifyKey) != ed25519.PublicKeySize {
		return fmt.Errorf("sqlfence: Config.VerifyKey is %d bytes, want %d", len(c.VerifyKey), ed25519.PublicKeySize)
	}
	if c.Dialect == SQLite && c.Isolation != sql.LevelDefault && c.Isolation != sql.LevelSerializable {
		return fmt.Errorf("sqlfence: Config.Isolation %v: SQLite transactions are serializable", c.Isolation)
	}
	if c.MaxAttempts < 0 || c.RetryBackoff < 0 || c.MaxBackoff < 0 {
		return errors.New("sqlfence: Config.MaxAttempts, RetryBackoff and MaxBackoff must not be negative")
	}
	return nil
}

// Fence runs fenced writes against one database. It is safe for concurrent
// use.
type Fence struct {
	db        *sql.DB
	dialect   Dialect
	table     string
	stmts     statements
	guards    *fence.Guards
	verifier  fence.Verifier
	isolation sql.IsolationLevel
	retry     retryPolicy
	log       *slog.Logger
}

// New returns a Fence for db. It does not touch the database: call Migrate
// once (it is idempotent) before the first Do.
func New(db *sql.DB, cfg Config) (*Fence, error) {
	if db == nil {
		return nil, errors.New("sqlfence: New: nil *sql.DB")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fence{
		db:        db,
		dialect:   cfg.Dialect,
		table:     cfg.Table,
		guards:    cfg.Guards,
		verifier:  fence.Verifier{Key: cfg.VerifyKey, Now: cfg.Now, AcceptExpired: cfg.AcceptExpiredProofs},
		isolation: cfg.Isolation,
		retry: retryPolicy{
			attempts: cfg.MaxAttempts, first: cfg.RetryBackoff, max: cfg.MaxBackoff,
			retryable: cfg.Retryable,
		},
		log: cfg.Logger,
	}
	if f.table == "" {
		f.table = DefaultTable
	}
	f.stmts = newStatements(f.dialect, f.table)
	if f.retry.attempts == 0 {
		f.retry.attempts = DefaultMaxAttempts
	}
	if f.retry.first == 0 {
		f.retry.first = DefaultRetryBackoff
	}
	if f.retry.max == 0 {
		f.retry.max = DefaultMaxBackoff
	}
	if f.retry.retryable == nil {
		f.retry.retryable = defaultRetryable(f.dialect)
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f, nil
}

// Table returns the guard table's name.
func (f *Fence) Table() string { return f.table }

// Migrate creates the guard table if it does not exist, and checks that a
// table of that name has the columns this package uses. It is idempotent
// and safe to run from several processes at once.
func (f *Fence) Migrate(ctx context.Context) error {
	err := f.run(ctx, "migrate", func(ctx context.Context, q querier) error {
		if f.dialect == Postgres {
			// Two sessions creating one table at once can both pass IF NOT
			// EXISTS and one then fails on the catalog's unique index.
			if _, err := q.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "lockd_fence:"+f.table); err != nil {
				return err
			}
		}
		for _, stmt := range f.stmts.create {
			if _, err := q.ExecContext(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlfence: migrate %s: %w", f.table, err)
	}
	rows, err := f.db.QueryContext(ctx, f.stmts.probe)
	if err != nil {
		return fmt.Errorf("sqlfence: table %s exists but is not a guard table (want columns resource_key, guard_lock, highest_token, updated_at): %w", f.table, err)
	}
	return rows.Close()
}

// Do runs fn in a transaction fenced for key with the write's credentials c
// (the token, the lock it was granted on, and with a verify key its proof:
// CredentialsOf(lock) for a lock of lockd's Go client).
//
// The transaction first takes key's row lock and checks c against it, and
// only if c is admitted raises key's highest token to c.Token (binding an
// unbound key to c.Lock) and calls fn, whose writes through tx then commit
// together with the new token. A refusal is returned without calling fn:
// see the package documentation for each; none changes anything. When fn
// returns an error (or panics), the transaction is rolled back, the token
// included, and that error is returned (the panic continues).
//
// Retryable failures run the whole transaction again (fn too), at most
// Config.MaxAttempts times and not past ctx. fn must use only tx: the
// connection running the transaction is taken from db, and on a pool with
// one connection (common with SQLite) a query through db would wait for it
// forever. It must not commit, roll back or begin a transaction itself, and
// must close what it opens (rows, statements) before it returns.
func (f *Fence) Do(ctx context.Context, key string, c fence.Credentials, fn func(ctx context.Context, tx Tx) error) error {
	if fn == nil {
		return errors.New("sqlfence: Do: nil fn")
	}
	if err := checkKey(key); err != nil {
		return err
	}
	adm, err := f.verifier.Authenticate(key, f.guards.Lock(key), c)
	if err != nil {
		f.refused(key, c, err)
		return err
	}
	return f.run(ctx, key, func(ctx context.Context, q querier) error {
		cur, _, err := f.lockRow(ctx, q, key)
		if err != nil {
			return err
		}
		next, err := adm.Write().Apply(key, cur)
		if err == nil {
			// Only a write that would be admitted hears that its proof
			// expired: a stale one is told it is stale.
			err = f.verifier.Expired(adm)
		}
		if err != nil {
			f.refused(key, c, err)
			return refusal{err}
		}
		if err := f.store(ctx, q, key, next); err != nil {
			return err
		}
		return fn(ctx, txOf(q))
	})
}

// refusal marks an error of the fence's own checks: never retried.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

func (f *Fence) refused(key string, c fence.Credentials, err error) {
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		f.log.Info("stale fencing token refused", "table", f.table, "key", key, "lock", c.Lock,
			"token", c.Token, "highest", stale.Highest)
		return
	}
	f.log.Info("fenced write refused", "table", f.table, "key", key, "lock", c.Lock, "token", c.Token, "err", err)
}

// Get returns key's guard row: the highest token admitted, the lock the key
// is bound to, when it last changed. A key without a row gets the zero
// Record.
func (f *Fence) Get(ctx context.Context, key string) (Record, error) {
	if err := checkKey(key); err != nil {
		return Record{}, err
	}
	var rec Record
	var tok, at string
	switch err := f.db.QueryRowContext(ctx, f.stmts.get, key).Scan(&rec.Lock, &tok, &at); {
	case errors.Is(err, sql.ErrNoRows):
		return Record{}, nil
	case err != nil:
		return Record{}, fmt.Errorf("sqlfence: get %q: %w", key, err)
	}
	var err error
	if rec.Token, err = decodeToken(f.dialect, key, tok); err != nil {
		return Record{}, err
	}
	if rec.UpdatedAt, err = time.Parse(updatedAtLayout, at); err != nil {
		return Record{}, fmt.Errorf("%w: key %q: updated_at %q: %v", fence.ErrCorrupt, key, at, err)
	}
	return rec, nil
}

// Reset is the operator's way out of a key no holder can write any more
// (say, after a write with token 2^64-1 without proofs): it sets key's
// highest token to token (0 lets every token in again), even below the
// current one, and unbinds the key from its lock. It returns the record as
// it was. Prefer the current holder's token to 0: 0 lets every old token of
// the lock in again. Resetting a key without a row to 0 stores nothing.
func (f *Fence) Reset(ctx context.Context, key string, token uint64) (Record, error) {
	if err := checkKey(key); err != nil {
		return Record{}, err
	}
	var prev fence.Record
	err := f.run(ctx, key, func(ctx context.Context, q querier) error {
		cur, existed, err := f.lockRow(ctx, q, key)
		if err != nil {
			return err
		}
		prev = cur
		if !existed && token == 0 {
			if f.stmts.insertRow != "" { // the row made to lock it
				_, err := q.ExecContext(ctx, f.stmts.deleteRow, key)
				return err
			}
			return nil
		}
		return f.store(ctx, q, key, fence.Record{Token: token})
	})
	if err != nil {
		return Record{}, fmt.Errorf("sqlfence: reset %q: %w", key, err)
	}
	f.log.Warn("fence reset", "table", f.table, "key", key, "previous_token", prev.Token,
		"previous_lock", prev.Lock, "fencing_token", token)
	return Record{Token: prev.Token, Lock: prev.Lock}, nil
}

// checkKey applies the limits of a resource key.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > fence.MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), fence.MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: holds a NUL byte", ErrInvalidKey)
		}
	}
	return nil
}

// Holder is a lock grant as lockd's Go client hands it out: *client.Lock is
// one.
type Holder interface {
	Name() string
	Token() uint64
	Proof() string
}

// CredentialsOf returns the credentials of h's grant, for Do.
func CredentialsOf(h Holder) fence.Credentials {
	return fence.Credentials{Token: h.Token(), Lock: h.Name(), Proof: h.Proof()}
}
