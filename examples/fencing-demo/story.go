//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
)

// storyConfig is what the story runs against.
type storyConfig struct {
	lockd      []string // member URLs
	fencestore string   // base URL
	lock       string
	key        string
	ttl        time.Duration
	runID      string // makes client IDs unique per run
	signed     bool   // lockd signs grants: proofs are expected
}

// outcome is what happened, for the final check and for tests.
type outcome struct {
	TokenA, TokenB   uint64
	ProofA, ProofB   bool   // the grants carried a fencing proof
	FirstWriteA      int    // status of A's write before its pause
	WriteB           int    // status of B's write
	StaleWrite       int    // status of A's write after its pause
	StaleCode        string // its error code
	StaleHighest     uint64 // the highest_token it reported
	FinalValue       string // what fencestore holds at the end
	FinalToken       uint64 // its Fencing-Token
	ValueA1, ValueA2 string
	ValueB           string
}

// check says whether the story ended as fencing promises: A's late write
// refused with 409 stale_token, B's value kept.
func (o *outcome) check(signed bool) error {
	var errs []error
	if o.TokenB <= o.TokenA {
		errs = append(errs, fmt.Errorf("B's token %d is not greater than A's %d", o.TokenB, o.TokenA))
	}
	if signed && (!o.ProofA || !o.ProofB) {
		errs = append(errs, fmt.Errorf("lockd signs grants, but a grant came without a fencing proof (A %v, B %v)", o.ProofA, o.ProofB))
	}
	if o.FirstWriteA != http.StatusOK || o.WriteB != http.StatusOK {
		errs = append(errs, fmt.Errorf("the writes of the current holders were not accepted (A: %d, B: %d)", o.FirstWriteA, o.WriteB))
	}
	if o.StaleWrite != http.StatusConflict || o.StaleCode != "stale_token" {
		errs = append(errs, fmt.Errorf("A's late write with token %d got %d %s, want 409 stale_token", o.TokenA, o.StaleWrite, orNone(o.StaleCode)))
	} else if o.StaleHighest != o.TokenB {
		errs = append(errs, fmt.Errorf("the 409 named highest_token %d, want B's %d", o.StaleHighest, o.TokenB))
	}
	if o.FinalValue != o.ValueB || o.FinalToken != o.TokenB {
		errs = append(errs, fmt.Errorf("fencestore holds %q with token %d, want B's %q with token %d", o.FinalValue, o.FinalToken, o.ValueB, o.TokenB))
	}
	return errors.Join(errs...)
}

// narrator prints the story's steps with the time since it began.
type narrator struct {
	w     io.Writer
	start time.Time
}

func (n *narrator) say(who, format string, args ...any) {
	fmt.Fprintf(n.w, "[%5.2fs] %-10s %s\n", time.Since(n.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// tell runs the story: client A is a child process (this program again,
// as the writer), client B runs here. errOut gets A's own stderr.
func tell(ctx context.Context, cfg storyConfig, out, errOut io.Writer) (*outcome, error) {
	o := &outcome{
		ValueA1: "report, draft 1 (by A)",
		ValueA2: "report, draft 2 (by A, finished after its pause)",
		ValueB:  "report, final (by B)",
	}
	fmt.Fprintf(out, `
The story. Clients A and B both update object %q in fencestore, and take
lock %q in lockd first, so that only one of them writes at a time.
The lock has a TTL of %v: if its holder dies, the lock frees itself. Every
grant comes with a fencing token, larger than any token lockd issued before;
clients send it with each write, and fencestore refuses a token lower than one
it has already accepted for that object.

`, cfg.key, cfg.lock, cfg.ttl)
	n := &narrator{w: out, start: time.Now()}

	// Client A: this same program, re-executed as a child process so that
	// it can be frozen for real.
	a, err := startWriter(ctx, writerConfig{
		Endpoints: cfg.lockd, Fencestore: cfg.fencestore, Lock: cfg.lock, Key: cfg.key,
		ClientID: "client-A-" + cfg.runID, TTL: cfg.ttl, Values: [2]string{o.ValueA1, o.ValueA2},
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
	n.say("A", "(process %d) acquired %q: fencing token %d, TTL %v, renewed automatically every %v%s",
		ev.Pid, cfg.lock, ev.Token, cfg.ttl, (cfg.ttl / 3).Round(time.Millisecond), proofNote(ev.Proof))

	if ev, err = a.next(ctx, "put", 30*time.Second); err != nil {
		return o, err
	}
	o.FirstWriteA = ev.Status
	n.say("A", "PUT %s  Fencing-Token: %d  %q  → %s", cfg.key, ev.Token, ev.Value, statusText(ev.Status, ev.Body))
	if ev.Status != http.StatusOK {
		return o, fmt.Errorf("A's first write, as the lock's holder, was refused: %d %s", ev.Status, ev.Body)
	}

	if ev, err = a.next(ctx, "lease", 30*time.Second); err != nil {
		return o, err
	}
	n.say("A", "checks its lease before the next write: still held, %v left. Writing draft 2 ...", time.Duration(ev.LeftMs)*time.Millisecond)
	if _, err = a.next(ctx, "stopping", 30*time.Second); err != nil {
		return o, err
	}
	if err := a.waitStopped(ctx, 30*time.Second); err != nil {
		return o, err
	}
	n.say("A", "... and FREEZES right there, between its check and its write: SIGSTOP.")
	n.say("", "(A stopped itself with SIGSTOP, as `kill -STOP %d` would: the stand-in for a long", a.cmd.Process.Pid)
	n.say("", " stop-the-world GC pause, heavy swapping or a suspended VM. No code of A runs now:")
	n.say("", " no renewal, no keepalive, no timer. A cannot know it is frozen.)")

	// Client B, in this process.
	b, err := client.New(ctx, client.Config{Endpoints: cfg.lockd, ClientID: "client-B-" + cfg.runID})
	if err != nil {
		return o, fmt.Errorf("client B: connect to lockd: %w", err)
	}
	defer b.Close()
	if st, err := b.API().Status(ctx, cfg.lock, false); err == nil && st.Held {
		n.say("lockd", "%q is held by %s with token %d until %s (A's last renewal + TTL)", cfg.lock, st.ClientID, st.FencingToken, clock(st.ExpiresAt))
	}
	n.say("B", "asks for %q and waits in lockd's queue ...", cfg.lock)
	lockB, err := b.Acquire(ctx, cfg.lock, client.WithTTL(cfg.ttl), client.WithAutoRenew(),
		client.WithWaitTimeout(cfg.ttl+30*time.Second))
	if err != nil {
		return o, fmt.Errorf("client B: acquire %q: %w", cfg.lock, err)
	}
	o.TokenB, o.ProofB = lockB.Token(), lockB.Proof() != ""
	n.say("lockd", "A's TTL ran out with no renewal: the lock expired and went to B, next in line")
	n.say("B", "acquired %q: fencing token %d%s%s", cfg.lock, lockB.Token(), nPlusOne(o.TokenA, o.TokenB), proofNote(o.ProofB))

	status, body, err := fencedPut(ctx, cfg.fencestore, cfg.key, o.ValueB, lockB.Fence)
	if err != nil {
		return o, fmt.Errorf("client B: write: %w", err)
	}
	o.WriteB = status
	n.say("B", "PUT %s  Fencing-Token: %d  %q  → %s", cfg.key, lockB.Token(), o.ValueB, statusText(status, body))
	if status != http.StatusOK {
		return o, fmt.Errorf("B's write, as the lock's holder, was refused: %d %s", status, body)
	}

	n.say("demo", "kill -CONT %d: A wakes up, where it froze", a.cmd.Process.Pid)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return o, fmt.Errorf("SIGCONT A: %w", err)
	}
	if _, err = a.next(ctx, "resumed", 30*time.Second); err != nil {
		return o, err
	}
	if ev, err = a.next(ctx, "put", 30*time.Second); err != nil {
		return o, err
	}
	o.StaleWrite = ev.Status
	var reply struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Highest uint64 `json:"highest_token"`
	}
	_ = json.Unmarshal([]byte(ev.Body), &reply)
	o.StaleCode, o.StaleHighest = reply.Error.Code, reply.Highest
	n.say("A", "PUT %s  Fencing-Token: %d  %q  → %s", cfg.key, ev.Token, ev.Value, statusText(ev.Status, ev.Body))
	if ev.Status == http.StatusConflict {
		n.say("fencestore", "refused it: token %d is lower than %d, which it already accepted for %q", ev.Token, reply.Highest, cfg.key)
	}
	if ev, err = a.next(ctx, "lock_state", 30*time.Second); err == nil {
		n.say("A", "only now does its client library notice: %s", ev.Err)
	}

	o.FinalValue, o.FinalToken, err = getObject(ctx, cfg.fencestore, cfg.key)
	if err != nil {
		return o, fmt.Errorf("read back %s: %w", cfg.key, err)
	}
	n.say("fencestore", "GET %s → %q  Fencing-Token: %d", cfg.key, o.FinalValue, o.FinalToken)

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

// writer is client A's process as the story sees it.
type writer struct {
	cmd    *exec.Cmd
	events chan event
	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // its Wait error, once done is closed
}

func startWriter(ctx context.Context, cfg writerConfig, errOut io.Writer) (*writer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run client A: %w", err)
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
	cmd.Env = append(os.Environ(), writerEnv+"="+string(js))
	cmd.Stdout, cmd.Stderr = w, errOut
	cmd.SysProcAttr = dieWithParent(syscall.SIGKILL) // even a stopped A
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start client A: %w", err)
	}
	w.Close()
	a := &writer{cmd: cmd, events: make(chan event, 16), done: make(chan struct{})}
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
func (a *writer) next(ctx context.Context, want string, timeout time.Duration) (event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case e, ok := <-a.events:
		switch {
		case !ok:
			<-a.done
			return e, fmt.Errorf("client A ended (%v) before %q", a.err, want)
		case e.Ev == "fail":
			return e, fmt.Errorf("client A: %s", e.Err)
		case e.Ev != want:
			return e, fmt.Errorf("client A said %q, expected %q", e.Ev, want)
		}
		return e, nil
	case <-t.C:
		return event{}, fmt.Errorf("client A: no %q within %v", want, timeout)
	case <-ctx.Done():
		return event{}, ctx.Err()
	}
}

// waitStopped waits until the kernel reports A stopped (wait4 WUNTRACED),
// so that the SIGCONT that follows cannot come before the stop.
func (a *writer) waitStopped(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pid := a.cmd.Process.Pid
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("client A: wait for its stop: %w", err)
		case wpid == pid && ws.Stopped():
			return nil
		case wpid == pid:
			return fmt.Errorf("client A ended instead of stopping (%v)", ws)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("client A did not stop within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.done:
			return fmt.Errorf("client A ended instead of stopping (%v)", a.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// wait waits for A to exit by itself.
func (a *writer) wait(timeout time.Duration) error {
	select {
	case <-a.done:
		return a.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %v", timeout)
	}
}

// kill ends A, stopped or not, and reaps it.
func (a *writer) kill() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}

// getObject reads an object and its highest accepted token.
func getObject(ctx context.Context, base, key string) (string, uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, objectURL(base, key), nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	body, err := readBody(resp)
	if err != nil {
		return "", 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("%d %s", resp.StatusCode, strings.TrimSpace(body))
	}
	tok, err := strconv.ParseUint(resp.Header.Get("Fencing-Token"), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("header Fencing-Token: %w", err)
	}
	return body, tok, nil
}

func statusText(status int, body string) string {
	s := fmt.Sprintf("%d %s", status, http.StatusText(status))
	if status != http.StatusOK {
		var r struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(body), &r) == nil && r.Error.Code != "" {
			s += " " + r.Error.Code
		}
		s += "  " + body
	}
	return s
}

func orNone(code string) string {
	if code == "" {
		return "(no error code)"
	}
	return code
}

func proofNote(proof bool) string {
	if proof {
		return ", and a fencing proof signed by lockd"
	}
	return ""
}

func nPlusOne(a, b uint64) string {
	if b == a+1 {
		return " (A's token + 1)"
	}
	if b > a {
		return fmt.Sprintf(" (> A's %d)", a)
	}
	return ""
}

// clock shows the time of day of an RFC 3339 timestamp.
func clock(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	return t.Local().Format("15:04:05.000")
}
