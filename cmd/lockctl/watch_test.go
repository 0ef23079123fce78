package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// waitOutput waits until out holds want.
func waitOutput(t *testing.T, out *testutil.SyncBuffer, want string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "output "+want, func() bool { return strings.Contains(out.String(), want) })
}

// stopped sends SIGTERM and wants exit 0.
func stopped(t *testing.T, cmd *exec.Cmd, out *testutil.SyncBuffer) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitOf(t, cmd, 10*time.Second); code != exitOK {
		t.Fatalf("exit %d after SIGTERM, want 0: %s", code, out)
	}
}

func TestWatchElectUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"watch"}, exitUsage, "missing NAME"},
		{[]string{"watch", "a", "--prefix", "b"}, exitUsage, "not both"},
		{[]string{"watch", "a", "b"}, exitUsage, `unexpected argument "b"`},
		{[]string{"watch", "-h"}, exitOK, "-prefix"},
		{[]string{"elect"}, exitUsage, "missing NAME"},
		{[]string{"elect", "el"}, exitUsage, "missing VALUE"},
		{[]string{"elect", "el", "v", "--listen"}, exitUsage, "--listen takes no VALUE"},
		{[]string{"elect", "el", "v", "w"}, exitUsage, `unexpected argument "w"`},
		{[]string{"elect", "el", strings.Repeat("v", 4097)}, exitUsage, "at most 4096 bytes"},
		{[]string{"elect", "-h"}, exitOK, "-listen"},
		{[]string{"--help"}, exitOK, "watch NAME | watch --prefix P"},
		{[]string{"--help"}, exitOK, "elect NAME --listen"},
		{[]string{"--help"}, exitOK, "elect: the leadership was lost"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := cli(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(out+errs, tc.out) {
				t.Fatalf("code %d (want %d), output %q (want %q)", code, tc.code, out+errs, tc.out)
			}
		})
	}
}

// lockctl watch prints a lock's state, then a line per change; with
// --prefix and -o json one object a line; SIGTERM ends it with exit 0.
func TestWatchCommand(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	out := &testutil.SyncBuffer{}
	one := runLockctl(t, f.URL(0), out, "watch", "w/a")
	waitOutput(t, out, "w/a index=0 free waiters=0\n")
	jout := &testutil.SyncBuffer{}
	all := runLockctl(t, f.URL(0), jout, "watch", "--prefix", "w/", "-o", "json")
	testutil.WaitFor(t, 10*time.Second, "two watches", func() bool { return f.Watches() == 2 })

	if code, _, _ := cli(t, env, "acquire", "w/a", "--client-id", "h1", "--value", "host a"); code != exitOK {
		t.Fatal("acquire w/a")
	}
	if code, _, _ := cli(t, env, "acquire", "x/b", "--client-id", "h1"); code != exitOK {
		t.Fatal("acquire x/b")
	}
	if code, _, _ := cli(t, env, "release", "w/a", "--client-id", "h1", "--token", "1"); code != exitOK {
		t.Fatal("release w/a")
	}
	waitOutput(t, out, `w/a index=1 held client_id=h1 token=1 mode=exclusive waiters=0 value="host a"`+"\n")
	waitOutput(t, out, "w/a index=3 free waiters=0\n")
	testutil.WaitFor(t, 10*time.Second, "two JSON lines", func() bool { return strings.Count(jout.String(), "\n") >= 2 })
	stopped(t, one, out)
	stopped(t, all, jout)

	lines := strings.Split(strings.TrimSpace(jout.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("watch --prefix w/ -o json printed %q, want two lines (w/a held, w/a free; nothing of x/)", jout)
	}
	var evs []watchEvent
	for _, l := range lines {
		var ev watchEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	if evs[0].Lock != "w/a" || !evs[0].Status.Held || evs[0].Status.Value != "host a" || evs[0].Index != 1 ||
		evs[1].Lock != "w/a" || evs[1].Status.Held || evs[1].Index != 3 {
		t.Fatalf("events %+v", evs)
	}
	// The member notices a closed connection (and drops its watches) a
	// moment after the process exits.
	testutil.WaitFor(t, 5*time.Second, "no watch or session left behind", func() bool {
		return f.Watches() == 0 && len(f.Sessions()) == 0
	})
}

// lockctl elect: the first candidate leads and prints its value; --listen
// prints the leader, then each new one; SIGTERM to the leader hands over
// to the next candidate (exit 0); a leadership revoked exits 3.
func TestElectCommand(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	aout := &testutil.SyncBuffer{}
	alpha := runLockctl(t, f.URL(0), aout, "elect", "el", "alpha")
	waitOutput(t, aout, "alpha\n")
	if st := f.Status("el"); st.Value != "alpha" || !st.Held {
		t.Fatalf("status %+v while alpha leads", st)
	}
	lout := &testutil.SyncBuffer{}
	listen := runLockctl(t, f.URL(0), lout, "elect", "el", "--listen", "-o", "json")
	waitOutput(t, lout, `"value":"alpha"`)
	bout := &testutil.SyncBuffer{}
	beta := runLockctl(t, f.URL(0), bout, "elect", "el", "beta")
	testutil.WaitFor(t, 10*time.Second, "beta to queue", func() bool { return len(f.Waiters("el")) == 1 })
	if bout.String() != "" {
		t.Fatalf("beta printed %q before it was elected", bout)
	}

	stopped(t, alpha, aout)
	waitOutput(t, bout, "beta\n")
	waitOutput(t, lout, `"value":"beta"`)
	if st := f.Status("el"); st.Value != "beta" {
		t.Fatalf("status %+v after alpha stopped", st)
	}
	lines := strings.Split(strings.TrimSpace(lout.String()), "\n")
	var ls []leaderLine
	for _, l := range lines {
		var li leaderLine
		if err := json.Unmarshal([]byte(l), &li); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		ls = append(ls, li)
	}
	if len(ls) != 2 || ls[0].Value != "alpha" || ls[1].Value != "beta" || ls[0].FencingToken >= ls[1].FencingToken ||
		ls[1].ClientID == "" || ls[1].Lock != "el" {
		t.Fatalf("--listen printed %+v, want alpha then beta with rising tokens", ls)
	}

	if code, _, _ := cli(t, env, "revoke", "el"); code != exitOK {
		t.Fatal("revoke")
	}
	if code := exitOf(t, beta, 10*time.Second); code != exitLost {
		t.Fatalf("beta exit %d after its leadership was revoked, want %d: %s", code, exitLost, bout)
	}
	if !strings.Contains(bout.String(), "lost the leadership of el") || !strings.Contains(bout.String(), "revoked") {
		t.Fatalf("beta's message %q", bout)
	}
	stopped(t, listen, lout)

	// A candidate stopped before it was elected exits 0 and leaves no wait;
	// one whose session ends while it waits campaigns again.
	if code, _, _ := cli(t, env, "acquire", "el2", "--client-id", "holder"); code != exitOK {
		t.Fatal("acquire el2")
	}
	cout := &testutil.SyncBuffer{}
	cand := runLockctl(t, f.URL(0), cout, "elect", "el2", "gamma")
	testutil.WaitFor(t, 10*time.Second, "gamma to queue", func() bool { return len(f.Waiters("el2")) == 1 })
	// Its session ends while it campaigns: it campaigns again in a new one.
	ss := f.Sessions()
	if len(ss) != 1 {
		t.Fatalf("sessions %v, want gamma's only", ss)
	}
	f.ExpireSession(ss[0])
	waitOutput(t, cout, "campaigning again")
	testutil.WaitFor(t, 10*time.Second, "gamma to queue again", func() bool {
		s := f.Sessions()
		return len(f.Waiters("el2")) == 1 && len(s) == 1 && s[0] != ss[0]
	})
	stopped(t, cand, cout)
	if w := f.Waiters("el2"); len(w) != 0 {
		t.Fatalf("waiters %v after the candidate stopped", w)
	}
}
