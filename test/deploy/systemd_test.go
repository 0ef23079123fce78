package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/testutil"
)

var builds testutil.Builds

func TestMain(m *testing.M) {
	code := m.Run()
	builds.Remove()
	os.Exit(code)
}

// tool finds a systemd tool (Debian's systemd package); CI installs it.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found; CI installs Debian's systemd package (.ci/run)", name)
		}
		t.Skipf("%s not found (apt-get install systemd)", name)
	}
	return p
}

// unitKeys reads a unit file's Key=value lines (the last one of a key wins,
// as systemd's do for these keys).
func unitKeys(unit string) map[string]string {
	keys := map[string]string{}
	for _, l := range strings.Split(unit, "\n") {
		l = strings.TrimSpace(l)
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ";") {
			keys[k] += v
		}
	}
	return keys
}

// TestSystemdUnitOnAFreshHost: the unit runs lockd as the user lockd, which
// packaging/lockd.sysusers creates (systemd-sysusers, into a scratch root
// here), with its data dir in the state directory systemd creates and owns
// for that user; systemd-analyze verify finds nothing to say about the unit.
func TestSystemdUnitOnAFreshHost(t *testing.T) {
	unit := read(t, "../../packaging/lockd.service")
	keys := unitKeys(unit)
	for k, want := range map[string]string{"User": "lockd", "Group": "lockd", "StateDirectory": "lockd",
		"Environment": "LOCKD_DATA_DIR=/var/lib/lockd", "EnvironmentFile": "/etc/lockd/lockd.env",
		"ExecStart": "/usr/local/bin/lockd", "KillSignal": "SIGTERM"} {
		if keys[k] != want {
			t.Errorf("lockd.service: %s=%q, want %q", k, keys[k], want)
		}
	}
	if !strings.Contains(unit, "lockd.sysusers") || !strings.Contains(unit, "systemd-sysusers") {
		t.Error("lockd.service does not say how its user is created (packaging/lockd.sysusers, systemd-sysusers)")
	}

	// The user: created by the sysusers file, at home in the state dir.
	// Installed where the unit's comment says, in a scratch root.
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/lib/sysusers.d"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/lib/sysusers.d/lockd.conf"), []byte(read(t, "../../packaging/lockd.sysusers")), 0o644); err != nil {
		t.Fatal(err)
	}
	sysusers := tool(t, "systemd-sysusers")
	if out, err := exec.Command(sysusers, "--root="+root).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	var user []string
	for _, l := range strings.Split(read(t, filepath.Join(root, "etc", "passwd")), "\n") {
		if f := strings.Split(l, ":"); f[0] == keys["User"] {
			user = f
		}
	}
	if len(user) != 7 || user[5] != "/var/lib/"+keys["StateDirectory"] || !strings.HasSuffix(user[6], "nologin") {
		t.Fatalf("the sysusers file made %q, want user %s at home in /var/lib/%s without a login shell", user, keys["User"], keys["StateDirectory"])
	}
	if !strings.Contains(read(t, filepath.Join(root, "etc", "group")), keys["Group"]+":x:"+user[3]+":") {
		t.Fatalf("no group %s of gid %s", keys["Group"], user[3])
	}

	// The unit, as systemd reads it; only the binary's path is this
	// test's (verify checks that ExecStart is executable).
	analyze := tool(t, "systemd-analyze")
	bin := builds.Path(t, "lockd")
	f := filepath.Join(t.TempDir(), "lockd.service")
	if err := os.WriteFile(f, []byte(strings.Replace(unit, "ExecStart=/usr/local/bin/lockd", "ExecStart="+bin, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", f).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out) // warnings (unknown keys) exit 0: any output fails
	}
}
