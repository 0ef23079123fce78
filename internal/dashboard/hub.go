package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// Snapshot is what the page shows. It is pushed whenever it changes.
type Snapshot struct {
	// Member is the member that served this snapshot.
	Member api.NodeStatus `json:"member"`
	// Stale is true when Member is not the leader: the lock table is its
	// local replica and may lag the leader slightly.
	Stale        bool              `json:"stale"`
	Cluster      api.ClusterStatus `json:"cluster"`
	ClusterError string            `json:"cluster_error,omitempty"`
	Locks        []Lock            `json:"locks"`
	// LocksTotal counts every lock in the table (held, waited on or
	// delayed); Locks holds at most LocksLimit of them, the first by name.
	LocksTotal  int    `json:"locks_total"`
	LocksLimit  int    `json:"locks_limit"`
	Held        int    `json:"held"`
	Waiters     int    `json:"waiters"`
	Sessions    int    `json:"sessions"`
	LastToken   uint64 `json:"last_token"`
	HeartbeatMs int64  `json:"heartbeat_ms"`
}

// Lock is one row of the locks table. Times are unix ms on the leader's
// clock (the page counts down from the snapshot's "now").
type Lock struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// Mode is the holders' mode (all of a lock's holders have the same),
	// "exclusive" or "shared"; "none" when the lock is free (as in the
	// API's lock status).
	Mode string `json:"mode"`
	// Limit is the number of exclusive holders the lock admits: 1 for an
	// ordinary lock, the permits of a semaphore.
	Limit int64 `json:"limit"`
	// Holders are the grants in token order (the first one's value is the
	// lock's value): at most maxHoldersPerLock of them, and fewer once a
	// snapshot lists maxHolders in all, but always the first;
	// HoldersTotal counts them all.
	Holders      []Holder `json:"holders,omitempty"`
	HoldersTotal int      `json:"holders_total"`
	// DelayedUntil is when a running lock-delay ends (0: none): until
	// then the lock is granted to no one new.
	DelayedUntil int64 `json:"delayed_until,omitempty"`
	Waiters      int   `json:"waiters"`
	// Index is the log index of the lock's last change.
	Index uint64 `json:"index"`
}

// Holder is one grant of a lock.
type Holder struct {
	ClientID string `json:"client_id"`
	// Session is set for a grant held through a session: the first
	// characters of its id, enough to tell sessions apart on the page (the
	// whole id would let a viewer act as the session).
	Session string `json:"session,omitempty"`
	Token   uint64 `json:"fencing_token"`
	TTLms   int64  `json:"ttl_ms,omitempty"`
	// ExpiresAt is 0 for a grant with no TTL of its own (it lives as long
	// as its session).
	ExpiresAt      int64  `json:"expires_at,omitempty"`
	Value          string `json:"value,omitempty"`
	ValueTruncated bool   `json:"value_truncated,omitempty"`
}

// Bounds of what one snapshot carries beyond maxLocks: a semaphore may
// have 10 000 holders and a value may be 4 KiB, and every viewer receives
// the whole snapshot at each change.
const (
	maxHoldersPerLock = 16   // holders listed per lock
	maxHolders        = 2000 // holders listed per snapshot (every listed lock keeps its first)
	maxValueBytes     = 200  // bytes of a value shown; the rest is cut at a UTF-8 boundary
)

// frame is one published snapshot, encoded without "now".
type frame struct {
	seq  uint64
	body []byte
}

// view is what the hub last read: the member's facts and the lock table's.
type view struct {
	member     api.NodeStatus
	cluster    api.ClusterStatus
	clusterErr string
	locks      lockPart
}

// lockPart is one read of the lock table.
type lockPart struct {
	locks                          []Lock
	total, held, waiters, sessions int
	lastToken                      uint64
	lastChange                     uint64 // the table's LastChange: every change up to it is reflected
}

// hubStats counts the hub's work, for tests and measurements.
type hubStats struct {
	lockReads    int           // reads of the lock table (the list and its counts)
	lockReadTime time.Duration // time spent in them, encoding included
	clusterReads int           // refreshes of the cluster facts alone
	changes      int           // changes received from the watch
	skipped      int           // of which already reflected by a read
	resyncs      int
	publishes    int
}

// hub runs one watcher while streams are open and publishes a new frame
// when the snapshot changes. Streams wait on a channel that is closed and
// replaced at each publication.
type hub struct {
	src Source
	cfg config
	log *slog.Logger

	mu      sync.Mutex
	streams int
	running bool
	wake    chan struct{} // nudges the watcher when the last stream leaves
	cur     *frame
	changed chan struct{}
	seq     uint64
	stats   hubStats
}

func newHub(src Source, cfg config, log *slog.Logger) *hub {
	return &hub{src: src, cfg: cfg, log: log, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// join registers a stream, starting the watcher if needed; false when the
// stream limit is reached.
func (h *hub) join() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams >= h.cfg.maxStreams {
		return false
	}
	h.streams++
	if !h.running {
		h.running = true
		h.cur = nil // a frame from an earlier run is stale
		go h.run()
	}
	return true
}

// leave unregisters a stream; the watcher stops when none is left.
func (h *hub) leave() {
	h.mu.Lock()
	h.streams--
	last := h.streams == 0
	h.mu.Unlock()
	if last {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// current returns the latest frame (nil before the first read) and the
// channel closed when the next one is published.
func (h *hub) current() (*frame, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.changed
}

// counters returns a copy of the hub's counters.
func (h *hub) counters() hubStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// publish makes body the current frame unless it is the current one.
func (h *hub) publish(body []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil && bytes.Equal(body, h.cur.body) {
		return
	}
	h.seq++
	h.cur = &frame{seq: h.seq, body: body}
	h.stats.publishes++
	close(h.changed)
	h.changed = make(chan struct{})
}

// stopIfIdle reports whether no stream is left, marking the watcher
// stopped if so (under the lock, so that a join either sees it running or
// starts a new one).
func (h *hub) stopIfIdle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams > 0 {
		return false
	}
	h.running = false
	return true
}

// readBudget spaces the reads of the lock table. Two reads are at least
// gap apart (coalesce, or 20× the last read's cost when that is more, so
// that the dashboard never holds the state lock more than ~5% of the
// time), and on average no more than one per every (readEvery, the
// interval of the poll this replaced, or 20× the cost): a read is earned
// every `every`, up to burst saved for a burst after a quiet spell, and the
// budget starts with one, spent on the first read. So from the moment a
// viewer arrives the hub has never read the table more often than the
// poll did, however busy the table.
type readBudget struct {
	coalesce, readEvery time.Duration
	burst               int
	gap, every          time.Duration
	last                time.Time // the last read
	tat                 time.Time // when every saved read will have been earned back
}

func newReadBudget(cfg config, start time.Time) *readBudget {
	b := &readBudget{coalesce: cfg.coalesce, readEvery: cfg.readEvery, burst: max(1, cfg.readBurst),
		gap: cfg.coalesce, every: cfg.readEvery}
	b.tat = start.Add(time.Duration(b.burst-1) * b.every)
	return b
}

// next is the earliest time of the next read.
func (b *readBudget) next() time.Time {
	at := b.last.Add(b.gap)
	if t := b.tat.Add(-time.Duration(b.burst-1) * b.every); t.After(at) {
		at = t
	}
	return at
}

// spend records a read made at at that took cost.
func (b *readBudget) spend(at time.Time, cost time.Duration) {
	b.gap, b.every = max(b.coalesce, 20*cost), max(b.readEvery, 20*cost)
	b.last = at
	if b.tat.Before(at) {
		b.tat = at
	}
	b.tat = b.tat.Add(b.every)
}

// run is the watcher: it holds one watch on every lock while streams are
// open, re-reads the lock table when the watch reports changes (at the pace
// readBudget allows, so that a burst costs one read per coalesce interval)
// or asks for a resync, refreshes the cluster facts every clusterEvery,
// and publishes each new snapshot. It returns when no stream is left.
func (h *hub) run() {
	w := h.src.WatchPrefix("", h.cfg.watchBuf)
	defer w.Close()

	var v view
	budget := newReadBudget(h.cfg, time.Now())
	dirty, full := true, true // the first read is a full one
	armed := true
	timer := time.NewTimer(0)
	defer timer.Stop()
	tick := time.NewTicker(h.cfg.clusterEvery)
	defer tick.Stop()

	// note takes one change: it needs a read unless the last read
	// reflected it already (a change's index is its entry's; the read saw
	// every change up to the table's LastChange).
	var changes, skipped int
	note := func(c *notify.Change) {
		changes++
		if c.Index != 0 && c.Index <= v.locks.lastChange {
			skipped++
		} else {
			dirty = true
		}
	}
	// drain takes the changes queued on the watch, without waiting.
	drain := func() {
	loop:
		for range h.cfg.watchBuf {
			select {
			case c := <-w.C():
				note(c)
			default:
				break loop
			}
		}
		h.mu.Lock()
		h.stats.changes += changes
		h.stats.skipped += skipped
		h.mu.Unlock()
		changes, skipped = 0, 0
	}

	for {
		// While a read is pending, changes wait on the watch's buffer:
		// the read will reflect them, and taking them one by one would
		// wake this goroutine at every change. They are taken after the
		// read (should the buffer fill meanwhile, the watch asks for a
		// resync, which costs one read within the budget).
		var changed <-chan *notify.Change
		if !dirty {
			changed = w.C()
		}
		select {
		case c := <-changed:
			note(c)
			drain()
		case <-w.Resync():
			h.mu.Lock()
			h.stats.resyncs++
			h.mu.Unlock()
			dirty, full = true, true
		case <-timer.C:
			armed = false
		case <-tick.C:
			if dirty {
				full = true // the pending read refreshes them too
				break
			}
			h.readCluster(context.Background(), &v)
			h.src.View(func(t *locktable.Table) {
				_, v.locks.sessions = t.Size()
				v.locks.lastToken = t.LastToken()
			})
			h.mu.Lock()
			h.stats.clusterReads++
			h.mu.Unlock()
			h.publish(h.encode(v))
		case <-h.wake:
			if h.stopIfIdle() {
				return
			}
		}
		for dirty && !armed {
			now := time.Now()
			if at := budget.next(); at.After(now) {
				timer.Reset(at.Sub(now))
				armed = true
				break
			}
			if full {
				h.readCluster(context.Background(), &v)
			} else {
				v.member = h.src.Status() // cheap: the indexes move with the changes
			}
			start := time.Now()
			v.locks = h.readLocks()
			body := h.encode(v)
			cost := time.Since(start)
			budget.spend(start, cost)
			dirty, full = false, false
			h.mu.Lock()
			h.stats.lockReads++
			h.stats.lockReadTime += cost
			h.mu.Unlock()
			h.publish(body)
			drain() // what arrived meanwhile, mostly reflected by this read
		}
	}
}

// readCluster reads the member's status and the cluster's configuration
// into v.
func (h *hub) readCluster(ctx context.Context, v *view) {
	v.member = h.src.Status()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cs, err := h.src.Cluster(ctx)
	v.clusterErr = ""
	if err != nil {
		v.clusterErr = err.Error()
		cs = api.ClusterStatus{LeaderID: v.member.LeaderID, Term: v.member.Term}
	}
	if cs.Members == nil {
		cs.Members = []api.Member{}
	}
	v.cluster = cs
}

// readLocks reads the first maxLocks locks by name and the table's counts.
// Under the state's read lock it only copies them; the rows are made after.
func (h *hub) readLocks() lockPart {
	var infos []locktable.LockInfo
	var st locktable.Stats
	var lastChange uint64
	h.src.View(func(t *locktable.Table) {
		infos = t.List("", h.cfg.maxLocks)
		st = t.Stats()
		lastChange = t.LastChange()
	})
	p := lockPart{locks: make([]Lock, 0, len(infos)), total: st.Locks, held: st.Held, waiters: st.Waiters,
		sessions: st.Sessions, lastToken: st.LastToken, lastChange: lastChange}
	// The rows' holders share one allocation.
	counts := make([]int, len(infos))
	budget, n := maxHolders, 0
	for i, li := range infos {
		counts[i] = listed(li, &budget)
		n += counts[i]
	}
	backing := make([]Holder, n)
	for i, li := range infos {
		p.locks = append(p.locks, lockOf(li, backing[:counts[i]:counts[i]]))
		backing = backing[counts[i]:]
	}
	return p
}

// listed is how many of a lock's holders its row lists: up to
// maxHoldersPerLock while the snapshot's budget of holders lasts, and the
// first one always.
func listed(li locktable.LockInfo, budget *int) int {
	if len(li.Holders) == 0 {
		return 0
	}
	n := min(len(li.Holders), maxHoldersPerLock, max(1, *budget))
	*budget -= n
	return n
}

// lockOf is the row of one lock, its first len(holders) holders written
// to holders.
func lockOf(li locktable.LockInfo, holders []Holder) Lock {
	l := Lock{Name: li.Name, Held: li.Held, Mode: api.ModeNone, Limit: max(1, li.Limit),
		HoldersTotal: li.HoldersTotal, DelayedUntil: li.DelayedUntil, Waiters: li.Waiters, Index: li.Index}
	if li.Held {
		l.Mode = li.Mode.String()
	}
	for i, x := range li.Holders[:len(holders)] {
		hd := Holder{ClientID: x.ClientID, Session: shortID(x.SessionID), Token: x.Token, TTLms: x.TTLms, ExpiresAt: x.ExpiresAt}
		hd.Value, hd.ValueTruncated = cut(x.Value)
		holders[i] = hd
	}
	if len(holders) > 0 {
		l.Holders = holders
	}
	return l
}

// cut shortens a value to maxValueBytes at a UTF-8 boundary.
func cut(s string) (string, bool) {
	if len(s) <= maxValueBytes {
		return s, false
	}
	n := maxValueBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// build reads the member's state into an encoded Snapshot (for
// /ui/snapshot, which reads afresh at each request).
func (h *hub) build(ctx context.Context) []byte {
	var v view
	h.readCluster(ctx, &v)
	v.locks = h.readLocks()
	return h.encode(v)
}

// encode encodes v as a Snapshot.
func (h *hub) encode(v view) []byte {
	s := Snapshot{Member: v.member, Stale: !strings.EqualFold(v.member.State, "leader"), Cluster: v.cluster,
		ClusterError: v.clusterErr, Locks: v.locks.locks, LocksTotal: v.locks.total, LocksLimit: h.cfg.maxLocks,
		Held: v.locks.held, Waiters: v.locks.waiters, Sessions: v.locks.sessions, LastToken: v.locks.lastToken,
		HeartbeatMs: h.cfg.heartbeat.Milliseconds()}
	if s.Locks == nil {
		s.Locks = []Lock{}
	}
	if s.Cluster.Members == nil {
		s.Cluster.Members = []api.Member{}
	}
	body, err := json.Marshal(s)
	if err != nil { // cannot happen with these types
		h.log.Error("dashboard snapshot encoding failed", "err", err)
		return []byte(`{"cluster_error":` + strconv.Quote(err.Error()) + `}`)
	}
	return body
}

// shortID shortens a session id for display.
func shortID(id string) string {
	const n = 8
	if len(id) <= n {
		return id
	}
	return id[:n] + "…"
}
