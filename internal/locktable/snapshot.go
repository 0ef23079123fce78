package locktable

import (
	"bytes"
	"fmt"
	"slices"
)

// snapshotMagic and snapshotVersion open every snapshot. A member refuses a
// snapshot of a newer format instead of misreading it, and reads every
// older one.
//
// Format 2 adds the owner identity after the client and session ids of each
// session, holder and waiter. Format 1 has none: its sessions, holders and
// waiters restore with the owner "" (the identity of a cluster without
// auth).
//
// Format 3 adds the lock kinds: the index of the last change to any lock
// after the token counter;
// per lock its limit, lock-delay end and last-change index, then a count of
// holders (format 2: a 0/1 byte) and, for each holder and waiter, its mode,
// lock-delay and value, and for each waiter its multi-lock names.
const (
	snapshotMagic   = "LOCKDSNP"
	snapshotVersion = 3
)

// Snapshot encodes the whole table. The encoding is canonical (maps are
// written in key order), so equal tables give byte-identical snapshots.
func (t *Table) Snapshot() []byte {
	w := &writer{b: make([]byte, 0, 64+t.locks.Len()*64+len(t.sessions)*48)}
	w.b = append(w.b, snapshotMagic...)
	w.byte(snapshotVersion)
	w.uvarint(t.lastToken)
	w.uvarint(t.changed)

	w.uvarint(uint64(len(t.sessions)))
	for _, id := range sortedKeys(t.sessions) {
		s := t.sessions[id]
		w.string(s.ID)
		w.string(s.ClientID)
		w.string(s.Owner)
		w.varint(s.TTLms)
		w.varint(s.CreatedAt)
	}

	w.uvarint(uint64(t.locks.Len()))
	for l := range t.locks.all { // in name order
		w.string(l.Name)
		w.varint(l.Limit)
		w.varint(l.DelayedUntil)
		w.uvarint(l.Index)
		w.uvarint(uint64(len(l.Holders)))
		for _, h := range l.Holders {
			w.string(h.ClientID)
			w.string(h.SessionID)
			w.string(h.Owner)
			w.uvarint(h.Token)
			w.varint(h.TTLms)
			w.varint(h.ExpiresAt)
			w.varint(h.GrantedAt)
			w.byte(byte(h.Mode))
			w.varint(h.DelayMs)
			w.string(h.Value)
		}
		w.uvarint(uint64(len(l.Waiters)))
		for _, q := range l.Waiters {
			w.string(q.ClientID)
			w.string(q.SessionID)
			w.string(q.Owner)
			w.varint(q.TTLms)
			w.varint(q.Deadline)
			w.varint(q.EnqueuedAt)
			w.byte(byte(q.Mode))
			w.varint(q.DelayMs)
			w.string(q.Value)
			w.uvarint(uint64(len(q.Locks)))
			for _, n := range q.Locks {
				w.string(n)
			}
		}
	}

	w.uvarint(uint64(len(t.members)))
	for _, id := range sortedKeys(t.members) {
		m := t.members[id]
		w.string(m.ID)
		w.string(m.RaftAddr)
		w.string(m.HTTPAddr)
	}

	// The release memo in age order, oldest first.
	w.uvarint(uint64(len(t.memo)))
	for i := range t.memo {
		m := t.memo[(t.memoHead+i)%len(t.memo)]
		w.string(m.Lock)
		w.uvarint(m.Token)
		w.string(m.ClientID)
	}
	return w.b
}

// Restore decodes a snapshot made by Snapshot (this format or an older
// one) into a new table, and rebuilds the quota counts from it.
func Restore(b []byte) (*Table, error) {
	if !bytes.HasPrefix(b, []byte(snapshotMagic)) {
		return nil, fmt.Errorf("%w: not a lockd snapshot", ErrCorrupt)
	}
	r := &reader{b: b[len(snapshotMagic):]}
	v := r.byte()
	if r.err == nil && (v < 1 || v > snapshotVersion) {
		return nil, fmt.Errorf("%w: snapshot format %d (this build reads 1 to %d)", ErrCorrupt, v, snapshotVersion)
	}
	t := New()
	t.lastToken = r.uvarint()
	if v >= 3 {
		t.changed = r.uvarint()
	}
	t.gone.floor = t.changed   // what was dropped before the snapshot changed at or below it
	ids := map[string]string{} // client, session and owner ids, shared (internString)
	// owner reads an owner identity; format 1 has none.
	owner := func() string {
		if v < 2 {
			return ""
		}
		return r.internString(ids)
	}
	extra := 0 // bytes an owner adds at least
	if v >= 2 {
		extra = 1
	}

	n := r.count(4 + extra)
	t.sessions = make(map[string]*Session, n)
	for i := 0; i < n && r.err == nil; i++ {
		s := &Session{ID: r.internString(ids), ClientID: r.internString(ids)}
		s.Owner, s.TTLms, s.CreatedAt = owner(), r.varint(), r.varint()
		if _, dup := t.sessions[s.ID]; dup {
			r.fail("session listed twice")
			break
		}
		t.sessions[s.ID] = s
		s.Owner = t.chargeSession(s.Owner, 1)
	}

	n = r.count(3)
	locks := make([]*Lock, 0, min(n, 1<<20))
	for i := 0; i < n && r.err == nil; i++ {
		// A lock, its holder and the one-element holder list in one
		// allocation: restoring a million held locks is dominated by
		// allocation and GC.
		lh := &struct {
			l  Lock
			h  Holder
			hs [1]*Holder
		}{}
		l := &lh.l
		l.Name = r.string()
		hn := 0
		if v >= 3 {
			l.Limit, l.DelayedUntil, l.Index = r.varint(), r.varint(), r.uvarint()
			hn = r.count(6)
		} else if r.byte() == 1 {
			hn = 1
		}
		if hn == 1 {
			l.Holders = lh.hs[:0]
		} else if hn > 1 {
			l.Holders = make([]*Holder, 0, hn)
		}
		for j := 0; j < hn && r.err == nil; j++ {
			h := &lh.h
			if j > 0 {
				h = &Holder{}
			}
			*h = Holder{ClientID: r.internString(ids), SessionID: r.internString(ids)}
			h.Owner, h.Token = owner(), r.uvarint()
			h.TTLms, h.ExpiresAt, h.GrantedAt = r.varint(), r.varint(), r.varint()
			if v >= 3 {
				h.Mode, h.DelayMs, h.Value = Mode(r.byte()), r.varint(), r.string()
			}
			if h.Token > t.lastToken {
				r.fail("holder token above counter")
			}
			l.Holders = append(l.Holders, h)
			if s, ok := t.sessions[h.SessionID]; ok {
				s.index(&s.holds)[l.Name] = struct{}{}
			}
			h.Owner = t.chargeLock(h.SessionID, h.Owner, 1)
		}
		wn := r.count(5 + extra)
		if wn > 0 {
			l.Waiters = make([]Waiter, 0, wn)
		}
		for j := 0; j < wn && r.err == nil; j++ {
			q := Waiter{ClientID: r.internString(ids), SessionID: r.internString(ids)}
			q.Owner, q.TTLms, q.Deadline, q.EnqueuedAt = owner(), r.varint(), r.varint(), r.varint()
			if v >= 3 {
				q.Mode, q.DelayMs, q.Value = Mode(r.byte()), r.varint(), r.string()
				if n := r.count(1); n > 0 {
					if n > MaxMultiLocks {
						r.fail("multi-lock waiter with too many locks")
						break
					}
					q.Locks = make([]string, 0, n)
					for k := 0; k < n && r.err == nil; k++ {
						q.Locks = append(q.Locks, r.internString(ids))
					}
				}
			}
			if s, ok := t.sessions[q.SessionID]; ok {
				s.index(&s.waits)[l.Name] = struct{}{}
			}
			q.Owner = t.chargeLock(q.SessionID, q.Owner, 1)
			l.Waiters = append(l.Waiters, q)
		}
		locks = append(locks, l)
	}
	// Snapshots list the locks in name order; sort anyway rather than
	// trust it, then load the index in one go.
	if !slices.IsSortedFunc(locks, byName) {
		slices.SortFunc(locks, byName)
	}
	for i := 1; i < len(locks) && r.err == nil; i++ {
		if locks[i].Name == locks[i-1].Name {
			r.fail("lock listed twice")
		}
	}
	t.locks.load(locks)

	n = r.count(3)
	for i := 0; i < n && r.err == nil; i++ {
		m := Member{ID: r.string(), RaftAddr: r.string(), HTTPAddr: r.string()}
		t.members[m.ID] = m
	}

	n = r.count(3)
	if n > releaseMemoSize {
		r.fail("release memo too large")
	}
	for i := 0; i < n && r.err == nil; i++ {
		t.remember(r.string(), r.uvarint(), r.string())
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return nil, r.err
	}
	if err := t.checkInvariants(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	t.recount()
	t.dl.rebuild(t)
	return t, nil
}
