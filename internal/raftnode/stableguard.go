package raftnode

import (
	"sync"

	"github.com/hashicorp/raft"
)

// stableGuard wraps the stable store so that, once the node is shutting
// down, writes are dropped instead of failing. hashicorp/raft handles a
// heartbeat on the transport's goroutine: it checks that raft is not shut
// down and then saves the leader's term; a heartbeat that arrives between
// the check and the stores being closed wrote to a closed store, and raft
// panics when saving the term fails, taking the process (a test binary,
// with every member in it) down. Dropping that write is safe: the member
// is stopping, and the term it has not saved is only one it acknowledged as
// a follower, never a vote.
type stableGuard struct {
	raft.StableStore
	mu     sync.RWMutex
	closed bool
}

// Close makes every later write a no-op; the store itself is closed by
// its owner afterwards. Closers run in reverse order of registration, and
// the guard is registered after the stores, so it closes first.
func (g *stableGuard) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	return nil
}

func (g *stableGuard) Set(key, val []byte) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return nil
	}
	return g.StableStore.Set(key, val)
}

func (g *stableGuard) SetUint64(key []byte, val uint64) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return nil
	}
	return g.StableStore.SetUint64(key, val)
}
