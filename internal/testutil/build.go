package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Builds compiles this repository's commands for tests that run them as
// processes: each at most once per test binary, into one directory that
// Remove deletes (from TestMain, when the tests are done). The zero value
// is ready to use.
type Builds struct {
	mu    sync.Mutex
	dir   string
	built map[string]error
}

// Path builds ./cmd/<name> the first time it is asked for and returns the
// binary's path.
func (b *Builds) Path(t testing.TB, name string) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "lockd-test-bin")
		if err != nil {
			t.Fatal(err)
		}
		b.dir, b.built = dir, map[string]error{}
	}
	path := filepath.Join(b.dir, name)
	err, done := b.built[name]
	if !done {
		cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
		cmd.Dir = repoRoot()
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("build %s: %v\n%s", name, berr, out)
		}
		b.built[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Remove deletes the built binaries.
func (b *Builds) Remove() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir != "" {
		os.RemoveAll(b.dir)
		b.dir, b.built = "", nil
	}
}

// repoRoot is the repository's root: two levels above this file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
