//go:build unix

package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/fence/sqlfence"
)

// storyConfig is what the story runs against.
type storyConfig struct {
	lockd     []string // member URLs
	dsn       string
	verifyKey ed25519.PublicKey // nil: proofs are not checked
	lock      string
	ttl       time.Duration
	run       string // this run's accounts and fence key, and client IDs
	unfenced  bool   // A's late write skips the fence
}

// outcome is what happened, for the final check and for tests.
type outcome struct {
	TokenA, TokenB uint64
	ProofA, ProofB bool
	Refused        bool   // A's late write was refused
	RefusedStale   bool   // ... as stale
	RefusedHighest uint64 // ... naming this highest token
	RefusedErr     string
	Audit          *audit
	FenceToken     uint64 // the guard row's token at the end
}

// check says whether the story ended as fencing promises.
func (o *outcome) check(signed bool) error {
	var errs []error
	if o.TokenB <= o.TokenA {
		errs = append(errs, fmt.Errorf("B's token %d is not greater than A's %d", o.TokenB, o.TokenA))
	}
	if signed && (!o.ProofA || !o.ProofB) {
		errs = append(errs, fmt.Errorf("the grants are checked for proofs, but came without (A %v, B %v)", o.ProofA, o.ProofB))
	}
	if !o.Refused || !o.RefusedStale || o.RefusedHighest != o.TokenB {
		errs = append(errs, fmt.Errorf("A's late write with token %d: refused %v (stale %v, highest %d, %q); want refused as stale with B's token %d",
			o.TokenA, o.Refused, o.RefusedStale, o.RefusedHighest, o.RefusedErr, o.TokenB))
	}
	if o.Audit == nil {
		errs = append(errs, errors.New("no audit of the ledger"))
	} else if err := o.Audit.balanced(); err != nil {
		errs = append(errs, fmt.Errorf("the ledger is not balanced: %w", err))
	}
	if o.FenceToken != o.TokenB {
		errs = append(errs, fmt.Errorf("the ledger's fence holds token %d, want B's %d", o.FenceToken, o.TokenB))
	}
	return errors.Join(errs...)
}

// narrator prints the story's steps with the time since it began.
type narrator struct {
	w     io.Writer
	start time.Time
}

func (n *narrator) say(who, format string, args ...any) {
	fmt.Fprintf(n.w, "[%5.2fs] %-9s %s\n", time.Since(n.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// tell runs the story: worker A is a child process (this program again),
// worker B runs here. errOut gets A's own stderr.
func tell(ctx context.Context, cfg storyConfig, out, errOut io.Writer) (*outcome, error) {
	o := &outcome{}
	db, err := sql.Open("pgx", cfg.dsn)
	if err != nil {
		return o, err
	}
	defer db.Close()
	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.Postgres, VerifyKey: cfg.verifyKey})
	if err != nil {
		return o, err
	}
	l, err := openLedger(ctx, db, f, cfg.run)
	if err != nil {
		return o, fmt.Errorf("set up the ledger: %w", err)
	}
	fmt.Fprintf(out, `
The story. Workers A and B move money between accounts alice and bob
(%d each) in PostgreSQL: tables sql_fencing_accounts and
sql_fencing_transfers, run %s. Each takes lock %q in lockd first,
so that only one of them works at a time. The lock has a TTL of %v: if its
holder dies, it frees itself. Every grant carries a fencing token, larger
than any lockd issued before, and every write goes through sqlfence.Do,
which checks the token against the ledger's row in %s, in the write's
own transaction; %s.

`, opening, cfg.run, cfg.lock, cfg.ttl, f.Table(), verifyKeyNote(cfg.verifyKey))
	n := &narrator{w: out, start: time.Now()}

	a, err := startWorker(ctx, workerConfig{
		Lockd: cfg.lockd, DSN: cfg.dsn, Lock: cfg.lock, Run: cfg.run, ClientID: "worker-A-" + cfg.run,
		TTL: cfg.ttl, VerifyKey: cfg.verifyKey, Unfenced: cfg.unfenced,
	}, errOut)
	if err != nil {
		return o, err
	}
	defer a.kill()

	ev, err := a.next(ctx, "acquired", 60*time.Second)
	if err != nil {
		return o, err
	}
	o.TokenA, o.ProofA = ev.Token, ev.Proof
	n.say("A", "(process %d) acquired %q: fencing token %d, TTL %v, renewed automatically%s", ev.Pid, cfg.lock, ev.Token, cfg.ttl, proofNote(ev.Proof))
	if _, err = a.next(ctx, "transferred", 30*time.Second); err != nil {
		return o, err
	}
	n.say("A", "transfer #1: alice → bob 100, fencing token %d → committed", o.TokenA)
	if ev, err = a.next(ctx, "planned", 30*time.Second); err != nil {
		return o, err
	}
	p := ev.Plan
	n.say("A", "transfer #2: reads alice %d, bob %d; will write alice %d, bob %d (after a slow call to the payment provider)",
		p.ReadFrom, p.ReadTo, p.NewFrom, p.NewTo)
	if ev, err = a.next(ctx, "lease", 30*time.Second); err != nil {
		return o, err
	}
	n.say("A", "checks its lease before writing: still held, %v left. Writing ...", time.Duration(ev.LeftMs)*time.Millisecond)
	if _, err = a.next(ctx, "stopping", 30*time.Second); err != nil {
		return o, err
	}
	if err := a.waitStopped(ctx, 30*time.Second); err != nil {
		return o, err
	}
	n.say("A", "... and FREEZES right there, between its check and its write: SIGSTOP (kill -STOP %d).", a.cmd.Process.Pid)
	n.say("", "(a stand-in for a long GC pause, heavy swapping or a suspended VM: no renewal, no keepalive)")

	b, err := client.New(ctx, client.Config{Endpoints: cfg.lockd, ClientID: "worker-B-" + cfg.run})
	if err != nil {
		return o, fmt.Errorf("worker B: connect to lockd: %w", err)
	}
	defer b.Close()
	n.say("B", "asks for %q and waits in lockd's queue ...", cfg.lock)
	lockB, err := b.Acquire(ctx, cfg.lock, client.WithTTL(cfg.ttl), client.WithAutoRenew(), client.WithWaitTimeout(cfg.ttl+30*time.Second))
	if err != nil {
		return o, fmt.Errorf("worker B: acquire %q: %w", cfg.lock, err)
	}
	o.TokenB, o.ProofB = lockB.Token(), lockB.Proof() != ""
	n.say("lockd", "A's TTL ran out with no renewal: the lock expired and went to B")
	n.say("B", "acquired %q: fencing token %d%s", cfg.lock, o.TokenB, proofNote(o.ProofB))
	if err := l.transfer(ctx, sqlfence.CredentialsOf(lockB), "B", "bob", "alice", 300); err != nil {
		return o, fmt.Errorf("worker B's transfer, as the lock's holder: %w", err)
	}
	bals, err := l.balances(ctx)
	if err != nil {
		return o, err
	}
	n.say("B", "transfer: bob → alice 300, fencing token %d → committed (alice %d, bob %d)", o.TokenB, bals["alice"], bals["bob"])

	n.say("demo", "kill -CONT %d: A wakes up where it froze", a.cmd.Process.Pid)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return o, fmt.Errorf("SIGCONT A: %w", err)
	}
	if _, err = a.next(ctx, "resumed", 30*time.Second); err != nil {
		return o, err
	}
	ev, err = a.nextOf(ctx, 30*time.Second, "refused", "applied")
	if err != nil {
		return o, err
	}
	how := "sqlfence.Do"
	if cfg.unfenced {
		how = "a plain transaction, WITHOUT the fence"
	}
	if ev.Ev == "refused" {
		o.Refused, o.RefusedStale, o.RefusedHighest, o.RefusedErr = true, ev.Stale, ev.Highest, ev.Err
		n.say("A", "transfer #2: writes alice %d, bob %d with fencing token %d → REFUSED by PostgreSQL: %s", p.NewFrom, p.NewTo, ev.Token, ev.Err)
		n.say("postgres", "rolled A's transaction back: not a row of it was written")
	} else {
		n.say("A", "transfer #2: writes alice %d, bob %d with fencing token %d through %s → committed", p.NewFrom, p.NewTo, ev.Token, how)
	}
	if ev, err = a.next(ctx, "lock_state", 30*time.Second); err == nil {
		n.say("A", "only now does its client library notice: %s", ev.Err)
	}

	if o.Audit, err = l.audit(ctx); err != nil {
		return o, fmt.Errorf("audit the ledger: %w", err)
	}
	rec, err := f.Get(ctx, l.key)
	if err != nil {
		return o, err
	}
	o.FenceToken = rec.Token
	n.say("postgres", "balances: alice %d, bob %d (total %d); the journal says alice %d, bob %d; %s holds token %d for %q",
		o.Audit.Balances["alice"], o.Audit.Balances["bob"], o.Audit.Balances["alice"]+o.Audit.Balances["bob"],
		o.Audit.Expected["alice"], o.Audit.Expected["bob"], f.Table(), rec.Token, l.key)
	var journal []string
	for _, e := range o.Audit.Journal {
		journal = append(journal, fmt.Sprintf("%s→%s %d by %s (token %s)", e.From, e.To, e.Amount, e.Worker, e.Token))
	}
	n.say("postgres", "journal: %s", strings.Join(journal, "; "))

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := lockB.Release(rctx); err == nil {
		n.say("B", "released %q", cfg.lock)
	}
	cancel()
	if err := a.wait(15 * time.Second); err != nil {
		n.say("A", "did not end cleanly: %v", err)
	}
	return o, nil
}

func proofNote(proof bool) string {
	if proof {
		return ", and a proof signed by lockd"
	}
	return ""
}

// worker is A's process as the story sees it.
type worker struct {
	cmd    *exec.Cmd
	events chan event
	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // its Wait error, once done is closed
}

func startWorker(ctx context.Context, cfg workerConfig, errOut io.Writer) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run worker A: %w", err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	cmd.Stdout, cmd.Stderr = w, errOut
	cmd.SysProcAttr = dieWithParent(syscall.SIGKILL) // even a stopped A
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start worker A: %w", err)
	}
	w.Close()
	a := &worker{cmd: cmd, events: make(chan event, 16), done: make(chan struct{})}
	go func() {
		defer close(a.events)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				a.events <- e
			}
		}
	}()
	go func() { a.err = cmd.Wait(); close(a.done) }()
	return a, nil
}

// next returns A's next event, which must be want.
func (a *worker) next(ctx context.Context, want string, timeout time.Duration) (event, error) {
	return a.nextOf(ctx, timeout, want)
}

// nextOf returns A's next event, which must be one of want.
func (a *worker) nextOf(ctx context.Context, timeout time.Duration, want ...string) (event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case e, ok := <-a.events:
		switch {
		case !ok:
			<-a.done
			return e, fmt.Errorf("worker A ended (%v) before %q", a.err, want)
		case e.Ev == "fail":
			return e, fmt.Errorf("worker A: %s", e.Err)
		}
		for _, w := range want {
			if e.Ev == w {
				return e, nil
			}
		}
		return e, fmt.Errorf("worker A said %q, expected %q", e.Ev, want)
	case <-t.C:
		return event{}, fmt.Errorf("worker A: no %q within %v", want, timeout)
	case <-ctx.Done():
		return event{}, ctx.Err()
	}
}

// waitStopped waits until the kernel reports A stopped (wait4 WUNTRACED),
// so that the SIGCONT that follows cannot come before the stop.
func (a *worker) waitStopped(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pid := a.cmd.Process.Pid
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("worker A: wait for its stop: %w", err)
		case wpid == pid && ws.Stopped():
			return nil
		case wpid == pid:
			return fmt.Errorf("worker A ended instead of stopping (%v)", ws)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker A did not stop within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.done:
			return fmt.Errorf("worker A ended instead of stopping (%v)", a.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// wait waits for A to exit by itself.
func (a *worker) wait(timeout time.Duration) error {
	select {
	case <-a.done:
		return a.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %v", timeout)
	}
}

// kill ends A, stopped or not, and reaps it.
func (a *worker) kill() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}
