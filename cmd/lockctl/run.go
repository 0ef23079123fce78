package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lockd/lockd/client"
)

// forwarded are the signals lockctl run passes on to the command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

func (e *env) runCmd() *cobra.Command {
	var ttl, wait, sessionTTL, grace time.Duration
	var kf *kindFlags
	c := &cobra.Command{
		Use:   "run NAME[,NAME...] [--ttl D] [--wait D] [--session-ttl 15s] [--grace 10s] [--shared] [--limit N] [--lock-delay D] [--value V] -- CMD [ARGS...]",
		Short: "hold a lock through a session while CMD runs (cron jobs)",
		Long: `Hold NAME through a session while CMD runs. CMD inherits stdin, stdout and
stderr, runs in its own process group, and gets LOCKD_LOCK,
LOCKD_FENCING_TOKEN and (when the server signs grants) LOCKD_FENCING_PROOF
in its environment: pass the token to whatever the job writes to.

NAME,NAME holds several locks, taken in one step or none (a multi-lock);
the variables are then comma-separated lists in name order, and losing any
of the locks counts as losing the lock. The lock-kind flags are acquire's.

A wait for the lock rides through a failover (the session is resumed on
the new leader, the acquire keeps its place); a signal before the lock is
taken withdraws the wait (exit 128+N). Once CMD runs, signals to lockctl
(INT, TERM, HUP, QUIT, USR1, USR2) are passed on to CMD.
If the lock is lost (the client's conservative local lease runs out, or the
server ends the lock or the session), CMD's group gets SIGTERM at once and
SIGKILL after --grace, and lockctl exits 3. Otherwise lockctl releases the
lock and exits with CMD's exit code (128+N if CMD died of signal N).
Without --ttl the lock lives as long as the session; with it, it is renewed.

The first argument after NAME is CMD: lockctl's own flags come before it
(or before "--").`,
		Example: `  lockctl run reports/hourly --wait 0s -- /usr/local/bin/make-report
  */5 * * * * lockctl run reports/hourly -- make-report   # in a crontab, on every host`,
		// run parses its own flags: they end where CMD begins.
		DisableFlagParsing: true,
		Annotations:        map[string]string{stopAfter: "2"},
		RunE: func(c *cobra.Command, args []string) error {
			fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.SetNormalizeFunc(normalizeFlag)
			fs.AddFlagSet(c.Flags())
			fs.AddFlagSet(c.InheritedFlags())
			pos, rest, err := parseArgs(fs, args, 2)
			if errors.Is(err, errHelp) {
				return c.Help()
			}
			if err != nil {
				return flagError(c, err)
			}
			if err := e.setup(c); err != nil {
				return err
			}
			if len(pos) == 0 {
				return errors.New("run: missing NAME")
			}
			argv := append(pos[1:], rest...)
			if len(argv) == 0 {
				return errors.New("run: missing CMD (lockctl run NAME -- CMD [ARGS...])")
			}
			// Several locks are one argument, NAME,NAME: the first argument
			// after NAME is CMD.
			names, err := lockNames(pos[:1])
			if err == nil {
				err = kf.check(len(names) > 1)
			}
			if err != nil {
				return err
			}
			return status(e.run(c.Context(), names, argv, runFlags{ttl: ttl, wait: wait, sessionTTL: sessionTTL, grace: grace, kf: kf}))
		},
	}
	fs := c.Flags()
	durationVar(fs, &ttl, "ttl", 0, "lock TTL, renewed while CMD runs (default: none, the lock lives with the session)")
	durationVar(fs, &wait, "wait", 0, "how long to wait for the lock (0: try once)")
	durationVar(fs, &sessionTTL, "session-ttl", 15*time.Second, "session TTL: how long the cluster keeps the lock after lockctl stops answering")
	durationVar(fs, &grace, "grace", 10*time.Second, "after a lost lock, how long CMD has between SIGTERM and SIGKILL")
	kf = addKindFlags(fs)
	return c
}

// runFlags are run's flags.
type runFlags struct {
	ttl, wait, sessionTTL, grace time.Duration
	kf                           *kindFlags
}

func (e *env) run(ctx context.Context, names, argv []string, f runFlags) int {
	name := strings.Join(names, ",")
	tc, err := e.tlsConfig()
	if err != nil {
		return e.setupFailed(err)
	}

	sigCh := make(chan os.Signal, 8)
	signal.Notify(sigCh, forwarded...)
	defer signal.Stop(sigCh)

	// Take the lock; a signal meanwhile gives up.
	type result struct {
		c   *client.Client
		ls  []*client.Lock
		err error
	}
	resCh := make(chan result, 1)
	actx, cancel := context.WithTimeout(ctx, e.g.timeout+f.wait)
	defer cancel()
	what := "lock " + name
	if len(names) > 1 {
		what = "locks " + name
	}
	e.deadline, _ = actx.Deadline()
	go func() {
		c, ls, err := e.runAcquire(actx, tc, names, f.ttl, f.wait, f.sessionTTL, f.kf.options(), what)
		resCh <- result{c, ls, err}
	}()
	var r result
	select {
	case r = <-resCh:
	case s := <-sigCh:
		cancel()
		r = <-resCh
		if r.c != nil {
			_ = r.c.Close()
		}
		// The client withdrew the wait as the acquire's ctx ended, and
		// Close ends the session (and any grant that raced the withdrawal).
		e.note("%s: interrupted by %s before the lock was taken; the wait was withdrawn", what, sigName(s))
		return 128 + int(s.(syscall.Signal))
	}
	if r.err != nil {
		if r.c != nil {
			e.nameHolder(r.c.API(), names[0], &r.err)
			_ = r.c.Close()
		}
		return e.fail(r.err, what)
	}
	c, ls := r.c, r.ls
	defer c.Close()
	// The locks of a multi-lock share one fate: ls[0].Lost closes when
	// any of them is lost.
	l := ls[0]
	heldNames, tokens, proofs := make([]string, len(ls)), make([]string, len(ls)), make([]string, len(ls))
	for i, l := range ls {
		heldNames[i], tokens[i], proofs[i] = l.Name(), strconv.FormatUint(l.Token(), 10), l.Proof()
	}
	name = strings.Join(heldNames, ",") // in name order, as the tokens
	token := strings.Join(tokens, ",")

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	// Several locks: comma-separated lists, in name order.
	cmd.Env = append(os.Environ(), "LOCKD_LOCK="+name, "LOCKD_FENCING_TOKEN="+token)
	if !slices.Contains(proofs, "") {
		cmd.Env = append(cmd.Env, "LOCKD_FENCING_PROOF="+strings.Join(proofs, ","))
	}
	// Its own process group, so that a lost lock stops the whole job, not
	// only a shell whose children would go on writing.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.releaseAll(ls)
		fmt.Fprintf(e.stderr, "lockctl: starting %s: %s\n", safe(argv[0]), safe(err.Error()))
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 127
		}
		return 126
	}
	pgid := cmd.Process.Pid
	waitCh := make(chan error, 1)
	go func() { waitCh <- cmd.Wait() }()

	lost := l.Lost()
	var lostErr error
	var killAfter <-chan time.Time
	var werr error
wait:
	for {
		select {
		case werr = <-waitCh:
			break wait
		case <-lost:
			lost = nil
			lostErr = l.Err()
			fmt.Fprintf(e.stderr, "lockctl: lost lock %s (token %s): %s; sent SIGTERM to %s, SIGKILL in %v\n", safe(name), token, safe(lostCause(lostErr)), safe(argv[0]), f.grace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			t := time.NewTimer(f.grace)
			defer t.Stop()
			killAfter = t.C
		case <-killAfter:
			killAfter = nil
			fmt.Fprintf(e.stderr, "lockctl: %s still running %v after SIGTERM; sent SIGKILL\n", safe(argv[0]), f.grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case s := <-sigCh:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		}
	}
	if lostErr == nil {
		if err := l.Err(); err != nil {
			// Lost while CMD was exiting: its last writes may have raced
			// another holder, so report the loss all the same.
			lostErr = err
			fmt.Fprintf(e.stderr, "lockctl: lost lock %s (token %s) as %s exited: %s\n", safe(name), token, safe(argv[0]), safe(lostCause(lostErr)))
		}
	}
	if lostErr != nil {
		return exitLost
	}
	e.releaseAll(ls)
	return commandExit(werr)
}

// runAcquire opens the session and takes the lock(s).
func (e *env) runAcquire(ctx context.Context, tc *tls.Config, names []string, ttl, wait, sessionTTL time.Duration, opts []client.AcquireOption, what string) (*client.Client, []*client.Lock, error) {
	c, err := client.New(ctx, client.Config{Endpoints: e.endpoints(), ClientID: e.sessionClientID(), SessionTTL: sessionTTL, Logger: e.logger(), DialTimeout: -1, // ctx bounds it (--timeout)
		TLSConfig: tc, Token: e.g.token, OnRetry: e.waitingNote(what)})
	if err != nil {
		return nil, nil, err
	}
	if ttl > 0 {
		opts = append(opts, client.WithTTL(ttl), client.WithAutoRenew())
	}
	var ls []*client.Lock
	if wait > 0 {
		ls, err = c.AcquireMany(ctx, names, append(opts, client.WithWaitTimeout(wait))...)
	} else {
		ls, err = c.TryAcquireMany(ctx, names, opts...)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && wait > 0 {
			err = fmt.Errorf("%w after %v: %w", client.ErrWaitTimeout, wait, err)
		}
		return c, nil, err
	}
	return c, ls, nil
}

// logger is the client's logger: debug lines on stderr with
// LOCKCTL_DEBUG set, else none.
func (e *env) logger() *slog.Logger {
	if e.getenv("LOCKCTL_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// nameHolder adds the current holder to a lock_held or wait_timeout error
// that does not name one (WebSocket errors and wait_timeout replies don't).
func (e *env) nameHolder(a *client.API, name string, errp *error) {
	err := *errp
	if !errors.Is(err, client.ErrLockHeld) && !errors.Is(err, client.ErrWaitTimeout) {
		return
	}
	var se *client.ServerError
	if errors.As(err, &se) && se.Holder != "" {
		return
	}
	lock := ""
	if se != nil && se.Lock != "" {
		name, lock = se.Lock, se.Lock // the lock that blocked a multi-lock
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, serr := a.Status(ctx, name, true)
	if serr != nil || !st.Held {
		return
	}
	code := "lock_held"
	if errors.Is(err, client.ErrWaitTimeout) {
		code = "wait_timeout"
	}
	*errp = &client.ServerError{API: apiError(code, err.Error()), Lock: lock, Holder: fmt.Sprintf("%s, token %d", st.ClientID, st.FencingToken)}
}

func (e *env) releaseAll(ls []*client.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), e.g.timeout)
	defer cancel()
	for _, l := range ls {
		if err := l.Release(ctx); err != nil {
			fmt.Fprintf(e.stderr, "lockctl: releasing lock %s: %s (the session end releases it)\n", safe(l.Name()), safe(err.Error()))
		}
	}
}

// lostCause words why a lock was lost.
func lostCause(err error) string {
	switch {
	case errors.Is(err, client.ErrLeaseExpired):
		return "no keepalive was confirmed by the leader in time (cut off from the cluster?)"
	case errors.Is(err, client.ErrSessionExpired):
		return "the session ended on the server (expired or deleted)"
	case errors.Is(err, client.ErrLockExpired):
		return "the lock's TTL ran out on the server"
	case errors.Is(err, client.ErrRevoked):
		return "the lock was revoked (lockctl revoke, or DELETE /api/v1/locks/NAME)"
	case errors.Is(err, client.ErrNotHolder):
		return "the server no longer has this client as the holder"
	}
	return fmt.Sprint(err)
}

// commandExit maps CMD's end to lockctl's exit code: its own, or 128+N for
// signal N.
func commandExit(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitError
}
