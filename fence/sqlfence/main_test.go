package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/lockd/lockd/fence/sqlfence"
	"github.com/lockd/lockd/internal/testutil"
)

// pg is the package's throwaway PostgreSQL server, started once.
var pg *testutil.Postgres

// builds holds the lockd binary of the chaos test.
var builds testutil.Builds

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain()) // the chaos test's frozen holder
	}
	pg = testutil.StartPostgres()
	code := m.Run()
	pg.Stop()
	builds.Remove()
	if code == 0 {
		// After the server is gone: its process's waiter is a goroutine.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// backend is one database the tests run against.
type backend struct {
	name    string
	dialect sqlfence.Dialect
	open    func(t *testing.T) *sql.DB // a fresh, empty database, closed at the end of t
}

var backends = []backend{
	{"sqlite", sqlfence.SQLite, openSQLite},
	{"postgres", sqlfence.Postgres, openPostgres},
}

// eachBackend runs fn as a subtest against each database.
func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// openSQLite opens a new SQLite database in a temporary file, as a program
// should: writers wait for each other (busy timeout), readers do not wait
// for writers (WAL).
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openPostgres opens a new database of the package's PostgreSQL server
// (skipped without one, failed under CI).
func openPostgres(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", pg.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newFence opens b's database and returns a migrated Fence on it.
func newFence(t *testing.T, b backend, cfg sqlfence.Config) (*sqlfence.Fence, *sql.DB) {
	t.Helper()
	db := b.open(t)
	cfg.Dialect = b.dialect
	f, err := sqlfence.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, db
}

// sqlFor rewrites a statement written with $n placeholders for b (SQLite
// takes ?n).
func sqlFor(b backend, q string) string {
	if b.dialect != sqlfence.SQLite {
		return q
	}
	out := []byte(q)
	for i := range out {
		if out[i] == '$' {
			out[i] = '?'
		}
	}
	return string(out)
}
