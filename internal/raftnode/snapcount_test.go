package raftnode

import (
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"
)

type fakeSnapshots struct {
	createErr, closeErr error
}

func (f fakeSnapshots) Create(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error) {
	if f.createErr != nil {
		return nil, f.createErr
	}
	return &fakeSink{closeErr: f.closeErr}, nil
}
func (fakeSnapshots) List() ([]*raft.SnapshotMeta, error) { return nil, nil }
func (fakeSnapshots) Open(string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	return nil, nil, errors.New("none")
}

type fakeSink struct{ closeErr error }

func (s *fakeSink) Write(b []byte) (int, error) { return len(b), nil }
func (s *fakeSink) Close() error                { return s.closeErr }
func (s *fakeSink) Cancel() error               { return nil }
func (s *fakeSink) ID() string                  { return "1-2-3" }

// TestSnapshotFailuresCounted: a snapshot that cannot be created, is
// cancelled (however often) or fails to close counts once; a snapshot
// written and closed (even twice, as raft and the state machine both do)
// counts nothing.
func TestSnapshotFailuresCounted(t *testing.T) {
	var n atomic.Uint64
	store := func(f fakeSnapshots) countingSnapshots { return countingSnapshots{SnapshotStore: f, failures: &n} }
	create := func(s countingSnapshots) raft.SnapshotSink {
		sink, err := s.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sink
	}

	ok := create(store(fakeSnapshots{}))
	_, _ = ok.Write([]byte("state"))
	_ = ok.Close()
	_ = ok.Close()
	if n.Load() != 0 {
		t.Fatalf("a written snapshot counted as %d failures", n.Load())
	}
	if _, err := store(fakeSnapshots{createErr: errors.New("disk full")}).Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil); err == nil {
		t.Fatal("the error was swallowed")
	}
	cancelled := create(store(fakeSnapshots{}))
	_ = cancelled.Cancel()
	_ = cancelled.Cancel()
	badClose := create(store(fakeSnapshots{closeErr: errors.New("fsync failed")}))
	if err := badClose.Close(); err == nil {
		t.Fatal("the close error was swallowed")
	}
	_ = badClose.Cancel()
	if n.Load() != 3 {
		t.Fatalf("%d failures counted, want 3 (create, cancel, close)", n.Load())
	}
	if id := cancelled.ID(); id != "1-2-3" {
		t.Fatalf("the wrapped sink's ID is %q", id)
	}
}
