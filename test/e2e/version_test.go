package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

func git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// TestBinariesReportTheirBuild: built from a checkout (as `go build` does by
// default), every binary's --version and a member's /api/v1/status say
// dev+<the commit's first 12 digits>, with +dirty when the tree had changes.
func TestBinariesReportTheirBuild(t *testing.T) {
	// Go reads version control only where .git is a directory: not in a
	// git worktree (whose .git is a file), nor in a tarball.
	if fi, err := os.Stat("../../.git"); err != nil || !fi.IsDir() {
		t.Skip("not a git clone here (Go embeds no revision in a worktree's or a tarball's build)")
	}
	rev := git(t, "rev-parse", "HEAD")[:12]
	dirtyBefore := git(t, "status", "--porcelain") != ""
	dir := t.TempDir()
	for _, name := range []string{"lockd", "lockctl", "fencestore"} {
		// -buildvcs=true: the default (auto) is what users get; a GOFLAGS
		// here may say otherwise.
		cmd := exec.Command("go", "build", "-buildvcs=true", "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}
	dirtyAfter := git(t, "status", "--porcelain") != ""
	want := `dev\+` + rev
	switch {
	case dirtyBefore && dirtyAfter:
		want += `\+dirty`
	case dirtyBefore != dirtyAfter:
		want += `(\+dirty)?` // the tree changed while building
	}
	for _, name := range []string{"lockd", "lockctl", "fencestore"} {
		out, err := exec.Command(filepath.Join(dir, name), "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", name, err)
		}
		if !regexp.MustCompile(`^` + name + ` ` + want + `\n$`).Match(out) {
			t.Errorf("%s --version printed %q, want %q", name, out, name+" "+want)
		}
	}

	httpAddr, raftAddr := freePort(t), freePort(t)
	cmd := exec.Command(filepath.Join(dir, "lockd"), "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr,
		"--raft-addr", raftAddr, "--log-level", "warn")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var st testutil.Reply
	testutil.WaitFor(t, 20*time.Second, "the member to answer", func() bool {
		st = testutil.Get("http://" + httpAddr + "/api/v1/status")
		return st.Status == 200
	})
	if v := st.Str("version"); !regexp.MustCompile(`^` + want + `$`).MatchString(v) {
		t.Errorf("/api/v1/status version %q, want %q", v, want)
	}
}
