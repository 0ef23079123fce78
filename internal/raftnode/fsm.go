package raftnode

import (
	"crypto/sha256"
	"encoding/hex"
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
	index   uint64 // the last entry reflected in table (under mu); 0 after a restore until the next apply
	effects func(Effect)
	applied atomic.Uint64
	// undecodable counts committed entries that did not decode; halted is
	// the index of an entry written by a newer lockd, from which on this
	// member applies nothing (0: none).
	undecodable atomic.Uint64
	halted      atomic.Uint64
	// appliedCh is closed and replaced after every applied entry, so readers
	// waiting for an index wake without polling.
	waitMu    sync.Mutex
	appliedCh chan struct{}
	// maxSnapshot bounds Restore's read; 0 means MaxSnapshotBytes.
	maxSnapshot int64
	// watching: record the changed locks' statuses in each Effect.
	watching atomic.Bool
}

// MaxSnapshotBytes bounds the snapshot a member reads whole into memory
// when it installs one (from its disk at start, or sent by the leader): a
// bigger one fails with an error rather than exhausting memory. It is far
// above the state quotas let a table hold; a restore's upload limit
// (httpapi.Config.MaxRestoreBytes) must stay below it, or an accepted
// backup could not be installed.
const MaxSnapshotBytes = 2 << 30

func newFSM(log *slog.Logger, effects func(Effect)) *fsm {
	if effects == nil {
		effects = func(Effect) {}
	}
	return &fsm{log: log, table: locktable.New(), appliedCh: make(chan struct{}), effects: effects}
}

// Apply decodes and applies one committed command.
//
// No committed entry crash-loops a member (a panic here did, for every
// member at once and again at every restart):
//   - an entry that does not decode as any command is skipped: every
//     member runs the same decoder over the same bytes and skips it alike,
//     so the state stays identical everywhere. It is logged and counted.
//   - an entry written by a newer lockd (a command version this one does
//     not know) cannot be skipped: the others applied it. This member halts
//     instead: it applies nothing more and refuses to snapshot, so nothing
//     past the entry is ever saved, and it reports not ready. Restarted on
//     a lockd that reads the entry, it replays from its last snapshot and
//     log and catches up.
//
// The API cannot produce either kind (every command is validated before
// it is encoded) and a peer must prove a member identity to append one.
func (f *fsm) Apply(l *raft.Log) interface{} {
	defer f.advance(l.Index)
	if l.Type != raft.LogCommand {
		return nil
	}
	if f.halted.Load() != 0 {
		return locktable.Result{Code: locktable.CodeInvalid}
	}
	cmd, err := locktable.DecodeCommand(l.Data)
	if err != nil {
		f.undecodable.Add(1)
		sum := sha256.Sum256(l.Data)
		if locktable.FromNewerVersion(l.Data) {
			f.halted.Store(l.Index)
			f.log.Error("a committed entry was written by a newer lockd: this member stops applying the log and reports not ready; upgrade it",
				"index", l.Index, "bytes", len(l.Data), "sha256", hex.EncodeToString(sum[:8]), "err", err)
		} else {
			f.log.Error("skipped an undecodable committed entry (every member skips it alike)",
				"index", l.Index, "bytes", len(l.Data), "sha256", hex.EncodeToString(sum[:8]), "err", err)
			f.mu.Lock()
			f.index = l.Index
			f.mu.Unlock()
		}
		return locktable.Result{Code: locktable.CodeInvalid}
	}
	f.mu.Lock()
	res := f.table.ApplyEntry(l.Index, l.Term, cmd)
	f.index = l.Index
	ev := res.AllEvents()
	var changed []locktable.LockInfo
	if len(ev) > 0 && f.watching.Load() {
		changed = changedLocks(f.table, ev)
	}
	f.mu.Unlock()
	// Every member hands the committed events on, in log order, whoever
	// proposed the entry and whether or not that proposer still waits.
	if len(ev) > 0 {
		f.effects(Effect{Index: l.Index, Events: ev, Changed: changed})
	}
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
	if at := f.halted.Load(); at != 0 {
		return nil, fmt.Errorf("raftnode: halted at entry %d (written by a newer lockd): no snapshot may cover it", at)
	}
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
	limit := f.maxSnapshot
	if limit == 0 {
		limit = MaxSnapshotBytes
	}
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("snapshot over the limit of %d bytes (raftnode.MaxSnapshotBytes)", limit)
	}
	if err != nil {
		return fmt.Errorf("raftnode: read snapshot: %w", err)
	}
	t, err := locktable.Restore(b)
	if err != nil {
		return fmt.Errorf("raftnode: restore snapshot: %w", err)
	}
	f.mu.Lock()
	f.table = t
	f.index = 0
	f.mu.Unlock()
	f.effects(Effect{Restored: true})
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

// Effect is what one committed entry sets in motion, handed on by the apply
// loop in log order on every member: the state machine's events, or the
// news that a snapshot replaced the whole state (Restored: consumers re-read
// the state instead of following events).
type Effect struct {
	Index    uint64
	Events   []locktable.Event
	Restored bool
	// Changed is the status, right after this entry, of every lock its
	// events name (in the order first named), recorded only while someone
	// watches (Node.SetWatching): watchers see each committed change, not
	// whatever the state has become by the time they read it.
	Changed []locktable.LockInfo
}

// changedLocks reads the status of every lock the events name, once each.
func changedLocks(t *locktable.Table, events []locktable.Event) []locktable.LockInfo {
	var out []locktable.LockInfo
	seen := map[string]bool{}
	for _, ev := range events {
		if ev.Lock == "" || seen[ev.Lock] {
			continue
		}
		seen[ev.Lock] = true
		out = append(out, t.Get(ev.Lock))
	}
	return out
}
