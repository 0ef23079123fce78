// Package leader runs the leader-only timers: lock TTLs, waiter deadlines and
// session TTLs. A timer never changes state itself; it proposes a command
// (expire lock L with token T, time out waiter W, expire session S) that the
// state machine re-checks against the time carried in the command, so a late,
// duplicate or deposed-leader proposal is harmless.
//
// Timers are rebuilt from the replicated state when leadership is gained and
// dropped when it is lost. Between those, they follow the committed log:
// Observe is fed every entry's events in log order by the apply loop (never
// by the request that proposed the entry, which may have given up), so a
// timer is armed for every grant that commits, whoever asked for it. Lock
// timers are keyed by the grant's fencing token: nothing about an old grant
// can touch the next one. Keepalives are not replicated: the leader tracks
// them here, in memory, and every session gets a fresh full TTL from the
// moment a new leader takes office.
package leader

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/lockd/lockd/internal/locktable"
)

// Proposer replicates a command. Its events reach the timers through
// Observe, from the apply loop, not from here.
type Proposer interface {
	Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error)
}

// Viewer reads the local replicated state and the log index it reflects
// (0 when unknown).
type Viewer interface {
	ViewAt(fn func(t *locktable.Table, index uint64))
}

// ErrNotRunning is returned by Keepalive when this member is not an active
// leader.
var ErrNotRunning = errors.New("leader: timers not running")

// Config configures the timers.
type Config struct {
	Proposer Proposer
	Viewer   Viewer
	// Grace is added to a lock's replicated expiry when a new leader finds it
	// already (nearly) due, so a renew in flight during the election can
	// land. One election timeout: bounded, so leases never grow without
	// bound when elections repeat.
	Grace   time.Duration
	Now     func() time.Time
	Logger  *slog.Logger
	Workers int
	// Retry is the delay before a timer whose proposal failed or was a
	// no-op fires again.
	Retry time.Duration
}

type kind uint8

const (
	kLock kind = iota
	kWaiter
	kSession
	kDelay // a lock-delay's end, by lock name
)

type item struct {
	at     int64 // unix ms
	kind   kind
	lock   string
	client string // waiter
	id     string // session
	token  uint64
}

type itemHeap []item

func (h itemHeap) Len() int           { return len(h) }
func (h itemHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h itemHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *itemHeap) Push(x any)        { *h = append(*h, x.(item)) }
func (h *itemHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

type lockTimer struct {
	lock string
	at   int64
}

type waiterKey struct{ lock, client string }

type sessionTimer struct {
	ttl      int64
	deadline int64
	// expiring: this leader has decided to expire the session (its expiry
	// is proposed or being retried). Keepalives are refused from then on,
	// so no client is told its lease grew while its locks are being freed.
	expiring bool
}

// Timers is the leader-only timer set. The zero value is unusable; use New.
type Timers struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	running  bool
	since    uint64 // Observe skips entries at or below this index: the rebuild saw them
	h        itemHeap
	locks    map[uint64]lockTimer // by fencing token
	waiters  map[waiterKey]int64
	sessions map[string]*sessionTimer
	delays   map[string]int64 // lock-delay ends, by lock name
	wake     chan struct{}
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// Session expiries are logged as one line per burst, not one per session.
	burstMu    sync.Mutex
	burstCount int
	burstTimer *time.Timer
}

// New returns stopped timers.
func New(cfg Config) *Timers {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 100 * time.Millisecond
	}
	return &Timers{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1)}
}

func (t *Timers) now() int64 { return t.cfg.Now().UnixMilli() }

// Start rebuilds every timer from the replicated state and starts firing.
// Call it only after the new leader's Barrier, so the state is complete.
func (t *Timers) Start() {
	t.mu.Lock()
	if t.running {
		t.mu.Unlock()
		return
	}
	t.running = true
	nLocks, nWaiters, nSessions := t.rebuildLocked()
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	jobs := make(chan item, 1024)
	t.wg.Add(1 + t.cfg.Workers)
	go t.loop(ctx, jobs)
	for i := 0; i < t.cfg.Workers; i++ {
		go t.worker(ctx, jobs)
	}
	t.mu.Unlock()
	t.log.Info("leader timers rebuilt", "locks", nLocks, "waiters", nWaiters, "sessions", nSessions)
}

// Rebuild re-reads every timer from the replicated state, which was
// replaced wholesale (a snapshot restore). It does nothing when stopped.
func (t *Timers) Rebuild() {
	t.mu.Lock()
	if !t.running {
		t.mu.Unlock()
		return
	}
	nLocks, nWaiters, nSessions := t.rebuildLocked()
	t.wakeLocked()
	t.mu.Unlock()
	t.log.Info("leader timers rebuilt after a restore", "locks", nLocks, "waiters", nWaiters, "sessions", nSessions)
}

// rebuildLocked builds every timer from the state. t.mu is held throughout,
// so entries applied after the state was read wait in Observe and are
// taken in afterwards; those at or below its index are skipped.
func (t *Timers) rebuildLocked() (nLocks, nWaiters, nSessions int) {
	type delay struct {
		lock  string
		until int64
	}
	var delays []delay
	tookOffice := t.now()
	grace := t.cfg.Grace.Milliseconds()
	// Copy what the timers need while holding the state's read lock, and
	// nothing more: Apply waits on that lock, and with a million locks
	// building maps and a heap under it stalled the log long enough to
	// cost elections.
	type grant struct {
		lock      string
		token     uint64
		expiresAt int64
	}
	var locks []grant
	var waiters []locktable.WaiterInfo
	var sessions []locktable.Session
	t.cfg.Viewer.ViewAt(func(tab *locktable.Table, index uint64) {
		t.since = index
		st := tab.Stats()
		locks = make([]grant, 0, st.Holders)
		waiters = make([]locktable.WaiterInfo, 0, st.Waiters)
		sessions = make([]locktable.Session, 0, st.Sessions)
		tab.ForEachHolder(func(name string, h locktable.Holder) {
			if h.ExpiresAt != 0 {
				locks = append(locks, grant{name, h.Token, h.ExpiresAt})
			}
		})
		tab.ForEachDelayed(func(name string, until int64) { delays = append(delays, delay{name, until}) })
		tab.ForEachWaiter(func(w locktable.WaiterInfo) { waiters = append(waiters, w) })
		tab.ForEachSession(func(s locktable.Session) { sessions = append(sessions, s) })
	})
	// Sized up front: growing maps of a million entries rehashes them
	// again and again while the new leader is not yet serving.
	t.locks = make(map[uint64]lockTimer, len(locks))
	t.waiters = make(map[waiterKey]int64, len(waiters))
	t.sessions = make(map[string]*sessionTimer, len(sessions))
	t.h = make(itemHeap, 0, len(locks)+len(waiters)+len(sessions))
	for _, g := range locks {
		at := g.expiresAt
		if at <= tookOffice+grace {
			at = g.expiresAt + grace // never before the replicated expiry, at most one grace after
		}
		t.locks[g.token] = lockTimer{lock: g.lock, at: at}
		t.h = append(t.h, item{at: at, kind: kLock, lock: g.lock, token: g.token})
	}
	// A lock-delay ends at its replicated time, never before; no grace:
	// nothing a client sends can move it.
	t.delays = make(map[string]int64, len(delays))
	for _, d := range delays {
		t.delays[d.lock] = d.until
		t.h = append(t.h, item{at: d.until, kind: kDelay, lock: d.lock})
	}
	for _, w := range waiters {
		t.waiters[waiterKey{w.Lock, w.ClientID}] = w.Deadline
		t.h = append(t.h, item{at: w.Deadline, kind: kWaiter, lock: w.Lock, client: w.ClientID})
	}
	for _, s := range sessions {
		d := tookOffice + s.TTLms
		t.sessions[s.ID] = &sessionTimer{ttl: s.TTLms, deadline: d}
		t.h = append(t.h, item{at: d, kind: kSession, id: s.ID})
	}
	heap.Init(&t.h)
	return len(locks), len(waiters), len(sessions)
}

// Stop drops every timer (leadership lost). It waits for in-flight
// proposals to return.
func (t *Timers) Stop() {
	t.mu.Lock()
	if !t.running {
		t.mu.Unlock()
		return
	}
	t.running = false
	t.cancel()
	t.h, t.locks, t.waiters, t.sessions, t.delays = nil, nil, nil, nil, nil
	t.mu.Unlock()
	t.wg.Wait()
}

// Keepalive pushes a session's deadline a full TTL out from received (when
// the keepalive arrived). It returns the TTL, or 0 when the session is
// unknown to this leader or its expiry has already been decided.
func (t *Timers) Keepalive(id string, received time.Time) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return 0, ErrNotRunning
	}
	s, ok := t.sessions[id]
	if !ok || s.expiring {
		return 0, nil
	}
	t.setSessionLocked(id, s.ttl, received.UnixMilli()+s.ttl)
	return s.ttl, nil
}

// Observe updates timers from the events of the committed entry at index.
// The apply loop calls it for every entry, in log order.
func (t *Timers) Observe(index uint64, events []locktable.Event) {
	if len(events) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running || (index != 0 && index <= t.since) {
		return
	}
	for _, ev := range events {
		switch ev.Kind {
		case locktable.EvGranted, locktable.EvRenewed:
			delete(t.waiters, waiterKey{ev.Lock, ev.ClientID})
			if ev.ExpiresAt > 0 {
				t.setLockLocked(ev.Lock, ev.Token, ev.ExpiresAt)
			} else {
				delete(t.locks, ev.Token)
			}
		case locktable.EvReleased, locktable.EvLost:
			delete(t.locks, ev.Token)
		case locktable.EvQueued:
			t.setWaiterLocked(ev.Lock, ev.ClientID, ev.Deadline)
		case locktable.EvWaitEnded:
			if d, ok := t.waiters[waiterKey{ev.Lock, ev.ClientID}]; ok && d == ev.Deadline {
				delete(t.waiters, waiterKey{ev.Lock, ev.ClientID})
			}
		case locktable.EvSessionCreated:
			if _, ok := t.sessions[ev.SessionID]; !ok {
				t.setSessionLocked(ev.SessionID, ev.TTLms, t.now()+ev.TTLms)
			}
		case locktable.EvSessionEnded:
			delete(t.sessions, ev.SessionID)
		case locktable.EvDelayed:
			t.delays[ev.Lock] = ev.ExpiresAt
			t.pushLocked(item{at: ev.ExpiresAt, kind: kDelay, lock: ev.Lock})
		case locktable.EvDelayEnded:
			delete(t.delays, ev.Lock)
		}
	}
}

func (t *Timers) setLockLocked(lock string, token uint64, at int64) {
	t.locks[token] = lockTimer{lock: lock, at: at}
	t.pushLocked(item{at: at, kind: kLock, lock: lock, token: token})
}

func (t *Timers) setWaiterLocked(lock, client string, deadline int64) {
	t.waiters[waiterKey{lock, client}] = deadline
	t.pushLocked(item{at: deadline, kind: kWaiter, lock: lock, client: client})
}

func (t *Timers) setSessionLocked(id string, ttl, deadline int64) {
	s, ok := t.sessions[id]
	if !ok {
		s = &sessionTimer{ttl: ttl}
		t.sessions[id] = s
	}
	moved := s.deadline != 0 && deadline > s.deadline
	s.deadline = deadline
	// A keepalive only moves the deadline out; the item already queued for
	// the old deadline re-arms itself when it fires (lazy), so a busy
	// session costs one heap item per TTL, not one per keepalive.
	if !moved {
		t.pushLocked(item{at: deadline, kind: kSession, id: id})
	}
}

func (t *Timers) pushLocked(it item) {
	heap.Push(&t.h, it)
	t.wakeLocked()
}

func (t *Timers) wakeLocked() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// loop sleeps until the earliest timer, then hands due items that are still
// current to the workers. Stale heap items (superseded by a renew, a
// keepalive or a release) are dropped here.
func (t *Timers) loop(ctx context.Context, jobs chan<- item) {
	defer t.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		t.mu.Lock()
		var due []item
		now := t.now()
		next := int64(-1)
		for t.h.Len() > 0 {
			it := t.h[0]
			if it.at > now {
				next = it.at
				break
			}
			heap.Pop(&t.h)
			if t.currentLocked(it, now) {
				due = append(due, it)
			}
		}
		t.mu.Unlock()
		for _, it := range due {
			select {
			case jobs <- it:
			case <-ctx.Done():
				return
			}
		}
		wait := time.Hour
		if next >= 0 {
			wait = time.Duration(next-now) * time.Millisecond
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-t.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

// currentLocked says whether a popped item still stands for a live timer;
// a session whose deadline moved is re-armed at the new deadline.
func (t *Timers) currentLocked(it item, now int64) bool {
	switch it.kind {
	case kLock:
		lt, ok := t.locks[it.token]
		return ok && lt.at == it.at
	case kWaiter:
		d, ok := t.waiters[waiterKey{it.lock, it.client}]
		return ok && d == it.at
	case kDelay:
		at, ok := t.delays[it.lock]
		return ok && at == it.at
	case kSession:
		s, ok := t.sessions[it.id]
		if !ok {
			return false
		}
		if s.deadline > now {
			heap.Push(&t.h, item{at: s.deadline, kind: kSession, id: it.id})
			return false
		}
		return true
	}
	return false
}

func (t *Timers) worker(ctx context.Context, jobs <-chan item) {
	defer t.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-jobs:
			t.fire(ctx, it)
		}
	}
}

// fire proposes the command for a due timer. When the state machine says
// "not yet" (clock skew between leaders, a renew that raced the timer) the
// timer is re-armed from the replicated state.
func (t *Timers) fire(ctx context.Context, it item) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var cmd locktable.Command
	switch it.kind {
	case kLock:
		cmd = locktable.Command{Op: locktable.OpExpireLock, Lock: it.lock, Token: it.token}
	case kWaiter:
		cmd = locktable.Command{Op: locktable.OpTimeoutWaiter, Lock: it.lock, ClientID: it.client}
	case kDelay:
		cmd = locktable.Command{Op: locktable.OpEndDelay, Lock: it.lock}
	case kSession:
		t.mu.Lock()
		s, ok := t.sessions[it.id]
		stillDue := ok && s.deadline <= t.now()
		if stillDue {
			// Decided: from here on keepalives are refused, even if this
			// proposal fails and is retried.
			s.expiring = true
		}
		t.mu.Unlock()
		if !stillDue {
			return // a keepalive arrived while the job was queued
		}
		cmd = locktable.Command{Op: locktable.OpExpireSession, SessionID: it.id}
	}
	res, err := t.cfg.Proposer.Propose(pctx, cmd)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.log.Debug("timer proposal failed; retrying", "op", cmd.Op, "err", err)
		t.rearm(it, t.now()+t.cfg.Retry.Milliseconds())
		return
	}
	if len(res.AllEvents()) > 0 {
		if it.kind == kSession {
			t.noteSessionExpiry(it.id)
		}
		return // it acted; the apply loop updates the timers from its events
	}
	// A no-op: find out from the replicated state whether it is still due.
	switch it.kind {
	case kLock:
		var expires int64
		t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) {
			for _, h := range tab.Get(it.lock).Holders {
				if h.Token == it.token {
					expires = h.ExpiresAt
				}
			}
		})
		if expires > 0 {
			t.rearm(it, max(expires, t.now()+t.cfg.Retry.Milliseconds()))
		} else {
			t.mu.Lock()
			delete(t.locks, it.token)
			t.mu.Unlock()
		}
	case kDelay:
		var until int64
		t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) { until = tab.Get(it.lock).DelayedUntil })
		if until > 0 {
			t.rearm(it, max(until, t.now()+t.cfg.Retry.Milliseconds()))
		} else {
			t.mu.Lock()
			delete(t.delays, it.lock)
			t.mu.Unlock()
		}
	case kSession:
		// The session was already gone: drop its timer, or keepalives for
		// it would go on being answered.
		t.mu.Lock()
		delete(t.sessions, it.id) // a no-op once the timers stopped (nil map)
		t.mu.Unlock()
	case kWaiter:
		var deadline int64
		t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) {
			for _, w := range tab.Waiters(it.lock) {
				if w.ClientID == it.client {
					deadline = w.Deadline
				}
			}
		})
		if deadline > 0 {
			t.rearm(it, max(deadline, t.now()+t.cfg.Retry.Milliseconds()))
		} else {
			t.mu.Lock()
			delete(t.waiters, waiterKey{it.lock, it.client})
			t.mu.Unlock()
		}
	}
}

// noteSessionExpiry logs expiries in bursts: the first at once, then a
// count per 5 s window, so a mass client failure makes a few lines, not
// thousands.
func (t *Timers) noteSessionExpiry(id string) {
	t.burstMu.Lock()
	defer t.burstMu.Unlock()
	if t.burstTimer == nil {
		t.log.Info("session expired", "session", id)
		t.burstTimer = time.AfterFunc(5*time.Second, func() {
			t.burstMu.Lock()
			n := t.burstCount
			t.burstCount, t.burstTimer = 0, nil
			t.burstMu.Unlock()
			if n > 0 {
				t.log.Info("sessions expired", "count", n, "window", "5s")
			}
		})
		return
	}
	t.burstCount++
}

func (t *Timers) rearm(it item, at int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return
	}
	switch it.kind {
	case kLock:
		if _, ok := t.locks[it.token]; ok {
			t.setLockLocked(it.lock, it.token, at)
		}
	case kWaiter:
		if _, ok := t.waiters[waiterKey{it.lock, it.client}]; ok {
			t.setWaiterLocked(it.lock, it.client, at)
		}
	case kDelay:
		if _, ok := t.delays[it.lock]; ok {
			t.delays[it.lock] = at
			t.pushLocked(item{at: at, kind: kDelay, lock: it.lock})
		}
	case kSession:
		if s, ok := t.sessions[it.id]; ok {
			s.deadline = max(s.deadline, at)
			heap.Push(&t.h, item{at: s.deadline, kind: kSession, id: it.id})
		}
	}
}
