package client

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockd/lockd/api"
)

// One Client is one holder to the server: the server knows it by its
// client ID, not by goroutine, so two goroutines of one Client cannot wait
// for one lock on the server side by side. The Client therefore keeps a
// queue per lock name of the calls that want it, in the order they came;
// the call at the head of every queue it is in goes to the server once
// nothing of this Client holds, awaits or is releasing those names. A
// multi-acquire's ticket sits in the queue of every name, put there in one
// step, so any two tickets are in the same order in every queue they
// share and the heads can always move (as the server's own queues).
//
// When a lock is released and the next in its queue is a single-lock
// acquire of this Client, Release hands the lock on: one release with a
// hand-off, one committed step (see Lock.Release and api.WSRequest.Handoff).

// ticket is one Acquire (or AcquireMany) call in the Client's queues.
type ticket struct {
	names []string
	o     acquireOptions
	try   bool
	ctx   context.Context
	start time.Time
	// ready is closed when the ticket may go (it heads its queues and its
	// names are free), or when a hand-off started its acquire (op set).
	ready     chan struct{}
	signalled bool
	op        *acquireOp
}

// freeLocked reports that nothing of this Client holds, awaits or is
// releasing any of names.
func (c *Client) freeLocked(names []string) bool {
	for _, n := range names {
		if c.locks[n] != nil || c.ops[n] != nil || c.releasing[n] > 0 {
			return false
		}
	}
	return true
}

// headsLocked reports that t is first in the queue of each of its names.
func (c *Client) headsLocked(t *ticket) bool {
	for _, n := range t.names {
		if q := c.queues[n]; len(q) == 0 || q[0] != t {
			return false
		}
	}
	return true
}

// queuedLocked reports a ticket waiting for any of names.
func (c *Client) queuedLocked(names []string) bool {
	for _, n := range names {
		if len(c.queues[n]) > 0 {
			return true
		}
	}
	return false
}

func (c *Client) enqueueLocked(t *ticket) {
	for _, n := range t.names {
		c.queues[n] = append(c.queues[n], t)
	}
}

// dequeueLocked takes t out of its queues.
func (c *Client) dequeueLocked(t *ticket) {
	for _, n := range t.names {
		q := slices.DeleteFunc(c.queues[n], func(x *ticket) bool { return x == t })
		if len(q) == 0 {
			delete(c.queues, n)
		} else {
			c.queues[n] = q
		}
	}
}

// pumpLocked lets the head of the queue of each of names go if it can:
// called whenever something of this Client on one of them ends.
func (c *Client) pumpLocked(names ...string) {
	for _, n := range names {
		q := c.queues[n]
		if len(q) == 0 {
			continue
		}
		t := q[0]
		if !t.signalled && c.headsLocked(t) && c.freeLocked(t.names) {
			t.signalled = true
			close(t.ready)
		}
	}
}

// busyHereLocked is what a try of names says when this Client itself holds
// or wants one of them, nil when nothing but background releases stand in
// the way (a try waits for those: the server would answer it with the
// grant being released).
func (c *Client) busyHereLocked(names []string) *heldHereError {
	for _, n := range names {
		if l := c.locks[n]; l != nil {
			return &heldHereError{what: describe(names), lock: n, token: l.token}
		}
		if c.ops[n] != nil || len(c.queues[n]) > 0 {
			return &heldHereError{what: describe(names), lock: n, pending: true}
		}
	}
	return nil
}

// takeTurn waits for t's turn in the Client's queues, then starts its
// acquire (or takes the one a hand-off started) and sends it.
func (c *Client) takeTurn(t *ticket) (*acquireOp, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if t.try {
		if here := c.busyHereLocked(t.names); here != nil {
			c.mu.Unlock()
			return nil, here
		}
	}
	if !c.queuedLocked(t.names) && c.freeLocked(t.names) {
		return c.startAndSend(t) // unlocks
	}
	c.enqueueLocked(t)
	var expired <-chan time.Time
	if t.o.waitSet && !t.try {
		tm := time.NewTimer(time.Until(t.start.Add(t.o.wait)))
		defer tm.Stop()
		expired = tm.C
	}
	timedOut := false
	for {
		ready := t.ready
		c.mu.Unlock()
		select {
		case <-ready:
		case <-t.ctx.Done():
		case <-c.ctx.Done():
		case <-expired:
			timedOut = true
		}
		c.mu.Lock()
		if t.op != nil {
			// A hand-off sent its acquire along with the release.
			op := t.op
			c.mu.Unlock()
			return op, nil
		}
		switch {
		case c.closed || c.ctx.Err() != nil:
			c.dequeueLocked(t)
			c.pumpLocked(t.names...)
			c.mu.Unlock()
			return nil, ErrClosed
		case t.ctx.Err() != nil:
			c.dequeueLocked(t)
			c.pumpLocked(t.names...)
			c.mu.Unlock()
			return nil, t.ctx.Err()
		case timedOut:
			c.dequeueLocked(t)
			c.pumpLocked(t.names...)
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: %s: another call of this client held or awaited it for the whole wait", ErrWaitTimeout, describe(t.names))
		case c.headsLocked(t) && c.freeLocked(t.names):
			c.dequeueLocked(t)
			return c.startAndSend(t) // unlocks
		}
		// Woken, and something took the names first: wait again.
		t.signalled = false
		t.ready = make(chan struct{})
		c.pumpLocked(t.names...)
	}
}

// startAndSend starts t's acquire and sends it; called with c.mu held,
// returns with it released.
func (c *Client) startAndSend(t *ticket) (*acquireOp, error) {
	op := c.startLocked(t)
	cs := c.cur
	frame := c.prepAcquireLocked(op, true)
	c.mu.Unlock()
	if frame != nil {
		_ = c.write(cs, frame)
	}
	return op, nil
}

// startLocked makes t's acquire pending (it is sent by the caller, or by
// the next connection).
func (c *Client) startLocked(t *ticket) *acquireOp {
	op := &acquireOp{names: t.names, acquireOptions: t.o, try: t.try, ctx: t.ctx, deadline: t.start.Add(t.o.wait), done: make(chan struct{})}
	for _, n := range t.names {
		c.ops[n] = op
	}
	t.op = op
	return op
}

// handOffLocked picks the acquire that lock l's release hands the lock on
// to: the next in l's queue, if it is a single-lock acquire whose turn
// comes with the release. It starts that acquire, wakes its caller, and
// returns the release request carrying it, and the acquire; nil when there
// is none, and the release is a plain one.
func (c *Client) handOffLocked(l *Lock, cs *wsConn) (*api.WSRequest, *acquireOp) {
	q := c.queues[l.name]
	if cs == nil || cs != c.cur || cs.sess != l.sess || l.group != nil || c.locks[l.name] != l || len(q) == 0 {
		return nil, nil
	}
	t := q[0]
	// A release of an earlier grant may still be unanswered (the previous
	// hand-off, say): this one goes out after it on the same connection,
	// where the server applies them in order.
	if len(t.names) != 1 || t.signalled || t.ctx.Err() != nil || c.ops[l.name] != nil {
		return nil, nil
	}
	c.dequeueLocked(t)
	op := c.startLocked(t)
	t.signalled = true
	close(t.ready)
	acq := c.acquireRequestLocked(op, true, true)
	if acq == nil {
		// Not sendable now (the session is being replaced): the next
		// connection sends it as an ordinary acquire.
		return nil, nil
	}
	acq.Op, acq.Lock = "", "" // implied by the release it rides on
	return &api.WSRequest{Op: api.OpRelease, Lock: l.name, FencingToken: l.token, Handoff: acq}, op
}
