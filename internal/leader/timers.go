// Package leader runs the leader-only timers: lock TTLs, waiter deadlines,
// lock-delay ends and session TTLs. A timer never changes state itself; it
// proposes a command (expire lock L with token T, time out waiter W, end
// the delay of L, expire session S) that the state machine re-checks
// against the time carried in the command, and refuses when it was decided
// in another term than its log entry's, so a late, duplicate or
// deposed-leader proposal is harmless.
//
// One loop over one ordered structure. Every replicated deadline — grant
// expiries, waiter deadlines, lock-delay ends — is kept in time order by
// the state machine itself, on every member (locktable's deadline index),
// so a new leader reads the next due item instead of walking the table to
// build timers (seconds at a million locks). The loop reads what is due,
// proposes it and waits for the outcome; a due item stays in the index
// until the command that ends it commits, so nothing due can be lost to a
// busy worker, a failed proposal or a keepalive that raced it: the next
// round finds it again.
//
// Sessions are the one deadline that is not replicated: keepalives reach
// only the leader. Every session gets a full TTL from the moment this
// leader took office; the sessions the state holds are read in TTL order
// (also indexed by the state machine) as their office deadlines come, and
// only sessions refreshed since — by a keepalive, or created since — are
// tracked here, in memory. The same loop expires them.
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

// Proposer replicates a command and returns the state machine's result.
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
	Grace  time.Duration
	Now    func() time.Time
	Logger *slog.Logger
	// Retry is how long the loop waits after a round that failed (no
	// quorum, a timeout) or moved nothing before it proposes again.
	Retry time.Duration
	// MaxRound bounds the commands one round proposes; what is left is
	// taken by the next round at once. Default 1024.
	MaxRound int
	// ProposeTimeout bounds one round's wait for its commands. Default 10s.
	ProposeTimeout time.Duration
}

// maxIdle is the longest the loop sleeps without looking: a wake-up that
// was somehow missed costs at most this much delay, never a lost timer.
const maxIdle = time.Second

// Timers is the leader-only timer loop. The zero value is unusable; use New.
type Timers struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	running bool
	term    uint64 // stamped into every command (locktable.Command.Term)
	office  int64  // unix ms this leader took office: sessions' fresh TTLs count from it
	since   uint64 // Observe skips entries at or below this index: the state at office had them
	// kept holds the deadline of every session refreshed since office (a
	// keepalive, or created since); kh orders them, lazily: an item whose
	// session's deadline moved is re-armed when it comes up.
	kept map[string]int64
	kh   sessionHeap
	// cursor is how far, in the state's TTL order, sessions have been
	// claimed: each was either expired or moved into kept.
	cursor locktable.SessionKey
	// expiring: sessions this leader decided to expire, with when to
	// propose again if the expiry has not committed by then. Keepalives
	// for them are refused from the decision on.
	expiring map[string]int64
	next     int64 // when the loop plans to look again (unix ms)
	wake     chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}

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
	if cfg.Retry <= 0 {
		cfg.Retry = 100 * time.Millisecond
	}
	if cfg.MaxRound <= 0 {
		cfg.MaxRound = 1024
	}
	if cfg.ProposeTimeout <= 0 {
		cfg.ProposeTimeout = 10 * time.Second
	}
	return &Timers{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1)}
}

func (t *Timers) now() int64 { return t.cfg.Now().UnixMilli() }

// Start takes office for Raft term term and starts the loop. Call it only
// after the new leader's Barrier, so the state holds every earlier entry.
// It reads nothing but the log index: nothing is walked before serving.
func (t *Timers) Start(term uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running {
		return
	}
	t.running, t.term = true, term
	t.takeOfficeLocked()
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done = cancel, make(chan struct{})
	go t.loop(ctx, t.done)
	t.log.Info("leader timers started", "term", term, "applied_index", t.since)
}

// takeOfficeLocked starts the sessions' office afresh: every session the
// state holds gets a full TTL from now.
func (t *Timers) takeOfficeLocked() {
	t.office = t.now()
	t.cfg.Viewer.ViewAt(func(_ *locktable.Table, index uint64) { t.since = index })
	t.kept, t.kh = map[string]int64{}, nil
	t.cursor = locktable.SessionKey{}
	t.expiring = map[string]int64{}
	t.next = t.office
	t.wakeLocked()
}

// Rebuild starts over after the replicated state was replaced wholesale (a
// snapshot restore): sessions get a full TTL from now. It does nothing
// when stopped.
func (t *Timers) Rebuild() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return
	}
	t.takeOfficeLocked()
	t.log.Info("leader timers restarted after a restore")
}

// Stop ends the loop (leadership lost) and waits for its proposals to
// return.
func (t *Timers) Stop() {
	t.mu.Lock()
	if !t.running {
		t.mu.Unlock()
		return
	}
	t.running = false
	t.cancel()
	done := t.done
	t.kept, t.kh, t.expiring = nil, nil, nil
	t.mu.Unlock()
	<-done
}

// Keepalive pushes a session's deadline a full TTL out from received (when
// the keepalive arrived). It returns the TTL, or 0 when the session is
// unknown or its expiry has already been decided.
func (t *Timers) Keepalive(id string, received time.Time) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return 0, ErrNotRunning
	}
	if _, ok := t.expiring[id]; ok {
		return 0, nil
	}
	var s locktable.Session
	var ok bool
	t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) { s, ok = tab.Session(id) })
	if !ok {
		return 0, nil
	}
	t.refreshLocked(id, received.UnixMilli()+s.TTLms)
	return s.TTLms, nil
}

// refreshLocked moves a session's deadline out to at (never in).
func (t *Timers) refreshLocked(id string, at int64) {
	if cur, ok := t.kept[id]; ok && cur >= at {
		return
	}
	_, had := t.kept[id]
	t.kept[id] = at
	// A session already in the heap re-arms itself when its old item
	// comes up (lazy), so a busy session costs one heap item per TTL, not
	// one per keepalive.
	if !had {
		heap.Push(&t.kh, sessionItem{at: at, id: id})
		t.wakeIfEarlierLocked(at)
	}
}

// Observe follows the committed log: the apply loop calls it for every
// entry, in log order. The replicated deadlines need nothing from it but a
// wake-up when one comes due before the loop planned to look; sessions
// created since office are tracked from their creation.
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
			if ev.ExpiresAt > 0 {
				t.wakeIfEarlierLocked(ev.ExpiresAt)
			}
		case locktable.EvQueued:
			t.wakeIfEarlierLocked(ev.Deadline)
		case locktable.EvDelayed:
			t.wakeIfEarlierLocked(ev.ExpiresAt)
		case locktable.EvSessionCreated:
			if _, dying := t.expiring[ev.SessionID]; !dying {
				t.refreshLocked(ev.SessionID, ev.ExpiresAt)
			}
		case locktable.EvSessionEnded:
			delete(t.kept, ev.SessionID)
			delete(t.expiring, ev.SessionID)
		}
	}
}

func (t *Timers) wakeIfEarlierLocked(at int64) {
	if at < t.next {
		t.next = at
		t.wakeLocked()
	}
}

func (t *Timers) wakeLocked() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// loop runs rounds: read what is due, propose it, wait for the outcome;
// then sleep until the next deadline, a wake-up or maxIdle.
func (t *Timers) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-t.wake:
		}
		now := t.now()
		cmds, sessions, next := t.due(now)
		if len(cmds) > 0 {
			progress, failed := t.propose(ctx, cmds, sessions)
			if ctx.Err() != nil {
				return
			}
			retry := now + t.cfg.Retry.Milliseconds()
			switch {
			case !progress:
				// Nothing moved (no quorum, a timeout, a term that
				// ended): what is due is still due; look again after a
				// pause rather than at once.
				next = retry
			case failed:
				next = min(next, retry) // what failed is still due
			case len(cmds) >= t.cfg.MaxRound:
				next = now // more is due: go again at once
			}
		}
		t.mu.Lock()
		t.next = next
		t.mu.Unlock()
		wait := time.Duration(next-t.now()) * time.Millisecond
		timer.Reset(min(max(wait, 0), maxIdle))
	}
}

// due reads what is due at now, up to MaxRound commands, and when to look
// again. Sessions it decides to expire are marked expiring before it
// returns, so keepalives for them are refused from here on.
func (t *Timers) due(now int64) (cmds []locktable.Command, sessions []string, next int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	next = now + maxIdle.Milliseconds()
	if !t.running {
		return nil, nil, next
	}
	room := func() bool { return len(cmds) < t.cfg.MaxRound }
	term, graceEnd, grace := t.term, t.office+t.cfg.Grace.Milliseconds(), t.cfg.Grace.Milliseconds()
	t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) {
		// Grants: never before the replicated expiry; one already (nearly)
		// due when this leader took office gets one grace period, so a
		// renew in flight during the election can land.
		tab.GrantsByExpiry(func(g locktable.DueGrant) bool {
			if g.ExpiresAt > now || !room() {
				next = min(next, fireAt(g.ExpiresAt, graceEnd, grace))
				return false
			}
			if at := fireAt(g.ExpiresAt, graceEnd, grace); at > now {
				next = min(next, at)
				return true
			}
			cmds = append(cmds, locktable.Command{Op: locktable.OpExpireLock, Lock: g.Lock, Token: g.Token, Term: term})
			return true
		})
		// Waits: a multi-acquire has one copy per lock, all with one
		// deadline; timing out one drops them all.
		type waitKey struct {
			client   string
			deadline int64
		}
		seen := map[waitKey]bool{}
		tab.WaitsByDeadline(func(w locktable.DueWait) bool {
			if w.Deadline > now || !room() {
				next = min(next, w.Deadline)
				return false
			}
			if k := (waitKey{w.ClientID, w.Deadline}); !seen[k] {
				seen[k] = true
				cmds = append(cmds, locktable.Command{Op: locktable.OpTimeoutWaiter, Lock: w.Lock, ClientID: w.ClientID, Term: term})
			}
			return true
		})
		tab.DelaysByEnd(func(d locktable.DueDelay) bool {
			if d.Until > now || !room() {
				next = min(next, d.Until)
				return false
			}
			cmds = append(cmds, locktable.Command{Op: locktable.OpEndDelay, Lock: d.Lock, Term: term})
			return true
		})
		sessions, next = t.dueSessionsLocked(tab, now, next, room)
	})
	for _, id := range sessions {
		cmds = append(cmds, locktable.Command{Op: locktable.OpExpireSession, SessionID: id, Term: term})
	}
	return cmds, sessions, next
}

// fireAt is when a grant expiring at expiresAt may be expired by a leader
// whose grace window ends at graceEnd.
func fireAt(expiresAt, graceEnd, grace int64) int64 {
	if expiresAt <= graceEnd {
		return expiresAt + grace
	}
	return expiresAt
}

// dueSessionsLocked decides which sessions expire now: those whose expiry
// was decided and has not committed by its retry time, those refreshed
// since office whose deadline passed, and those the state held at office
// whose full TTL since office ran out without a refresh.
func (t *Timers) dueSessionsLocked(tab *locktable.Table, now, next int64, room func() bool) ([]string, int64) {
	var out []string
	// A decided expiry is proposed again by any round after retry whose
	// session is still there: rounds run one at a time, so by then the
	// last proposal has failed or the session is gone.
	retry := t.cfg.Retry.Milliseconds()
	expire := func(id string) {
		t.expiring[id] = now + retry
		delete(t.kept, id)
		out = append(out, id)
	}
	for id, at := range t.expiring {
		if _, ok := tab.Session(id); !ok {
			delete(t.expiring, id) // gone: nothing to answer keepalives for
			continue
		}
		if at <= now && room() {
			t.expiring[id] = now + retry
			out = append(out, id)
		} else {
			next = min(next, at)
		}
	}
	for t.kh.Len() > 0 {
		it := t.kh[0]
		if it.at > now || !room() {
			next = min(next, it.at)
			break
		}
		heap.Pop(&t.kh)
		at, ok := t.kept[it.id]
		switch {
		case !ok:
			// Ended or already expiring: nothing to do.
		case at > it.at:
			heap.Push(&t.kh, sessionItem{at: at, id: it.id}) // refreshed since: re-arm
		default:
			if _, ok := tab.Session(it.id); ok {
				expire(it.id)
			} else {
				delete(t.kept, it.id)
			}
		}
	}
	tab.SessionsByTTL(t.cursor, func(s locktable.Session) bool {
		if t.office+s.TTLms > now || !room() {
			next = min(next, t.office+s.TTLms)
			return false
		}
		t.cursor = locktable.SessionKey{TTLms: s.TTLms, ID: s.ID}
		if _, ok := t.kept[s.ID]; ok {
			return true // refreshed since office: kept has it
		}
		if _, ok := t.expiring[s.ID]; ok {
			return true
		}
		// Created after office (its creation not yet observed): its TTL
		// counts from its creation, stamped by this leader's clock.
		if at := max(t.office, s.CreatedAt) + s.TTLms; at > now {
			t.refreshLocked(s.ID, at)
			next = min(next, at)
			return true
		}
		expire(s.ID)
		return true
	})
	return out, next
}

// propose sends one round's commands concurrently (the node packs them
// into a few log entries) and waits for every outcome. It reports whether
// the round moved anything and whether any command failed. Commands that
// failed need no bookkeeping: what they were for is still due in the state
// (or still expiring) and a later round proposes it again.
func (t *Timers) propose(ctx context.Context, cmds []locktable.Command, sessions []string) (progress, failed bool) {
	pctx, cancel := context.WithTimeout(ctx, t.cfg.ProposeTimeout)
	defer cancel()
	type outcome struct {
		res locktable.Result
		err error
	}
	out := make([]outcome, len(cmds))
	var wg sync.WaitGroup
	for i := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].res, out[i].err = t.cfg.Proposer.Propose(pctx, cmds[i])
		}()
	}
	wg.Wait()
	var firstErr error
	stale := 0
	for i, o := range out {
		switch {
		case o.err != nil:
			firstErr = firstOf(firstErr, o.err)
		case o.res.Code == locktable.CodeStale:
			stale++
		case len(o.res.AllEvents()) > 0:
			progress = true
			if cmds[i].Op == locktable.OpExpireSession {
				t.noteSessionExpiry(cmds[i].SessionID)
			}
		}
	}
	if firstErr != nil && ctx.Err() == nil {
		t.log.Debug("timer proposals failed; retrying", "failed", firstErr, "commands", len(cmds))
	}
	if stale > 0 {
		t.log.Warn("timer commands refused: this leader's term ended", "term", t.term, "refused", stale)
	}
	// A session whose expiry committed, or that was already gone, stops
	// being tracked (Observe does the same when its end arrives).
	t.mu.Lock()
	if t.running {
		t.cfg.Viewer.ViewAt(func(tab *locktable.Table, _ uint64) {
			for _, id := range sessions {
				if _, ok := tab.Session(id); !ok {
					delete(t.expiring, id)
				}
			}
		})
	}
	t.mu.Unlock()
	return progress, firstErr != nil
}

func firstOf(first, err error) error {
	if first != nil {
		return first
	}
	return err
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

type sessionItem struct {
	at int64
	id string
}

type sessionHeap []sessionItem

func (h sessionHeap) Len() int           { return len(h) }
func (h sessionHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h sessionHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *sessionHeap) Push(x any)        { *h = append(*h, x.(sessionItem)) }
func (h *sessionHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}
