package raftnode

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataDirOfAnotherMemberIsRefused: a data dir records the member that
// owns it; started with another --id, New refuses and names the owner
// (instead of a member that waits leaderless forever).
func TestDataDirOfAnotherMemberIsRefused(t *testing.T) {
	dir := t.TempDir()
	n, err := startNode(t, dir, "wal")
	if err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	if b, _ := os.ReadFile(filepath.Join(dir, memberIDFile)); strings.TrimSpace(string(b)) != "n1" {
		t.Fatalf("member-id file holds %q", b)
	}
	_, err = New(Config{ID: "n2", DataDir: dir, RaftAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), `belongs to member "n1"`) {
		t.Fatalf("started n2 on n1's data dir: %v", err)
	}
	// Its owner still starts on it.
	n, err = startNode(t, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
}

// TestDataDirWithoutThisMemberIsRefused: a data dir from before member-id
// files, whose configuration has members but not this one (another
// member's, or this member was removed), is refused too.
func TestDataDirWithoutThisMemberIsRefused(t *testing.T) {
	dir := t.TempDir()
	n, err := startNode(t, dir, "wal")
	if err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	if err := os.Remove(filepath.Join(dir, memberIDFile)); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{ID: "n2", DataDir: dir, RaftAddr: "127.0.0.1:0"})
	if !errors.Is(err, ErrRemoved) || !strings.Contains(err.Error(), "n1") {
		t.Fatalf("started n2 on a data dir whose configuration is {n1}: %v", err)
	}

}
