// Package sqlfence fences writes to a SQL database with lockd's fencing
// tokens, in the database itself: a holder that paused past its lock's TTL
// and wakes up after the next holder has written is refused by the database,
// in the same transaction as the writes it wanted to make.
//
// It works through database/sql, so with any driver; it speaks two dialects,
// PostgreSQL and SQLite (tested with github.com/jackc/pgx/v5/stdlib and
// modernc.org/sqlite).
//
// # How
//
// A guard table (lockd_fence unless Config.Table says otherwise; Migrate
// creates it) holds one row per resource key: the lock that guards the key,
// the highest token admitted for it, and when it last changed. Do runs the
// caller's writes in one transaction that first takes the key's row lock,
// checks the write's credentials against the row and raises the token:
//
//	BEGIN
//	  lock the key's row            PostgreSQL: INSERT ... ON CONFLICT DO NOTHING,
//	                                then SELECT ... FOR UPDATE
//	                                SQLite: BEGIN IMMEDIATE (the database's write lock)
//	  check: token >= highest, the lock is the key's, the proof (with a verify key)
//	  UPDATE the row: highest = token
//	  fn(tx): the caller's writes
//	COMMIT                          (any refusal or error: ROLLBACK)
//
// Because the check holds the row lock until COMMIT, two holders' writes to
// one key are serialized in token order: once a transaction with token n has
// committed, no transaction with a lower token commits after it, and the
// check, the token and the caller's writes commit or roll back together. A
// failed fn leaves the token where it was.
//
// The refusals are exactly those of the fence middleware and fencestore
// (the checks are fence.Verifier's and fence.Write.Apply's): a token below
// the key's highest is a *fence.StaleTokenError (errors.Is
// fence.ErrStaleToken); a write under another lock than the key's is a
// *fence.LockMismatchError (fence.ErrLockMismatch), the key being bound to a
// lock by Config.Guards or else by its first admitted write that names one;
// with Config.VerifyKey, a missing proof (fence.ErrMissingProof), a proof
// without its lock (fence.ErrMissingLock), a bad one (fence.ErrBadProof), a
// shared grant's (fence.ErrSharedProof) or an expired one
// (fence.ErrExpiredProof; a stale token is reported as stale first).
//
// # Tokens
//
// Tokens are uint64 and every value up to 2^64-1 is stored exactly and
// compares correctly inside the database: PostgreSQL keeps them as
// NUMERIC(20,0), SQLite (whose INTEGER is a signed 64-bit number) as
// 20-digit, zero-padded text, whose byte order is the numeric order. So
// `ORDER BY highest_token` is right in both.
//
// # Retries
//
// PostgreSQL's serialization failures (SQLSTATE 40001) and deadlocks
// (40P01), and SQLite's SQLITE_BUSY and SQLITE_LOCKED, are retried with
// jittered exponential backoff, at most Config.MaxAttempts times in all and
// never past ctx: the whole transaction again, fn included. So fn must do
// nothing but database work through the Tx it is given, and may run more
// than once.
//
// # SQLite
//
// database/sql's BeginTx starts a deferred SQLite transaction: it reads
// under a shared lock and asks for the write lock at its first write, and if
// another connection wrote in between, that request fails at once with
// SQLITE_BUSY instead of waiting (waiting could deadlock). Do therefore runs
// its SQLite transaction on a dedicated connection (sql.DB.Conn) and starts
// it with a raw BEGIN IMMEDIATE, which takes the write lock first and waits
// for it under the connection's busy timeout. The driver's _txlock=immediate
// option would do the same through BeginTx, but the package cannot check or
// require how the caller opened the database, and the option makes every
// transaction of the program take the write lock. A ROLLBACK that fails
// (SQLite may already have rolled back, after an interrupt) discards the
// connection rather than return it to the pool in an unknown state. Open
// the database with a busy timeout (modernc.org/sqlite:
// "file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"), so
// writers wait for each other instead of being retried. An in-memory
// database (":memory:") is one per connection, so the guard table Migrate
// made would not be there for the next connection: use a file.
//
// # What it does not do
//
// Only writes made through Do, inside fn's transaction, are fenced: a write
// to the same rows outside Do (another program, a migration, a hand-typed
// UPDATE) is not checked against anything. A holder frozen inside fn holds
// the key's row lock, so the next holder waits for it (set
// idle_in_transaction_session_timeout in PostgreSQL, or a context deadline,
// to bound that); when the frozen holder wakes, its transaction commits in
// its turn, before the next holder's, which is correct: it was admitted while
// its token was the highest. A COMMIT whose reply is lost (the connection
// dropped) has an unknown outcome, as every database transaction does. And
// without a verify key, tokens are whatever callers pass: one call with
// token 2^64-1 blocks a key until an operator resets it (Reset).
package sqlfence
