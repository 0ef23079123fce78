package locktable

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// deadlines keeps every replicated deadline of the table in time order:
// grant expiries, waiter deadlines and lock-delay ends, plus the sessions in
// TTL order. Apply maintains it on every member, in the same step that
// changes the deadline, so a new leader reads the next due timer instead of
// walking the table to build timers before it serves (a million held locks
// took seconds to walk), and a due deadline can never be lost: it stays in
// the index until the command that ends it commits.
//
// It is derived state: never encoded, rebuilt by Restore, and read only by
// the leader's timers; no Apply decision depends on it. Each item carries
// its key, so comparing two reads no holder, lock or session.
type deadlines struct {
	grants   sorted[grantItem]   // holders with a TTL, by (ExpiresAt, Token)
	waits    sorted[waitItem]    // waiters (one item per queue copy), by (Deadline, lock, client)
	delays   sorted[delayItem]   // locks with a lock-delay, by (DelayedUntil, Name)
	sessions sorted[sessionItem] // sessions, by (TTLms, ID)
}

// grantItem is a holder with a TTL and its lock (a holder does not know its
// lock's name).
type grantItem struct {
	at  int64 // the holder's ExpiresAt
	tok uint64
	h   *Holder
	l   *Lock
}

// waitItem is one queued copy of a wait. Waiters are values that move in
// their queue's slice, so the item carries the key itself.
type waitItem struct {
	deadline int64
	l        *Lock
	client   string
}

type delayItem struct {
	until int64
	l     *Lock
}

type sessionItem struct {
	ttl int64
	s   *Session
}

// deadlineChunk: items are 24-32 bytes, so a chunk is a few KiB and an
// insert moves at most that.
const deadlineChunk = 128

func newDeadlines() deadlines {
	return deadlines{
		grants: newSorted(deadlineChunk, func(a, b grantItem) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return cmp.Compare(a.tok, b.tok)
		}),
		waits: newSorted(deadlineChunk, func(a, b waitItem) int {
			if c := cmp.Compare(a.deadline, b.deadline); c != 0 {
				return c
			}
			if c := strings.Compare(a.l.Name, b.l.Name); c != 0 {
				return c
			}
			return strings.Compare(a.client, b.client)
		}),
		delays: newSorted(deadlineChunk, func(a, b delayItem) int {
			if c := cmp.Compare(a.until, b.until); c != 0 {
				return c
			}
			return strings.Compare(a.l.Name, b.l.Name)
		}),
		sessions: newSorted(deadlineChunk, func(a, b sessionItem) int {
			if c := cmp.Compare(a.ttl, b.ttl); c != 0 {
				return c
			}
			return strings.Compare(a.s.ID, b.s.ID)
		}),
	}
}

// The index follows the few primitives that change a deadline: a holder's
// expiry is indexed while it is in its lock (grant, unhold) and re-keyed
// around every change of ExpiresAt (setExpiry); a waiter from enqueue to
// unwait, re-keyed by rewait; a lock-delay by setDelay.

func (d *deadlines) addGrant(l *Lock, h *Holder) {
	if h.ExpiresAt != 0 {
		d.grants.insert(grantItem{h.ExpiresAt, h.Token, h, l})
	}
}

func (d *deadlines) removeGrant(h *Holder) {
	if h.ExpiresAt != 0 {
		d.grants.remove(grantItem{at: h.ExpiresAt, tok: h.Token})
	}
}

// setExpiry changes a holder's expiry and its place in the index.
func (d *deadlines) setExpiry(l *Lock, h *Holder, at int64) {
	if at == h.ExpiresAt {
		return
	}
	d.removeGrant(h)
	h.ExpiresAt = at
	d.addGrant(l, h)
}

func (d *deadlines) addWait(l *Lock, w *Waiter) {
	d.waits.insert(waitItem{w.Deadline, l, w.ClientID})
}

func (d *deadlines) removeWait(l *Lock, w *Waiter) {
	d.waits.remove(waitItem{w.Deadline, l, w.ClientID})
}

// setWaitDeadline changes a waiter's deadline and its place in the index.
func (d *deadlines) setWaitDeadline(l *Lock, w *Waiter, at int64) {
	if at == w.Deadline {
		return
	}
	d.removeWait(l, w)
	w.Deadline = at
	d.addWait(l, w)
}

// setDelay changes a lock's lock-delay end (0: none) and its place in the
// index.
func (d *deadlines) setDelay(l *Lock, until int64) {
	if until == l.DelayedUntil {
		return
	}
	if l.DelayedUntil != 0 {
		d.delays.remove(delayItem{l.DelayedUntil, l})
	}
	l.DelayedUntil = until
	if until != 0 {
		d.delays.insert(delayItem{until, l})
	}
}

func (d *deadlines) addSession(s *Session)    { d.sessions.insert(sessionItem{s.TTLms, s}) }
func (d *deadlines) removeSession(s *Session) { d.sessions.remove(sessionItem{s.TTLms, s}) }

// rebuild indexes every deadline of t (after Restore): each index is
// sorted in one go and cut into full chunks.
func (d *deadlines) rebuild(t *Table) {
	*d = newDeadlines()
	st := t.Stats()
	grants := make([]grantItem, 0, st.Holders)
	waits := make([]waitItem, 0, st.Waiters)
	var delays []delayItem
	for l := range t.locks.all {
		for _, h := range l.Holders {
			if h.ExpiresAt != 0 {
				grants = append(grants, grantItem{h.ExpiresAt, h.Token, h, l})
			}
		}
		for i := range l.Waiters {
			waits = append(waits, waitItem{l.Waiters[i].Deadline, l, l.Waiters[i].ClientID})
		}
		if l.DelayedUntil != 0 {
			delays = append(delays, delayItem{l.DelayedUntil, l})
		}
	}
	sessions := make([]sessionItem, 0, len(t.sessions))
	for _, s := range t.sessions {
		sessions = append(sessions, sessionItem{s.TTLms, s})
	}
	slices.SortFunc(grants, d.grants.cmp)
	slices.SortFunc(waits, d.waits.cmp)
	slices.SortFunc(delays, d.delays.cmp)
	slices.SortFunc(sessions, d.sessions.cmp)
	d.grants.load(grants)
	d.waits.load(waits)
	d.delays.load(delays)
	d.sessions.load(sessions)
}

// DueGrant is a holder whose expiry the leader's timers watch.
type DueGrant struct {
	Lock      string
	Token     uint64
	ExpiresAt int64
}

// DueWait is one queued copy of a wait whose deadline the timers watch.
type DueWait struct {
	Lock     string
	ClientID string
	Deadline int64
}

// DueDelay is a lock-delay whose end the timers watch.
type DueDelay struct {
	Lock  string
	Until int64
}

// SessionKey is a session's place in TTL order: (TTLms, ID). The zero key
// sorts before every session.
type SessionKey struct {
	TTLms int64
	ID    string
}

// Compare orders keys as the index does.
func (k SessionKey) Compare(o SessionKey) int {
	if c := cmp.Compare(k.TTLms, o.TTLms); c != 0 {
		return c
	}
	return strings.Compare(k.ID, o.ID)
}

// GrantsByExpiry calls fn for the holders with a TTL in expiry order (ties
// by token), until fn returns false.
func (t *Table) GrantsByExpiry(fn func(DueGrant) bool) {
	t.dl.grants.ascend(0, 0, func(it grantItem) bool {
		return fn(DueGrant{Lock: it.l.Name, Token: it.tok, ExpiresAt: it.at})
	})
}

// WaitsByDeadline calls fn for every queued copy of every wait in deadline
// order, until fn returns false.
func (t *Table) WaitsByDeadline(fn func(DueWait) bool) {
	t.dl.waits.ascend(0, 0, func(it waitItem) bool {
		return fn(DueWait{Lock: it.l.Name, ClientID: it.client, Deadline: it.deadline})
	})
}

// DelaysByEnd calls fn for every running lock-delay in order of its end,
// until fn returns false.
func (t *Table) DelaysByEnd(fn func(DueDelay) bool) {
	t.dl.delays.ascend(0, 0, func(it delayItem) bool {
		return fn(DueDelay{Lock: it.l.Name, Until: it.until})
	})
}

// SessionsByTTL calls fn for every session after the key `after` in TTL
// order (ties by id), until fn returns false.
func (t *Table) SessionsByTTL(after SessionKey, fn func(Session) bool) {
	ci, i := t.dl.sessions.seek(sessionItem{after.TTLms, &Session{ID: after.ID}}, true)
	t.dl.sessions.ascend(ci, i, func(it sessionItem) bool { return fn(it.s.copy()) })
}

// checkDeadlines reports how the index differs from the state, for the
// invariant checks of tests (and Restore, which rebuilds it).
func (t *Table) checkDeadlines() error {
	grants, waits, delays := 0, 0, 0
	for l := range t.locks.all {
		for _, h := range l.Holders {
			if h.ExpiresAt == 0 {
				continue
			}
			grants++
			if got, ok := t.dl.grants.get(grantItem{at: h.ExpiresAt, tok: h.Token}); !ok || got.h != h || got.l != l {
				return fmt.Errorf("lock %s: grant %d (expires %d) missing from the deadline index", l.Name, h.Token, h.ExpiresAt)
			}
		}
		for i := range l.Waiters {
			w := &l.Waiters[i]
			waits++
			if _, ok := t.dl.waits.get(waitItem{w.Deadline, l, w.ClientID}); !ok {
				return fmt.Errorf("lock %s: wait of %q (deadline %d) missing from the deadline index", l.Name, w.ClientID, w.Deadline)
			}
		}
		if l.DelayedUntil != 0 {
			delays++
			if got, ok := t.dl.delays.get(delayItem{l.DelayedUntil, l}); !ok || got.l != l {
				return fmt.Errorf("lock %s: delay until %d missing from the deadline index", l.Name, l.DelayedUntil)
			}
		}
	}
	if grants != t.dl.grants.Len() || waits != t.dl.waits.Len() || delays != t.dl.delays.Len() {
		return fmt.Errorf("deadline index holds %d grants, %d waits, %d delays; the table %d, %d, %d",
			t.dl.grants.Len(), t.dl.waits.Len(), t.dl.delays.Len(), grants, waits, delays)
	}
	for _, s := range t.sessions {
		if got, ok := t.dl.sessions.get(sessionItem{s.TTLms, s}); !ok || got.s != s {
			return fmt.Errorf("session %s missing from the deadline index", s.ID)
		}
	}
	if t.dl.sessions.Len() != len(t.sessions) {
		return fmt.Errorf("deadline index holds %d sessions, the table %d", t.dl.sessions.Len(), len(t.sessions))
	}
	// Every grant item points at a holder that is in its lock.
	var bad error
	t.dl.grants.ascend(0, 0, func(it grantItem) bool {
		if l, ok := t.locks.get(it.l.Name); !ok || l != it.l || l.holderOf(it.h.ClientID) < 0 || l.Holders[l.holderOf(it.h.ClientID)] != it.h {
			bad = fmt.Errorf("deadline index holds grant %d of %s, which the lock does not", it.h.Token, it.l.Name)
			return false
		}
		return true
	})
	return bad
}
