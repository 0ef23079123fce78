package raftnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/locktable"
)

// TestProposeRefusesUndecodable: a command whose encoding the state
// machine's decoder refuses never reaches the log (every member would panic
// on it, at every restart); Propose says so before it looks at Raft.
func TestProposeRefusesUndecodable(t *testing.T) {
	n := &Node{} // no Raft: a refused command must not get that far
	for name, cmd := range map[string]locktable.Command{
		"http_addr of 195 KB": {Op: locktable.OpSetMember, MemberID: "n9", RaftAddr: "127.0.0.1:7071",
			HTTPAddr: strings.Repeat("\uFFFD", 65000)},
		"lock name over 64 KiB": {Op: locktable.OpAcquire, Lock: strings.Repeat("a", 1<<16+1), ClientID: "c", TTLms: 1000},
		"unknown op":            {Op: 0},
		"a batch":               {Op: locktable.OpBatch, Batch: []locktable.Command{{Op: locktable.OpRemoveMember, MemberID: "x"}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := n.Propose(context.Background(), cmd)
			if !errors.Is(err, locktable.ErrInvalidCommand) {
				t.Fatalf("Propose: %v, want ErrInvalidCommand", err)
			}
		})
	}
}

// TestRestoreBoundsSnapshot: installing a snapshot reads at most the
// limit and fails clearly beyond it, instead of reading it all into memory.
func TestRestoreBoundsSnapshot(t *testing.T) {
	f := newFSM(slog.New(slog.DiscardHandler), nil)
	f.maxSnapshot = 1 << 10
	err := f.Restore(io.NopCloser(bytes.NewReader(make([]byte, 2<<10))))
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("2 KiB snapshot over a 1 KiB limit: %v", err)
	}
	tb := locktable.New()
	tb.Apply(locktable.Command{Op: locktable.OpAcquire, Now: 1, Lock: "a", ClientID: "c", TTLms: 1000})
	if err := f.Restore(io.NopCloser(bytes.NewReader(tb.Snapshot()))); err != nil {
		t.Fatalf("snapshot within the limit: %v", err)
	}
	var held bool
	f.mu.RLock()
	held = f.table.Get("a").Held
	f.mu.RUnlock()
	if !held {
		t.Fatal("the restored table lost lock a")
	}
	if f := newFSM(slog.New(slog.DiscardHandler), nil); f.maxSnapshot != 0 || MaxSnapshotBytes < 1<<30 {
		t.Fatalf("default snapshot bound %d", MaxSnapshotBytes)
	}
}
