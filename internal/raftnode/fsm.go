package raftnode

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd/lockd/internal/locktable"
)

// fsm adapts the pure lock table to raft.FSM. It owns the only lock around
// the table: Apply takes it for writing, readers for reading.
type fsm struct {
	log     *slog.Logger
	mu      sync.RWMutex
	table   *locktable.Table
	applied atomic.Uint64
	// appliedCh is closed and replaced after every applied entry, so readers
	// waiting for an index wake without polling.
	waitMu    sync.Mutex
	appliedCh chan struct{}
}

func newFSM(log *slog.Logger) *fsm {
	return &fsm{log: log, table: locktable.New(), appliedCh: make(chan struct{})}
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

// raise records that everything up to idx is reflected in the table (after
// a barrier or a restore), waking readers.
func (f *fsm) raise(idx uint64) {
	f.waitMu.Lock()
	if idx > f.applied.Load() {
		f.applied.Store(idx)
		close(f.appliedCh)
		f.appliedCh = make(chan struct{})
	}
	f.waitMu.Unlock()
}

// advance records an applied entry (indexes only go up).
func (f *fsm) advance(idx uint64) { f.raise(idx) }

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
	start := time.Now()
	f.mu.RLock()
	b := f.table.Snapshot()
	locks, sessions := f.table.Size() // Stats would walk every lock while Apply waits
	f.mu.RUnlock()
	return &snapshot{data: b, log: f.log, start: start, locks: locks, sessions: sessions}, nil
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
	st := t.Stats()
	f.log.Info("snapshot restored", "bytes", len(b), "locks", st.Locks, "sessions", st.Sessions, "last_token", st.LastToken)
	return nil
}

type snapshot struct {
	data            []byte
	log             *slog.Logger
	start           time.Time
	locks, sessions int
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		_ = sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return err
	}
	s.log.Info("snapshot taken", "id", sink.ID(), "bytes", len(s.data), "locks", s.locks,
		"sessions", s.sessions, "took", time.Since(s.start).Round(time.Millisecond))
	return nil
}

func (s *snapshot) Release() {}
