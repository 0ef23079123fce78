//go:build unix

// Command sql-fencing shows PostgreSQL refusing a lock holder that paused
// past its lock's TTL, with lockd's fencing tokens checked by the
// fence/sqlfence package inside the database's own transactions.
//
// Two workers move money between the rows of a ledger, taking lockd's lock
// first. Worker A takes the lock (fencing token n), makes a transfer, reads
// the balances for a second one, and freezes for real (SIGSTOP) between
// checking its lease and writing. Its TTL runs out; worker B takes the lock
// (token n+1) and makes a transfer. A wakes up and writes the balances it
// computed before the pause: PostgreSQL refuses the transaction (stale
// token) and the ledger stays balanced.
//
// From the repository root, with no flags, it starts a throwaway PostgreSQL
// (initdb and postgres on a unix socket in a temporary directory; the
// server binaries must be installed: Debian's postgresql package) and a
// one-member lockd signing its grants, tells the story, checks the ledger
// and stops what it started:
//
//	go run ./examples/sql-fencing
//
// It exits 0 when PostgreSQL refused A's late write and the ledger is
// balanced, 1 otherwise. --lockd and --dsn run it against a running lockd
// and database instead. Worker A is this program again: it re-executes
// itself with SQL_FENCING_WORKER set in its environment.
//
// The program imports pgx's database/sql driver (github.com/jackc/pgx/v5
// /stdlib): sqlfence itself needs none.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/lockd/lockd/fence"
)

func main() {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the demo's flags.
type options struct {
	lockd     string
	dsn       string
	verifyKey string
	binDir    string
	lock      string
	ttl       time.Duration
	keep      bool
	unfenced  bool
}

// run is the demo: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("sql-fencing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.lockd, "lockd", "", "comma-separated URLs of a running lockd cluster (default: start a one-member lockd)")
	fs.StringVar(&o.dsn, "dsn", "", "PostgreSQL connection string, as pgx takes it (default: start a throwaway PostgreSQL)")
	fs.StringVar(&o.verifyKey, "verify-key", "", "with --lockd: the cluster's public key (lockctl keygen), so that sqlfence checks the grants' proofs")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory with a prebuilt lockd binary (default: go build it from this repository)")
	fs.StringVar(&o.lock, "lock", "sql-fencing", "lock name")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "the lock's TTL; A stays frozen past it")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (lockd's binary, keys, data and log)")
	fs.BoolVar(&o.unfenced, "unfenced", false, "A writes after its pause without the fence: shows the damage (the ledger ends unbalanced; exit 1)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: go run ./examples/sql-fencing [flags]\n\n"+
			"Two workers move money between rows of PostgreSQL under one lockd lock. Worker A freezes\n"+
			"(SIGSTOP) past the lock's TTL between reading balances and writing them; B takes the\n"+
			"lock and makes a transfer; A wakes and writes: PostgreSQL refuses it (stale fencing\n"+
			"token) and the ledger stays balanced. Exit 0 on that outcome.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sql-fencing: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.ttl < 500*time.Millisecond || o.ttl > time.Minute {
		fmt.Fprintf(stderr, "sql-fencing: --ttl %v: want 500ms to 1m\n", o.ttl)
		return 2
	}
	if o.verifyKey != "" && o.lockd == "" {
		fmt.Fprintln(stderr, "sql-fencing: --verify-key is for a --lockd cluster; the lockd started here has its own key")
		return 2
	}
	if _, err := demo(ctx, o, stdout, stderr); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "\nsql-fencing: interrupted; every process it started is stopped")
			return 1
		}
		fmt.Fprintf(stderr, "\nsql-fencing: FAILED: %v\n", err)
		return 1
	}
	return 0
}

// demo starts what is missing, tells the story and checks its outcome.
func demo(ctx context.Context, o options, out, errOut io.Writer) (*outcome, error) {
	out, errOut = lockedWriters(out, errOut)
	cfg := storyConfig{lock: o.lock, ttl: o.ttl, run: randomID(), dsn: strings.TrimSpace(o.dsn), unfenced: o.unfenced}
	for _, u := range strings.Split(o.lockd, ",") {
		if u = strings.TrimSpace(u); u != "" {
			if !strings.Contains(u, "://") {
				u = "http://" + u
			}
			cfg.lockd = append(cfg.lockd, u)
		}
	}
	if o.verifyKey != "" {
		pub, err := fence.LoadPublicKey(o.verifyKey)
		if err != nil {
			return nil, err
		}
		cfg.verifyKey = pub
	}

	fmt.Fprintln(out, "== lockd: fencing in PostgreSQL ==")
	if len(cfg.lockd) > 0 && cfg.dsn != "" {
		fmt.Fprintf(out, "lockd: %s\npostgres: %s\n", strings.Join(cfg.lockd, ", "), redact(cfg.dsn))
		return tellAndCheck(ctx, cfg, out, errOut)
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	st, err := startStack(ctx, stackConfig{startLockd: len(cfg.lockd) == 0, startPG: cfg.dsn == "", binDir: o.binDir}, say)
	if err != nil {
		return nil, err
	}
	defer st.close(o.keep, out)
	if len(cfg.lockd) == 0 {
		cfg.lockd, cfg.verifyKey = []string{st.lockdURL}, st.verifyKey
	}
	if cfg.dsn == "" {
		cfg.dsn = st.pg.DSN("postgres")
	}
	res, err := tellAndCheck(ctx, cfg, out, errOut)
	if err != nil && ctx.Err() == nil && !errors.Is(err, errOutcome) {
		fmt.Fprintf(errOut, "\nlogs:\n%s", st.logTails(20))
	}
	return res, err
}

// errOutcome: the story was told, and did not end as fencing promises.
var errOutcome = errors.New("the outcome is wrong")

// tellAndCheck tells the story and checks its outcome.
func tellAndCheck(ctx context.Context, cfg storyConfig, out, errOut io.Writer) (*outcome, error) {
	o, err := tell(ctx, cfg, out, errOut)
	if err != nil {
		return o, err
	}
	if err := o.check(cfg.verifyKey != nil); err != nil {
		fmt.Fprintf(out, "\nUNEXPECTED: %v\n", err)
		return o, fmt.Errorf("%w: %w", errOutcome, err)
	}
	fmt.Fprintf(out, `
What happened: A read the balances while it held the lock, and froze before
writing the new ones. Its lock expired; B took it and moved money. A woke up
believing it still held the lock and wrote balances computed from its stale
read: without fencing, B's transfer would have silently vanished (a lost
update, and balances that no longer match the journal). sqlfence checked A's
token %d in the same transaction, under the row lock of the ledger's fence,
saw that %d was already admitted, and rolled the transaction back.

OK: PostgreSQL refused A's late write, and the ledger is balanced.
`, o.TokenA, o.TokenB)
	return o, nil
}

func randomID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// redact hides a password in a DSN for printing.
func redact(dsn string) string {
	var out []string
	for _, f := range strings.Fields(dsn) {
		if strings.HasPrefix(f, "password=") {
			f = "password=***"
		}
		out = append(out, f)
	}
	s := strings.Join(out, " ")
	if i := strings.Index(s, "://"); i >= 0 {
		if at := strings.Index(s[i+3:], "@"); at >= 0 {
			if colon := strings.Index(s[i+3:i+3+at], ":"); colon >= 0 {
				s = s[:i+3+colon+1] + "***" + s[i+3+at:]
			}
		}
	}
	return s
}

// lockedWriters serialises writes to stdout and stderr, which the demo, its
// goroutines and worker A's stderr copier share.
func lockedWriters(stdout, stderr io.Writer) (io.Writer, io.Writer) {
	mu := &sync.Mutex{}
	return &lockedWriter{mu: mu, w: stdout}, &lockedWriter{mu: mu, w: stderr}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// verifyKeyNote says whether proofs are checked.
func verifyKeyNote(k ed25519.PublicKey) string {
	if k != nil {
		return "it checks every grant's proof (lockd's signature) too"
	}
	return "it checks tokens only (no --verify-key: proofs are not checked)"
}
