package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// The lock kinds through lockctl, against the fake: --shared, --limit,
// several names, --value, --lock-delay, revoke, and what status and list
// show of them.

func TestAcquireKinds(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	// A read-write lock: two readers together, a writer refused.
	for _, id := range []string{"r1", "r2"} {
		code, out, _ := cli(t, env, "acquire", "rw", "--shared", "--client-id", id)
		if code != exitOK || !strings.Contains(out, "rw acquired token=") || !strings.Contains(out, "mode=shared") {
			t.Fatalf("shared acquire by %s: %d %q", id, code, out)
		}
	}
	if code, _, errs := cli(t, env, "acquire", "rw", "--client-id", "w"); code != exitNotAcquired || !strings.Contains(errs, "held by r1") {
		t.Fatalf("exclusive acquire of a read-held lock: %d %q", code, errs)
	}
	code, out, _ := cli(t, env, "status", "rw")
	for _, want := range []string{"rw held client_id=r1 token=1", "mode=shared", "holders=2", "\n  holder client_id=r1 token=1 mode=shared", "\n  holder client_id=r2 token=2 mode=shared"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("status: %d %q lacks %q", code, out, want)
		}
	}
	code, out, _ = cli(t, env, "status", "rw", "-o", "json")
	var st api.LockStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Mode != api.ModeShared || len(st.Holders) != 2 || st.Holders[1].ClientID != "r2" {
		t.Fatalf("status -o json: %d %q", code, out)
	}

	// A semaphore of two.
	for _, id := range []string{"s1", "s2"} {
		if code, out, _ := cli(t, env, "acquire", "sem", "--limit", "2", "--client-id", id); code != exitOK {
			t.Fatalf("semaphore acquire by %s: %d %q", id, code, out)
		}
	}
	if code, _, errs := cli(t, env, "acquire", "sem", "--limit", "2", "--client-id", "s3"); code != exitNotAcquired {
		t.Fatalf("a third permit of two: %d %q", code, errs)
	}
	if code, _, errs := cli(t, env, "acquire", "sem", "--limit", "3", "--client-id", "s3"); code != exitError || !strings.Contains(errs, "limit mismatch") {
		t.Fatalf("another limit: %d %q", code, errs)
	}
	code, out, _ = cli(t, env, "list")
	if code != exitOK || !strings.Contains(out, "LIMIT") || !strings.Contains(out, "s1,s2") || !strings.Contains(out, "r1,r2") {
		t.Fatalf("list: %d %q", code, out)
	}

	// A value.
	code, out, _ = cli(t, env, "acquire", "val", "--value", "host a:7", "--client-id", "v")
	if code != exitOK {
		t.Fatalf("acquire --value: %d %q", code, out)
	}
	if code, out, _ := cli(t, env, "status", "val"); code != exitOK || !strings.Contains(out, `value="host a:7"`) {
		t.Fatalf("status of a lock with a value: %d %q", code, out)
	}
	if code, out, _ := cli(t, env, "list", "--prefix", "val"); code != exitOK || !strings.Contains(out, `"host a:7"`) || !strings.Contains(out, "VALUE") {
		t.Fatalf("list of a lock with a value: %d %q", code, out)
	}
}

func TestAcquireSeveralNames(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	code, out, _ := cli(t, env, "acquire", "acct/b", "acct/a", "--client-id", "m", "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Grants) != 2 || rep.Grants[0].Lock != "acct/a" {
		t.Fatalf("acquire of two names: %d %q", code, out)
	}
	for _, g := range rep.Grants {
		if code, _, _ := cli(t, env, "release", g.Lock, "--token", strconv.FormatUint(g.FencingToken, 10), "--client-id", "m"); code != exitOK {
			t.Fatalf("release %s on its own: %d", g.Lock, code)
		}
	}
	if code, _, _ := cli(t, env, "acquire", "acct/b", "--client-id", "o"); code != exitOK {
		t.Fatal("acquire acct/b")
	}
	code, _, errs := cli(t, env, "acquire", "acct/a,acct/b", "--client-id", "m")
	if code != exitNotAcquired || !strings.Contains(errs, "lock acct/b held by o") || !strings.Contains(errs, "nothing was taken") {
		t.Fatalf("multi try with acct/b held: %d %q", code, errs)
	}
	if _, _, held := f.Holder("acct/a"); held {
		t.Fatal("a refused multi-lock took acct/a")
	}
	code, out, _ = cli(t, env, "acquire", "acct/c", "acct/d", "--client-id", "m", "--ttl", "1m")
	if code != exitOK || !strings.Contains(out, "acct/c acquired token=") || !strings.Contains(out, "\nacct/d acquired token=") {
		t.Fatalf("acquire text of two names: %d %q", code, out)
	}
}

func TestRevokeAndLockDelay(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}

	code, out, _ := cli(t, env, "acquire", "rv", "--client-id", "h", "--lock-delay", "1m", "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("acquire: %d %q", code, out)
	}
	tok := strconv.FormatUint(rep.FencingToken, 10)
	if code, _, errs := cli(t, env, "revoke", "rv", "--token", "999"); code != exitNotHolder || !strings.Contains(errs, "no current grant has token 999") {
		t.Fatalf("revoke of a token nobody has: %d %q", code, errs)
	}
	if code, out, _ := cli(t, env, "revoke", "rv"); code != exitOK || !strings.Contains(out, "rv revoked tokens="+tok) {
		t.Fatalf("revoke: %d %q", code, out)
	}
	// The revocation started the lock-delay: free, but nobody gets it.
	code, out, _ = cli(t, env, "status", "rv")
	if code != exitOK || !strings.Contains(out, "rv free waiters=0 delayed_until=") {
		t.Fatalf("status during the lock-delay: %d %q", code, out)
	}
	if code, _, _ := cli(t, env, "acquire", "rv", "--client-id", "x"); code != exitNotAcquired {
		t.Fatalf("acquire during the lock-delay: %d", code)
	}
	code, out, _ = cli(t, env, "list", "-o", "json")
	var list api.LockList
	if code != exitOK || json.Unmarshal([]byte(out), &list) != nil || len(list.Locks) != 1 || list.Locks[0].DelayedUntil == "" {
		t.Fatalf("list -o json of a delayed lock: %d %q", code, out)
	}
	code, out, _ = cli(t, env, "revoke", "rv", "-o", "json")
	var rr api.RevokeReply
	if code != exitOK || json.Unmarshal([]byte(out), &rr) != nil || rr.Revoked == nil || len(rr.Revoked) != 0 {
		t.Fatalf("revoke of a lock without holders: %d %q", code, out)
	}
}

// lockctl run with several locks: the variables list them in name order;
// losing one stops CMD and exits 3, naming the revocation.
func TestRunSeveralLocksAndRevocation(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Proofs: true})
	defer f.Close()
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "y,x", "--lock-delay", "1s", "--", "sh", "-c",
		`echo "lock=$LOCKD_LOCK token=$LOCKD_FENCING_TOKEN proof=$LOCKD_FENCING_PROOF"; touch `+started+`; while :; do sleep 0.05; done`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CMD did not start: %s", out)
		}
	}
	if want := "lock=x,y token=1,2 proof=proof:x:1,proof:y:2"; !strings.Contains(out.String(), want) {
		t.Fatalf("output %q lacks %q", out, want)
	}
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	if code, _, _ := cli(t, env, "revoke", "y"); code != exitOK {
		t.Fatal("revoke")
	}
	if code := exitOf(t, cmd, 5*time.Second); code != exitLost {
		t.Fatalf("exit %d, want %d: %s", code, exitLost, out)
	}
	if !strings.Contains(out.String(), "lost lock x,y (token 1,2)") || !strings.Contains(out.String(), "revoked") {
		t.Fatalf("message %q does not name the locks and the revocation", out)
	}
	testutil.WaitFor(t, 5*time.Second, "x released", func() bool { _, _, held := f.Holder("x"); return !held })
}

// lockctl run --shared runs beside another reader; an exclusive run does
// not.
func TestRunShared(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	if code, _, _ := cli(t, env, "acquire", "rw", "--shared", "--client-id", "reader"); code != exitOK {
		t.Fatal("acquire --shared")
	}
	out := &testutil.SyncBuffer{}
	cmd := runLockctl(t, f.URL(0), out, "run", "rw", "--shared", "--value", "batch", "--", "sh", "-c", `exit 0`)
	if code := exitOf(t, cmd, 10*time.Second); code != 0 {
		t.Fatalf("run --shared beside a reader: exit %d: %s", code, out)
	}
	out = &testutil.SyncBuffer{}
	cmd = runLockctl(t, f.URL(0), out, "run", "rw", "--", "true")
	if code := exitOf(t, cmd, 10*time.Second); code != exitNotAcquired || !strings.Contains(out.String(), "held by reader") {
		t.Fatalf("exclusive run beside a reader: exit %d: %s", code, out)
	}
}

// TestKindsOnACluster: the lock-kind commands against lockd itself.
func TestKindsOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c, env := plainCluster(t, 1)

	for _, id := range []string{"r1", "r2"} {
		if code, out, _ := cli(t, env, "acquire", "rw", "--shared", "--client-id", id, "--value", "reader "+id); code != exitOK || !strings.Contains(out, "mode=shared") {
			t.Fatalf("shared acquire by %s: %d %q", id, code, out)
		}
	}
	code, out, _ := cli(t, env, "status", "rw")
	for _, want := range []string{"rw held client_id=r1", "mode=shared", "holders=2", `value="reader r1"`, "\n  holder client_id=r2", `value="reader r2"`} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("status: %d %q lacks %q", code, out, want)
		}
	}
	if code, _, errs := cli(t, env, "acquire", "rw", "--client-id", "w"); code != exitNotAcquired || !strings.Contains(errs, "held by r1") {
		t.Fatalf("exclusive acquire of a read-held lock: %d %q", code, errs)
	}
	if code, _, errs := cli(t, env, "acquire", "rw", "--limit", "3", "--client-id", "w"); code != exitError || !strings.Contains(errs, "limit mismatch") {
		t.Fatalf("another limit: %d %q", code, errs)
	}

	// Several names: all or nothing.
	if code, _, _ := cli(t, env, "acquire", "acct/b", "--client-id", "o"); code != exitOK {
		t.Fatal("acquire acct/b")
	}
	code, _, errs := cli(t, env, "acquire", "acct/a", "acct/b", "--client-id", "m")
	if code != exitNotAcquired || !strings.Contains(errs, "acct/b") || !strings.Contains(errs, "held by o") {
		t.Fatalf("multi try with acct/b held: %d %q", code, errs)
	}
	code, out, _ = cli(t, env, "acquire", "acct/c", "acct/d", "--client-id", "m", "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Grants) != 2 || rep.Grants[1].Lock != "acct/d" {
		t.Fatalf("multi acquire: %d %q", code, out)
	}

	// Revocation starts the lock-delay.
	code, out, _ = cli(t, env, "acquire", "ld", "--client-id", "h", "--lock-delay", "30s", "-o", "json")
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("acquire --lock-delay: %d %q", code, out)
	}
	if code, out, _ := cli(t, env, "revoke", "ld"); code != exitOK || !strings.Contains(out, "ld revoked tokens="+strconv.FormatUint(rep.FencingToken, 10)) {
		t.Fatalf("revoke: %d %q", code, out)
	}
	if code, out, _ := cli(t, env, "status", "ld"); code != exitOK || !strings.Contains(out, "ld free waiters=0 delayed_until=") {
		t.Fatalf("status during the lock-delay: %d %q", code, out)
	}
	if code, _, errs := cli(t, env, "revoke", "acct/c", "--token", "999999"); code != exitNotHolder {
		t.Fatalf("revoke of a token nobody has: %d %q", code, errs)
	}
	code, out, _ = cli(t, env, "list")
	for _, want := range []string{"LOCK", "MODE", "DELAYED_UNTIL", "r1,r2", "shared", "ld "} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("list: %d %q lacks %q", code, out, want)
		}
	}

	// run with two locks on the real cluster.
	ep := c.WaitLeader(10 * time.Second).URL()
	buf := &testutil.SyncBuffer{}
	cmd := runLockctl(t, ep, buf, "run", "job/y,job/x", "--shared", "--", "sh", "-c", `echo "lock=$LOCKD_LOCK token=$LOCKD_FENCING_TOKEN"`)
	if code := exitOf(t, cmd, 20*time.Second); code != 0 || !strings.Contains(buf.String(), "lock=job/x,job/y token=") {
		t.Fatalf("run with two locks: exit %d: %s", code, buf)
	}
}
