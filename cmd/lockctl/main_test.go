package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// bin is the lockctl binary built once for the tests that run it as a
// process (run: signals, process groups, exit codes).
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockctl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "lockctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building lockctl: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		// A real cluster (secure_test.go) leaves hashicorp/raft's readers of
		// inbound connections from killed members, which its
		// NetworkTransport does not close.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		maxPos    int
		pos, rest string
		wait      time.Duration
		err       bool
	}{
		{args: []string{"bar-run", "--wait", "10s", "--", "sh", "-c", "echo hi"}, maxPos: 2, pos: "bar-run", rest: "sh|-c|echo hi", wait: 10 * time.Second},
		{args: []string{"--wait", "1s", "bar", "--", "sh"}, maxPos: 2, pos: "bar", rest: "sh", wait: time.Second},
		{args: []string{"bar", "--wait=2s", "sh", "-c", "x"}, maxPos: 2, pos: "bar|sh", rest: "-c|x", wait: 2 * time.Second},
		{args: []string{"bar", "--", "sh", "--wait", "5s"}, maxPos: 2, pos: "bar", rest: "sh|--wait|5s"},
		{args: []string{"a", "--wait", "3s", "b"}, maxPos: 0, pos: "a|b", wait: 3 * time.Second},
		{args: []string{"a", "--nope"}, err: true},
		{args: []string{"--wait", "soon"}, err: true},
		{args: []string{}, pos: ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			wait := fs.Duration("wait", 0, "")
			pos, rest, err := parseArgs(fs, tc.args, tc.maxPos)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if err != nil {
				return
			}
			if p, r := strings.Join(pos, "|"), strings.Join(rest, "|"); p != tc.pos || r != tc.rest || *wait != tc.wait {
				t.Fatalf("pos %q rest %q wait %v; want %q %q %v", p, r, *wait, tc.pos, tc.rest, tc.wait)
			}
		})
	}
}

// cli runs lockctl in-process.
func cli(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = lockctl(t.Context(), args, func(k string) string { return env[k] }, &out, &errb)
	t.Logf("lockctl %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

func TestUsageAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{[]string{"--version"}, exitOK, "lockctl "},
		{[]string{"--help"}, exitOK, "Exit codes:"},
		{[]string{}, exitUsage, "Usage:"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"acquire"}, exitUsage, "missing NAME"},
		{[]string{"acquire", "a", "b", "a"}, exitUsage, `lock "a" named twice`},
		{[]string{"acquire", "a,,b"}, exitUsage, "empty lock name"},
		{[]string{"acquire", "a", "--shared", "--limit", "2"}, exitUsage, "a shared lock has no limit above 1"},
		{[]string{"acquire", "a", "b", "--limit", "2"}, exitUsage, "limit-1 locks only"},
		{[]string{"acquire", "a", "--limit", "10001"}, exitUsage, "--limit 10001"},
		{[]string{"acquire", "a", "--lock-delay", "2m"}, exitUsage, "--lock-delay 2m0s"},
		{[]string{"acquire", "a", "--value", strings.Repeat("v", 4097)}, exitUsage, "--value"},
		{[]string{"run", "a,b", "--limit", "3", "--", "true"}, exitUsage, "limit-1 locks only"},
		{[]string{"run", "a,a", "--", "true"}, exitUsage, "named twice"},
		{[]string{"revoke"}, exitUsage, "missing NAME"},
		{[]string{"revoke", "-h"}, exitOK, "-token"},
		{[]string{"acquire", "-h"}, exitOK, "-lock-delay"},
		{[]string{"run", "-h"}, exitOK, "-shared"},
		{[]string{"--help"}, exitOK, "revoke NAME [--token N]"},
		{[]string{"--help"}, exitOK, "acquire NAME [NAME...]"},
		{[]string{"release", "x"}, exitUsage, "--token is required"},
		{[]string{"status", "x", "-o", "yaml"}, exitUsage, "want text or json"},
		{[]string{"run", "x"}, exitUsage, "missing CMD"},
		{[]string{"run"}, exitUsage, "missing NAME"},
		{[]string{"session", "frob"}, exitUsage, "unknown subcommand"},
		{[]string{"cluster", "add", "n4"}, exitUsage, "missing RAFTADDR"},
		{[]string{"acquire", "--ttl", "x", "a"}, exitUsage, "invalid value"},
		{[]string{"status", "-h"}, exitOK, "usage: lockctl status"},
		{[]string{"--help"}, exitOK, "snapshot restore FILE [--force]"},
		{[]string{"--help"}, exitOK, "7  not authorized"},
		{[]string{"--help"}, exitOK, "--auth-token T"},
		{[]string{"snapshot"}, exitUsage, "want save FILE or restore FILE"},
		{[]string{"snapshot", "save"}, exitUsage, "missing FILE"},
		{[]string{"snapshot", "restore", "a", "b"}, exitUsage, `unexpected argument "b"`},
		{[]string{"snapshot", "frob"}, exitUsage, "unknown subcommand"},
		{[]string{"snapshot", "restore", "-h"}, exitOK, "-force"},
		{[]string{"snapshot", "restore", "-h"}, exitOK, "-min-token"},
		{[]string{"--help"}, exitOK, "--min-token N"},
		{[]string{"list", "-h"}, exitOK, "-limit"},
		{[]string{"list", "--limit", "-1"}, exitUsage, "--limit"},
		{[]string{"status", "x", "--cert", "c.pem"}, exitUsage, "--cert and --key go together"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := cli(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(out+errs, tc.out) {
				t.Fatalf("code %d (want %d), output %q (want %q)", code, tc.code, out+errs, tc.out)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	code, out, _ := cli(t, env, "acquire", "jobs/a", "--client-id", "w1", "--ttl", "30s")
	if code != exitOK || !strings.Contains(out, "jobs/a acquired token=1 expires_at=") {
		t.Fatalf("acquire: %d %q", code, out)
	}
	code, _, errs := cli(t, env, "--client-id", "w2", "acquire", "jobs/a")
	if code != exitNotAcquired || !strings.Contains(errs, "held by w1") {
		t.Fatalf("held: %d %q", code, errs)
	}
	code, _, errs = cli(t, env, "--client-id", "w2", "acquire", "jobs/a", "--wait", "200ms")
	if code != exitNotAcquired || !strings.Contains(errs, "timed out waiting") {
		t.Fatalf("wait: %d %q", code, errs)
	}
	code, _, errs = cli(t, env, "release", "jobs/a", "--token", "1", "--client-id", "w2")
	if code != exitNotHolder || !strings.Contains(errs, "not the holder") {
		t.Fatalf("release by a stranger: %d %q", code, errs)
	}
	code, out, _ = cli(t, env, "renew", "jobs/a", "--token", "1", "--client-id", "w1", "--ttl", "1m")
	if code != exitOK || !strings.Contains(out, "renewed") {
		t.Fatalf("renew: %d %q", code, out)
	}
	code, out, _ = cli(t, env, "status", "jobs/a", "-o", "json")
	var st api.LockStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || !st.Held || st.ClientID != "w1" {
		t.Fatalf("status: %d %q", code, out)
	}
	code, out, _ = cli(t, env, "list", "--prefix", "jobs/")
	if code != exitOK || !strings.Contains(out, "jobs/a") || !strings.Contains(out, "w1") {
		t.Fatalf("list: %d %q", code, out)
	}
	code, _, _ = cli(t, env, "release", "jobs/a", "--token", "1", "--client-id", "w1")
	if code != exitOK {
		t.Fatalf("release: %d", code)
	}
	code, out, _ = cli(t, env, "status", "jobs/a")
	if code != exitOK || !strings.Contains(out, "jobs/a free") {
		t.Fatalf("status after release: %d %q", code, out)
	}

	code, out, _ = cli(t, env, "session", "create", "--ttl", "5s", "-o", "json")
	var s api.SessionReply
	if code != exitOK || json.Unmarshal([]byte(out), &s) != nil || s.SessionID == "" {
		t.Fatalf("session create: %d %q", code, out)
	}
	if code, _, _ = cli(t, env, "session", "keepalive", s.SessionID); code != exitOK {
		t.Fatalf("keepalive: %d", code)
	}
	if code, _, _ = cli(t, env, "session", "delete", s.SessionID); code != exitOK {
		t.Fatalf("delete: %d", code)
	}
	code, _, errs = cli(t, env, "session", "keepalive", s.SessionID)
	if code != exitNotHolder || !strings.Contains(errs, "session expired") {
		t.Fatalf("keepalive of a deleted session: %d %q", code, errs)
	}

	code, out, _ = cli(t, env, "cluster", "status")
	if code != exitOK || !strings.Contains(out, "leader node1") {
		t.Fatalf("cluster status: %d %q", code, out)
	}
	if code, _, _ = cli(t, env, "cluster", "add", "node9", "127.0.0.1:1", "127.0.0.1:2"); code != exitOK {
		t.Fatalf("cluster add: %d", code)
	}
	if code, _, _ = cli(t, env, "cluster", "remove", "node9"); code != exitOK {
		t.Fatalf("cluster remove: %d", code)
	}

	f.SetLeader(-1)
	code, _, errs = cli(t, env, "status", "x", "--timeout", "300ms")
	if code != exitNoLeader || !strings.Contains(errs, "no leader") {
		t.Fatalf("no leader: %d %q", code, errs)
	}
}

// runLockctl starts the lockctl binary.
func runLockctl(t *testing.T, endpoint string, stdout io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+endpoint)
	cmd.Stdout = stdout
	cmd.Stderr = stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func exitOf(t *testing.T, cmd *exec.Cmd, within time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return commandExit(err)
	case <-time.After(within):
		cmd.Process.Kill()
		<-done
		t.Fatalf("lockctl did not exit within %v", within)
	}
	return -1
}

func TestRunPassesEnvAndExitCode(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Proofs: true})
	defer f.Close()
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "jobs/x", "--", "sh", "-c", `echo "lock=$LOCKD_LOCK token=$LOCKD_FENCING_TOKEN proof=$LOCKD_FENCING_PROOF"; exit 7`)
	if code := exitOf(t, cmd, 10*time.Second); code != 7 {
		t.Fatalf("exit %d, want CMD's 7; output %q", code, out)
	}
	if want := "lock=jobs/x token=1 proof=proof:jobs/x:1"; !strings.Contains(out.String(), want) {
		t.Fatalf("output %q lacks %q", out, want)
	}
	if _, _, held := f.Holder("jobs/x"); held {
		t.Fatal("lock still held after run")
	}
	if len(f.Sessions()) != 0 {
		t.Fatalf("sessions left: %v", f.Sessions())
	}
}

// Two runs on one lock never overlap and see increasing tokens (the
// contract's clients-run check, against the fake).
func TestRunMutualExclusion(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	marks := filepath.Join(t.TempDir(), "marks")
	job := `echo "start $LOCKD_FENCING_TOKEN" >>` + marks + `; sleep 0.3; echo "end $LOCKD_FENCING_TOKEN" >>` + marks
	var cmds []*exec.Cmd
	var outs []*testutil.SyncBuffer
	for range 3 {
		out := &testutil.SyncBuffer{}
		outs = append(outs, out)
		cmds = append(cmds, runLockctl(t, f.URL(0), out, "run", "bar-run", "--wait", "10s", "--", "sh", "-c", job))
	}
	for i, cmd := range cmds {
		if code := exitOf(t, cmd, 20*time.Second); code != 0 {
			t.Fatalf("run %d exit %d: %s", i, code, outs[i])
		}
	}
	data, _ := os.ReadFile(marks)
	lines := strings.Fields(strings.ReplaceAll(string(data), "\n", " "))
	if len(lines) != 12 {
		t.Fatalf("marks %q", data)
	}
	last := ""
	for i := 0; i < len(lines); i += 4 {
		if lines[i] != "start" || lines[i+2] != "end" || lines[i+1] != lines[i+3] {
			t.Fatalf("interleaved: %q", data)
		}
		if last != "" && !(len(lines[i+1]) > len(last) || lines[i+1] > last) {
			t.Fatalf("tokens not increasing: %q", data)
		}
		last = lines[i+1]
	}
}

// A lost lock stops CMD (SIGTERM to its group) and lockctl exits 3.
func TestRunLostLockStopsCommand(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	dir := t.TempDir()
	started, termed := filepath.Join(dir, "started"), filepath.Join(dir, "termed")
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "L", "--grace", "5s", "--", "sh", "-c",
		`trap 'echo term > `+termed+`; exit 1' TERM; touch `+started+`; while :; do sleep 0.05; done`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CMD did not start: %s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	sessions := f.Sessions()
	if len(sessions) != 1 {
		t.Fatalf("sessions %v", sessions)
	}
	start := time.Now()
	f.ExpireSession(sessions[0]) // deleted from outside
	if code := exitOf(t, cmd, 5*time.Second); code != exitLost {
		t.Fatalf("exit %d, want %d: %s", code, exitLost, out)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v to stop CMD", d)
	}
	if _, err := os.Stat(termed); err != nil {
		t.Fatalf("CMD got no SIGTERM: %s", out)
	}
	if !strings.Contains(out.String(), "lost lock L") || !strings.Contains(out.String(), "session ended") {
		t.Fatalf("message %q does not name the cause", out)
	}
}

// A CMD that ignores SIGTERM is killed after the grace period.
func TestRunLostLockKillsAfterGrace(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	started := filepath.Join(t.TempDir(), "started")
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "L", "--grace", "300ms", "--", "sh", "-c",
		`trap '' TERM; touch `+started+`; while :; do sleep 0.05; done`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CMD did not start: %s", out)
		}
	}
	f.ExpireLock("L")
	if code := exitOf(t, cmd, 5*time.Second); code != exitLost {
		t.Fatalf("exit %d: %s", code, out)
	}
	if !strings.Contains(out.String(), "sent SIGKILL") {
		t.Fatalf("output %q", out)
	}
}

// Signals to lockctl reach CMD; lockctl then exits with CMD's code.
func TestRunForwardsSignals(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	started := filepath.Join(t.TempDir(), "started")
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "sig", "--", "sh", "-c",
		`trap 'echo got-term; exit 42' TERM; touch `+started+`; while :; do sleep 0.05; done`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CMD did not start: %s", out)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitOf(t, cmd, 5*time.Second); code != 42 {
		t.Fatalf("exit %d, want 42: %s", code, out)
	}
	if !strings.Contains(out.String(), "got-term") {
		t.Fatalf("output %q", out)
	}
	if _, _, held := f.Holder("sig"); held {
		t.Fatal("lock not released")
	}
}

func TestRunNotAcquired(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	if code, _, _ := cli(t, env, "acquire", "busy", "--client-id", "owner"); code != 0 {
		t.Fatal("acquire")
	}
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "busy", "--wait", "200ms", "--", "true")
	if code := exitOf(t, cmd, 5*time.Second); code != exitNotAcquired {
		t.Fatalf("exit %d: %s", code, out)
	}
	if !strings.Contains(out.String(), "timed out") || !strings.Contains(out.String(), "owner") {
		t.Fatalf("message %q does not say timed out and by whom", out)
	}
	out = &testutil.SyncBuffer{}
	cmd = runLockctl(t, f.URL(0), out, "run", "busy", "--", "true")
	if code := exitOf(t, cmd, 5*time.Second); code != exitNotAcquired || !strings.Contains(out.String(), "held by owner") {
		t.Fatalf("exit %d: %s", code, out)
	}
	out = &testutil.SyncBuffer{}
	cmd = runLockctl(t, f.URL(0), out, "run", "free", "--", "/no/such/command")
	if code := exitOf(t, cmd, 5*time.Second); code != 127 {
		t.Fatalf("exit %d: %s", code, out)
	}
}
