package raftnode

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// closedStable fails every write, as a closed store does.
type closedStable struct{ raft.StableStore }

var errClosedStore = errors.New("closed")

func (closedStable) Set([]byte, []byte) error       { return errClosedStore }
func (closedStable) SetUint64([]byte, uint64) error { return errClosedStore }

// A term saved during a shutdown (a heartbeat racing it) must not fail:
// hashicorp/raft panics when it cannot save the current term.
func TestStableGuardDropsWritesOnceClosed(t *testing.T) {
	mem := raft.NewInmemStore()
	g := &stableGuard{StableStore: mem}
	if err := g.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if v, _ := mem.GetUint64([]byte("CurrentTerm")); v != 3 {
		t.Fatalf("a write before close did not reach the store: %d", v)
	}
	g.Close()
	g.StableStore = closedStable{mem}
	if err := g.SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatalf("a write after close: %v", err)
	}
	if err := g.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatalf("a write after close: %v", err)
	}
	if v, _ := mem.GetUint64([]byte("CurrentTerm")); v != 3 {
		t.Fatalf("a write after close reached the store: %d", v)
	}
}
