package raftnode

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// confirmer batches leadership confirmations. Keepalives are frequent and a
// confirmation is a round of heartbeats to a quorum, so every caller that
// arrives while one round is in flight waits for the next round: each
// caller's answer comes from a round that began after it asked.
type confirmer struct {
	mu      sync.Mutex
	waiting []chan error
	running bool
	stopped bool // the node is shutting down: no new round goroutine
}

// stop refuses new rounds, so none is started while Shutdown waits for the
// node's goroutines.
func (c *confirmer) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

// ConfirmLeadership returns nil once a quorum has acknowledged this member
// as leader in a round of heartbeats that began after the call. A paused
// leader that wakes up deposed gets ErrNotLeader, never a stale yes.
func (n *Node) ConfirmLeadership(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	ch := make(chan error, 1)
	c := &n.confirm
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrShutdown
	}
	c.waiting = append(c.waiting, ch)
	if !c.running {
		c.running = true
		n.wg.Add(1)
		go n.runConfirm()
	}
	c.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrNotLeader, ctx.Err())
	case <-n.done:
		return ErrShutdown
	}
}

// runConfirm runs rounds while callers wait, then exits; the next caller
// starts it again.
func (n *Node) runConfirm() {
	defer n.wg.Done()
	c := &n.confirm
	for {
		c.mu.Lock()
		batch := c.waiting
		c.waiting = nil
		if len(batch) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		err := n.verifyLeader(n.raft.CurrentTerm())
		for _, ch := range batch {
			ch <- err
		}
	}
}
