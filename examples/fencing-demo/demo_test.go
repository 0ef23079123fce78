//go:build unix

package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// Client A is this test binary, re-executed by the demo.
	if os.Getenv(writerEnv) != "" {
		os.Exit(writerMain())
	}
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestDemo runs the demo as `go run ./examples/fencing-demo` does, with no
// flags: it builds lockd and fencestore, starts a 3-member cluster signing
// its grants and a fencestore verifying them, and tells the story. Exit 0
// means A's late write got 409 stale_token and B's value was kept; the test
// also checks the outcome itself.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o, err := demo(ctx, options{lock: "fencing-demo", ttl: 2 * time.Second}, &out, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if o.StaleWrite != http.StatusConflict || o.StaleCode != "stale_token" || o.StaleHighest != o.TokenB {
		t.Errorf("A's late write: %d %q highest %d; want 409 stale_token highest %d", o.StaleWrite, o.StaleCode, o.StaleHighest, o.TokenB)
	}
	if o.FinalValue != "report, final (by B)" || o.FinalToken != o.TokenB || o.TokenB != o.TokenA+1 {
		t.Errorf("final value %q token %d (A %d, B %d); want B's value with B's token, B = A+1", o.FinalValue, o.FinalToken, o.TokenA, o.TokenB)
	}
	if !o.ProofA || !o.ProofB {
		t.Errorf("grants without proofs from a signing cluster: A %v, B %v", o.ProofA, o.ProofB)
	}
	for _, want := range []string{"SIGSTOP", "kill -CONT", "409 Conflict stale_token", "OK: A's late write was refused"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestDemoAgainstRunningServers runs the demo with --lockd and --fencestore
// against a cluster and a fencestore started beforehand, then checks the
// servers' state on its own: B's value is stored with B's token, a write
// without a fencing proof is refused (this fencestore verifies proofs), and
// the lock is free again.
func TestDemoAgainstRunningServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	st := testStack(t, ctx, true)
	var out bytes.Buffer
	code := run(ctx, []string{"--lockd", strings.Join(st.lockdURLs, ","), "--fencestore", st.fencestore,
		"--key", "ledger", "--lock", "jobs/ledger", "--ttl", "1s"}, &out, &out)
	t.Logf("demo output:\n%s", out.String())
	if code != 0 {
		t.Fatalf("demo exit code %d, want 0", code)
	}

	value, tok, err := getObject(ctx, st.fencestore, "ledger")
	if err != nil || value != "report, final (by B)" {
		t.Fatalf("fencestore holds %q token %d (%v), want B's value", value, tok, err)
	}
	// Tokens of this fresh cluster: A got 1, B got 2.
	if tok != 2 {
		t.Fatalf("fencestore's highest token for ledger is %d, want B's 2", tok)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, objectURL(st.fencestore, "ledger"), strings.NewReader("again"))
	req.Header.Set("Fencing-Token", "1")
	req.Header.Set("Fencing-Lock", "jobs/ledger")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := readBody(resp)
	resp.Body.Close()
	// Without a proof this fencestore refuses with 403 before it looks at
	// the token: it verifies proofs.
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("unsigned write with A's token: %d %s, want 403", resp.StatusCode, body)
	}
	// The lock is free: B released it, A's expired.
	sresp, err := httpClient.Get(st.lockdURLs[0] + "/api/v1/locks/jobs%2Fledger")
	if err != nil {
		t.Fatal(err)
	}
	sbody, _ := readBody(sresp)
	sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK || strings.Contains(sbody, `"held":true`) {
		t.Fatalf("lock status after the demo: %d %s, want 200 and not held", sresp.StatusCode, sbody)
	}
}

// TestDemoFailsWithoutFencing points the demo at a store that does not fence
// (the last write wins, whatever its token). The demo must see A's stale
// write overwrite B's and exit 1: its check is real.
func TestDemoFailsWithoutFencing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	st := testStack(t, ctx, false)
	naive := httptest.NewServer(newNaiveStore())
	defer naive.Close()
	var out bytes.Buffer
	code := run(ctx, []string{"--lockd", strings.Join(st.lockdURLs, ","), "--fencestore", naive.URL, "--ttl", "1s"}, &out, &out)
	t.Logf("demo output:\n%s", out.String())
	if code != 1 {
		t.Fatalf("demo against a store without fencing: exit %d, want 1", code)
	}
	for _, want := range []string{"UNEXPECTED", "want 409 stale_token", "overwrote B's", "FAILED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"-h"}, 0, "Usage: go run ./examples/fencing-demo"},
		{[]string{"--ttl", "10ms"}, 2, "want 500ms to 1m"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--verify-key", "k.pem"}, 2, "--verify-key is for"},
		{[]string{"--nope"}, 2, "flag provided but not defined"},
	} {
		var out bytes.Buffer
		if code := run(t.Context(), tc.args, &out, &out); code != tc.code || !strings.Contains(out.String(), tc.out) {
			t.Errorf("%v: exit %d, output %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.out)
		}
	}
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// testStack starts a 3-member lockd cluster and, with fencestore, a
// fencestore verifying its proofs, from binaries built once per test run.
func testStack(t *testing.T, ctx context.Context, fencestore bool) *stack {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "fencing-demo-test-bin")
		if binErr == nil {
			binErr = buildBinaries(ctx, binDir)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	st, err := startStack(ctx, stackConfig{startLockd: true, startFencestore: fencestore, members: 3, binDir: binDir},
		func(format string, args ...any) { t.Logf(format, args...) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server logs:\n%s", st.logTails(40))
		}
		st.close(false, io.Discard)
	})
	return st
}

// naiveStore is a key-value store without fencing: it records the token it
// is sent but accepts every write.
type naiveStore struct {
	mu     sync.Mutex
	values map[string]string
	tokens map[string]string
}

func newNaiveStore() *naiveStore {
	return &naiveStore{values: map[string]string{}, tokens: map[string]string{}}
}

func (s *naiveStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/v1/objects/")
	s.mu.Lock()
	defer s.mu.Unlock()
	switch r.Method {
	case http.MethodPut:
		b, _ := io.ReadAll(r.Body)
		s.values[key], s.tokens[key] = string(b), r.Header.Get("Fencing-Token")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true,"fencing_token":`+strconv.Quote(s.tokens[key])+`}`)
	case http.MethodGet:
		v, ok := s.values[key]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Fencing-Token", s.tokens[key])
		_, _ = io.WriteString(w, v)
	}
}
