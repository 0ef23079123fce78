package raftnode

import (
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/lockd/lockd/internal/locktable"
)

func applyCmd(t *testing.T, f *fsm, idx uint64, data []byte) locktable.Result {
	t.Helper()
	res, _ := f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: data}).(locktable.Result)
	return res
}

func acquireBytes(lock string) []byte {
	c := locktable.Command{Op: locktable.OpAcquire, Now: 1, Lock: lock, ClientID: "c", TTLms: 1000}
	return c.Encode()
}

// TestUndecodableEntryIsSkippedNotFatal: garbage in the log (3 bytes were
// enough to crash-loop every member) is skipped alike everywhere.
func TestUndecodableEntryIsSkippedNotFatal(t *testing.T) {
	var effects []Effect
	f := newFSM(slog.New(slog.DiscardHandler), func(e Effect) { effects = append(effects, e) })
	applyCmd(t, f, 1, acquireBytes("a"))
	if r := applyCmd(t, f, 2, []byte{1, 0xff, 0x00}); r.Code != locktable.CodeInvalid {
		t.Fatalf("garbage applied with %v", r.Code)
	}
	if r := applyCmd(t, f, 3, acquireBytes("b")); !r.Granted {
		t.Fatalf("the entry after the garbage was not applied: %+v", r)
	}
	if n := f.undecodable.Load(); n != 1 || f.halted.Load() != 0 {
		t.Fatalf("undecodable %d halted %d, want 1 and 0", n, f.halted.Load())
	}
	if f.index != 3 || len(effects) != 2 || effects[1].Index != 3 {
		t.Fatalf("index %d effects %+v", f.index, effects)
	}
	if _, err := f.Snapshot(); err != nil {
		t.Fatalf("snapshot after a skipped entry: %v", err)
	}
}

// TestEntryFromNewerVersionHalts: an entry this lockd cannot read but the
// others applied must not be skipped (the state would diverge): the member
// applies nothing more and never snapshots past it.
func TestEntryFromNewerVersionHalts(t *testing.T) {
	f := newFSM(slog.New(slog.DiscardHandler), nil)
	applyCmd(t, f, 1, acquireBytes("a"))
	newer := acquireBytes("x")
	newer[0] = 200
	applyCmd(t, f, 2, newer)
	if r := applyCmd(t, f, 3, acquireBytes("b")); r.Granted {
		t.Fatal("a halted member applied an entry")
	}
	if f.halted.Load() != 2 {
		t.Fatalf("halted at %d, want 2", f.halted.Load())
	}
	if f.table.Get("b").Held {
		t.Fatal("the entry after the halt changed the state")
	}
	if _, err := f.Snapshot(); err == nil {
		t.Fatal("a halted member took a snapshot")
	}
}
