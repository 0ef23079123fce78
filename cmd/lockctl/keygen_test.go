package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/fence"
)

// TestKeygen writes a pair, checks it is a working Ed25519 pair with the
// right file modes, and that a second run refuses to replace it unless
// --force is given.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	priv := filepath.Join(dir, "lockd-signing.pem")
	pub := filepath.Join(dir, "lockd-verify.pem")

	code, out, _ := cli(t, nil, "keygen", "--private", priv, "--public", pub)
	if code != exitOK || !strings.Contains(out, "--signing-key "+priv) || !strings.Contains(out, "--verify-key "+pub) {
		t.Fatalf("keygen: code %d, output %q", code, out)
	}
	checkPair(t, priv, pub)
	for path, want := range map[string]os.FileMode{priv: 0o600, pub: 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		// The umask may only take permissions away.
		if got := fi.Mode().Perm(); got&^want != 0 {
			t.Errorf("%s: mode %v, want at most %v", path, got, want)
		}
	}
	privBefore := readFile(t, priv)
	before := privBefore + readFile(t, pub)

	// No --force: nothing changes, whichever of the two exists.
	code, _, errs := cli(t, nil, "keygen", "--private", priv, "--public", pub)
	if code != exitError || !strings.Contains(errs, "exists") || !strings.Contains(errs, "--force") {
		t.Fatalf("keygen over existing files: code %d, stderr %q", code, errs)
	}
	other := filepath.Join(dir, "new-verify.pem")
	code, _, _ = cli(t, nil, "keygen", "--private", priv, "--public", other)
	if code != exitError {
		t.Fatalf("keygen over an existing private key: code %d", code)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatalf("a refused keygen left %s behind (%v)", other, err)
	}
	if readFile(t, priv)+readFile(t, pub) != before {
		t.Fatal("a refused keygen changed the key files")
	}

	// --force: a new pair, still matching, mode still 0600 for the private
	// key, and no temporary files left behind.
	code, out, _ = cli(t, nil, "keygen", "--private", priv, "--public", pub, "--force", "-o", "json")
	if code != exitOK {
		t.Fatalf("keygen --force: code %d", code)
	}
	var rep keygenReply
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Private != priv || rep.Public != pub {
		t.Fatalf("keygen -o json: %q (%v)", out, err)
	}
	if readFile(t, priv) == privBefore {
		t.Fatal("keygen --force did not replace the private key")
	}
	checkPair(t, priv, pub)
	if fi, _ := os.Stat(priv); fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("private key mode %v after --force", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("files left in the key dir: %v", names)
	}
}

func TestKeygenUsage(t *testing.T) {
	dir := t.TempDir()
	same := filepath.Join(dir, "k.pem")
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"keygen", "--private", same, "--public", same}, exitUsage, "same file"},
		{[]string{"keygen", "--private", ""}, exitUsage, "must not be empty"},
		{[]string{"keygen", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"keygen", "-h"}, exitOK, "usage: lockctl keygen"},
		{[]string{"--help"}, exitOK, "keygen [--private F]"},
		{[]string{"keygen", "--private", filepath.Join(dir, "no", "such", "dir", "k"), "--public", filepath.Join(dir, "p")}, exitError, "keygen:"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := cli(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(out+errs, tc.out) {
				t.Fatalf("code %d (want %d), output %q (want %q)", code, tc.code, out+errs, tc.out)
			}
		})
	}
	if _, err := os.Stat(same); !os.IsNotExist(err) {
		t.Fatal("keygen with the same file for both keys wrote it")
	}
}

// TestKeygenDefaultsInCwd runs the built binary without flags: the pair
// lands in the working directory under the documented default names.
func TestKeygenDefaultsInCwd(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(bin, "keygen")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("lockctl keygen: %v\n%s", err, out.String())
	}
	checkPair(t, filepath.Join(dir, "lockd-signing.pem"), filepath.Join(dir, "lockd-verify.pem"))
}

// checkPair loads both files with the fence package and checks a proof
// signed with the private key verifies with the public one.
func checkPair(t *testing.T, privPath, pubPath string) {
	t.Helper()
	priv, err := fence.LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := fence.LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	proof := fence.Sign(priv, "jobs/nightly", 42, 1700000000000)
	if exp, err := fence.Verify(pub, "jobs/nightly", 42, proof); err != nil || exp != 1700000000000 {
		t.Fatalf("the written keys are not a pair: %v (expiry %d)", err, exp)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
