package locktable

// Quotas bound what the table may hold, so that no client (and, with the
// per-owner quotas, no tenant) can grow the replicated state until members
// run out of memory. Each is checked inside Apply, against the quotas the
// command carries (the leader stamps its configured quotas into every
// acquire and create-session command), so every member decides alike
// whatever its own flags say. A value of 0 (or below) means no limit.
//
// A quota is checked only where something new would be added: a new
// session, a new lock, a new holder or a new waiter. Idempotent retries (the
// holder re-acquiring, a waiter retrying, a create-session retried) and
// hand-offs (a waiter becoming the holder) are never refused. Lowering a
// quota therefore refuses new work but takes nothing away.
type Quotas struct {
	Sessions         int64 // sessions in the cluster
	SessionsPerOwner int64 // sessions created by one owner identity
	Locks            int64 // locks with state (held, awaited) in the table
	WaitersPerLock   int64 // waiters queued on one lock
	LocksPerSession  int64 // locks held plus waits queued through one session
	LocksPerOwner    int64 // locks held plus waits queued by one owner identity
	// Grants bounds the grants held plus waits queued in the cluster (a
	// semaphore's holders each count, a multi-acquire's wait once per
	// lock); ValueBytes the bytes of their values: what the table holds
	// grows with both, not only with the number of locks.
	Grants     int64
	ValueBytes int64
}

// Quota names one of the Quotas in a resource_exhausted result.
type Quota uint8

// The quotas, in Quotas field order.
const (
	QuotaSessions Quota = iota + 1
	QuotaSessionsPerOwner
	QuotaLocks
	QuotaWaitersPerLock
	QuotaLocksPerSession
	QuotaLocksPerOwner
	QuotaGrants
	QuotaValueBytes
)

// String is the quota's name as operators know it: the lockd flag that
// sets it, without the leading dashes.
func (q Quota) String() string {
	switch q {
	case QuotaSessions:
		return "max-sessions"
	case QuotaSessionsPerOwner:
		return "max-sessions-per-token"
	case QuotaLocks:
		return "max-locks"
	case QuotaWaitersPerLock:
		return "max-waiters-per-lock"
	case QuotaLocksPerSession:
		return "max-locks-per-session"
	case QuotaLocksPerOwner:
		return "max-locks-per-token"
	case QuotaGrants:
		return "max-grants"
	case QuotaValueBytes:
		return "max-value-bytes"
	}
	return "none"
}

// Limit is the value of quota q in qs (0 or below: no limit).
func (qs Quotas) Limit(q Quota) int64 {
	switch q {
	case QuotaSessions:
		return qs.Sessions
	case QuotaSessionsPerOwner:
		return qs.SessionsPerOwner
	case QuotaLocks:
		return qs.Locks
	case QuotaWaitersPerLock:
		return qs.WaitersPerLock
	case QuotaLocksPerSession:
		return qs.LocksPerSession
	case QuotaLocksPerOwner:
		return qs.LocksPerOwner
	case QuotaGrants:
		return qs.Grants
	case QuotaValueBytes:
		return qs.ValueBytes
	}
	return 0
}

// reached reports whether count already uses up quota q (no room for one
// more).
func (qs Quotas) reached(q Quota, count int) bool {
	lim := qs.Limit(q)
	return lim > 0 && int64(count) >= lim
}

// exhausted fills r with a resource_exhausted outcome for quota q.
func (qs Quotas) exhausted(r *Result, q Quota) {
	r.Code, r.Quota, r.QuotaLimit = CodeResourceExhausted, q, qs.Limit(q)
}

// Encoding: a presence mask (one bit per field, in field order) and the
// non-zero values as varints, so the encoding stays canonical.
func (qs Quotas) encode(w *writer) {
	vals := qs.values()
	var mask uint64
	for i, v := range vals {
		if v != 0 {
			mask |= 1 << i
		}
	}
	w.uvarint(mask)
	for _, v := range vals {
		if v != 0 {
			w.varint(v)
		}
	}
}

func (qs Quotas) values() [8]int64 {
	return [8]int64{qs.Sessions, qs.SessionsPerOwner, qs.Locks, qs.WaitersPerLock, qs.LocksPerSession, qs.LocksPerOwner,
		qs.Grants, qs.ValueBytes}
}

// sinceV3 reports whether qs carries a quota a version-2 decoder does not
// know (it would take the command for a corrupt one).
func (qs Quotas) sinceV3() bool { return qs.Grants != 0 || qs.ValueBytes != 0 }

func decodeQuotas(r *reader) Quotas {
	mask := r.uvarint()
	if mask >= 1<<8 {
		r.fail("unknown quota")
		return Quotas{}
	}
	var v [8]int64
	for i := range v {
		if mask&(1<<i) != 0 {
			v[i] = r.varint()
		}
	}
	return Quotas{Sessions: v[0], SessionsPerOwner: v[1], Locks: v[2], WaitersPerLock: v[3],
		LocksPerSession: v[4], LocksPerOwner: v[5], Grants: v[6], ValueBytes: v[7]}
}

// usage is what one owner identity has in the table, kept up to date by
// every command that adds or removes a session, a holder or a waiter, so a
// quota check costs O(1) and never walks the table. Derived state: Restore
// rebuilds it, snapshots do not carry it.
type usage struct {
	owner    string // the map key; holders and waiters share this copy
	sessions int
	locks    int // locks held plus waits queued
}

// OwnerUsage returns how many sessions and how many locks held plus waits
// queued the owner identity has.
func (t *Table) OwnerUsage(owner string) (sessions, locks int) {
	if u, ok := t.usage[owner]; ok {
		return u.sessions, u.locks
	}
	return 0, 0
}

// SessionUsage returns how many locks are held plus waits queued through
// the session (0 for a session that does not exist).
func (t *Table) SessionUsage(id string) int {
	if s, ok := t.sessions[id]; ok {
		return s.used
	}
	return 0
}

// ownerUsage returns the owner's usage, creating it at zero.
func (t *Table) ownerUsage(owner string) *usage {
	u, ok := t.usage[owner]
	if !ok {
		u = &usage{owner: owner}
		t.usage[owner] = u
	}
	return u
}

// dropUsage forgets an owner with nothing left, so the map only holds
// owners with state.
func (t *Table) dropUsage(u *usage) {
	if u.sessions == 0 && u.locks == 0 {
		delete(t.usage, u.owner)
	}
}

// chargeLock counts one hold or wait more (n = 1) or less (n = -1) for its
// session (when it still exists) and its owner. It returns the owner
// string the table keeps, so a million holders of one owner share it.
func (t *Table) chargeLock(session, owner string, n int) string {
	if session != "" {
		if s, ok := t.sessions[session]; ok {
			s.used += n
		}
	}
	u := t.ownerUsage(owner)
	u.locks += n
	t.dropUsage(u)
	return u.owner
}

// chargeSession counts one session more or less for its owner and returns
// the owner string the table keeps.
func (t *Table) chargeSession(owner string, n int) string {
	u := t.ownerUsage(owner)
	u.sessions += n
	t.dropUsage(u)
	return u.owner
}

// lockQuota is the first quota a new holder (queue false) or a new waiter
// (queue true) of lock l would break; 0 when there is room. l is nil for a
// lock that does not exist yet; sess is nil without a session.
func (t *Table) lockQuota(c Command, l *Lock, sess *Session, queue bool) Quota {
	q := c.Quotas
	switch {
	case l == nil && q.reached(QuotaLocks, t.locks.Len()):
		return QuotaLocks
	case queue && l != nil && q.reached(QuotaWaitersPerLock, len(l.Waiters)):
		return QuotaWaitersPerLock
	case sess != nil && q.reached(QuotaLocksPerSession, sess.used):
		return QuotaLocksPerSession
	case q.reached(QuotaGrants, t.count.holders+t.count.waiters):
		return QuotaGrants
	case t.valueOver(q, int64(len(c.Value))):
		return QuotaValueBytes
	}
	if u, ok := t.usage[c.Owner]; ok && q.reached(QuotaLocksPerOwner, u.locks) {
		return QuotaLocksPerOwner
	}
	return 0
}

// valueOver reports whether n more bytes of values would go past the
// value quota. Only what adds value bytes is refused: with the quota
// lowered below what is stored, an acquire without a value still goes in.
func (t *Table) valueOver(q Quotas, n int64) bool {
	lim := q.Limit(QuotaValueBytes)
	return n > 0 && lim > 0 && t.count.valueBytes+n > lim
}

// sessionQuota is the first quota a new session would break; 0 when there
// is room.
func (t *Table) sessionQuota(c Command) Quota {
	q := c.Quotas
	if q.reached(QuotaSessions, len(t.sessions)) {
		return QuotaSessions
	}
	if u, ok := t.usage[c.Owner]; ok && q.reached(QuotaSessionsPerOwner, u.sessions) {
		return QuotaSessionsPerOwner
	}
	return 0
}

// QuotaList lists every quota, in Quotas field order: each constant from
// QuotaSessions on that has a name (a new quota needs one for its
// resource_exhausted message, and so appears here by itself).
func QuotaList() []Quota {
	var qs []Quota
	for q := QuotaSessions; q.String() != "none"; q++ {
		qs = append(qs, q)
	}
	return qs
}

// ClusterUse is how much of quota q the whole table uses now, for the
// quotas that bound the cluster as a whole and whose count the table keeps
// as it goes (ok is false for the others): /metrics reads it at every
// scrape, so it never walks the table. A new cluster-wide quota answers
// here with the count its check uses, and is then exported by itself.
func (t *Table) ClusterUse(q Quota) (used int64, ok bool) {
	switch q {
	case QuotaSessions:
		return int64(len(t.sessions)), true
	case QuotaLocks:
		return int64(t.locks.Len()), true
	case QuotaGrants:
		return int64(t.count.holders + t.count.waiters), true
	case QuotaValueBytes:
		return t.count.valueBytes, true
	}
	return 0, false
}
