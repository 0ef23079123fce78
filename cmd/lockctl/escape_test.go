package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

func TestEscapeHelpers(t *testing.T) {
	for _, c := range []struct {
		in, safe, field, line string
	}{
		{"plain", "plain", "plain", "plain"},
		{"", "", "-", `""`},
		{"http://node-a:8080", "http://node-a:8080", "http://node-a:8080", "http://node-a:8080"},
		{"two words", "two words", `"two words"`, "two words"},
		{"日本語🔒ünï", "日本語🔒ünï", "日本語🔒ünï", "日本語🔒ünï"},
		{`back\slash`, `back\slash`, `back\slash`, `back\slash`},
		{"a=b", "a=b", `"a=b"`, "a=b"},
		{`"quoted"`, `"quoted"`, `"\"quoted\""`, `"\"quoted\""`},
		{"client_id=x", "client_id=x", `"client_id=x"`, `"client_id=x"`},
		{" lead", " lead", `" lead"`, `" lead"`},
		{"two\nlines", `two\nlines`, `"two\nlines"`, `"two\nlines"`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `"\x1b[31mred\x1b[0m"`, `"\x1b[31mred\x1b[0m"`},
		{"cr\rlf", `cr\rlf`, `"cr\rlf"`, `"cr\rlf"`},
		{"tab\tx", `tab\tx`, `"tab\tx"`, `"tab\tx"`},
		{"del\x7f", `del\x7f`, `"del\x7f"`, `"del\x7f"`},
		{"c1\u0085", `c1\u0085`, `"c1\u0085"`, `"c1\u0085"`},
		{"bidi\u202eevil", `bidi\u202eevil`, `"bidi\u202eevil"`, `"bidi\u202eevil"`},
		{"bad\xffutf8", `bad\xffutf8`, `"bad\xffutf8"`, `"bad\xffutf8"`},
	} {
		if got := safe(c.in); got != c.safe {
			t.Errorf("safe(%q) = %q, want %q", c.in, got, c.safe)
		}
		if got := textValue(c.in); got != c.field {
			t.Errorf("textValue(%q) = %q, want %q", c.in, got, c.field)
		}
		if c.in != "" {
			if got := lineValue(c.in); got != c.line {
				t.Errorf("lineValue(%q) = %q, want %q", c.in, got, c.line)
			}
			// A quoted line reads back.
			if got := lineValue(c.in); strings.HasPrefix(got, `"`) {
				if back, err := strconv.Unquote(got); err != nil || back != c.in {
					t.Errorf("lineValue(%q) = %q does not unquote back: %q, %v", c.in, got, back, err)
				}
			}
		}
	}
	if got := safeText("a\x1b\nb\r\n"); got != `a\x1b`+"\n"+`b\r`+"\n" {
		t.Errorf("safeText = %q", got)
	}
}

// terminalSafe fails when out holds anything a terminal acts on or hides:
// a control character other than the newlines between lines, DEL, a C1
// control, a format character such as a bidi override, invalid UTF-8.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: invalid UTF-8 in the output: %q", what, out)
	}
	for _, r := range out {
		if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
			t.Errorf("%s: %U reaches the terminal in %q", what, r, out)
			return
		}
	}
}

func lines(s string) int { return strings.Count(strings.TrimSuffix(s, "\n"), "\n") + 1 }

// TestTextOutputEscapesStoredStrings (SPEC 21): values and client ids with
// newlines, escape sequences, carriage returns, bidi overrides and other
// controls never reach the terminal raw in any text output — acquire,
// status, list, watch, elect and elect --listen, release and the errors
// that echo a holder — and each record stays on its lines; printable
// Unicode is shown as it is; -o json carries the exact strings.
func TestTextOutputEscapesStoredStrings(t *testing.T) {
	f := lockdtest.New(lockdtest.Options{})
	defer f.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": f.URL(0)}
	evilID := "evil\x1b]0;pwned\a\nid"
	values := []string{"two\nlines", "\x1b[31mred\x1b[0m\x1b[2J", "carriage\rreturn", "bidi\u202eevil", "del\x7f and c1\u0085", "日本語 🔒"}

	code, out, _ := cli(t, env, "acquire", "esc/0", "--client-id", evilID, "--value", values[0], "--ttl", "1m")
	if code != exitOK || lines(out) != 1 || !strings.Contains(out, `client_id="evil\x1b]0;pwned\a\nid"`) {
		t.Fatalf("acquire: %d %q", code, out)
	}
	terminalSafe(t, "acquire", out)
	for i, v := range values[1:] {
		if code, _, _ := cli(t, env, "acquire", fmt.Sprintf("esc/%d", i+1), "--client-id", "ok", "--value", v, "--ttl", "1m"); code != exitOK {
			t.Fatalf("acquire esc/%d", i+1)
		}
	}

	code, out, _ = cli(t, env, "status", "esc/0")
	if code != exitOK || lines(out) != 1 || !strings.Contains(out, `value="two\nlines"`) || !strings.Contains(out, `client_id="evil\x1b]0;pwned\a\nid"`) {
		t.Fatalf("status: %d %q", code, out)
	}
	terminalSafe(t, "status", out)
	code, out, _ = cli(t, env, "status", "esc/5")
	if code != exitOK || !strings.Contains(out, `value="日本語 🔒"`) {
		t.Fatalf("status of a printable value: %d %q", code, out)
	}
	code, out, _ = cli(t, env, "list", "--prefix", "esc/")
	if code != exitOK || lines(out) != 1+len(values) {
		t.Fatalf("list: %d, %d lines, want a header and %d: %q", code, lines(out), len(values), out)
	}
	terminalSafe(t, "list", out)
	code, out, _ = cli(t, env, "status", "esc/0", "-o", "json")
	var st api.LockStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Value != values[0] || st.ClientID != evilID {
		t.Fatalf("status -o json: %d %q", code, out)
	}

	// Errors that echo a holder or a client id.
	code, _, errs := cli(t, env, "acquire", "esc/0", "--client-id", "other")
	if code != exitNotAcquired || lines(errs) != 1 || !strings.Contains(errs, `evil\x1b]0;pwned\a\nid`) {
		t.Fatalf("lock_held: %d %q", code, errs)
	}
	terminalSafe(t, "lock_held", errs)
	code, _, errs = cli(t, env, "release", "esc/0", "--client-id", evilID, "--token", "999")
	if code != exitNotHolder || lines(errs) != 1 {
		t.Fatalf("not_holder: %d %q", code, errs)
	}
	terminalSafe(t, "not_holder", errs)

	// watch, text and JSON.
	out1 := &testutil.SyncBuffer{}
	w := runLockctl(t, f.URL(0), out1, "watch", "--prefix", "esc/")
	jout := &testutil.SyncBuffer{}
	wj := runLockctl(t, f.URL(0), jout, "watch", "--prefix", "esc/", "-o", "json")
	testutil.WaitFor(t, 10*time.Second, "the pictures", func() bool {
		return strings.Count(out1.String(), "\n") >= len(values) && strings.Count(jout.String(), "\n") >= len(values)
	})
	stopped(t, w, out1)
	stopped(t, wj, jout)
	if lines(out1.String()) != len(values) || !strings.Contains(out1.String(), `value="bidi\u202eevil"`) {
		t.Fatalf("watch printed %d lines, want %d: %q", lines(out1.String()), len(values), out1)
	}
	terminalSafe(t, "watch", out1.String())
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(jout.String()), "\n") {
		var ev watchEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("watch -o json line %q: %v", l, err)
		}
		got[ev.Status.Value] = true
	}
	for _, v := range values {
		if !got[v] {
			t.Fatalf("watch -o json lost value %q: %q", v, jout)
		}
	}

	// elect: a leader's value with a newline is one line, quoted, for
	// the candidate and for every listener; a plain one prints as it is.
	lout := &testutil.SyncBuffer{}
	listen := runLockctl(t, f.URL(0), lout, "elect", "el", "--listen")
	cout := &testutil.SyncBuffer{}
	cand := runLockctl(t, f.URL(0), cout, "elect", "el", "leader\nfake-leader\x1b[2J")
	want := `"leader\nfake-leader\x1b[2J"` + "\n"
	waitOutput(t, cout, want)
	waitOutput(t, lout, want)
	stopped(t, cand, cout)
	c2 := &testutil.SyncBuffer{}
	cand2 := runLockctl(t, f.URL(0), c2, "elect", "el", "http://node-b:8080")
	waitOutput(t, lout, want+"http://node-b:8080\n")
	stopped(t, cand2, c2)
	stopped(t, listen, lout)
	if lout.String() != want+"http://node-b:8080\n" {
		t.Fatalf("elect --listen printed %q", lout)
	}
	terminalSafe(t, "elect --listen", lout.String())
}

// TestTextOutputEscapesServerStrings (SPEC 21): what a member says about
// itself and the cluster — member ids and addresses, the leader, versions,
// error messages — is escaped too (a member of another version, or a
// hostile endpoint, may say anything).
func TestTextOutputEscapesServerStrings(t *testing.T) {
	evil := "n1\x1b[2J\nFAKE"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/cluster":
			json.NewEncoder(w).Encode(api.ClusterStatus{LeaderID: evil, LeaderHTTP: "http://" + r.Host + "/\x1b[31m", Term: 1,
				Members: []api.Member{{ID: evil, RaftAddr: "a\rb:1", HTTPAddr: "http://" + r.Host, Voter: true}}})
		case "/api/v1/status":
			json.NewEncoder(w).Encode(api.NodeStatus{ID: evil, State: "Leader\x1b[5m", Version: "v1\u202e\n2", LogStore: "wal\r"})
		case "/api/v1/locks/x":
			w.WriteHeader(500)
			json.NewEncoder(w).Encode(api.ErrorReply{Error: api.Error{Code: "internal", Message: "boom\x1b[31m\nsecond line\r"}})
		case "/api/v1/sessions":
			json.NewEncoder(w).Encode(api.SessionReply{SessionID: "s\x1b[1m\n1", TTLms: 15000})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	env := map[string]string{"LOCKD_ENDPOINTS": srv.URL}
	for _, c := range []struct {
		args  []string
		lines int
	}{
		{[]string{"cluster", "status"}, 3},
		{[]string{"endpoint", "status"}, 2},
		{[]string{"session", "create"}, 1},
	} {
		code, out, errs := cli(t, env, append(c.args, "--timeout", "2s")...)
		if lines(out) != c.lines {
			t.Errorf("%v: exit %d, %d lines, want %d: %q %q", c.args, code, lines(out), c.lines, out, errs)
		}
		terminalSafe(t, strings.Join(c.args, " "), out)
		terminalSafe(t, strings.Join(c.args, " ")+" (stderr)", errs)
	}
	code, _, errs := cli(t, env, "status", "x", "--timeout", "2s")
	if code == exitOK || lines(errs) != 1 || !strings.Contains(errs, `boom\x1b[31m\nsecond line\r`) {
		t.Fatalf("server error: %d %q", code, errs)
	}
	terminalSafe(t, "server error", errs)
}
