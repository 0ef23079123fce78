package raftnode

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd/lockd/internal/locktable"
)

// Group commit. Concurrent proposals are packed into one log entry (an
// OpBatch) while earlier entries are in flight: under load, many commands
// share one log append, one replication round and one FSM dispatch; with a
// single client, a command goes out alone and waits for nobody.
const (
	maxBatch    = 256 // commands per entry (the decoder accepts up to 4096)
	maxInflight = 2   // batches handed to Raft and not yet committed
)

type proposal struct {
	cmd  locktable.Command
	done chan proposalResult
}

type proposalResult struct {
	res locktable.Result
	err error
}

// Propose replicates cmd and returns the state machine's result once it is
// committed and applied here. ErrNotLeader: nothing was proposed.
// ErrUnknownOutcome: it may still commit.
func (n *Node) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	// An entry the state machine cannot decode would panic every member, at
	// every restart: refuse it here. A batch would nest in the batcher's;
	// checkpoints are the node's own (Checkpoint).
	err := cmd.Validate()
	if err == nil && (cmd.Op == locktable.OpBatch || cmd.Op == locktable.OpCheckpoint) {
		err = fmt.Errorf("%w: a %s", locktable.ErrInvalidCommand, cmd.Op)
	}
	if err != nil {
		return locktable.Result{}, fmt.Errorf("raftnode: refusing to propose: %w", err)
	}
	if n.raft.State() != raft.Leader {
		return locktable.Result{}, ErrNotLeader
	}
	p := proposal{cmd: cmd, done: make(chan proposalResult, 1)}
	select {
	case n.proposals <- p:
	case <-ctx.Done():
		return locktable.Result{}, fmt.Errorf("%w: %v", ErrNotLeader, ctx.Err())
	case <-n.done:
		return locktable.Result{}, ErrShutdown
	}
	select {
	case r := <-p.done:
		return r.res, r.err
	case <-ctx.Done():
		return locktable.Result{}, fmt.Errorf("%w: %v", ErrUnknownOutcome, ctx.Err())
	}
}

// runBatcher owns the proposal queue: it takes what has queued up, sends it
// to Raft as one entry, and lets the next batch build while that one
// commits.
func (n *Node) runBatcher() {
	defer n.wg.Done()
	sem := make(chan struct{}, maxInflight)
	for {
		var first proposal
		select {
		case first = <-n.proposals:
		case <-n.done:
			n.failQueued()
			return
		}
		select {
		case sem <- struct{}{}:
		case <-n.done:
			first.done <- proposalResult{err: ErrShutdown}
			n.failQueued()
			return
		}
		// A restore holds the gate: nothing new reaches the log until the
		// restored state is installed.
		n.gate.RLock()
		batch := []proposal{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case p := <-n.proposals:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		var data []byte
		if len(batch) == 1 {
			data = batch[0].cmd.Encode()
		} else {
			c := locktable.Command{Op: locktable.OpBatch, Batch: make([]locktable.Command, len(batch))}
			for i, p := range batch {
				c.Batch[i] = p.cmd
				c.Now = max(c.Now, p.cmd.Now)
			}
			data = c.Encode()
		}
		n.batchSizes.Observe(float64(len(batch)))
		f := n.raft.Apply(data, 5*time.Second)
		n.gate.RUnlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			err := f.Error()
			<-sem
			if err != nil {
				err = mapApplyErr(err)
				for _, p := range batch {
					p.done <- proposalResult{err: err}
				}
				return
			}
			res, _ := f.Response().(locktable.Result)
			if len(batch) == 1 {
				batch[0].done <- proposalResult{res: res}
				return
			}
			for i, p := range batch {
				var r locktable.Result
				if i < len(res.Batch) {
					r = res.Batch[i]
				}
				p.done <- proposalResult{res: r}
			}
		}()
	}
}

func (n *Node) failQueued() {
	for {
		select {
		case p := <-n.proposals:
			p.done <- proposalResult{err: ErrShutdown}
		default:
			return
		}
	}
}
