//go:build unix

package main

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/pgtemp"
	"github.com/lockd/lockd/internal/testutil"
)

var builds testutil.Builds

func TestMain(m *testing.M) {
	// Worker A is this test binary, re-executed by the demo.
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	code := m.Run()
	builds.Remove()
	os.Exit(code)
}

// needPostgres skips t without the PostgreSQL server binaries, unless CI
// is set: there it fails.
func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := pgtemp.FindBin(); err != nil {
		if testutil.InCI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// lockdBinDir builds lockd once for the package's tests.
func lockdBinDir(t *testing.T) string { return filepath.Dir(builds.Path(t, "lockd")) }

// TestDemo runs the demo as `go run ./examples/sql-fencing` does, with no
// flags (but a prebuilt lockd): it starts a throwaway PostgreSQL and a
// lockd signing its grants, and tells the story. No error means A's late
// write was refused as stale and the ledger is balanced; the test checks
// that outcome itself too.
func TestDemo(t *testing.T) {
	needPostgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o, err := demo(ctx, options{lock: "sql-fencing", ttl: time.Second, binDir: lockdBinDir(t)}, &out, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if !o.Refused || !o.RefusedStale || o.RefusedHighest != o.TokenB || o.TokenB <= o.TokenA {
		t.Errorf("A's late write: %+v; want refused as stale naming B's token", o)
	}
	if !o.ProofA || !o.ProofB {
		t.Errorf("grants without proofs from a signing lockd: A %v, B %v", o.ProofA, o.ProofB)
	}
	if err := o.Audit.balanced(); err != nil || len(o.Audit.Journal) != 2 {
		t.Errorf("ledger: %v, journal %+v; want balanced with A's first transfer and B's", err, o.Audit.Journal)
	}
	for _, want := range []string{"SIGSTOP", "kill -CONT", "REFUSED by PostgreSQL: fence: stale fencing token", "OK: PostgreSQL refused A's late write"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestDemoAgainstRunningServers runs the demo with --lockd, --dsn and
// --verify-key against a lockd and a PostgreSQL started beforehand, checks
// the database on its own afterwards, and runs it again with --unfenced,
// where it must fail: A's late write lands and the ledger no longer adds up.
func TestDemoAgainstRunningServers(t *testing.T) {
	needPostgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	st, err := startStack(ctx, stackConfig{startLockd: true, startPG: true, binDir: lockdBinDir(t)},
		func(format string, args ...any) { t.Logf(format, args...) })
	if err != nil {
		t.Fatal(err)
	}
	defer st.close(false, io.Discard)
	dsn := st.pg.DSN("postgres")
	args := []string{"--lockd", st.lockdURL, "--dsn", dsn, "--verify-key", filepath.Join(st.dir, "lockd-verify.pem"),
		"--lock", "jobs/ledger", "--ttl", "1s"}

	var out bytes.Buffer
	code := run(ctx, args, &out, &out)
	t.Logf("demo output:\n%s", out.String())
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if !strings.Contains(out.String(), "checks every grant's proof") {
		t.Error("with --verify-key the demo does not say it checks proofs")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Every run's accounts agree with its journal, and its fence holds the
	// token of the last transfer that committed (B's).
	var bad int
	err = db.QueryRowContext(ctx, `
		SELECT count(*) FROM sql_fencing_accounts a
		WHERE a.balance <> 1000
			- COALESCE((SELECT sum(amount) FROM sql_fencing_transfers t WHERE t.run = a.run AND t.from_account = a.name), 0)
			+ COALESCE((SELECT sum(amount) FROM sql_fencing_transfers t WHERE t.run = a.run AND t.to_account = a.name), 0)`).Scan(&bad)
	if err != nil || bad != 0 {
		t.Fatalf("%d accounts disagree with their journal (%v)", bad, err)
	}
	var fenceToken, lastToken string
	err = db.QueryRowContext(ctx, `SELECT f.highest_token::text, (SELECT max(fencing_token)::text FROM sql_fencing_transfers)
		FROM lockd_fence f WHERE f.resource_key LIKE 'ledger/%'`).Scan(&fenceToken, &lastToken)
	if err != nil || fenceToken != lastToken {
		t.Fatalf("fence token %s, last transfer's token %s (%v)", fenceToken, lastToken, err)
	}
	if r := testutil.Get(st.lockdURL + "/api/v1/locks/jobs%2Fledger"); r.Status != 200 || r.Body["held"] != false {
		t.Fatalf("the lock is still held after the demo: %d %s", r.Status, r.Raw)
	}

	out.Reset()
	code = run(ctx, append(args, "--unfenced"), &out, &out)
	t.Logf("demo output (--unfenced):\n%s", out.String())
	if code != 1 {
		t.Fatalf("--unfenced: exit code %d, want 1", code)
	}
	for _, want := range []string{"WITHOUT the fence → committed", "the ledger is not balanced", "but its journal says"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--unfenced output lacks %q", want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--ttl", "10ms"},
		{"--ttl", "2m"},
		{"extra"},
		{"--verify-key", "k.pem"},
		{"--no-such-flag"},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), args, &out, &out); code != 2 {
			t.Errorf("%v: exit code %d, want 2\n%s", args, code, out.String())
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "-dsn") {
		t.Errorf("--help: exit code %d\n%s", code, out.String())
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"host=/tmp/x user=postgres password=s3cret dbname=app": "host=/tmp/x user=postgres password=*** dbname=app",
		"postgres://app:s3cret@db.example:5432/app":            "postgres://app:***@db.example:5432/app",
		"postgres://app@db.example/app":                        "postgres://app@db.example/app",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
