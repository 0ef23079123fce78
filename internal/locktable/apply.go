package locktable

import "sort"

// Code is the outcome of one command. The HTTP layer maps it to a status.
type Code uint8

// Outcome codes.
const (
	OK                    Code = iota
	CodeLockHeld               // try-acquire on a held lock
	CodeNotHolder              // release/renew by a client that does not hold that token
	CodeSessionExpired         // the named session does not exist
	CodeInvalid                // a command that passed the API checks but is still malformed
	CodeResourceExhausted      // a quota is used up (Result.Quota names it); nothing changed
)

func (c Code) String() string {
	switch c {
	case OK:
		return "ok"
	case CodeLockHeld:
		return "lock_held"
	case CodeNotHolder:
		return "not_holder"
	case CodeSessionExpired:
		return "session_expired"
	case CodeResourceExhausted:
		return "resource_exhausted"
	default:
		return "invalid"
	}
}

// EventKind names something the leader must tell a client or a timer about.
type EventKind uint8

// Event kinds.
const (
	EvGranted        EventKind = iota + 1 // a lock was granted (or re-granted) to ClientID
	EvQueued                              // an acquire was queued until Deadline
	EvRenewed                             // a holder's expiry moved to ExpiresAt
	EvReleased                            // a holder released its lock
	EvLost                                // a holder lost its lock (Reason: expired, session_expired)
	EvWaitEnded                           // a waiter left the queue ungranted (Reason: wait_timeout, session_expired; Deadline names which wait)
	EvSessionCreated                      // a session began (TTLms)
	EvSessionEnded                        // a session ended (Reason: deleted, session_expired)
)

// Reasons carried by events.
const (
	ReasonExpired        = "expired"
	ReasonSessionExpired = "session_expired"
	ReasonWaitTimeout    = "wait_timeout"
	ReasonDeleted        = "deleted"
	ReasonRegrant        = "regrant" // EvGranted for an idempotent re-acquire by the holder
)

// Event is a deterministic by-product of Apply. The leader hands events to
// waiting clients and to its timers after the command commits; followers
// and log replay ignore them.
type Event struct {
	Kind      EventKind
	Lock      string
	ClientID  string
	SessionID string
	Token     uint64
	TTLms     int64
	ExpiresAt int64
	Deadline  int64
	Reason    string
}

// Result is what Apply returns for one command.
type Result struct {
	Code      Code
	Granted   bool   // acquire: the caller holds the lock now
	Queued    bool   // acquire: the caller waits in the queue
	Position  int    // acquire: queue position when queued (0 = next)
	Token     uint64 // acquire/renew/release: the grant's token
	ExpiresAt int64  // acquire/renew: the grant's expiry (0 = none)
	Holder    string // lock_held: who holds it
	// Quota and QuotaLimit name the quota a resource_exhausted refusal hit
	// and its value in the command.
	Quota      Quota
	QuotaLimit int64
	Events     []Event
	Batch      []Result // OpBatch: one result per command
}

// Apply applies one committed command and returns its outcome. It is
// deterministic: the same table and command always give the same result and
// the same next table.
func (t *Table) Apply(c Command) Result {
	var r Result
	switch c.Op {
	case OpAcquire:
		t.acquire(c, &r)
	case OpRelease:
		t.release(c, &r)
	case OpRenew:
		t.renew(c, &r)
	case OpExpireLock:
		t.expireLock(c, &r)
	case OpTimeoutWaiter:
		t.timeoutWaiter(c, &r)
	case OpCreateSession:
		t.createSession(c, &r)
	case OpDeleteSession:
		t.endSession(c, &r, ReasonDeleted)
	case OpExpireSession:
		t.endSession(c, &r, ReasonSessionExpired)
		if r.Code == CodeSessionExpired { // already gone: a duplicate or late timer
			r.Code = OK
		}
	case OpSetMember:
		if c.MemberID == "" {
			r.Code = CodeInvalid
			break
		}
		t.members[c.MemberID] = Member{ID: c.MemberID, RaftAddr: c.RaftAddr, HTTPAddr: c.HTTPAddr}
	case OpRemoveMember:
		delete(t.members, c.MemberID)
	case OpBatch:
		r.Batch = make([]Result, len(c.Batch))
		for i, sub := range c.Batch {
			if sub.Op == OpBatch {
				r.Batch[i] = Result{Code: CodeInvalid}
				continue
			}
			r.Batch[i] = t.Apply(sub)
		}
	case OpCheckpoint:
		// The leader writes one now and then so every member can check its
		// stored log against a checksum (raftnode); the state is untouched.
	default:
		r.Code = CodeInvalid
	}
	return r
}

func (t *Table) lockFor(name string) *Lock {
	l, ok := t.locks[name]
	if !ok {
		l = &Lock{Name: name}
		t.locks[name] = l
		t.names.insert(name)
	}
	return l
}

// dropIfEmpty keeps the table from growing with free, unwaited locks.
func (t *Table) dropIfEmpty(l *Lock) {
	if l.Holder == nil && len(l.Waiters) == 0 {
		delete(t.locks, l.Name)
		t.names.remove(l.Name)
	}
}

func expiry(now, ttl int64) int64 {
	if ttl <= 0 {
		return 0
	}
	return now + ttl
}

func (t *Table) acquire(c Command, r *Result) {
	if c.Lock == "" || c.ClientID == "" || c.TTLms < 0 || c.WaitMs < 0 || (c.TTLms == 0 && c.SessionID == "") {
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
	l, exists := t.locks[c.Lock]
	if !exists {
		// A new lock: nothing to retry, and only room in the table decides.
		if q := t.lockQuota(c, nil, sess, false); q != 0 {
			c.Quotas.exhausted(r, q)
			return
		}
		l = t.lockFor(c.Lock)
	}
	if h := l.Holder; h != nil && h.ClientID == c.ClientID && !sameOwner(h.Owner, c.Owner) {
		// The holder's client id used by another identity: not a retry.
		r.Code, r.Holder = CodeLockHeld, h.ClientID
		return
	}
	if h := l.Holder; h != nil && h.ClientID == c.ClientID {
		// Idempotent re-acquire by the holder: same grant, expiry refreshed.
		if c.TTLms > 0 {
			h.TTLms = c.TTLms
		}
		h.ExpiresAt = expiry(c.Now, h.TTLms)
		r.Granted, r.Token, r.ExpiresAt = true, h.Token, h.ExpiresAt
		r.Events = append(r.Events, Event{Kind: EvGranted, Lock: l.Name, ClientID: h.ClientID,
			SessionID: h.SessionID, Token: h.Token, TTLms: h.TTLms, ExpiresAt: h.ExpiresAt, Reason: ReasonRegrant})
		return
	}
	for i := range l.Waiters {
		w := &l.Waiters[i]
		if w.ClientID != c.ClientID {
			continue
		}
		if !sameOwner(w.Owner, c.Owner) {
			r.Code, r.Holder = CodeLockHeld, holderOf(l)
			return
		}
		// Idempotent retry by a waiter: it keeps its place.
		if c.WaitMs > 0 {
			w.Deadline = c.Now + c.WaitMs
			if c.TTLms > 0 { // as for the holder: a retry without a TTL keeps the queued one
				w.TTLms = c.TTLms
			}
		}
		r.Queued, r.Position = true, i
		r.Events = append(r.Events, Event{Kind: EvQueued, Lock: l.Name, ClientID: w.ClientID,
			SessionID: w.SessionID, Deadline: w.Deadline})
		return
	}
	if l.Holder == nil {
		// A free lock has no live waiters (hand-off happens in the step that
		// frees it), so the caller is first.
		if exists {
			if q := t.lockQuota(c, l, sess, false); q != 0 {
				c.Quotas.exhausted(r, q)
				return
			}
		}
		t.grant(l, c.ClientID, c.SessionID, c.Owner, c.TTLms, c.Now, &r.Events)
		h := l.Holder
		r.Granted, r.Token, r.ExpiresAt = true, h.Token, h.ExpiresAt
		return
	}
	if c.WaitMs == 0 {
		r.Code, r.Holder = CodeLockHeld, l.Holder.ClientID
		return
	}
	if q := t.lockQuota(c, l, sess, true); q != 0 {
		c.Quotas.exhausted(r, q)
		return
	}
	w := Waiter{ClientID: c.ClientID, SessionID: c.SessionID, TTLms: c.TTLms,
		Deadline: c.Now + c.WaitMs, EnqueuedAt: c.Now}
	w.Owner = t.chargeLock(w.SessionID, c.Owner, 1)
	l.Waiters = append(l.Waiters, w)
	if sess != nil {
		sess.index(&sess.waits)[l.Name] = struct{}{}
	}
	r.Queued, r.Position = true, len(l.Waiters)-1
	r.Events = append(r.Events, Event{Kind: EvQueued, Lock: l.Name, ClientID: w.ClientID,
		SessionID: w.SessionID, Deadline: w.Deadline})
}

func (s *Session) index(m *map[string]struct{}) map[string]struct{} {
	if *m == nil {
		*m = map[string]struct{}{}
	}
	return *m
}

// grant makes the client the holder with a fresh token.
func (t *Table) grant(l *Lock, client, session, owner string, ttl, now int64, ev *[]Event) {
	t.lastToken++
	l.Holder = &Holder{ClientID: client, SessionID: session, Owner: t.chargeLock(session, owner, 1),
		Token: t.lastToken, TTLms: ttl, ExpiresAt: expiry(now, ttl), GrantedAt: now}
	if s, ok := t.sessions[session]; ok {
		s.index(&s.holds)[l.Name] = struct{}{}
	}
	*ev = append(*ev, Event{Kind: EvGranted, Lock: l.Name, ClientID: client, SessionID: session,
		Token: l.Holder.Token, TTLms: ttl, ExpiresAt: l.Holder.ExpiresAt})
}

// unhold clears the holder and its session index.
func (t *Table) unhold(l *Lock) *Holder {
	h := l.Holder
	l.Holder = nil
	if s, ok := t.sessions[h.SessionID]; ok && s.holds != nil {
		delete(s.holds, l.Name)
	}
	t.chargeLock(h.SessionID, h.Owner, -1)
	return h
}

// handOff grants a free lock to its first live waiter in the same step,
// dropping waiters whose deadline passed or whose session is gone.
func (t *Table) handOff(l *Lock, now int64, ev *[]Event) {
	for l.Holder == nil && len(l.Waiters) > 0 {
		w := l.Waiters[0]
		l.Waiters = l.Waiters[1:]
		t.unwait(l.Name, w)
		if w.Deadline <= now {
			*ev = append(*ev, Event{Kind: EvWaitEnded, Lock: l.Name, ClientID: w.ClientID,
				SessionID: w.SessionID, Deadline: w.Deadline, Reason: ReasonWaitTimeout})
			continue
		}
		if w.SessionID != "" {
			if _, ok := t.sessions[w.SessionID]; !ok {
				*ev = append(*ev, Event{Kind: EvWaitEnded, Lock: l.Name, ClientID: w.ClientID,
					SessionID: w.SessionID, Deadline: w.Deadline, Reason: ReasonSessionExpired})
				continue
			}
		}
		t.grant(l, w.ClientID, w.SessionID, w.Owner, w.TTLms, now, ev)
	}
	if len(l.Waiters) == 0 {
		l.Waiters = nil // let the backing array go
	}
	t.dropIfEmpty(l)
}

// unwait removes a waiter, already taken out of the lock's queue, from its
// session's index, unless another client still waits there through the same
// session (a session is not tied to one client). The index must match what
// Restore rebuilds, or a restored member would diverge.
func (t *Table) unwait(lock string, w Waiter) {
	t.chargeLock(w.SessionID, w.Owner, -1)
	s, ok := t.sessions[w.SessionID]
	if !ok || s.waits == nil {
		return
	}
	if l, ok := t.locks[lock]; ok {
		for _, o := range l.Waiters {
			if o.SessionID == w.SessionID {
				return
			}
		}
	}
	delete(s.waits, lock)
}

func (t *Table) release(c Command, r *Result) {
	l, ok := t.locks[c.Lock]
	if !ok || l.Holder == nil || l.Holder.ClientID != c.ClientID || l.Holder.Token != c.Token || !sameOwner(l.Holder.Owner, c.Owner) {
		if who, ok := t.memoIdx[memoKey{c.Lock, c.Token}]; ok && who == c.ClientID {
			r.Token = c.Token // a retry of a release that already happened
			return
		}
		r.Code = CodeNotHolder
		return
	}
	h := t.unhold(l)
	t.remember(c.Lock, h.Token, h.ClientID)
	r.Token = h.Token
	r.Events = append(r.Events, Event{Kind: EvReleased, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token})
	t.handOff(l, c.Now, &r.Events)
}

func (t *Table) remember(lock string, token uint64, client string) {
	m := releaseMemo{Lock: lock, Token: token, ClientID: client}
	if len(t.memo) < releaseMemoSize {
		t.memo = append(t.memo, m)
	} else {
		old := t.memo[t.memoHead]
		delete(t.memoIdx, memoKey{old.Lock, old.Token})
		t.memo[t.memoHead] = m
		t.memoHead = (t.memoHead + 1) % releaseMemoSize
	}
	t.memoIdx[memoKey{lock, token}] = client
}

func (t *Table) renew(c Command, r *Result) {
	if c.TTLms < 0 {
		r.Code = CodeInvalid
		return
	}
	l, ok := t.locks[c.Lock]
	if !ok || l.Holder == nil || l.Holder.ClientID != c.ClientID || l.Holder.Token != c.Token || !sameOwner(l.Holder.Owner, c.Owner) {
		r.Code = CodeNotHolder
		return
	}
	h := l.Holder
	if c.TTLms > 0 {
		h.TTLms = c.TTLms
	}
	h.ExpiresAt = expiry(c.Now, h.TTLms)
	r.Token, r.ExpiresAt = h.Token, h.ExpiresAt
	r.Events = append(r.Events, Event{Kind: EvRenewed, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token, TTLms: h.TTLms, ExpiresAt: h.ExpiresAt})
}

// expireLock releases a lock whose TTL ran out. The timer that proposed it
// may be late, duplicated or from a deposed leader: the command only acts if
// the same grant still holds and its replicated expiry has passed.
func (t *Table) expireLock(c Command, r *Result) {
	l, ok := t.locks[c.Lock]
	if !ok || l.Holder == nil || l.Holder.Token != c.Token || l.Holder.ExpiresAt == 0 || l.Holder.ExpiresAt > c.Now {
		return
	}
	h := t.unhold(l)
	r.Token = h.Token
	r.Events = append(r.Events, Event{Kind: EvLost, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token, Reason: ReasonExpired})
	t.handOff(l, c.Now, &r.Events)
}

func (t *Table) timeoutWaiter(c Command, r *Result) {
	l, ok := t.locks[c.Lock]
	if !ok {
		return
	}
	for i, w := range l.Waiters {
		if w.ClientID != c.ClientID {
			continue
		}
		if w.Deadline > c.Now {
			return // the wait was extended by a retry
		}
		l.Waiters = append(l.Waiters[:i:i], l.Waiters[i+1:]...)
		t.unwait(l.Name, w)
		r.Events = append(r.Events, Event{Kind: EvWaitEnded, Lock: l.Name, ClientID: w.ClientID,
			SessionID: w.SessionID, Deadline: w.Deadline, Reason: ReasonWaitTimeout})
		break
	}
	t.handOff(l, c.Now, &r.Events)
}

func (t *Table) createSession(c Command, r *Result) {
	if c.SessionID == "" || c.TTLms <= 0 {
		r.Code = CodeInvalid
		return
	}
	if _, ok := t.sessions[c.SessionID]; ok {
		return // idempotent: a retried create finds its session
	}
	if q := t.sessionQuota(c); q != 0 {
		c.Quotas.exhausted(r, q)
		return
	}
	t.sessions[c.SessionID] = &Session{ID: c.SessionID, ClientID: c.ClientID,
		Owner: t.chargeSession(c.Owner, 1), TTLms: c.TTLms, CreatedAt: c.Now}
	r.Events = append(r.Events, Event{Kind: EvSessionCreated, SessionID: c.SessionID,
		ClientID: c.ClientID, TTLms: c.TTLms})
}

// endSession releases every lock the session holds (handing each to its next
// waiter in this same step) and drops its waits. Locks are visited in name
// order so every member issues the same tokens.
func (t *Table) endSession(c Command, r *Result, reason string) {
	s, ok := t.sessions[c.SessionID]
	if !ok {
		r.Code = CodeSessionExpired
		return
	}
	delete(t.sessions, c.SessionID)
	t.chargeSession(s.Owner, -1)
	var touched []string
	for name := range s.holds {
		touched = append(touched, name)
	}
	for name := range s.waits {
		if _, dup := s.holds[name]; !dup {
			touched = append(touched, name)
		}
	}
	sort.Strings(touched)
	for _, name := range touched {
		l, ok := t.locks[name]
		if !ok {
			continue
		}
		if h := l.Holder; h != nil && h.SessionID == s.ID {
			l.Holder = nil
			t.chargeLock(h.SessionID, h.Owner, -1)
			r.Events = append(r.Events, Event{Kind: EvLost, Lock: name, ClientID: h.ClientID,
				SessionID: s.ID, Token: h.Token, Reason: ReasonSessionExpired})
		}
		kept := l.Waiters[:0]
		for _, w := range l.Waiters {
			if w.SessionID == s.ID {
				t.chargeLock(w.SessionID, w.Owner, -1)
				r.Events = append(r.Events, Event{Kind: EvWaitEnded, Lock: name, ClientID: w.ClientID,
					SessionID: s.ID, Deadline: w.Deadline, Reason: ReasonSessionExpired})
				continue
			}
			kept = append(kept, w)
		}
		l.Waiters = kept
		t.handOff(l, c.Now, &r.Events)
	}
	r.Events = append(r.Events, Event{Kind: EvSessionEnded, SessionID: s.ID, ClientID: s.ClientID, Reason: reason})
}

// sameOwner ties a client id to the identity (auth token name) that used it
// first: another identity naming the same client id is another client, so
// it can neither release, renew nor re-acquire that grant. A grant with no
// recorded owner (made without authentication, or before owners were
// recorded) is anybody's, as it was.
func sameOwner(recorded, caller string) bool { return recorded == "" || recorded == caller }

func holderOf(l *Lock) string {
	if l.Holder == nil {
		return ""
	}
	return l.Holder.ClientID
}
