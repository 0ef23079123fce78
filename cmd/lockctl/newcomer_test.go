package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// What a newcomer meets in the first hour: help, usage errors with one
// line and a hint, completion, endpoint status, stale reads, the exit code
// of a refused membership change, an http:// URL of an HTTPS member.

func TestUsageErrorsAreOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"acquire", "x", "--ttl", "30"}, []string{`invalid value "30" for --ttl: a duration needs a unit, e.g. 30s`, "Run 'lockctl acquire --help' for usage."}},
		{[]string{"run", "x", "--wait", "5", "--", "true"}, []string{`invalid value "5" for --wait: a duration needs a unit, e.g. 5s`, "Run 'lockctl run --help'"}},
		{[]string{"session", "create", "--ttl", "2d"}, []string{"durations have no days: write 48h", "Run 'lockctl session create --help'"}},
		{[]string{"--timeout", "x", "status", "a"}, []string{`invalid value "x" for --timeout: not a duration`}},
		{[]string{"release", "x", "--token", "soon"}, []string{`invalid value "soon" for --token: want a whole number, 0 or more`}},
		{[]string{"acquire"}, []string{"acquire: missing NAME", "Run 'lockctl acquire --help'"}},
		{[]string{"cluster", "remove"}, []string{"cluster remove: missing ID", "Run 'lockctl cluster remove --help'"}},
		{[]string{"acquire", "x", "--nope"}, []string{"unknown flag: --nope", "Run 'lockctl acquire --help'"}},
		{[]string{"acquir", "x"}, []string{`unknown command "acquir"`, "Did you mean this?", "acquire"}},
		{[]string{"tls", "cert", "member"}, []string{"tls cert member: --id is required"}},
		{[]string{"completion"}, []string{"completion: missing the shell"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := cli(t, nil, tc.args...)
			if code != exitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q; want 2 and nothing on stdout", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Fatalf("stderr %q lacks %q", errs, w)
				}
			}
			// The error and the hint, not the whole help.
			if strings.Contains(errs, "Exit codes") || strings.Contains(errs, "Flags:") || strings.Count(errs, "\n") > 6 {
				t.Fatalf("stderr is more than the error and a hint:\n%s", errs)
			}
		})
	}
}

func TestHelpOfCommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"acquire", "--help"}, []string{"usage: lockctl acquire NAME [NAME...]", "--lock-delay D", "Global flags:", "--endpoints URLS"}},
		{[]string{"help", "run"}, []string{"usage: lockctl run NAME[,NAME...]", "LOCKD_FENCING_TOKEN", "--grace duration"}},
		{[]string{"run", "--help"}, []string{"usage: lockctl run", "--session-ttl"}},
		{[]string{"cluster", "--help"}, []string{"usage: lockctl cluster COMMAND", "cluster remove ID", "exits 8"}},
		{[]string{"endpoint", "status", "-h"}, []string{"usage: lockctl endpoint status", "GET /api/v1/status"}},
		{[]string{"tls", "cert", "member", "-h"}, []string{"spiffe://lockd/<cluster-id>/member/<id>", "--host HOSTS"}},
		{[]string{"completion", "--help"}, []string{"source <(lockctl completion bash)"}},
		{[]string{"--help"}, []string{"endpoint status", "tls cert member --id ID", "completion bash|zsh|fish|powershell", "8  cluster add, remove or transfer refused"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, _ := cli(t, nil, tc.args...)
			for _, w := range tc.want {
				if code != exitOK || !strings.Contains(out, w) {
					t.Fatalf("exit %d, stdout lacks %q", code, w)
				}
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		code, out, _ := cli(t, nil, "completion", sh)
		if code != exitOK || !strings.Contains(out, "lockctl") || len(out) < 1000 {
			t.Fatalf("completion %s: exit %d, %d bytes", sh, code, len(out))
		}
	}
	// What the scripts ask lockctl: the commands, and -o's values.
	code, out, _ := cli(t, nil, "__complete", "")
	for _, w := range []string{"acquire", "endpoint", "tls", "completion"} {
		if code != exitOK || !strings.Contains(out, w) {
			t.Fatalf("__complete '': exit %d, %q lacks %q", code, out, w)
		}
	}
	if code, out, _ := cli(t, nil, "__complete", "status", "x", "-o", ""); code != exitOK || !strings.Contains(out, "json") {
		t.Fatalf("__complete -o: %d %q", code, out)
	}
	f := lockdtest.New(lockdtest.Options{Members: 2})
	defer f.Close()
	code, out, _ = cli(t, map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}, "__complete", "cluster", "remove", "")
	if code != exitOK || !strings.Contains(out, "node1") || !strings.Contains(out, "node2") {
		t.Fatalf("__complete cluster remove: %d %q", code, out)
	}
}

// TestGoStyleFlags: the single-dash long flags of Go's flag package, which
// lockctl took before cobra, still work; values and CMD stay as they are.
func TestGoStyleFlags(t *testing.T) {
	root := (&env{g: &globals{}}).root()
	for _, tc := range []struct{ in, want string }{
		{"acquire x -ttl 30s -wait=1s -o json", "acquire x --ttl 30s --wait=1s -o json"},
		{"-endpoints http://a status x -stale", "--endpoints http://a status x --stale"},
		{"acquire x --value -shared", "acquire x --value -shared"},
		{"acquire x -value -shared", "acquire x --value -shared"},
		{"run x -wait 5s sh -c -limit", "run x --wait 5s sh -c -limit"},
		{"run x -- sh -ttl 5", "run x -- sh -ttl 5"},
		{"release x -token 5 -client-id w", "release x --token 5 --client-id w"},
		{"status x -nope -help", "status x -nope --help"},
		{"-version", "--version"},
		{"cluster remove n2 -timeout 1s", "cluster remove n2 --timeout 1s"},
	} {
		if got := strings.Join(goStyleArgs(root, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("%q → %q, want %q", tc.in, got, tc.want)
		}
	}
	// Whether a flag takes a value must not depend on the command.
	kinds := map[string]bool{}
	for _, c := range append(leaves(root), root) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.InheritedFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				v := f.NoOptDefVal == ""
				if prev, ok := kinds[f.Name]; ok && prev != v {
					t.Errorf("flag --%s takes a value in one command and not in another", f.Name)
				}
				kinds[f.Name] = v
			})
		}
	}

	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	code, out, _ := cli(t, env, "acquire", "g", "-ttl", "1m", "-client-id", "w", "--o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || !rep.Acquired {
		t.Fatalf("acquire with Go-style flags: %d %q", code, out)
	}
	if code, _, _ := cli(t, env, "release", "g", "-token="+strconv.FormatUint(rep.FencingToken, 10), "-client-id", "w"); code != exitOK {
		t.Fatalf("release with -token=N: %d", code)
	}
}

// TestEndpointStatus: every member's own view in one table; an
// unreachable member is shown as such; none answering exits 6.
func TestEndpointStatus(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Members: 2})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(1)}
	if code, _, _ := cli(t, env, "acquire", "x", "--client-id", "w"); code != exitOK {
		t.Fatal("acquire")
	}
	dead := testutil.DeadAddr(t)
	if code, _, _ := cli(t, env, "cluster", "add", "node3", "127.0.0.1:1", dead); code != exitOK {
		t.Fatal("cluster add")
	}
	for _, args := range [][]string{{"endpoint", "status"}, {"cluster", "status", "--all"}} {
		code, out, errs := cli(t, env, args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 {
			t.Fatalf("%v: want a header and 3 members:\n%s", args, out)
		}
		for i, w := range [][]string{
			{"ID", "ENDPOINT", "ROLE", "TERM", "COMMIT", "APPLIED", "LAST_TOKEN", "LOG_STORE", "VERSION", "REACHABLE"},
			{"node1", f.URL(0), "leader", "1", "fake", "lockdtest", "yes"},
			{"node2", f.URL(1), "follower", "yes"},
			{"node3", "http://" + dead, "no:", "connection refused"},
		} {
			for _, s := range w {
				if !strings.Contains(lines[i], s) {
					t.Fatalf("%v: line %d %q lacks %q", args, i, lines[i], s)
				}
			}
		}
	}
	code, out, _ := cli(t, env, "endpoint", "status", "-o", "json")
	var rep endpointStatusReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Members) != 3 {
		t.Fatalf("-o json: %d %q", code, out)
	}
	if m := rep.Members[0]; !m.Reachable || m.Status == nil || m.Status.State != "Leader" || m.Status.LastToken != 1 || m.Status.LogStore != "fake" {
		t.Fatalf("node1: %+v", m)
	}
	if m := rep.Members[2]; m.Reachable || m.Status != nil || m.Error == "" {
		t.Fatalf("node3: %+v", m)
	}

	// Nobody answers: every endpoint refuses, so it says so at once.
	code, _, errs := cli(t, map[string]string{"LOCKD_ENDPOINTS": "http://" + dead}, "endpoint", "status", "--timeout", "300ms")
	if code != exitNoLeader || !strings.Contains(errs, "cannot reach the cluster") || !strings.Contains(errs, "connection refused") {
		t.Fatalf("endpoint status of a dead cluster: %d %q", code, errs)
	}
}

// TestStaleStatusNamesTheMember: a stale read says so, and who answered.
func TestStaleStatusNamesTheMember(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Members: 2})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(1)}
	if code, _, _ := cli(t, env, "acquire", "x", "--client-id", "w"); code != exitOK {
		t.Fatal("acquire")
	}
	code, out, _ := cli(t, env, "status", "x", "--stale")
	if code != exitOK || !strings.HasPrefix(out, "x held client_id=w") || !strings.HasSuffix(strings.TrimSpace(out), "(stale, from node2)") {
		t.Fatalf("status --stale: %d %q", code, out)
	}
	code, out, _ = cli(t, env, "status", "x", "--stale", "-o", "json")
	var st api.LockStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || !st.Stale {
		t.Fatalf("status --stale -o json: %d %q", code, out)
	}
	if code, out, _ := cli(t, env, "status", "x"); code != exitOK || strings.Contains(out, "stale") {
		t.Fatalf("status: %d %q", code, out)
	}
}

// TestClusterRefusalExitCode: removing a member that does not exist is a
// cluster refusal (8), not "not the holder" (5).
func TestClusterRefusalExitCode(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{Members: 2})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	code, _, errs := cli(t, env, "cluster", "remove", "n9")
	if code != exitCluster || !strings.Contains(errs, "cluster remove n9: refused by the cluster: no member n9") {
		t.Fatalf("cluster remove n9: %d %q", code, errs)
	}
	if code, _, errs := cli(t, env, "cluster", "transfer", "--to", "n9"); code != exitCluster {
		t.Fatalf("cluster transfer --to n9: %d %q", code, errs)
	}
	f.SetLeader(-1)
	if code, _, _ := cli(t, env, "cluster", "remove", "n9", "--timeout", "300ms"); code != exitNoLeader {
		t.Fatalf("cluster remove without a leader: %d, want %d", code, exitNoLeader)
	}
}

// TestHTTPToHTTPSMember: an http:// endpoint of an HTTPS member is named
// as such, at once.
func TestHTTPToHTTPSMember(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": "http://" + strings.TrimPrefix(srv.URL, "https://")}
	for _, args := range [][]string{{"status", "x"}, {"run", "x", "--", "true"}} {
		start := time.Now()
		code, _, errs := cli(t, env, args...)
		if code != exitNoLeader || !strings.Contains(errs, "this member speaks HTTPS: use https://") || !strings.Contains(errs, "--cacert") {
			t.Fatalf("%v over http:// to an HTTPS member: %d %q", args, code, errs)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%v took %v", args, d)
		}
	}
}

// TestRunGivesUpOnADeadEndpoint: run (client.New) against nothing ends
// with --timeout, saying why.
func TestRunGivesUpOnADeadEndpoint(t *testing.T) {
	start := time.Now()
	code, _, errs := cli(t, map[string]string{"LOCKD_ENDPOINTS": "http://" + testutil.DeadAddr(t)}, "run", "x", "--timeout", "500ms", "--", "true")
	if code != exitNoLeader || !strings.Contains(errs, "connection refused") {
		t.Fatalf("run against a dead endpoint: %d %q", code, errs)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v with --timeout 500ms", d)
	}
}

func TestLockctlBinaryHelp(t *testing.T) {
	out, err := exec.Command(bin, "--help").Output()
	if err != nil || !strings.Contains(string(out), "Exit codes:") {
		t.Fatalf("lockctl --help: %v", err)
	}
	cmd := exec.Command(bin, "acquire", "x", "--ttl", "30")
	cmd.Env = os.Environ()
	b, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != exitUsage || !slices.Contains(strings.Split(string(b), "\n"), "Run 'lockctl acquire --help' for usage.") {
		t.Fatalf("lockctl acquire x --ttl 30: exit %d\n%s", cmd.ProcessState.ExitCode(), b)
	}
}
