package raftnode

import (
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// countingSnapshots is the snapshot store with a count of the snapshots
// this member failed to write: its own (taken every --snapshot-interval
// when due), one the leader sent it, or a restore. hashicorp/raft only
// logs such a failure and tries again later, so without the count a full
// or failing disk shows only as a log that grows without bound.
type countingSnapshots struct {
	raft.SnapshotStore
	failures *atomic.Uint64
}

func (s countingSnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.SnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		s.failures.Add(1)
		return nil, err
	}
	return &countingSink{SnapshotSink: sink, failures: s.failures}, nil
}

// countingSink counts its snapshot as failed, once, when it is cancelled
// (raft and the state machine cancel a snapshot they could not write) or
// when closing it fails.
type countingSink struct {
	raft.SnapshotSink
	failures *atomic.Uint64
	failed   atomic.Bool
}

func (s *countingSink) Close() error {
	err := s.SnapshotSink.Close()
	if err != nil {
		s.fail()
	}
	return err
}

func (s *countingSink) Cancel() error {
	s.fail()
	return s.SnapshotSink.Cancel()
}

func (s *countingSink) fail() {
	if s.failed.CompareAndSwap(false, true) {
		s.failures.Add(1)
	}
}

// SnapshotFailures is the number of snapshots this member failed to write
// since it started.
func (n *Node) SnapshotFailures() uint64 { return n.snapFailures.Load() }
