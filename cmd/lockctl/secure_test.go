package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

const (
	tokenTeamA = "token-for-team-a-0001"
	tokenAdmin = "token-for-members-0001"
)

// secureSetup is a CA, a client certificate and a token file shared by the
// secure clusters of one test, so one set of lockctl flags fits them all.
type secureSetup struct {
	ca                 *testutil.CA
	cert, key          string
	store              *auth.Store
	caFile, clientCert string
}

func newSecureSetup(t *testing.T) *secureSetup {
	t.Helper()
	ca := testutil.NewCA(t, "lockctl-test-ca")
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "team-a", "token": "`+tokenTeamA+`", "permissions": [{"prefix": "a/", "access": "lock"}]},
	  {"name": "members", "token": "`+tokenAdmin+`", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`)
	cert, key := ca.Issue("lockctl")
	return &secureSetup{ca: ca, cert: cert, key: key, store: store}
}

// cluster starts n members with HTTPS requiring client certificates, mutual
// TLS between members, and the tokens.
func (s *secureSetup) cluster(t *testing.T, n int) *testutil.Cluster {
	t.Helper()
	return testutil.NewCluster(t, n, testutil.Options{Modify: testutil.Secure(s.ca, s.store, tokenAdmin)})
}

// env is the environment of a lockctl speaking to c with token.
func (s *secureSetup) env(c *testutil.Cluster, token string) map[string]string {
	return map[string]string{
		"LOCKD_ENDPOINTS": strings.Join(c.URLsFollowersFirst(), ","),
		"LOCKD_CACERT":    s.ca.CertPEM,
		"LOCKD_CERT":      s.cert,
		"LOCKD_KEY":       s.key,
		"LOCKD_TOKEN":     token,
	}
}

// TestSecureCluster: lockctl with --cacert, --cert, --key and --auth-token
// against a cluster with HTTPS, client certificates and tokens; refused
// tokens and prefixes exit 7.
func TestSecureCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	s := newSecureSetup(t)
	c := s.cluster(t, 3)
	eps := strings.Join(c.URLsFollowersFirst(), ",")
	if !strings.HasPrefix(eps, "https://") {
		t.Fatalf("endpoints %s", eps)
	}
	flags := func(token string, extra ...string) []string {
		return append([]string{"--endpoints", eps, "--cacert", s.ca.CertPEM, "--cert", s.cert, "--key", s.key, "--auth-token", token, "--timeout", "5s"}, extra...)
	}

	code, out, _ := cli(t, nil, flags(tokenTeamA, "acquire", "a/x", "--client-id", "w1", "--ttl", "1m", "-o", "json")...)
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || !rep.Acquired {
		t.Fatalf("acquire: %d %q", code, out)
	}
	var st api.LockStatus
	code, out, _ = cli(t, nil, flags(tokenTeamA, "status", "a/x", "-o", "json")...)
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || !st.Held || st.ClientID != "w1" {
		t.Fatalf("status: %d %q", code, out)
	}
	// Global flags after the subcommand.
	code, _, _ = cli(t, nil, append([]string{"release", "a/x", "--token", strconv.FormatUint(rep.FencingToken, 10), "--client-id", "w1"}, flags(tokenTeamA)...)...)
	if code != exitOK {
		t.Fatalf("release: %d", code)
	}
	code, _, _ = cli(t, nil, append([]string{"session", "create", "--ttl", "2s", "--client-id", "w1"}, flags(tokenTeamA)...)...)
	if code != exitOK {
		t.Fatalf("session create with the flags after the subcommand: %d", code)
	}

	// A session over wss:// (lockctl run).
	code, _, errs := cli(t, nil, flags(tokenTeamA, "run", "a/run", "--", "true")...)
	if code != exitOK {
		t.Fatalf("run: %d %q", code, errs)
	}

	// Refusals: exit 7 with a clear message, and no retrying.
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"prefix", flags(tokenTeamA, "acquire", "b/x", "--client-id", "w1"), `permission denied: token "team-a" lacks lock access to lock (or prefix) "b/x"`},
		{"prefix over the WebSocket", flags(tokenTeamA, "run", "b/x", "--", "true"), "permission denied"},
		{"wrong token", flags("not-a-token-at-all-000", "status", "a/x"), "unauthenticated: the cluster does not know this token"},
		{"no token", flags("", "status", "a/x"), "requires a token; set LOCKD_TOKEN or pass --auth-token"},
		{"wrong token over the WebSocket", flags("not-a-token-at-all-000", "run", "a/x", "--", "true"), "unauthenticated"},
		{"lock token on a backup", flags(tokenTeamA, "snapshot", "save", filepath.Join(t.TempDir(), "x.snap")), "permission denied"},
	} {
		start := time.Now()
		code, _, errs := cli(t, nil, tc.args...)
		if code != exitAuth || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, code, errs, exitAuth, tc.want)
		}
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("%s took %v: a refused token must not be retried until --timeout", tc.name, d)
		}
	}

	// TLS mistakes.
	code, _, errs = cli(t, nil, "--endpoints", eps, "--cacert", s.ca.CertPEM, "--auth-token", tokenTeamA, "--timeout", "1s", "status", "a/x")
	if code != exitNoLeader || !strings.Contains(errs, "TLS failure") {
		t.Fatalf("without a client certificate: %d %q", code, errs)
	}
	code, _, errs = cli(t, nil, "--endpoints", eps, "--cacert", filepath.Join(t.TempDir(), "missing.pem"), "status", "a/x")
	if code != exitError || !strings.Contains(errs, "missing.pem") {
		t.Fatalf("missing --cacert file: %d %q", code, errs)
	}
	code, _, errs = cli(t, nil, "--endpoints", eps, "--cert", s.cert, "status", "a/x")
	if code != exitUsage || !strings.Contains(errs, "--cert and --key go together") {
		t.Fatalf("--cert without --key: %d %q", code, errs)
	}

	// The binary, configured from the environment only.
	e := s.env(c, tokenTeamA)
	cmd := exec.Command(bin, "status", "a/x")
	cmd.Env = os.Environ()
	for k, v := range e {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	b, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "a/x") {
		t.Fatalf("lockctl binary from the environment: %v\n%s", err, b)
	}
}

// TestSnapshotRoundTrip: a backup saved by lockctl from a cluster with
// locks, a waiter, a session and a token counter, restored by lockctl into
// a fresh cluster, gives the same lock status, a live session, and tokens
// above the old counter. A cluster with state refuses it without --force.
func TestSnapshotRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two 3-member clusters")
	}
	s := newSecureSetup(t)
	src := s.cluster(t, 3)
	senv := s.env(src, tokenAdmin)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// State: a session with a lock and a waiter queued behind it, two TTL
	// locks, and a counter moved past every held token.
	code, out, _ := cli(t, senv, "session", "create", "--ttl", "1h", "--client-id", "s-client", "-o", "json")
	var sess api.SessionReply
	if code != exitOK || json.Unmarshal([]byte(out), &sess) != nil || sess.SessionID == "" {
		t.Fatalf("session create: %d %q", code, out)
	}
	tc, err := (&env{g: &globals{cacert: s.ca.CertPEM, cert: s.cert, key: s.key}}).tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	a, err := client.NewAPI(client.APIConfig{Endpoints: strings.Split(senv["LOCKD_ENDPOINTS"], ","), TLSConfig: tc, Token: tokenAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AcquireRequest(ctx, "a/session", api.AcquireRequest{ClientID: "s-client", SessionID: sess.SessionID}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a/ttl", "jobs/nightly"} {
		if code, _, _ := cli(t, senv, "acquire", name, "--ttl", "1h", "--client-id", "w-"+name); code != exitOK {
			t.Fatalf("acquire %s: %d", name, code)
		}
	}
	wctx, wcancel := context.WithCancel(ctx)
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		_, _ = a.Acquire(wctx, "a/session", "waiter", time.Minute, 5*time.Minute)
	}()
	defer func() { wcancel(); <-waiterDone }()
	var last uint64
	code, out, _ = cli(t, senv, "acquire", "tmp", "--ttl", "1m", "--client-id", "bump", "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.FencingToken == 0 {
		t.Fatalf("acquire tmp: %d %q", code, out)
	}
	last = rep.FencingToken
	if code, _, _ := cli(t, senv, "release", "tmp", "--token", strconv.FormatUint(last, 10), "--client-id", "bump"); code != exitOK {
		t.Fatalf("release tmp: %d", code)
	}
	names := []string{"a/session", "a/ttl", "jobs/nightly", "tmp"}
	status := func(env map[string]string, name string) api.LockStatus {
		t.Helper()
		code, out, _ := cli(t, env, "status", name, "-o", "json")
		var st api.LockStatus
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("status %s: %d %q", name, code, out)
		}
		return st
	}
	deadline := time.Now().Add(10 * time.Second)
	for status(senv, "a/session").Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := map[string]api.LockStatus{}
	for _, n := range names {
		want[n] = status(senv, n)
		if held := n != "tmp"; want[n].Held != held {
			t.Fatalf("lock %s before the backup: %+v", n, want[n])
		}
	}

	// Save: atomically, mode 0600, the size printed.
	dir := t.TempDir()
	file := filepath.Join(dir, "lockd.snap")
	code, out, errs := cli(t, senv, "snapshot", "save", file)
	fi, err := os.Stat(file)
	if code != exitOK || err != nil || !strings.Contains(out, "saved "+strconv.FormatInt(fi.Size(), 10)+" bytes to "+file) {
		t.Fatalf("snapshot save: %d %q %q, stat %v", code, out, errs, err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left behind in the backup dir: %v", ents)
	}
	// A failed save leaves the old backup as it was, and no temporary file.
	saved, _ := os.ReadFile(file)
	lenv := s.env(src, tokenTeamA)
	if code, _, _ := cli(t, lenv, "snapshot", "save", file); code != exitAuth {
		t.Fatalf("snapshot save with a lock token: %d", code)
	}
	if now, _ := os.ReadFile(file); string(now) != string(saved) {
		t.Fatal("a failed save changed the backup file")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a failed save left behind: %v", ents)
	}

	// Restore into a fresh cluster, through a follower.
	dst := s.cluster(t, 3)
	denv := s.env(dst, tokenAdmin)
	if st := status(denv, "a/ttl"); st.Held {
		t.Fatalf("the new cluster is not fresh: %+v", st)
	}
	if code, out, errs := cli(t, denv, "snapshot", "restore", file); code != exitOK || !strings.Contains(out, "restored "+file) {
		t.Fatalf("snapshot restore: %d %q %q", code, out, errs)
	}
	// A write comes first after each restore: the server's linearizable
	// reads can wait for the next applied command after a restore (the
	// FSM's applied index does not move with a restored snapshot).
	code, out, _ = cli(t, denv, "acquire", "fresh", "--ttl", "1m", "--client-id", "n", "-o", "json")
	rep = api.AcquireReply{}
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.FencingToken <= last {
		t.Fatalf("acquire after restore: %d %q; the token must exceed %d", code, out, last)
	}
	freshToken := rep.FencingToken
	for _, n := range names {
		if got, w := status(denv, n), want[n]; !sameStatus(got, w) {
			t.Errorf("lock %s after restore:\n got %+v\nwant %+v", n, got, want[n])
		}
	}
	if code, _, errs := cli(t, denv, "session", "keepalive", sess.SessionID); code != exitOK {
		t.Errorf("keepalive of the restored session: %d %q", code, errs)
	}

	// A cluster with state refuses the backup unless --force.
	code, _, errs = cli(t, denv, "snapshot", "restore", file)
	if code != exitError || !strings.Contains(errs, "already holds state") || !strings.Contains(errs, "--force") {
		t.Fatalf("restore into a cluster with state: %d %q", code, errs)
	}
	if got := status(denv, "fresh"); !got.Held {
		t.Fatalf("a refused restore changed the state: %+v", got)
	}
	if code, _, errs := cli(t, denv, "snapshot", "restore", file, "--force"); code != exitOK {
		t.Fatalf("restore --force: %d %q", code, errs)
	}
	// The counter does not go back to the backup's.
	code, out, _ = cli(t, denv, "acquire", "after-force", "--ttl", "1m", "--client-id", "n", "-o", "json")
	rep = api.AcquireReply{}
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.FencingToken <= freshToken {
		t.Fatalf("acquire after restore --force: %d %q; the token must exceed %d", code, out, freshToken)
	}
	if got := status(denv, "fresh"); got.Held {
		t.Fatalf("restore --force kept a lock not in the backup: %+v", got)
	}
	if got := status(denv, "a/ttl"); !sameStatus(got, want["a/ttl"]) {
		t.Fatalf("a/ttl after restore --force: %+v, want %+v", got, want["a/ttl"])
	}
	// Not a backup.
	junk := filepath.Join(dir, "junk.snap")
	os.WriteFile(junk, []byte("not a backup"), 0o600)
	if code, _, errs := cli(t, denv, "snapshot", "restore", junk, "--force"); code != exitError || !strings.Contains(errs, "not a lockd backup") {
		t.Fatalf("restore of junk: %d %q", code, errs)
	}
}

// sameStatus compares two statuses of a lock but for the log index of its
// last change, which is the cluster's own.
func sameStatus(a, b api.LockStatus) bool {
	a.Index, b.Index = 0, 0
	return reflect.DeepEqual(a, b)
}

// TestWatchAndListenWithReadToken: lockctl watch and elect --listen need
// only read access: with a read token they follow the locks (no session is
// opened for them), and the same token's acquire is refused (exit 7).
func TestWatchAndListenWithReadToken(t *testing.T) {
	const (
		reader = "token-for-reader-0001"
		writer = "token-for-writer-0001"
	)
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "reader", "token": "`+reader+`", "permissions": [{"prefix": "jobs/", "access": "read"}]},
	  {"name": "writer", "token": "`+writer+`", "permissions": [{"prefix": "", "access": "lock"}]}]}`)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) { cfg.Auth = store }})
	l := c.WaitLeader(10 * time.Second)
	start := func(out *testutil.SyncBuffer, args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+l.URL(), "LOCKD_TOKEN="+reader)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	wout, lout := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	watch := start(wout, "watch", "--prefix", "jobs/")
	listen := start(lout, "elect", "jobs/leader", "--listen")
	env := map[string]string{"LOCKD_ENDPOINTS": l.URL(), "LOCKD_TOKEN": writer}
	// The watch's first picture is empty: wait until the watch is in place
	// by watching for a change made after both started.
	testutil.WaitFor(t, 10*time.Second, "the watchers", func() bool {
		if code, _, _ := cli(t, env, "acquire", "jobs/probe", "--client-id", "w", "--ttl", "1m"); code != exitOK && code != exitNotAcquired {
			t.Fatalf("acquire jobs/probe: %d", code)
		}
		return strings.Contains(wout.String(), "jobs/probe index=")
	})
	if code, _, errs := cli(t, env, "acquire", "jobs/leader", "--client-id", "node-a", "--value", "http://node-a:8080"); code != exitOK {
		t.Fatalf("acquire jobs/leader: %d %s", code, errs)
	}
	waitOutput(t, lout, "http://node-a:8080\n")
	waitOutput(t, wout, `jobs/leader index=`)
	waitOutput(t, wout, `value=http://node-a:8080`)
	var sessions int
	l.Srv.Node().View(func(tb *locktable.Table) { _, sessions = tb.Size() })
	if sessions != 0 {
		t.Fatalf("%d sessions: the read token's watchers opened sessions", sessions)
	}
	code, _, errs := cli(t, map[string]string{"LOCKD_ENDPOINTS": l.URL(), "LOCKD_TOKEN": reader}, "acquire", "jobs/x", "--client-id", "r")
	if code != exitAuth || !strings.Contains(errs, "permission denied") {
		t.Fatalf("acquire with the read token: %d %q", code, errs)
	}
	stopped(t, watch, wout)
	stopped(t, listen, lout)
}
