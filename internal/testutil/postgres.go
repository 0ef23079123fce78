//go:build unix

package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/pgtemp"
)

// Postgres is a throwaway PostgreSQL server shared by one package's tests:
// StartPostgres in TestMain starts it once, each test takes a fresh database
// of its own (Database), and Stop ends it after the tests.
//
// Without the PostgreSQL server binaries the tests that need it skip, unless
// the environment variable CI is set (and not "0" or "false"): there they
// fail, so a CI run cannot pass without having run them.
type Postgres struct {
	srv *pgtemp.Server
	err error // why there is no server
	n   atomic.Int64
}

// StartPostgres starts the server. It never fails: a test that asks for the
// server gets the reason there is none (Database).
func StartPostgres() *Postgres {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtemp.Start(ctx, pgtemp.Options{})
	return &Postgres{srv: srv, err: err}
}

// Stop shuts the server down and removes its files.
func (p *Postgres) Stop() {
	if p != nil && p.srv != nil {
		p.srv.Stop()
	}
}

// Server returns the server, or skips t (fails it under CI) when there is
// none.
func (p *Postgres) Server(t testing.TB) *pgtemp.Server {
	t.Helper()
	if p == nil {
		t.Fatal("testutil: no Postgres: call StartPostgres in TestMain")
	}
	if p.err != nil {
		if InCI() || !errors.Is(p.err, pgtemp.ErrNotInstalled) {
			// Under CI a missing server is a failure, and a server that
			// is installed but does not start is one everywhere.
			t.Fatalf("PostgreSQL: %v", p.err)
		}
		t.Skipf("PostgreSQL: %v", p.err)
	}
	return p.srv
}

// Database creates a new, empty database for t and returns its DSN (a
// keyword/value connection string, for pgx's stdlib driver "pgx"). It is
// dropped when t ends, after t's later cleanups (close its *sql.DB with
// t.Cleanup).
func (p *Postgres) Database(t testing.TB) string {
	t.Helper()
	srv := p.Server(t)
	name := fmt.Sprintf("t%d_%s", p.n.Add(1), dbSuffix(t.Name()))
	dsn, err := srv.CreateDatabase(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.DropDatabase(ctx, name); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return dsn
}

// dbSuffix makes a test name part of a database name, for the server log.
func dbSuffix(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if b.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// InCI reports whether the environment variable CI says this is a CI run.
func InCI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "0" && !strings.EqualFold(ci, "false")
}
