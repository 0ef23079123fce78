package httpapi

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBackend is a one-member "cluster" with no Raft: commands apply to a
// real lock table at once, events go to a real hub.
type fakeBackend struct {
	mu       sync.Mutex
	table    *locktable.Table
	hub      *notify.Hub
	watches  *notify.Watches
	index    uint64
	now      int64
	proposed atomic.Int64
	ready    bool
	leader   string
	sessions map[string]int64 // keepalive: session -> ttl
	nextID   int
	// before, when set, runs ahead of a proposal and returns commands to
	// commit first (a timer's proposal racing a client's).
	before func(cmd locktable.Command) []locktable.Command
	// commitDelay, when set, is how long every proposal takes to commit
	// (concurrent proposals overlap, as replication rounds do).
	commitDelay time.Duration
	// gate, when set, holds every proposal until it is closed (a cluster
	// that commits nothing for a while).
	gate chan struct{}
	// afterReadIndex and afterView, when set, run after every ReadIndex
	// and View (commits between a watch's steps).
	afterReadIndex, afterView func()
}

func newFake() *fakeBackend {
	return &fakeBackend{table: locktable.New(), hub: notify.NewHub(), watches: notify.NewWatches(nil), now: 1_700_000_000_000,
		ready: true, sessions: map[string]int64{}}
}

// timeoutBeforeRetry makes client's next acquire of lock race the timer of
// its earlier wait, which commits first, and moves the clock past that
// wait's deadline.
func (f *fakeBackend) timeoutBeforeRetry(lock, client string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = func(cmd locktable.Command) []locktable.Command {
		if cmd.Op != locktable.OpAcquire || cmd.ClientID != client {
			return nil
		}
		f.before = nil
		return []locktable.Command{{Op: locktable.OpTimeoutWaiter, Lock: lock, ClientID: client, Now: f.now + 100}}
	}
	f.now += 100
}

func (f *fakeBackend) Ready() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.ready }
func (f *fakeBackend) LeaderURL() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leader
}

func (f *fakeBackend) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	f.proposed.Add(1)
	if f.commitDelay > 0 {
		time.Sleep(f.commitDelay)
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return locktable.Result{}, fmt.Errorf("%w: %v", ErrUnknownOutcome, ctx.Err())
		}
	}
	f.mu.Lock()
	if f.before != nil {
		for _, c := range f.before(cmd) {
			res := f.table.Apply(c)
			f.mu.Unlock()
			f.hub.Publish(res.Events)
			f.mu.Lock()
		}
	}
	f.now++
	cmd.Now = f.now
	f.index++
	res := f.table.ApplyAt(f.index, cmd)
	var changes []notify.Change
	seen := map[string]bool{}
	for _, ev := range res.AllEvents() {
		if ev.Lock != "" && !seen[ev.Lock] {
			seen[ev.Lock] = true
			changes = append(changes, notify.Change{Index: f.index, Status: f.table.Get(ev.Lock)})
		}
	}
	for _, ev := range res.Events {
		switch ev.Kind {
		case locktable.EvSessionCreated:
			f.sessions[ev.SessionID] = ev.TTLms
		case locktable.EvSessionEnded:
			delete(f.sessions, ev.SessionID)
		}
	}
	idx := f.index
	f.mu.Unlock()
	f.hub.Publish(res.Events)
	f.watches.Publish(changes)
	f.watches.Advance(idx)
	return res, nil
}

func (f *fakeBackend) ReadIndex(ctx context.Context) error {
	f.mu.Lock()
	hook := f.afterReadIndex
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return nil
}

func (f *fakeBackend) View(fn func(t *locktable.Table)) {
	f.mu.Lock()
	fn(f.table)
	hook := f.afterView
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
}
func (f *fakeBackend) Keepalive(_ context.Context, id string) (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ttl, ok := f.sessions[id]
	return ttl, ok, nil
}
func (f *fakeBackend) Subscribe(clientID string) *notify.Sub { return f.hub.Subscribe(clientID) }
func (f *fakeBackend) WatchLock(name string, buf int) *notify.Watch {
	return f.watches.WatchLock(name, buf)
}
func (f *fakeBackend) WatchPrefix(prefix string, buf int) *notify.Watch {
	return f.watches.WatchPrefix(prefix, buf)
}
func (f *fakeBackend) NewSessionID() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	return fmt.Sprintf("s%d", f.nextID)
}
func (f *fakeBackend) Sign(lock string, token uint64, mode locktable.Mode, expiresAt int64) string {
	return ""
}
func (f *fakeBackend) Cluster(ctx context.Context) (api.ClusterStatus, error) {
	return api.ClusterStatus{LeaderID: "n1", Members: []api.Member{{ID: "n1", Voter: true}}}, nil
}
func (f *fakeBackend) AddMember(ctx context.Context, req api.AddMemberRequest) error { return nil }
func (f *fakeBackend) RemoveMember(ctx context.Context, id string) error             { return nil }
func (f *fakeBackend) TransferLeadership(ctx context.Context, to string) error       { return nil }
func (f *fakeBackend) Status() api.NodeStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := api.NodeStatus{ID: "n1", LeaderID: "n1"}
	if !f.ready {
		st.LeaderID = "n2"
	}
	return st
}
func (f *fakeBackend) Readyz() (bool, string)                     { return f.Ready(), "" }
func (f *fakeBackend) Backup(ctx context.Context) ([]byte, error) { return f.snapshot(), nil }
func (f *fakeBackend) RestoreBackup(ctx context.Context, data []byte, _ RestoreOptions) error {
	t, err := locktable.Restore(data)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.table = t
	f.mu.Unlock()
	return nil
}

// snapshot is the table's canonical encoding: "nothing changed" means these
// bytes did not change.
func (f *fakeBackend) snapshot() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.table.Snapshot()
}
