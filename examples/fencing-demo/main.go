//go:build unix

// Command fencing-demo shows why a lock alone cannot protect a resource, and
// how lockd's fencing tokens do.
//
// Client A takes a lock (fencing token n) and writes to fencestore. Then it
// freezes, for real (SIGSTOP), right after checking that its lease is still
// valid and right before its next write, for longer than the lock's TTL.
// The lock expires; client B takes it (token n+1) and writes. A wakes up and
// writes with its old token, believing it still holds the lock: fencestore
// answers 409 stale_token and keeps B's value.
//
// From the repository root, with no flags, it builds and starts everything
// itself (a 3-member lockd cluster signing its grants, and a fencestore
// verifying them, on free loopback ports), tells the story, checks the
// outcome and stops what it started:
//
//	go run ./examples/fencing-demo
//
// It exits 0 when fencestore refused A's late write and kept B's value,
// 1 otherwise. --lockd and --fencestore run it against servers already
// running instead. Client A is this program again: it re-executes itself
// with FENCING_DEMO_WRITER set in its environment.
package main

import (
	"context"
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
)

func main() {
	if os.Getenv(writerEnv) != "" {
		os.Exit(writerMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the demo's flags.
type options struct {
	lockd      string
	fencestore string
	verifyKey  string
	binDir     string
	lock       string
	key        string
	ttl        time.Duration
	keep       bool
}

// run is the demo: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("fencing-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.lockd, "lockd", "", "comma-separated URLs of a running lockd cluster (default: start a 3-member cluster)")
	fs.StringVar(&o.fencestore, "fencestore", "", "URL of a running fencestore (default: start one)")
	fs.StringVar(&o.verifyKey, "verify-key", "", "with --lockd and no --fencestore: the public key for the fencestore started here (--verify-key)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory with prebuilt lockd and fencestore binaries (default: go build them from this repository)")
	fs.StringVar(&o.lock, "lock", "fencing-demo", "lock name")
	fs.StringVar(&o.key, "key", "", "fencestore object key (default \"report\", or a fresh one against a running fencestore)")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "the lock's TTL; A stays frozen past it")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (binaries, keys, data, server logs)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: go run ./examples/fencing-demo [flags]\n\n"+
			"Tells the fencing story with real processes: client A takes a lock, writes, freezes\n"+
			"(SIGSTOP) past the lock's TTL; client B takes the lock and writes; A wakes and writes with\n"+
			"its old token, and fencestore refuses it (409 stale_token). Exit 0 on that outcome.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fencing-demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.ttl < 500*time.Millisecond || o.ttl > time.Minute {
		fmt.Fprintf(stderr, "fencing-demo: --ttl %v: want 500ms to 1m\n", o.ttl)
		return 2
	}
	if o.verifyKey != "" && (o.lockd == "" || o.fencestore != "") {
		fmt.Fprintln(stderr, "fencing-demo: --verify-key is for a fencestore started here in front of a --lockd cluster")
		return 2
	}
	if _, err := demo(ctx, o, stdout, stderr); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "\nfencing-demo: interrupted; every process it started is stopped")
			return 1
		}
		fmt.Fprintf(stderr, "\nfencing-demo: FAILED: %v\n", err)
		return 1
	}
	return 0
}

// demo starts what is missing, tells the story and checks its outcome.
func demo(ctx context.Context, o options, out, errOut io.Writer) (*outcome, error) {
	out, errOut = lockedWriters(out, errOut)
	cfg := storyConfig{lock: o.lock, key: o.key, ttl: o.ttl, runID: randomID()}
	for _, u := range strings.Split(o.lockd, ",") {
		if u = strings.TrimSpace(u); u != "" {
			if !strings.Contains(u, "://") {
				u = "http://" + u
			}
			cfg.lockd = append(cfg.lockd, u)
		}
	}
	cfg.fencestore = strings.TrimSpace(o.fencestore)
	if cfg.fencestore != "" && !strings.Contains(cfg.fencestore, "://") {
		cfg.fencestore = "http://" + cfg.fencestore
	}
	if cfg.key == "" {
		cfg.key = "report"
		if cfg.fencestore != "" {
			// A running fencestore may remember "report" from an earlier
			// run, with tokens of another cluster.
			cfg.key = "report-" + cfg.runID
		}
	}

	fmt.Fprintln(out, "== lockd fencing demo ==")
	if len(cfg.lockd) == 0 || cfg.fencestore == "" {
		say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
		st, err := startStack(ctx, stackConfig{
			startLockd: len(cfg.lockd) == 0, startFencestore: cfg.fencestore == "",
			members: 3, binDir: o.binDir, verifyKey: o.verifyKey, keep: o.keep,
		}, say)
		if err != nil {
			return nil, err
		}
		defer st.close(o.keep, out)
		if len(cfg.lockd) == 0 {
			cfg.lockd = st.lockdURLs
		}
		if cfg.fencestore == "" {
			cfg.fencestore = st.fencestore
		}
		cfg.signed = st.signed
		res, err := tellAndCheck(ctx, cfg, out, errOut)
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(errOut, "\nserver logs:\n%s", st.logTails(20))
		}
		return res, err
	}
	fmt.Fprintf(out, "lockd: %s\nfencestore: %s\n", strings.Join(cfg.lockd, ", "), cfg.fencestore)
	return tellAndCheck(ctx, cfg, out, errOut)
}

// tellAndCheck tells the story and checks its outcome.
func tellAndCheck(ctx context.Context, cfg storyConfig, out, errOut io.Writer) (*outcome, error) {
	o, err := tell(ctx, cfg, out, errOut)
	if err != nil {
		return o, err
	}
	if err := o.check(cfg.signed); err != nil {
		fmt.Fprintf(out, "\nUNEXPECTED: %v\n", err)
		if o.FinalValue != o.ValueB {
			fmt.Fprintln(out, "A's stale write overwrote B's: this is the corruption fencing tokens exist to prevent.")
		}
		return o, err
	}
	fmt.Fprintf(out, `
What happened: A checked its lease and it was valid; a moment later (for A) it
wrote, but in the meantime its lock had expired and B had taken it and written.
Without fencing, A's write would have silently replaced B's final report with
A's stale draft: two holders, one lost update, no error anywhere. With fencing,
fencestore saw token %d after it had accepted %d and refused it (409
stale_token), so B's value stands. The lock alone could not prevent that; the
token checked by the resource does.

OK: A's late write was refused, and fencestore kept B's value.
`, o.TokenA, o.TokenB)
	return o, nil
}

func randomID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lockedWriters serialises writes to stdout and stderr, which the demo, its
// goroutines and client A's stderr copier share.
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
