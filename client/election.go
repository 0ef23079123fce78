package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/lockd/lockd/api"
)

// LeaderInfo names the leader of an election: the holder of its lock.
type LeaderInfo struct {
	// Value is what the leader campaigned with or last proclaimed.
	Value string
	// ClientID is the leader's client ID.
	ClientID string
	// Token is the fencing token of the leadership: every new leader has a
	// higher one.
	Token uint64
	// Index is the log index of the lock status this was read from.
	Index uint64
}

// leaderOf is the leader a lock status shows: the holder with the lowest
// token.
func leaderOf(st *api.LockStatus) (LeaderInfo, bool) {
	if len(st.Holders) > 0 {
		h := st.Holders[0]
		return LeaderInfo{Value: h.Value, ClientID: h.ClientID, Token: h.FencingToken, Index: st.Index}, true
	}
	if !st.Held {
		return LeaderInfo{}, false
	}
	return LeaderInfo{Value: st.Value, ClientID: st.ClientID, Token: st.FencingToken, Index: st.Index}, true
}

// Election is a leader election on one lock, in the shape of etcd's
// concurrency.Election: candidates Campaign with a value, the one elected
// holds the lock (and its fencing token) until it resigns or its session
// ends, and everyone can read or Observe the leader's value. Campaign is an
// acquire that waits, with the value; Proclaim sets the value; Resign
// releases; Leader reads the lock's status; Observe watches it.
//
// Leadership is bound to the Client's session, not to a TTL of its own:
// when the leader's process dies or is cut off, its session expires
// (Config.SessionTTL) and the next candidate is elected; the old leader's
// Done closes before that can happen (see the client's conservative
// local lease). Candidates are elected in the order they campaigned.
//
// The methods are safe for concurrent use, but one Election runs one
// Campaign at a time; use one Election per candidate and Client.
type Election struct {
	c    *Client
	name string

	mu   sync.Mutex
	lock *Lock // the leadership won last; nil before
}

// NewElection returns the election on lock name, for candidates of c.
func NewElection(c *Client, name string) *Election {
	return &Election{c: c, name: name}
}

// Name returns the name of the election's lock.
func (e *Election) Name() string { return e.name }

// Campaign waits until this candidate is elected, then returns nil, with
// value as the leader's value; or until ctx ends (its error), or the
// client closes (ErrClosed). Candidates are elected in the order they
// campaigned. While this candidate leads, Campaign proclaims value
// instead. A lock of that name used as a semaphore (WithLimit above 1)
// gives ErrLimitMismatch: an election has one leader.
//
// A Campaign whose ctx ends withdraws its candidacy (a cancel of its
// wait, SPEC 18): the next candidate is elected when the leader resigns,
// never the one that gave up. Only when the election came first — it was
// granted as the ctx ended, or while the client was disconnected and the
// cancel went out on the next connection — does the client resign it at
// once (Campaign still returns ctx's error).
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	e.mu.Lock()
	l := e.lock
	e.mu.Unlock()
	if l != nil && l.Err() == nil {
		return e.Proclaim(ctx, value)
	}
	l, err := e.c.Acquire(ctx, e.name, WithValue(value), WithLimit(1))
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.lock = l
	e.mu.Unlock()
	return nil
}

// current returns the leadership while it lasts, else an error matching
// ErrElectionNotLeader.
func (e *Election) current() (*Lock, error) {
	e.mu.Lock()
	l := e.lock
	e.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("%w: election %q: not elected", ErrElectionNotLeader, e.name)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("%w: election %q: leadership ended: %w", ErrElectionNotLeader, e.name, err)
	}
	return l, nil
}

// Proclaim sets the leader's value while this candidate leads; otherwise
// the error matches ErrElectionNotLeader. Without an answer it matches
// ErrUnknownOutcome (see Lock.SetValue).
func (e *Election) Proclaim(ctx context.Context, value string) error {
	l, err := e.current()
	if err != nil {
		return err
	}
	if err := l.SetValue(ctx, value); err != nil {
		if errors.Is(err, ErrNotHolder) {
			return fmt.Errorf("%w: election %q: %w", ErrElectionNotLeader, e.name, err)
		}
		return err
	}
	return nil
}

// Resign gives the leadership up, so that the next candidate is elected
// in the same step; nil also when this candidate does not lead (any
// more). Without an answer the error matches ErrUnknownOutcome: the
// leadership counts as ended (Done is closed) and the client goes on
// releasing it in the background (see Lock.Release). A Campaign still
// waiting is not affected: end its ctx.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	l := e.lock
	e.mu.Unlock()
	if l == nil || l.Err() != nil {
		return nil
	}
	err := l.Release(ctx)
	if err == nil || errors.Is(err, ErrUnknownOutcome) {
		return err
	}
	if l.Err() != nil {
		return nil // it ended anyway (lost meanwhile, or not held any more)
	}
	return err
}

// Leader reads the current leader (a linearizable read of the lock's
// status); with none, the error matches ErrElectionNoLeader.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	st, err := e.c.api.Status(ctx, e.name, false)
	if err != nil {
		return LeaderInfo{}, err
	}
	li, ok := leaderOf(st)
	if !ok {
		return LeaderInfo{}, fmt.Errorf("%w: election %q", ErrElectionNoLeader, e.name)
	}
	return li, nil
}

// Observe follows the election's leader: the channel gets the current
// leader (if there is one), then each new leader as it is elected, in
// rising Token order, and each value a leader proclaims; a leader is
// never sent twice with the same value. Nothing is sent while there is
// none. Leaders elected and gone while the client was away (or while the
// consumer was behind) may be skipped: the latest always comes. It is a
// watch of the lock (see Client.Watch), closed when ctx ends or the
// client closes.
func (e *Election) Observe(ctx context.Context) (<-chan LeaderInfo, error) {
	ch, err := e.c.Watch(ctx, e.name)
	if err != nil {
		return nil, err
	}
	out := make(chan LeaderInfo)
	go func() {
		defer close(out)
		var last LeaderInfo
		for ev := range ch {
			li, ok := leaderOf(&ev.Status)
			if !ok || li.Token < last.Token || (li.Token == last.Token && li.Value == last.Value) {
				continue
			}
			last = li
			select {
			case out <- li:
			case <-ctx.Done():
				return
			case <-e.c.ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// closedCh is a channel that is closed.
var closedCh = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done returns a channel closed when the leadership ends: resigned, lost
// (the session expired or its local lease ran out, the lock was revoked)
// or the client closed. Err tells why. Before this candidate is elected
// it is closed already; call it again after Campaign to watch that
// leadership. A leader stops acting as one when it closes.
func (e *Election) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lock == nil {
		return closedCh
	}
	return e.lock.Lost()
}

// Err returns nil while this candidate leads; then why it does not, as
// Lock.Err says; before it was ever elected, an error matching
// ErrElectionNotLeader.
func (e *Election) Err() error {
	_, err := e.current()
	if err == nil {
		return nil
	}
	e.mu.Lock()
	l := e.lock
	e.mu.Unlock()
	if l != nil {
		return l.Err()
	}
	return err
}

// Token returns the fencing token of the leadership this candidate won
// last (0 before it was elected), also after it ended: a resource that
// takes fenced writes refuses it once a newer leader wrote. Check Done
// before acting on it.
func (e *Election) Token() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lock == nil {
		return 0
	}
	return e.lock.Token()
}

// Lock returns the lock of the leadership this candidate won last (nil
// before it was elected): its token, proof and Fence for fenced writes.
func (e *Election) Lock() *Lock {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lock
}
