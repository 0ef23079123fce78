package raftnode

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/lockd/lockd/internal/locktable"
)

// fsm adapts the pure lock table to raft.FSM. It owns the only lock around
// the table: Apply takes it for writing, readers for reading.
type fsm struct {
	mu      sync.RWMutex
	table   *locktable.Table
	applied atomic.Uint64
	// appliedCh is closed and replaced after every applied entry, so readers
	// waiting for an index wake without polling.
	waitMu    sync.Mutex
	appliedCh chan struct{}
}

func newFSM() *fsm {
	return &fsm{table: locktable.New(), appliedCh: make(chan struct{})}
}

// Apply decodes and applies one committed command. A committed entry that
// does not decode means this binary cannot follow the log; continuing would
// diverge from the other members, so it panics (as rqlite's FSM does).
func (f *fsm) Apply(l *raft.Log) interface{} {
	defer f.advance(l.Index)
	if l.Type != raft.LogCommand {
		return nil
	}
	cmd, err := locktable.DecodeCommand(l.Data)
	if err != nil {
		panic(fmt.Sprintf("raftnode: undecodable committed entry %d: %v", l.Index, err))
	}
	f.mu.Lock()
	res := f.table.Apply(cmd)
	f.mu.Unlock()
	return res
}

func (f *fsm) advance(idx uint64) {
	f.applied.Store(idx)
	f.waitMu.Lock()
	close(f.appliedCh)
	f.appliedCh = make(chan struct{})
	f.waitMu.Unlock()
}

// appliedWait returns the applied index and a channel closed at the next
// apply.
func (f *fsm) appliedWait() (uint64, <-chan struct{}) {
	f.waitMu.Lock()
	defer f.waitMu.Unlock()
	return f.applied.Load(), f.appliedCh
}

// Snapshot encodes the table while Apply is blocked (raft guarantees it),
// so Persist can write the bytes while the log moves on.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	b := f.table.Snapshot()
	f.mu.RUnlock()
	return &snapshot{data: b}, nil
}

// Restore replaces the table with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("raftnode: read snapshot: %w", err)
	}
	t, err := locktable.Restore(b)
	if err != nil {
		return fmt.Errorf("raftnode: restore snapshot: %w", err)
	}
	f.mu.Lock()
	f.table = t
	f.mu.Unlock()
	return nil
}

type snapshot struct{ data []byte }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
