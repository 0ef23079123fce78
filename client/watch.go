package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/lockd/lockd/api"
)

// WatchEvent is the status of a watched lock after a committed change.
type WatchEvent struct {
	// Lock is the lock's name.
	Lock string
	// Index is the log index of the lock's last change: Status.Index (for
	// a lock found freed after a reconnect, the index it was found free
	// at). Per lock, the events of one watch have strictly rising indexes.
	Index uint64
	// Status is the lock's status right after that change, as GET
	// /api/v1/locks/{name} shows it. A lock whose last holder and waiter
	// went away shows as free (Held false, Mode "none").
	Status api.LockStatus
	// Resync says the status was read again rather than pushed as the next
	// change: after a reconnect (a leader change, say) or after the watch
	// fell behind. Changes of the lock between the previous event and this
	// one may have been skipped; this is its state as of Index.
	Resync bool
	// Conn is set, only on a watch opened WithConnEvents, on an event that
	// tells the watch's connection state instead of a lock's change (Lock
	// is then empty): the connection was lost, or the watch is established
	// again on a new one.
	Conn *ConnEvent
}

// ConnEvent is a change of a watch's connection (see WithConnEvents).
type ConnEvent struct {
	// Connected is false when the connection the watch lived on was lost:
	// from then until an event with Connected true, no change is delivered
	// (the cluster may be changing all the same). It is true when the
	// watch is established again on a new connection and has caught up:
	// the statuses read again then (Resync events) came before it.
	Connected bool
	// Err is why the connection was lost (Connected false).
	Err error
	// CaughtUp is how many locks' statuses the watch delivered while it
	// caught up (Connected true): the changes made while it was away,
	// folded into one event per lock.
	CaughtUp int
	// Leader is the base URL of the member the watch lives on again
	// (Connected true).
	Leader string
}

// WatchOption configures Watch and WatchPrefix.
type WatchOption func(*watchOptions)

type watchOptions struct {
	buffer int
	conn   bool
}

// WithConnEvents makes the watch tell its connection state in the event
// channel, in order with the changes: an event with Conn set (and no
// Lock) when the connection it lives on is lost — so a consumer can tell
// "no change" from "not connected" — and another once it is established
// again and has caught up, with how many locks' statuses it re-read. The
// events of one outage come once each, however many attempts reconnecting
// takes. Without it the channel carries lock changes only.
func WithConnEvents() WatchOption {
	return func(o *watchOptions) { o.conn = true }
}

// defaultWatchBuffer is how many events a watch holds for its consumer.
const defaultWatchBuffer = 1024

// WithWatchBuffer sets how many events the watch holds for a consumer
// that has not taken them yet (default 1024). When they are full the
// client drops further changes rather than wait, and once the consumer
// has taken what was held it reads the watched locks again and goes on
// (those events are marked Resync): a slow consumer never holds up the
// client, and still sees every lock's latest state.
func WithWatchBuffer(n int) WatchOption {
	return func(o *watchOptions) { o.buffer = n }
}

// watch is one Watch or WatchPrefix of a Client. It outlives connections:
// on every new connection the client watches again and keeps only what is
// newer than what it delivered.
type watch struct {
	lock   string  // a single lock's watch
	prefix *string // or a prefix watch
	ctx    context.Context
	buf    int
	out    chan WatchEvent
	wake   chan struct{} // an event was queued (capacity 1)
	first  chan error    // the answer to the first watch request (capacity 1)
	conns  bool          // WithConnEvents

	// Guarded by Client.mu.
	started bool // the first watch request was answered ok
	ended   bool
	conn    *wsConn // the connection the server watch lives on (or is asked on)
	id      uint64  // the server's watch_id on conn; 0 while there is none
	reqID   uint64  // the watch request awaiting its answer; 0 for none
	gen     uint64  // counts the watch requests sent
	// rereading: a re-established watch whose initial frames are still
	// coming (until its synced frame); its events are marked Resync, and
	// pictured collects the locks they name.
	rereading bool
	pictured  map[string]bool
	// last is the index of the last event queued per lock; state tells
	// whether that event's lock had state (holders, waiters or a delay),
	// so that it would be among a prefix watch's first picture.
	last  map[string]uint64
	state map[string]bool
	queue []WatchEvent
	// overflow: an event was dropped because the queue was full; the
	// watch is read again once the consumer has emptied it.
	overflow bool
	// away: the connection was lost, and the watch has not caught up on a
	// new one yet; caught counts the statuses delivered since it came
	// back (see connLostLocked, caughtUpLocked).
	away   bool
	caught int
}

func (w *watch) what() string {
	if w.prefix != nil {
		return fmt.Sprintf("prefix %q", *w.prefix)
	}
	return fmt.Sprintf("lock %q", w.lock)
}

// Watch follows lock name: the returned channel first gets the lock's
// current status (free or not), then its status after each committed
// change, in log order (rising Index). It rides the client's WebSocket
// connection and survives reconnects and leader changes: the client
// watches again on the new connection, and delivers a status only if its
// index is above the last one it delivered, so no change comes twice or
// out of order, and the lock's latest state always comes (changes made
// while the client was away may be folded into it; see
// WatchEvent.Resync). The server's first frames of a watch end with a
// synced frame, after which nothing older than them comes.
//
// Watch returns once the leader has accepted the watch (an invalid name or
// a token without read access gives the server's error). The channel is
// closed when ctx ends or the client is closed. Take the events promptly:
// see WithWatchBuffer for what happens when they pile up. A connection
// carries at most 1024 watches (more give ErrResourceExhausted).
func (c *Client) Watch(ctx context.Context, name string, opts ...WatchOption) (<-chan WatchEvent, error) {
	if name == "" {
		return nil, errors.New("lockd: empty lock name")
	}
	return c.watch(ctx, name, nil, opts)
}

// WatchPrefix follows every lock whose name starts with prefix ("" for
// every lock): first one event per lock that has state now (held, awaited
// or delayed), then one per committed change of any of them, each lock's
// in log order (rising Index). A lock that loses its last holder and
// waiter shows as free. Across reconnects it behaves as Watch does: the
// client watches again, and the new watch's first frames, up to the
// server's synced frame at index N, are the prefix's state as of N; a lock
// it last showed with state that they do not name has none now, and is
// delivered as free (Held false, Mode "none") at index N — SPEC: a lock
// without state may report any index at or above its last change. For that
// the watch remembers the last index it delivered of every lock it has
// shown (a few dozen bytes each) for as long as it runs.
func (c *Client) WatchPrefix(ctx context.Context, prefix string, opts ...WatchOption) (<-chan WatchEvent, error) {
	return c.watch(ctx, "", &prefix, opts)
}

func (c *Client) watch(ctx context.Context, lock string, prefix *string, opts []WatchOption) (<-chan WatchEvent, error) {
	o := watchOptions{buffer: defaultWatchBuffer}
	for _, f := range opts {
		f(&o)
	}
	if o.buffer < 1 {
		return nil, fmt.Errorf("lockd: watch buffer %d: want at least 1", o.buffer)
	}
	w := &watch{lock: lock, prefix: prefix, ctx: ctx, buf: o.buffer, conns: o.conn,
		out: make(chan WatchEvent), wake: make(chan struct{}, 1), first: make(chan error, 1),
		last: make(map[string]uint64), state: make(map[string]bool)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.watches[w] = struct{}{}
	cs := c.cur
	frame := c.watchFrameLocked(w, cs)
	c.mu.Unlock()
	if frame != nil {
		_ = c.write(cs, frame) // on failure the next connection asks again
	}

	var err error
	select {
	case err = <-w.first:
	case <-ctx.Done():
		err = ctx.Err()
		c.mu.Lock()
		if c.cur == nil {
			err = fmt.Errorf("%w: waiting for a connection to the leader: %w", ErrNoLeader, err)
		}
		c.mu.Unlock()
	case <-c.ctx.Done():
		err = ErrClosed
	}
	c.mu.Lock()
	if err == nil && c.closed {
		err = ErrClosed
	}
	if err != nil {
		cs, frame := c.endWatchLocked(w)
		c.mu.Unlock()
		if frame != nil {
			_ = c.write(cs, frame)
		}
		return nil, err
	}
	c.goLocked(func() { c.deliver(w) })
	c.mu.Unlock()
	return w.out, nil
}

// watchFrameLocked asks for w on cs (nil: none now; the next connection
// will ask) and returns the request's frame.
func (c *Client) watchFrameLocked(w *watch, cs *wsConn) []byte {
	if w.ended || cs == nil {
		return nil
	}
	w.gen++
	w.reqID = c.nextID()
	w.conn, w.id = cs, 0
	w.rereading, w.pictured = w.started, nil
	cs.watchReqs[w.reqID] = w
	req := api.WSRequest{ID: w.reqID, Op: api.OpWatch, Lock: w.lock}
	if w.prefix != nil {
		p := *w.prefix
		req.Prefix = &p
	}
	data, _ := json.Marshal(&req)
	return data
}

// unwatchFrameLocked ends server watch id on cs and returns the frame.
func (c *Client) unwatchFrameLocked(cs *wsConn, id uint64) []byte {
	delete(cs.watchIDs, id)
	rid := c.nextID()
	cs.unwatches[rid] = true
	data, _ := json.Marshal(&api.WSRequest{ID: rid, Op: api.OpUnwatch, WatchID: id})
	return data
}

// resyncLocked reads w again: it replaces the server watch on the live
// connection with a new one, whose first picture is the re-read (see
// onWatchReplyLocked). It returns the frames to send on cs.
func (c *Client) resyncLocked(w *watch) (cs *wsConn, frames [][]byte) {
	cs = c.cur
	if w.ended || cs == nil || w.conn != cs || w.reqID != 0 {
		// Not on the live connection: the next one watches again anyway.
		// Or a watch request is under way: its first picture is to come.
		return nil, nil
	}
	if w.id != 0 {
		frames = append(frames, c.unwatchFrameLocked(cs, w.id))
		w.id = 0
	}
	return cs, append(frames, c.watchFrameLocked(w, cs))
}

// endWatchLocked forgets w and returns the unwatch frame to send on cs,
// if its server watch is on the live connection. A watch request still
// unanswered is unwatched when its answer comes.
func (c *Client) endWatchLocked(w *watch) (cs *wsConn, frame []byte) {
	if w.ended {
		return nil, nil
	}
	w.ended = true
	delete(c.watches, w)
	w.queue = nil
	if w.conn != nil && w.id != 0 {
		if w.conn == c.cur {
			cs, frame = w.conn, c.unwatchFrameLocked(w.conn, w.id)
		}
		delete(w.conn.watchIDs, w.id)
		w.id = 0
	}
	return cs, frame
}

// onWatchReplyLocked takes the answer to a watch request.
func (c *Client) onWatchReplyLocked(cs *wsConn, w *watch, m *api.WSMessage) []func() {
	if m.Type == api.TypeOK && (w.ended || w.conn != cs || w.reqID != m.ID) {
		// Nobody wants this watch any more.
		f := c.unwatchFrameLocked(cs, m.WatchID)
		return []func(){func() { _ = c.write(cs, f) }}
	}
	if w.ended || w.conn != cs || w.reqID != m.ID {
		return nil
	}
	w.reqID = 0
	switch m.Type {
	case api.TypeOK:
		w.id = m.WatchID
		cs.watchIDs[w.id] = w
		if !w.started {
			w.started = true
			select {
			case w.first <- nil:
			default:
			}
			return nil
		}
		// Watched again: its first frames, up to synced, are read again.
		w.pictured = map[string]bool{}
		return nil
	case api.TypeError:
		se := serverError(m.Error, 0)
		switch se.API.Code {
		case api.CodeNotLeader, api.CodeNoLeader:
			c.killLocked(cs, se.API.Code) // asked again on the next connection
			return nil
		case api.CodeSessionExpired:
			c.sessionLostLocked(c.sess, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
			return nil
		}
		if !w.started {
			select {
			case w.first <- fmt.Errorf("lockd: watch %s: %w", w.what(), se):
			default:
			}
			return nil
		}
		// Refused after it was accepted once (a quota, a token reloaded
		// with less access): try again later on this connection.
		c.log.Warn("lockd: watching again was refused, retrying", "watch", w.what(), "err", se)
		gen := w.gen
		c.goLocked(func() { c.rewatchLater(w, cs, gen) })
		return nil
	}
	c.log.Warn("lockd: unexpected reply to watch", "type", m.Type)
	return nil
}

// onWatchEndedLocked takes the server's end of w's watch on cs: a reload
// of the cluster's token file took the token's access to it away. As with a
// re-watch refused, the client asks again later on this connection (the
// access may come back); the consumer keeps its channel.
func (c *Client) onWatchEndedLocked(cs *wsConn, w *watch, m *api.WSMessage) {
	delete(cs.watchIDs, w.id)
	w.id = 0
	c.log.Warn("lockd: the server ended a watch, retrying", "watch", w.what(), "err", serverError(m.Error, 0))
	gen := w.gen
	c.goLocked(func() { c.rewatchLater(w, cs, gen) })
}

// rewatchLater asks for w again on cs after a pause, unless something
// else asked meanwhile.
func (c *Client) rewatchLater(w *watch, cs *wsConn, gen uint64) {
	if !sleep(cs.ctx, c.cfg.MaxBackoff) {
		return
	}
	c.mu.Lock()
	var frame []byte
	if w.gen == gen && w.reqID == 0 && w.id == 0 && w.conn == cs && c.cur == cs {
		frame = c.watchFrameLocked(w, cs)
	}
	c.mu.Unlock()
	if frame != nil {
		_ = c.write(cs, frame)
	}
}

// onChangedLocked takes a changed frame of w.
func (c *Client) onChangedLocked(w *watch, m *api.WSMessage) {
	if m.Status == nil {
		return
	}
	st := *m.Status
	name, idx := m.Lock, m.Index
	if name == "" {
		name = st.Lock
	}
	if idx == 0 {
		idx = st.Index
	}
	if w.rereading && w.pictured != nil {
		w.pictured[name] = true
	}
	c.offerLocked(w, name, idx, st, w.rereading)
}

// onSyncedLocked takes the synced frame that ends a server watch's first
// frames: they were the state of every watched lock as of m.Index. After a
// re-watch, a lock the watch last showed with state that they did not name
// has none as of m.Index (it was freed while the client was away, or
// while the watch was behind): it is delivered as free.
func (c *Client) onSyncedLocked(w *watch, m *api.WSMessage) {
	if !w.rereading {
		return
	}
	if w.prefix != nil && w.pictured != nil {
		var freed []string
		for name, st := range w.state {
			if st && !w.pictured[name] {
				freed = append(freed, name)
			}
		}
		slices.Sort(freed)
		for _, name := range freed {
			c.offerLocked(w, name, m.Index, api.LockStatus{Lock: name, Mode: api.ModeNone, Limit: 1, Index: m.Index}, true)
		}
	}
	w.rereading, w.pictured = false, nil
	c.caughtUpLocked(w) // the statuses re-read came before: tell a consumer that asked
}

// offerLocked queues a lock's status for the consumer if it is newer than
// the last one queued; with the queue full it drops it and marks the watch
// for a re-read.
func (c *Client) offerLocked(w *watch, name string, idx uint64, st api.LockStatus, resync bool) {
	if w.ended {
		return
	}
	if last, ok := w.last[name]; ok && idx <= last {
		return
	}
	if w.overflow || len(w.queue) >= w.buf {
		if !w.overflow {
			c.log.Info("lockd: watch consumer fell behind; dropping changes until it catches up, then reading again", "watch", w.what(), "buffer", w.buf)
		}
		w.overflow = true
		return
	}
	w.last[name] = idx
	w.state[name] = hasState(&st)
	if w.away && resync {
		w.caught++
	}
	c.queueLocked(w, WatchEvent{Lock: name, Index: idx, Status: st, Resync: resync})
}

func (c *Client) queueLocked(w *watch, ev WatchEvent) {
	w.queue = append(w.queue, ev)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// connLostLocked tells w, whose connection cs was lost (err), once per
// outage.
func (c *Client) connLostLocked(w *watch, err error) {
	if w.ended || !w.started || w.away {
		return
	}
	w.away, w.caught = true, 0
	if w.conns {
		// Beyond the buffer if need be: it is one small event per outage.
		c.queueLocked(w, WatchEvent{Conn: &ConnEvent{Err: err}})
	}
}

// caughtUpLocked tells w it is established again, once its first picture
// on the new connection (and its re-read) has been delivered.
func (c *Client) caughtUpLocked(w *watch) {
	if w.ended || !w.away {
		return
	}
	w.away = false
	if w.conns {
		leader := ""
		if w.conn != nil {
			leader = w.conn.base
		}
		c.queueLocked(w, WatchEvent{Conn: &ConnEvent{Connected: true, CaughtUp: w.caught, Leader: leader}})
	}
}

// hasState reports a status with holders, waiters or a running delay: a
// lock that a prefix watch's first picture shows.
func hasState(st *api.LockStatus) bool {
	return st.Held || len(st.Holders) > 0 || st.Waiters > 0 || st.DelayedUntil != ""
}

// deliver hands w's events to its consumer until ctx ends or the client
// closes; it asks for a re-read once the consumer has caught up after an
// overflow.
func (c *Client) deliver(w *watch) {
	defer close(w.out)
loop:
	for {
		c.mu.Lock()
		if len(w.queue) > 0 {
			ev := w.queue[0]
			c.mu.Unlock()
			select {
			case w.out <- ev:
				c.mu.Lock()
				if len(w.queue) > 0 {
					w.queue[0] = WatchEvent{}
					w.queue = w.queue[1:]
				}
				c.mu.Unlock()
				continue
			case <-w.ctx.Done():
				break loop
			case <-c.ctx.Done():
				break loop
			}
		}
		var cs *wsConn
		var frames [][]byte
		if w.overflow {
			w.overflow = false
			cs, frames = c.resyncLocked(w)
		}
		c.mu.Unlock()
		for _, f := range frames {
			if c.write(cs, f) != nil {
				break
			}
		}
		select {
		case <-w.wake:
		case <-w.ctx.Done():
			break loop
		case <-c.ctx.Done():
			break loop
		}
	}
	c.mu.Lock()
	cs, frame := c.endWatchLocked(w)
	c.mu.Unlock()
	if frame != nil {
		_ = c.write(cs, frame)
	}
}
