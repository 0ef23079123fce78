package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	tests := []struct {
		name    string
		args    []string
		env     func(string) string
		check   func(t *testing.T, c Config)
		wantErr string
	}{
		{"defaults", nil, env(), func(t *testing.T, c Config) {
			if c.Addr != "127.0.0.1:7090" || c.DataDir != "./fencestore-data" || c.VerifyKey != "" ||
				c.LogFormat != "text" || c.LogLevel != "info" || c.MaxValueBytes != 1<<20 {
				t.Fatalf("defaults: %+v", c)
			}
			if c.DBPath() != filepath.Join("fencestore-data", dbFile) {
				t.Fatalf("DBPath = %s", c.DBPath())
			}
		}, ""},
		{"flags", []string{"--addr", "127.0.0.1:1", "--data-dir", "/d", "--verify-key", "k.pub", "--log-format", "json", "--log-level", "debug"}, env(),
			func(t *testing.T, c Config) {
				if c.Addr != "127.0.0.1:1" || c.DataDir != "/d" || c.VerifyKey != "k.pub" || c.LogFormat != "json" || c.LogLevel != "debug" {
					t.Fatalf("flags: %+v", c)
				}
			}, ""},
		{"environment", nil, env("FENCESTORE_ADDR", "127.0.0.1:2", "FENCESTORE_DATA_DIR", "/e", "FENCESTORE_VERIFY_KEY", "e.pub", "FENCESTORE_LOG_FORMAT", "json", "FENCESTORE_MAX_VALUE_BYTES", "10"),
			func(t *testing.T, c Config) {
				if c.Addr != "127.0.0.1:2" || c.DataDir != "/e" || c.VerifyKey != "e.pub" || c.LogFormat != "json" || c.MaxValueBytes != 10 {
					t.Fatalf("env: %+v", c)
				}
			}, ""},
		{"flag beats environment", []string{"--addr", "127.0.0.1:3"}, env("FENCESTORE_ADDR", "127.0.0.1:4"),
			func(t *testing.T, c Config) {
				if c.Addr != "127.0.0.1:3" {
					t.Fatalf("addr = %s", c.Addr)
				}
			}, ""},
		{"bad log format", []string{"--log-format", "xml"}, env(), nil, "--log-format"},
		{"bad log level", nil, env("FENCESTORE_LOG_LEVEL", "loud"), nil, "--log-level"},
		{"bad env number", nil, env("FENCESTORE_MAX_VALUE_BYTES", "lots"), nil, "FENCESTORE_MAX_VALUE_BYTES"},
		{"bad addr", []string{"--addr", "nope"}, env(), nil, "--addr"},
		{"tls flags", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--client-ca", "ca.pem"}, env(),
			func(t *testing.T, c Config) {
				if c.TLSCert != "c.pem" || c.TLSKey != "k.pem" || c.ClientCA != "ca.pem" || !c.TLS() {
					t.Fatalf("tls flags: %+v", c)
				}
			}, ""},
		{"tls environment", nil, env("FENCESTORE_TLS_CERT", "ec.pem", "FENCESTORE_TLS_KEY", "ek.pem", "FENCESTORE_CLIENT_CA", "eca.pem"),
			func(t *testing.T, c Config) {
				if c.TLSCert != "ec.pem" || c.TLSKey != "ek.pem" || c.ClientCA != "eca.pem" {
					t.Fatalf("tls env: %+v", c)
				}
			}, ""},
		{"no tls by default", nil, env(), func(t *testing.T, c Config) {
			if c.TLS() || c.ClientCA != "" {
				t.Fatalf("TLS on by default: %+v", c)
			}
		}, ""},
		{"cert without key", []string{"--tls-cert", "c.pem"}, env(), nil, "--tls-cert and --tls-key go together"},
		{"key without cert", nil, env("FENCESTORE_TLS_KEY", "k.pem"), nil, "--tls-cert and --tls-key go together"},
		{"client ca without tls", []string{"--client-ca", "ca.pem"}, env(), nil, "--client-ca needs --tls-cert"},
		{"guards", []string{"--guard", "ledger=billing/ledger", "--guard", "ledger/eu=billing/eu,=catch-all"}, env(),
			func(t *testing.T, c Config) {
				want := []fence.Guard{{Prefix: "ledger", Lock: "billing/ledger"}, {Prefix: "ledger/eu", Lock: "billing/eu"}, {Prefix: "", Lock: "catch-all"}}
				if len(c.Guards) != len(want) {
					t.Fatalf("guards: %+v", c.Guards)
				}
				for i := range want {
					if c.Guards[i] != want[i] {
						t.Fatalf("guards: %+v, want %+v", c.Guards, want)
					}
				}
			}, ""},
		{"guards from the environment", nil, env("FENCESTORE_GUARD", "a/=A,b/=B", "FENCESTORE_ADMIN_TOKEN_FILE", "/run/admin"),
			func(t *testing.T, c Config) {
				if len(c.Guards) != 2 || c.Guards[1] != (fence.Guard{Prefix: "b/", Lock: "B"}) || c.AdminTokenFile != "/run/admin" {
					t.Fatalf("env: %+v", c)
				}
			}, ""},
		{"guard without a lock", []string{"--guard", "ledger"}, env(), nil, "PREFIX=LOCK"},
		{"guard with a bad lock", []string{"--guard", "ledger=bad lock"}, env(), nil, "guard"},
		{"one prefix, two locks", []string{"--guard", "p=A", "--guard", "p=B"}, env(), nil, "--guard"},
		{"stray argument", []string{"serve"}, env(), nil, "serve"},
		{"unknown flag", []string{"--nope"}, env(), nil, "nope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig(tc.args, tc.env, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"-addr", "-data-dir", "-verify-key", "-log-format", "-log-level", "FENCESTORE_", "-tls-cert", "-tls-key", "-client-ca", "SIGHUP",
		"-guard", "PREFIX=LOCK", "longest", "first accepted write", "-admin-token-file", "18446744073709551615", "DELETE /v1/objects/{key}/fence"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not mention %s:\n%s", want, out.String())
		}
	}
	if code := run([]string{"--help"}, func(string) string { return "" }, io.Discard); code != 0 {
		t.Fatalf("run --help = %d, want 0", code)
	}
	if code := run([]string{"--log-format", "xml"}, func(string) string { return "" }, io.Discard); code != 2 {
		t.Fatalf("run with a bad flag = %d, want 2", code)
	}
}

// TestBinary builds the real fencestore, serves, writes and reads over
// HTTP, stops it with SIGTERM (exit 0), restarts it on the same data dir
// with a verify key from the environment, and checks the highest token and
// value survived.
func TestBinary(t *testing.T) {
	dir, bin := binaryTest(t)
	data := filepath.Join(dir, "data")
	privPath, pubPath := filepath.Join(dir, "lockd.key"), filepath.Join(dir, "lockd.pub")
	if err := fence.GenerateKeyFiles(privPath, pubPath); err != nil {
		t.Fatal(err)
	}
	priv, err := fence.LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}

	// First run: no proofs.
	p := startBinary(t, bin, nil, "--addr", "127.0.0.1:0", "--data-dir", data, "--log-format", "json")
	if code, _, _ := p.do(t, "GET", "/healthz", "", nil); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	p.wantStatus(t, "PUT", "/v1/objects/x", "from-B", map[string]string{fence.HeaderToken: "6", fence.HeaderLock: "res"}, 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/x", "from-A", map[string]string{fence.HeaderToken: "5", fence.HeaderLock: "res"}, 409, api.CodeStaleToken)
	p.wantStatus(t, "PUT", "/v1/objects/y", "x", nil, 400, api.CodeInvalidArgument)
	p.wantStatus(t, "GET", "/v1/objects/y", "", nil, 404, api.CodeNotFound)
	p.wantObject(t, "x", "from-B", 6)
	p.stop(t, syscall.SIGTERM)

	// Second run: same data dir, proofs required (flag from the environment).
	p = startBinary(t, bin, []string{"FENCESTORE_VERIFY_KEY=" + pubPath},
		"--addr", "127.0.0.1:0", "--data-dir", data, "--log-format", "json")
	p.wantObject(t, "x", "from-B", 6)
	p.wantStatus(t, "PUT", "/v1/objects/x", "no-proof", map[string]string{fence.HeaderToken: "7", fence.HeaderLock: "res"}, 403, api.CodePermissionDenied)
	proof := func(token uint64) string {
		return fence.Sign(priv, "res", token, time.Now().Add(time.Minute).UnixMilli())
	}
	p.wantStatus(t, "PUT", "/v1/objects/x", "stale", map[string]string{fence.HeaderToken: "5", fence.HeaderLock: "res", fence.HeaderProof: proof(5)}, 409, api.CodeStaleToken)
	p.wantStatus(t, "PUT", "/v1/objects/x", "from-C", map[string]string{fence.HeaderToken: "7", fence.HeaderLock: "res", fence.HeaderProof: proof(7)}, 200, "")
	p.wantObject(t, "x", "from-C", 7)
	p.stop(t, syscall.SIGINT)
}

func TestBinaryBadVerifyKey(t *testing.T) {
	dir, bin := binaryTest(t)
	out, err := runOnce(bin, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "d"), "--verify-key", filepath.Join(dir, "missing.pub"))
	if code := exitCodeOf(err); code != 1 {
		t.Fatalf("exit %v, want 1; output:\n%s", err, out)
	}
	if !strings.Contains(out, "missing.pub") {
		t.Fatalf("output does not name the key file:\n%s", out)
	}
}

// runOnce runs the binary to its end (for configurations it refuses).
func runOnce(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// exitCodeOf is the exit code of a finished command (-1: did not exit).
func exitCodeOf(err error) int {
	var ee *exec.ExitError
	if err == nil {
		return 0
	}
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// buildBinary builds cmd/fencestore into dir (the go build cache makes a
// second build cheap).
// binaryTest skips in -short mode (it builds and runs the binary), else
// builds fencestore into a fresh temp dir and returns both.
func binaryTest(t *testing.T) (dir, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir = t.TempDir()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin = filepath.Join(dir, "fencestore")
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir, bin
}

// proc is a running fencestore.
type proc struct {
	cmd  *exec.Cmd
	logs *testutil.SyncBuffer
	base string
	// tls is the client TLS configuration for an HTTPS fencestore.
	tls *tls.Config
}

func startBinary(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), logs: &testutil.SyncBuffer{}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.logs
	p.cmd.Stdout = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("fencestore logs:\n%s", p.logs.String())
		}
	})
	// The server logs the address it bound (we asked for port 0).
	deadline := time.Now().Add(15 * time.Second)
	for p.base == "" {
		if time.Now().After(deadline) {
			t.Fatalf("fencestore did not log its address; logs:\n%s", p.logs.String())
		}
		for _, line := range lines(p.logs) {
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
				TLS  bool   `json:"tls"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				p.base = "http://" + rec.Addr
				if rec.TLS {
					p.base = "https://" + rec.Addr
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

func (p *proc) do(t *testing.T, method, path, body string, headers map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: p.tls}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func (p *proc) wantStatus(t *testing.T, method, path, body string, headers map[string]string, status int, code string) {
	t.Helper()
	got, _, b := p.do(t, method, path, body, headers)
	if got != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, got, b, status)
	}
	if code != "" && !strings.Contains(string(b), `"code":"`+code+`"`) {
		t.Fatalf("%s %s: body %s, want code %s", method, path, b, code)
	}
}

func (p *proc) wantObject(t *testing.T, key, value string, token uint64) {
	t.Helper()
	code, h, b := p.do(t, "GET", "/v1/objects/"+key, "", nil)
	if code != 200 || string(b) != value || h.Get(fence.HeaderToken) != strconv.FormatUint(token, 10) {
		t.Fatalf("GET %s: %d %q token %q; want %q token %d", key, code, b, h.Get(fence.HeaderToken), value, token)
	}
}

func (p *proc) stop(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after %v: %v; logs:\n%s", sig, err, p.logs.String())
		}
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Fatalf("fencestore did not exit after %v", sig)
	}
	if !strings.Contains(p.logs.String(), `"msg":"stopped"`) {
		t.Fatalf("no orderly stop in logs:\n%s", p.logs.String())
	}
}

// lines splits a process log into lines.
func lines(b *testutil.SyncBuffer) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(b.String()))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// TestBinaryBindingAndReset runs the real binary with --verify-key,
// --guard and --admin-token-file: a proof for one lock cannot write a key
// bound to another (by its first write, or by the longest matching guard),
// the binding survives a restart, an expired or shared proof is refused,
// and the admin reset unblocks a key.
func TestBinaryBindingAndReset(t *testing.T) {
	dir, bin := binaryTest(t)
	data := filepath.Join(dir, "data")
	privPath, pubPath := filepath.Join(dir, "lockd.key"), filepath.Join(dir, "lockd.pub")
	if err := fence.GenerateKeyFiles(privPath, pubPath); err != nil {
		t.Fatal(err)
	}
	priv, err := fence.LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "admin-token")
	const admin = "3f1c0d5e9a7b2c4d6e8f0a1b2c3d4e5f"
	if err := os.WriteFile(tokenFile, []byte(admin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	live := time.Now().Add(time.Minute).UnixMilli()
	signed := func(lock string, token uint64, exp int64) map[string]string {
		return map[string]string{fence.HeaderToken: strconv.FormatUint(token, 10), fence.HeaderLock: lock,
			fence.HeaderProof: fence.Sign(priv, lock, token, exp)}
	}
	args := []string{"--addr", "127.0.0.1:0", "--data-dir", data, "--log-format", "json", "--verify-key", pubPath,
		"--guard", "ledger=billing/ledger", "--guard", "ledger-eu=billing/eu", "--admin-token-file", tokenFile}

	p := startBinary(t, bin, nil, args...)
	p.wantStatus(t, "PUT", "/v1/objects/notes", "n1", signed("notes/lock", 10, live), 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/ledger-eu-1", "e1", signed("billing/ledger", 11, live), 403, api.CodePermissionDenied)
	p.wantStatus(t, "PUT", "/v1/objects/ledger-eu-1", "e1", signed("billing/eu", 11, live), 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/ledger", "l1", signed("billing/ledger", 12, live), 200, "")
	p.stop(t, syscall.SIGTERM)

	p = startBinary(t, bin, nil, args...)
	// The tenant's proof of a/x, with a higher token, expired or not.
	p.wantStatus(t, "PUT", "/v1/objects/notes", "evil", signed("a/x", 20, live), 403, api.CodePermissionDenied)
	p.wantStatus(t, "PUT", "/v1/objects/notes", "evil", signed("a/x", 21, time.Now().Add(-time.Second).UnixMilli()), 403, api.CodePermissionDenied)
	p.wantStatus(t, "PUT", "/v1/objects/ledger", "evil", signed("a/x", 22, live), 403, api.CodePermissionDenied)
	p.wantObject(t, "notes", "n1", 10)
	p.wantObject(t, "ledger", "l1", 12)
	p.wantStatus(t, "PUT", "/v1/objects/notes", "n2", signed("notes/lock", 10, live), 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/notes", "late", signed("notes/lock", 30, time.Now().Add(-time.Second).UnixMilli()), 403, api.CodePermissionDenied)
	shared := map[string]string{fence.HeaderToken: "31", fence.HeaderLock: "notes/lock",
		fence.HeaderProof: fence.SignGrant(priv, fence.Grant{Lock: "notes/lock", Token: 31, Mode: fence.ModeShared, ExpiresAt: live})}
	p.wantStatus(t, "PUT", "/v1/objects/notes", "reader", shared, 403, api.CodePermissionDenied)
	p.wantObject(t, "notes", "n2", 10)

	// The admin reset drops the binding; the next proof's lock binds again.
	p.wantStatus(t, "DELETE", "/v1/objects/notes/fence", "", nil, 401, api.CodeUnauthenticated)
	p.wantStatus(t, "DELETE", "/v1/objects/notes/fence?fencing_token=5", "", map[string]string{"Authorization": "Bearer " + admin}, 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/notes", "n3", signed("notes/v2", 6, live), 200, "")
	p.wantObject(t, "notes", "n3", 6)
	p.stop(t, syscall.SIGTERM)
}

// TestBinaryMaxTokenBlocksUntilReset: without --verify-key one PUT with
// the largest token blocks a key (documented); the admin reset undoes it.
func TestBinaryMaxTokenBlocksUntilReset(t *testing.T) {
	dir, bin := binaryTest(t)
	tokenFile := filepath.Join(dir, "admin-token")
	const admin = "an-admin-token-of-some-length"
	if err := os.WriteFile(tokenFile, []byte(admin), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, bin, nil, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--log-format", "json",
		"--admin-token-file", tokenFile)
	p.wantStatus(t, "PUT", "/v1/objects/k", "mine", map[string]string{fence.HeaderToken: "5", fence.HeaderLock: "L"}, 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/k", "blocked", map[string]string{fence.HeaderToken: "18446744073709551615", fence.HeaderLock: "L"}, 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/k", "mine", map[string]string{fence.HeaderToken: "6", fence.HeaderLock: "L"}, 409, api.CodeStaleToken)
	p.wantStatus(t, "DELETE", "/v1/objects/k/fence?fencing_token=6", "", map[string]string{"Authorization": "Bearer " + admin}, 200, "")
	p.wantStatus(t, "PUT", "/v1/objects/k", "mine", map[string]string{fence.HeaderToken: "6", fence.HeaderLock: "L"}, 200, "")
	p.wantObject(t, "k", "mine", 6)
	if !strings.Contains(p.logs.String(), "fence reset by admin") || !strings.Contains(p.logs.String(), "no --verify-key") {
		t.Fatalf("logs lack the reset or the warning:\n%s", p.logs.String())
	}
	p.stop(t, syscall.SIGTERM)
}

func TestBinaryBadAdminTokenFile(t *testing.T) {
	dir, bin := binaryTest(t)
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{short, filepath.Join(dir, "missing")} {
		out, err := runOnce(bin, "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "d"), "--admin-token-file", file)
		if code := exitCodeOf(err); code != 1 || !strings.Contains(out, "--admin-token-file") {
			t.Fatalf("%s: exit %v; output:\n%s", file, err, out)
		}
	}
}
