// Package walfault damages a raft-wal log on disk, as a failing disk would,
// for the tests of the online log verifier. It imports nothing of lockd, so
// the raftnode package's own tests can use it as well as the server's.
package walfault

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FlipInWAL flips one bit of the first occurrence of s in the wal's segment
// files in dir, in place.
func FlipInWAL(t testing.TB, dir, s string) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no wal segments in %s: %v", dir, err)
	}
	for _, seg := range segs {
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(string(b), s)
		if i < 0 {
			continue
		}
		f, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte{b[i] ^ 0x20}, int64(i)); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%q not found in %s", s, dir)
}
