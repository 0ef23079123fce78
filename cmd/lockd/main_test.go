package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFlagsComeFromTheEnvironment(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./lockd-data", "")
	hb := fs.Duration("heartbeat-timeout", time.Second, "")
	id := fs.String("id", "node1", "")
	if err := fs.Parse([]string{"--id", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"LOCKD_DATA_DIR": "/var/lib/x", "LOCKD_HEARTBEAT_TIMEOUT": "250ms", "LOCKD_ID": "from-env"}
	if err := applyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if *dataDir != "/var/lib/x" || *hb != 250*time.Millisecond {
		t.Fatalf("env not applied: %s %s", *dataDir, *hb)
	}
	if *id != "from-flag" {
		t.Fatalf("a flag on the command line must win over the environment, got %q", *id)
	}
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Duration("heartbeat-timeout", time.Second, "")
	env = map[string]string{"LOCKD_HEARTBEAT_TIMEOUT": "soon"}
	if err := applyEnv(fs2, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err == nil || !strings.Contains(err.Error(), "LOCKD_HEARTBEAT_TIMEOUT") {
		t.Fatalf("a bad value must be refused naming the variable: %v", err)
	}
}

func TestRunRefusesBadConfiguration(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "LOCKD_<FLAG>"},
		{[]string{"--no-such-flag"}, 2, "not defined"},
		{[]string{"--initial-cluster", "a=127.0.0.1:1,b=127.0.0.1:2", "--id", "c"}, 2, "does not list"},
		{[]string{"--initial-cluster", "a=127.0.0.1:1", "--id", "a", "--join", "http://x:1"}, 2, "exclusive"},
		{[]string{"--log-format", "xml"}, 2, "--log-format"},
		{[]string{"--leader-lease-timeout", "2s", "--heartbeat-timeout", "1s"}, 2, "must not exceed"},
		{[]string{"--tls-cert", "c.pem"}, 2, "go together"},
		{[]string{"--log-store", "floppy"}, 2, "--log-store"},
		{[]string{"--help"}, 0, "-allowed-hosts"},
		{[]string{"--allowed-hosts", "lockd.example,lb.example:7070"}, 2, `--allowed-hosts entry "lb.example:7070"`},
		{[]string{"--allowed-hosts", "http://lockd.example"}, 2, "without scheme or port"},
		{[]string{"--raft-log-level", "chatty"}, 2, "--raft-log-level"},
	}
	for _, c := range cases {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("lockd %v: exit %d, want %d with %q in:\n%s", c.args, code, c.code, c.want, stderr.String())
		}
	}
}

// TestRunRefusesLogStoreTheDataDirContradicts: a data dir keeps the log
// store it was created with; asking for the other one stops the start with
// a message that names both ways out.
func TestRunRefusesLogStoreTheDataDirContradicts(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "raft.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := run([]string{"--data-dir", dir, "--log-store", "wal", "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0"}, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "holds a bolt log") || !strings.Contains(stderr.String(), "--log-store bolt or without --log-store") {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); err == nil {
		t.Fatal("the refused start created wal/")
	}
}

// TestAllowedHostsFromTheEnvironment: LOCKD_ALLOWED_HOSTS is read like
// every flag, and checked like the flag.
func TestAllowedHostsFromTheEnvironment(t *testing.T) {
	t.Setenv("LOCKD_ALLOWED_HOSTS", "ok.example,bad example")
	var stderr bytes.Buffer
	if code := run([]string{"--data-dir", t.TempDir()}, &stderr); code != 2 || !strings.Contains(stderr.String(), `--allowed-hosts entry "bad example"`) {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "2GiB": 2 << 30, "1000": 1000, "3 KB": 3000, "64KiB": 64 << 10, "7B": 7} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1MiB", "0", "lots", "1TiB", "99999999999GiB"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) accepted", bad)
		}
	}
	var stderr bytes.Buffer
	if code := run([]string{"--memory-limit", "lots"}, &stderr); code != 2 || !strings.Contains(stderr.String(), "--memory-limit") {
		t.Fatalf("--memory-limit lots: exit %d, %q", code, stderr.String())
	}
}
