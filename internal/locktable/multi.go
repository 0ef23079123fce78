package locktable

// acquireMany is a multi-acquire: every lock of c.Locks is granted in one
// step, or none is. A waiting multi-acquire sits in every queue at once and
// is granted in the step where it heads them all and every lock is free
// (advance), so two multi-acquires never wait on each other in a cycle:
// whichever was committed first is ahead of the other in every queue they
// share.
func (t *Table) acquireMany(c Command, r *Result) {
	if c.Lock != "" || c.ClientID == "" || c.TTLms < 0 || c.WaitMs < 0 || (c.TTLms == 0 && c.SessionID == "") ||
		!validKinds(c) || c.Limit > 1 || !validLockSet(c.Locks) {
		r.Code = CodeInvalid
		return
	}
	var sess *Session
	if c.SessionID != "" {
		s, ok := t.sessions[c.SessionID]
		if !ok {
			r.Code = CodeSessionExpired
			return
		}
		sess = s
	}
	locks := make([]*Lock, len(c.Locks)) // nil for a lock not in the table
	for i, n := range c.Locks {
		locks[i], _ = t.locks.get(n)
		if l := locks[i]; l != nil && l.limit() > 1 {
			r.Code, r.Lock = CodeLimitMismatch, n
			return
		}
	}
	// A retry of a multi-acquire already granted: the same grants,
	// expiries refreshed. Holding only some of the locks is not a retry.
	held := 0
	for i, l := range locks {
		if j := l.holderOfIfAny(c.ClientID); j >= 0 {
			if !sameOwner(l.Holders[j].Owner, c.Owner) {
				r.Code, r.Lock, r.Holder = CodeLockHeld, c.Locks[i], c.ClientID
				return
			}
			held++
		}
	}
	if held == len(locks) && !oneMultiGrant(locks, c.ClientID, c.Mode) {
		// The client holds every lock, but through grants of its own, not
		// one multi-acquire's: returning them would pass off grants of
		// different steps (or modes) as one all-or-nothing grant.
		r.Code, r.Lock, r.Holder = CodeLockHeld, c.Locks[0], c.ClientID
		return
	}
	if held == len(locks) {
		for _, l := range locks {
			h := l.Holders[l.holderOf(c.ClientID)]
			t.regrant(l, h, c.TTLms, c.Now, c.Locks, &r.Events)
			r.Grants = append(r.Grants, Grant{Lock: l.Name, Token: h.Token, ExpiresAt: h.ExpiresAt, Mode: h.Mode})
		}
		r.Granted, r.Mode = true, r.Grants[0].Mode
		return
	}
	if held > 0 {
		for i, l := range locks {
			if l.holderOfIfAny(c.ClientID) >= 0 {
				r.Code, r.Lock, r.Holder = CodeLockHeld, c.Locks[i], c.ClientID
				return
			}
		}
	}
	// A retry of a multi-acquire still waiting keeps its places.
	waiting := 0
	for i, l := range locks {
		j := l.waiterOfIfAny(c.ClientID)
		if j < 0 {
			continue
		}
		w := l.Waiters[j]
		if !sameOwner(w.Owner, c.Owner) || !sameNames(w.Locks, c.Locks) {
			r.Code, r.Lock, r.Holder = CodeLockHeld, c.Locks[i], holderOf(l)
			return
		}
		waiting++
	}
	if waiting > 0 {
		for _, l := range locks {
			j := l.waiterOf(c.ClientID)
			t.rewait(l, j, c)
			r.Events = append(r.Events, queuedEvent(l.Name, l.Waiters[j]))
		}
		r.Queued = true
		return
	}
	// Free for a newcomer: every lock without waiters or delay, with room.
	blocked := -1
	for i, l := range locks {
		if l != nil && !l.freeFor(c.Mode) {
			blocked = i
			break
		}
	}
	if blocked < 0 {
		if q := t.manyQuota(c, locks, sess, false); q != 0 {
			c.Quotas.exhausted(r, q)
			return
		}
		w := request(c)
		for i, n := range c.Locks {
			if locks[i] == nil {
				locks[i] = t.lockFor(n, 1)
			}
			h := t.grant(locks[i], &w, c.Now, &r.Events)
			r.Grants = append(r.Grants, Grant{Lock: n, Token: h.Token, ExpiresAt: h.ExpiresAt, Mode: h.Mode})
		}
		r.Granted, r.Mode = true, c.Mode
		return
	}
	if c.WaitMs == 0 {
		r.Code, r.Lock, r.Holder = CodeLockHeld, c.Locks[blocked], holderOf(locks[blocked])
		return
	}
	if q := t.manyQuota(c, locks, sess, true); q != 0 {
		c.Quotas.exhausted(r, q)
		return
	}
	w := request(c)
	w.Locks = append([]string(nil), c.Locks...) // one copy shared by every queue
	for i, n := range c.Locks {
		if locks[i] == nil {
			locks[i] = t.lockFor(n, 1)
		}
		t.enqueue(locks[i], w, sess)
		r.Events = append(r.Events, queuedEvent(n, w))
	}
	r.Queued = true
	// A lock created just now is free: the request may head every queue it
	// joined and be grantable only through the new locks; advance decides.
	t.advance(c.Now, &r.Events, c.Locks...)
	if l, _ := t.locks.get(c.Locks[0]); l != nil && l.holderOf(c.ClientID) >= 0 {
		r.Queued = false
		r.Granted, r.Mode = true, c.Mode
		for _, n := range c.Locks {
			l, _ := t.locks.get(n)
			h := l.Holders[l.holderOf(c.ClientID)]
			r.Grants = append(r.Grants, Grant{Lock: n, Token: h.Token, ExpiresAt: h.ExpiresAt, Mode: h.Mode})
		}
	}
}

// oneMultiGrant reports whether client's grants of locks (in name order)
// came from one multi-acquire of mode m: made in one step, so their tokens
// are consecutive in name order and their grant times equal.
func oneMultiGrant(locks []*Lock, client string, m Mode) bool {
	var prev *Holder
	for _, l := range locks {
		h := l.Holders[l.holderOf(client)]
		if h.Mode != m || (prev != nil && (h.Token != prev.Token+1 || h.GrantedAt != prev.GrantedAt)) {
			return false
		}
		prev = h
	}
	return true
}

// validLockSet: MinMultiLocks..MaxMultiLocks valid names in strictly rising
// order (the API sorts and refuses duplicates).
func validLockSet(names []string) bool {
	if len(names) < MinMultiLocks || len(names) > MaxMultiLocks {
		return false
	}
	for i, n := range names {
		if LockNameProblem(n) != "" || (i > 0 && names[i-1] >= n) {
			return false
		}
	}
	return true
}

func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// manyQuota is the first quota a multi-acquire would break by holding
// (queue false) or waiting on (queue true) every lock; 0 when there is room.
func (t *Table) manyQuota(c Command, locks []*Lock, sess *Session, queue bool) Quota {
	q := c.Quotas
	n, fresh := len(locks), 0
	for _, l := range locks {
		if l == nil {
			fresh++
		} else if queue && q.reached(QuotaWaitersPerLock, len(l.Waiters)) {
			return QuotaWaitersPerLock
		}
	}
	if lim := q.Limit(QuotaLocks); lim > 0 && int64(t.locks.Len()+fresh) > lim {
		return QuotaLocks
	}
	if lim := q.Limit(QuotaLocksPerSession); sess != nil && lim > 0 && int64(sess.used+n) > lim {
		return QuotaLocksPerSession
	}
	if lim := q.Limit(QuotaGrants); lim > 0 && int64(t.count.holders+t.count.waiters+n) > lim {
		return QuotaGrants
	}
	if t.valueOver(q, int64(n*len(c.Value))) {
		return QuotaValueBytes
	}
	if u, ok := t.usage[c.Owner]; ok {
		if lim := q.Limit(QuotaLocksPerOwner); lim > 0 && int64(u.locks+n) > lim {
			return QuotaLocksPerOwner
		}
	} else if lim := q.Limit(QuotaLocksPerOwner); lim > 0 && int64(n) > lim {
		return QuotaLocksPerOwner
	}
	return 0
}
