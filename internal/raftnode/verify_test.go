package raftnode

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"
)

func entry(idx, term uint64, data string) *raft.Log {
	return &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: []byte(data)}
}

func checkpointAt(idx, term uint64) *raft.Log {
	return &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: checkpointEntry}
}

// replicate hands copies of the leader's stored entries to a follower, as
// the transport would (the checkpoint carries the leader's checksum).
func replicate(t *testing.T, leader raft.LogStore, follower raft.LogStore, from, to uint64) {
	t.Helper()
	var batch []*raft.Log
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := leader.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, &l)
	}
	if err := follower.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
}

// tailCut plays a leader change on a follower: it holds two entries of
// term 1 that never committed; the leader of term 2 overwrites them and
// writes a checkpoint. Raft cuts the follower's tail first (DeleteRange)
// and then stores the leader's entries. checked waits until both have
// checked the first checkpoint (a verifier busy with one drops the next).
func tailCut(t *testing.T, leader, follower raft.LogStore, checked func()) {
	t.Helper()
	for _, l := range []*raft.Log{entry(1, 1, "a"), entry(2, 1, "b"), entry(3, 1, "c"), checkpointAt(4, 1)} {
		if err := leader.StoreLogs([]*raft.Log{l}); err != nil {
			t.Fatal(err)
		}
	}
	replicate(t, leader, follower, 1, 4)
	checked()
	if err := follower.StoreLogs([]*raft.Log{entry(5, 1, "never committed"), entry(6, 1, "nor this")}); err != nil {
		t.Fatal(err)
	}
	if err := leader.StoreLogs([]*raft.Log{entry(5, 2, "d"), entry(6, 2, "e"), entry(7, 2, "f"), checkpointAt(8, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := follower.DeleteRange(5, 6); err != nil {
		t.Fatal(err)
	}
	replicate(t, leader, follower, 5, 8)
}

// TestTailCutIsNotAMismatch: raft-wal's verifier alone keeps the cut
// entries in its running checksum and reports the follower as corrupt at
// the next checkpoint; the node's wrapper starts afresh at a tail cut and
// the follower's log checks out.
func TestTailCutIsNotAMismatch(t *testing.T) {
	t.Run("verifier alone: a false alarm", func(t *testing.T) {
		reports := make(chan verifier.VerificationReport, 8)
		mk := func() *verifier.LogStore {
			return verifier.NewLogStore(raft.NewInmemStore(), isCheckpoint,
				func(r verifier.VerificationReport) { reports <- r }, &walmetrics.NoOpCollector{})
		}
		l, f := mk(), mk()
		defer l.Close()
		defer f.Close()
		var mismatch bool
		next := func() {
			select {
			case r := <-reports:
				var sumErr verifier.ErrChecksumMismatch
				mismatch = mismatch || errors.As(r.Err, &sumErr)
			case <-time.After(5 * time.Second):
				t.Fatal("missing report")
			}
		}
		tailCut(t, l, f, func() { next(); next() })
		next() // the second checkpoint, on leader and follower
		next()
		if !mismatch {
			t.Fatal("the verifier alone no longer reports a tail cut as corruption: the wrapper may be unneeded")
		}
	})
	t.Run("wrapped", func(t *testing.T) {
		log := slog.New(slog.DiscardHandler)
		l, f := newVerifiedLog(raft.NewInmemStore(), log), newVerifiedLog(raft.NewInmemStore(), log)
		defer l.Close()
		defer f.Close()
		checked := func(n uint64) func() bool {
			return func() bool {
				return l.check.verified.Load()+l.check.mismatches.Load() >= n && f.check.verified.Load()+f.check.mismatches.Load() >= n
			}
		}
		tailCut(t, l, f, func() { waitFor(t, 5*time.Second, "the first checkpoint checked", checked(1)) })
		waitFor(t, 5*time.Second, "the second checkpoint checked", checked(2))
		if l.check.mismatches.Load() != 0 || f.check.mismatches.Load() != 0 {
			t.Fatalf("mismatches: leader %d follower %d (%s)", l.check.mismatches.Load(), f.check.mismatches.Load(), f.check.last)
		}
	})
}

// TestCompactionKeepsTheChecksum: deleting the head of the log
// (compaction after a snapshot) is not a tail cut: the running checksum
// goes on and the next range is still compared as written.
func TestCompactionKeepsTheChecksum(t *testing.T) {
	vl := newVerifiedLog(raft.NewInmemStore(), slog.New(slog.DiscardHandler))
	defer vl.Close()
	gen := vl.cur.Load()
	if err := vl.StoreLogs([]*raft.Log{entry(1, 1, "a"), entry(2, 1, "b"), entry(3, 1, "c")}); err != nil {
		t.Fatal(err)
	}
	if err := vl.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	if vl.cur.Load() != gen {
		t.Fatal("a head delete restarted the verifier")
	}
	if err := vl.DeleteRange(3, 3); err != nil {
		t.Fatal(err)
	}
	if vl.cur.Load() == gen || gen.cutAt.Load() != 3 {
		t.Fatalf("a tail delete did not restart the verifier (cut at %d)", gen.cutAt.Load())
	}
}
