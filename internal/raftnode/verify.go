package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"

	"github.com/lockd/lockd/internal/locktable"
)

// Online log verification (hashicorp/raft-wal's verifier, the check Consul
// offers for its log stores). The leader appends a checkpoint entry now and
// then; as the checkpoint passes through the leader's log store, the
// verifier stamps it with a checksum of every entry written since the
// previous checkpoint. Every member, the leader included, then reads that
// range back from its own disk in the background and compares: a
// difference means the disk (or the path to it) returned other bytes than
// were written, or a follower received other bytes than the leader sent.
// Raft alone would never notice: a follower serves and replicates what it
// reads back.

// Checkpoint cadence: a checkpoint once 1024 entries were appended since the
// last one, or after 30 s when anything was appended at all. 1024 entries
// keep each background check short (≈ 100 KiB of single commands, a few MiB
// of batches under load) and far inside the 10240 entries a member keeps
// after a snapshot, so the range is still on every member's disk when it
// checks it; 30 s bounds how long a quiet cluster's entries stay unchecked,
// at the price of one 4-byte entry. An idle log gets no checkpoints.
const (
	DefaultCheckpointEntries  = 1024
	DefaultCheckpointInterval = 30 * time.Second
)

// checkpointEntry is the one encoding of a checkpoint: a command the state
// machine applies as a no-op. isCheckpoint recognises exactly these bytes, so
// no other command can pass for one.
var checkpointEntry = (&locktable.Command{Op: locktable.OpCheckpoint}).Encode()

// isCheckpoint is the verifier's IsCheckpointFn; it runs on every append of
// every member.
func isCheckpoint(l *raft.Log) (bool, error) {
	return l.Type == raft.LogCommand && bytes.Equal(l.Data, checkpointEntry), nil
}

// LogCheck is what the online log verifier has found on this member since it
// started.
type LogCheck struct {
	Enabled bool // the log store is checked (bolt and wal; not memory)
	// Verified counts log ranges read back equal to the leader's checksum.
	Verified uint64
	// Mismatches counts ranges that differed: this member stored or
	// received other bytes than the leader wrote. It never goes back down
	// while the process runs.
	Mismatches uint64
	// LastMismatch describes the last mismatch ("" when none).
	LastMismatch string
}

type logCheck struct {
	verified, mismatches atomic.Uint64
	mu                   sync.Mutex
	last                 string
}

// LogCheck reports the verifier's findings on this member.
func (n *Node) LogCheck() LogCheck {
	if n.verified == nil {
		return LogCheck{}
	}
	c := &n.verified.check
	c.mu.Lock()
	defer c.mu.Unlock()
	return LogCheck{Enabled: true, Verified: c.verified.Load(), Mismatches: c.mismatches.Load(), LastMismatch: c.last}
}

// ErrNoLogCheck is returned by Checkpoint on a member whose log store is not
// verified (the memory store).
var ErrNoLogCheck = errors.New("raftnode: this member's log store is not verified")

// Checkpoint appends a checkpoint entry now and returns its index once it is
// committed; it runs only on the leader. The node writes checkpoints by
// itself (see DefaultCheckpointEntries); this is for tests and tools.
func (n *Node) Checkpoint(ctx context.Context) (uint64, error) {
	if n.verified == nil {
		return 0, ErrNoLogCheck
	}
	if n.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	// On its own, never in a batch: the verifier looks at whole entries.
	// A restore holds the gate, and nothing may enter the log meanwhile.
	n.gate.RLock()
	f := n.raft.Apply(checkpointEntry, timeout)
	n.gate.RUnlock()
	if err := f.Error(); err != nil {
		return 0, mapApplyErr(err)
	}
	return f.Index(), nil
}

// runCheckpoints writes the checkpoints while this member leads. It looks
// once a second (or at the interval, when shorter) rather than following
// the leadership signal, which belongs to the server.
func (n *Node) runCheckpoints() {
	defer n.wg.Done()
	tick := time.NewTicker(min(time.Second, n.cfg.CheckpointInterval))
	defer tick.Stop()
	var term, lastIdx uint64 // the leadership counted from, the last checkpoint's index
	var lastAt time.Time
	for {
		select {
		case <-tick.C:
		case <-n.done:
			return
		}
		if n.raft.State() != raft.Leader {
			term = 0
			continue
		}
		if t := n.raft.CurrentTerm(); t != term {
			// Newly leading: count from here. The entries since the previous
			// leader's last checkpoint are in this member's running checksum
			// all the same, so its first checkpoint covers them.
			term, lastIdx, lastAt = t, n.raft.LastIndex(), time.Now()
			continue
		}
		last := n.raft.LastIndex()
		if last <= lastIdx || (last-lastIdx < n.cfg.CheckpointEntries && time.Since(lastAt) < n.cfg.CheckpointInterval) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		idx, err := n.Checkpoint(ctx)
		cancel()
		if err != nil {
			n.log.Info("log checkpoint not written", "err", err)
			continue
		}
		lastIdx, lastAt = idx, time.Now()
	}
}

// verifiedLog puts the verifier in front of a log store. Reads, and the
// head deletes of compaction, go straight to the store.
//
// The verifier keeps a running checksum of everything appended since the
// last checkpoint and knows nothing of deletes. When a new leader makes a
// follower cut the tail of its log (entries an old leader appended that
// never committed), that checksum still covers the cut entries and would
// differ from the leader's at the next checkpoint: a false alarm. So a tail
// cut starts a fresh verifier; its first checkpoint is only read back,
// which is sound, since everything up to a checkpoint a member accepted
// matches the leader's log. A check that was still running when the cut
// came may have read replaced entries: its mismatch is not counted.
type verifiedLog struct {
	raft.LogStore
	check logCheck
	log   *slog.Logger
	cur   atomic.Pointer[verifierGen]
}

type verifierGen struct {
	v     *verifier.LogStore
	cutAt atomic.Uint64 // first index cut from the tail while this one ran (0: none)
}

// storeOnly hides the store's Close from the verifier: the node closes the
// store, and a replaced verifier must not.
type storeOnly struct{ raft.LogStore }

func newVerifiedLog(store raft.LogStore, log *slog.Logger) *verifiedLog {
	vl := &verifiedLog{LogStore: store, log: log}
	vl.cur.Store(vl.newGen())
	return vl
}

func (vl *verifiedLog) newGen() *verifierGen {
	g := &verifierGen{}
	g.v = verifier.NewLogStore(storeOnly{vl.LogStore}, isCheckpoint,
		func(r verifier.VerificationReport) { vl.report(g, r) }, &walmetrics.NoOpCollector{})
	return g
}

func (vl *verifiedLog) StoreLog(l *raft.Log) error { return vl.StoreLogs([]*raft.Log{l}) }

func (vl *verifiedLog) StoreLogs(logs []*raft.Log) error { return vl.cur.Load().v.StoreLogs(logs) }

// DeleteRange deletes [lo, hi]. Raft calls it from its main goroutine for a
// tail cut (as StoreLogs) and from the snapshot goroutine for compaction
// (the head: never the last entry, since trailing logs are kept).
func (vl *verifiedLog) DeleteRange(lo, hi uint64) error {
	last, err := vl.LogStore.LastIndex()
	if err != nil {
		return err
	}
	tail := last != 0 && lo <= last && hi >= last
	if !tail {
		return vl.LogStore.DeleteRange(lo, hi)
	}
	old := vl.cur.Load()
	old.cutAt.Store(lo) // before the delete: a check reading meanwhile is discounted
	err = vl.LogStore.DeleteRange(lo, hi)
	vl.cur.Store(vl.newGen())
	_ = old.v.Close() // stops its background check; the store stays open
	return err
}

// IsMonotonic passes the store's answer on (raft-wal is monotonic: raft
// then drops the whole log after installing a snapshot).
func (vl *verifiedLog) IsMonotonic() bool {
	m, ok := vl.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// Close stops the background check; the store is closed by its owner.
func (vl *verifiedLog) Close() error { return vl.cur.Load().v.Close() }

func (vl *verifiedLog) report(g *verifierGen, r verifier.VerificationReport) {
	attrs := []any{"range", r.Range.String(), "leader_checksum", fmt.Sprintf("%016x", r.ExpectedSum),
		"read_checksum", fmt.Sprintf("%016x", r.ReadSum), "took", r.Elapsed.Round(time.Microsecond)}
	if r.SkippedRange != nil {
		vl.log.Warn("log check skipped a range: checkpoints came faster than the checks", "skipped", r.SkippedRange.String())
	}
	var sumErr verifier.ErrChecksumMismatch
	switch {
	case r.Err == nil:
		vl.check.verified.Add(1)
		vl.log.Debug("log range verified", attrs...)
	case errors.Is(r.Err, verifier.ErrRangeMismatch):
		// The range starts before this member's first entry (a snapshot
		// replaced its log, or it joined since): nothing to compare.
		vl.log.Debug("log range not checked: no longer in this member's log", attrs...)
	case errors.As(r.Err, &sumErr):
		if cut := g.cutAt.Load(); cut != 0 && cut < r.Range.End {
			vl.log.Warn("log check inconclusive: a new leader cut this member's log while it ran", append(attrs, "cut_at", cut)...)
			return
		}
		vl.check.mu.Lock()
		vl.check.mismatches.Add(1)
		vl.check.last = r.Err.Error()
		vl.check.mu.Unlock()
		vl.log.Error("log check FAILED: this member's log differs from what the leader wrote; "+
			"its disk returned other bytes than were written (storage corruption) or it received other bytes than were sent (in-flight corruption)",
			append(attrs, "written_checksum", fmt.Sprintf("%016x", r.WrittenSum), "err", r.Err)...)
	default:
		vl.log.Warn("log check could not run", append(attrs, "err", r.Err)...)
	}
}
