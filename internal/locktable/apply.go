package locktable

import (
	"sort"
	"unicode/utf8"
)

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
	CodeLimitMismatch          // acquire names another semaphore size (or mode) than the lock has
	CodeStale                  // a timer's command decided in another term than the entry's (Command.Term); nothing changed
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
	case CodeLimitMismatch:
		return "limit_mismatch"
	case CodeStale:
		return "stale"
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
	EvSessionCreated                      // a session began (TTLms; ExpiresAt: its first deadline, Now + TTLms)
	EvSessionEnded                        // a session ended (Reason: deleted, session_expired)
	EvValueSet                            // a holder's value changed (Value)
	EvDelayed                             // a lock-delay runs until ExpiresAt: no grants before
	EvDelayEnded                          // a lock-delay ended; waiters may be granted again
)

// Reasons carried by events.
const (
	ReasonExpired        = "expired"
	ReasonSessionExpired = "session_expired"
	ReasonWaitTimeout    = "wait_timeout"
	ReasonDeleted        = "deleted"
	ReasonRegrant        = "regrant" // EvGranted for an idempotent re-acquire by the holder
	ReasonRevoked        = "revoked"
	ReasonCancelled      = "cancelled" // EvWaitEnded: the client withdrew its wait
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
	Mode      Mode
	Value     string
	// Locks are a multi-acquire's locks (EvGranted, EvQueued, EvWaitEnded
	// of one): every lock of the request has its own event in the same
	// step, each carrying the whole list.
	Locks []string
}

// Result is what Apply returns for one command.
type Result struct {
	Code      Code
	Granted   bool     // acquire: the caller holds the lock now
	Queued    bool     // acquire: the caller waits in the queue
	Position  int      // acquire: queue position when queued (0 = next)
	Token     uint64   // acquire/renew/release: the grant's token
	ExpiresAt int64    // acquire/renew: the grant's expiry (0 = none)
	Holder    string   // lock_held: who holds it ("" for a free lock that is not free for a newcomer)
	Lock      string   // multi-acquire lock_held / limit_mismatch: the first blocking name
	Mode      Mode     // acquire: the grant's mode
	Grants    []Grant  // multi-acquire: one grant per lock, in name order
	Tokens    []uint64 // revoke: the grants it ended
	Cancelled bool     // cancel: a queued wait was withdrawn
	Released  bool     // acquire with a hand-off (Command.Token): the client's grant Token was released first
	// Quota and QuotaLimit name the quota a resource_exhausted refusal hit
	// and its value in the command.
	Quota      Quota
	QuotaLimit int64
	Events     []Event
	Batch      []Result // OpBatch: one result per command
}

// Grant is one lock of a multi-acquire's grant.
type Grant struct {
	Lock      string
	Token     uint64
	ExpiresAt int64
	Mode      Mode
}

// ApplyAt applies the command committed at log index; lock statuses record
// it as the index of their last change.
func (t *Table) ApplyAt(index uint64, c Command) Result {
	return t.ApplyEntry(index, 0, c)
}

// ApplyEntry applies the command of the log entry at index, appended in
// Raft term term (0: unknown, as for ApplyAt). A timer's command decided in
// another term than its entry's is refused (Command.Term).
func (t *Table) ApplyEntry(index, term uint64, c Command) Result {
	t.applying, t.applyingTerm = index, term
	return t.Apply(c)
}

// stale reports whether c is a timer's command that a leader decided in
// another term than the one its entry was appended in. Such a leader
// lost office since (or is losing it): its view of keepalives and renewals
// may be older than what another leader acknowledged, so its decision
// stands only if it reaches the log in its own term. Entries of its term
// that the next leader commits are still applied: no other leader served
// between (a new leader serves only after its own first entry commits,
// and an entry of an earlier term that is not in its log never commits).
func (t *Table) stale(c Command) bool {
	return c.Term != 0 && t.applyingTerm != 0 && c.Term != t.applyingTerm
}

// Apply applies one committed command and returns its outcome. It is
// deterministic: the same table and command always give the same result and
// the same next table.
func (t *Table) Apply(c Command) Result {
	var r Result
	switch c.Op {
	case OpExpireLock, OpTimeoutWaiter, OpExpireSession, OpEndDelay:
		if t.stale(c) {
			r.Code = CodeStale
			return r
		}
	}
	switch c.Op {
	case OpAcquire:
		switch {
		case len(c.Locks) > 0:
			t.acquireMany(c, &r)
		case c.Token != 0:
			t.handOff(c, &r)
		default:
			t.acquire(c, &r)
		}
	case OpRevoke:
		t.revoke(c, &r)
	case OpEndDelay:
		t.endDelay(c, &r)
	case OpSetValue:
		t.setValue(c, &r)
	case OpCancel:
		t.cancel(c, &r)
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

// touch records that l changed in the command being applied.
func (t *Table) touch(l *Lock) {
	l.Index = t.applying
	t.changed = max(t.changed, t.applying)
}

func (t *Table) lockFor(name string, limit int64) *Lock {
	l, ok := t.locks.get(name)
	if !ok {
		l = &Lock{Name: name}
		if limit > 1 {
			l.Limit = limit
		}
		t.locks.put(l)
	}
	return l
}

// dropIfEmpty keeps the table from growing with locks that have no state.
func (t *Table) dropIfEmpty(l *Lock) {
	if len(l.Holders) == 0 && len(l.Waiters) == 0 && l.DelayedUntil == 0 {
		t.locks.del(l)
		t.gone.add(l.Name, l.Index)
	}
}

func expiry(now, ttl int64) int64 {
	if ttl <= 0 {
		return 0
	}
	return now + ttl
}

// validKinds checks the lock-kind fields of an acquire.
func validKinds(c Command) bool {
	return c.Mode <= Shared && c.Limit >= 0 && c.Limit <= MaxLimit && !(c.Mode == Shared && c.Limit > 1) &&
		c.DelayMs >= 0 && c.DelayMs <= MaxLockDelayMs && validValue(c.Value)
}

// validValue: what Restore accepts (the API refuses anything else at the
// door; checked here too so no applied command can make a snapshot that
// does not restore).
func validValue(v string) bool { return len(v) <= MaxValueBytes && utf8.ValidString(v) }

// request is the waiter an acquire would become: what a grant is made from.
func request(c Command) Waiter {
	return Waiter{ClientID: c.ClientID, SessionID: c.SessionID, Owner: c.Owner, TTLms: c.TTLms,
		Deadline: c.Now + c.WaitMs, EnqueuedAt: c.Now, Mode: c.Mode, DelayMs: c.DelayMs, Value: c.Value,
		Locks: c.Locks}
}

// kindMismatch reports whether an acquire of mode m asking for limit (0: any)
// cannot join lock l: another semaphore size while it has holders or
// waiters, or a shared acquire on a semaphore.
func kindMismatch(l *Lock, m Mode, limit int64) bool {
	busy := len(l.Holders) > 0 || len(l.Waiters) > 0
	if limit != 0 && limit != l.limit() && busy {
		return true
	}
	eff := l.limit()
	if limit != 0 && !busy {
		eff = limit
	}
	return m == Shared && eff > 1
}

func (t *Table) acquire(c Command, r *Result) {
	if c.Lock == "" || c.ClientID == "" || c.TTLms < 0 || c.WaitMs < 0 || (c.TTLms == 0 && c.SessionID == "") || !validKinds(c) {
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
	l, exists := t.locks.get(c.Lock)
	if exists && kindMismatch(l, c.Mode, c.Limit) {
		r.Code, r.Lock = CodeLimitMismatch, l.Name
		return
	}
	if i := l.holderOfIfAny(c.ClientID); i >= 0 {
		h := l.Holders[i]
		if !sameOwner(h.Owner, c.Owner) {
			// The holder's client id used by another identity: not a retry.
			r.Code, r.Holder = CodeLockHeld, h.ClientID
			return
		}
		// Idempotent re-acquire by the holder: same grant, expiry refreshed.
		t.regrant(l, h, c.TTLms, c.Now, nil, &r.Events)
		r.Granted, r.Token, r.ExpiresAt, r.Mode = true, h.Token, h.ExpiresAt, h.Mode
		return
	}
	if i := l.waiterOfIfAny(c.ClientID); i >= 0 {
		w := &l.Waiters[i]
		if !sameOwner(w.Owner, c.Owner) || w.Locks != nil {
			// Another identity's client, or this client's multi-acquire.
			r.Code, r.Holder = CodeLockHeld, holderOf(l)
			return
		}
		// Idempotent retry by a waiter: it keeps its place.
		t.rewait(l, i, c)
		r.Queued, r.Position = true, i
		r.Events = append(r.Events, queuedEvent(l.Name, *w))
		return
	}
	if !exists {
		// A new lock: only room in the table decides.
		if q := t.lockQuota(c, nil, sess, false); q != 0 {
			c.Quotas.exhausted(r, q)
			return
		}
		l = t.lockFor(c.Lock, c.Limit)
	}
	// A delayed lock without holders or waiters takes the size asked for,
	// once the acquire adds something.
	resize := exists && c.Limit != 0 && len(l.Holders) == 0 && len(l.Waiters) == 0
	w := request(c)
	if l.freeFor(w.Mode) {
		if exists {
			if q := t.lockQuota(c, l, sess, false); q != 0 {
				c.Quotas.exhausted(r, q)
				return
			}
		}
		if resize {
			l.setLimit(c.Limit)
		}
		h := t.grant(l, &w, c.Now, &r.Events)
		r.Granted, r.Token, r.ExpiresAt, r.Mode = true, h.Token, h.ExpiresAt, h.Mode
		return
	}
	if c.WaitMs == 0 {
		r.Code, r.Holder = CodeLockHeld, holderOf(l)
		t.dropIfEmpty(l) // a delayed lock made no new state
		return
	}
	if q := t.lockQuota(c, l, sess, true); q != 0 {
		c.Quotas.exhausted(r, q)
		return
	}
	if resize {
		l.setLimit(c.Limit)
	}
	t.enqueue(l, w, sess)
	r.Queued, r.Position = true, len(l.Waiters)-1
	r.Events = append(r.Events, queuedEvent(l.Name, w))
}

// handOff is an acquire that first releases the same client's grant
// c.Token of the same lock, in one step: one process's goroutines pass a
// lock from one to the next with one commit instead of two in series. The
// release is an ordinary explicit release (no lock-delay, the next waiter
// in the queue is granted first); the acquire then comes after every
// waiter already queued, so FIFO across clients is kept, and a grant is
// always a new one with its own token. A release that finds no such grant
// (the lock was lost meanwhile) leaves Released false and the acquire
// proceeds as any other.
func (t *Table) handOff(c Command, r *Result) {
	rel := Command{Op: OpRelease, Now: c.Now, Lock: c.Lock, ClientID: c.ClientID, Token: c.Token, Owner: c.Owner}
	var rr Result
	t.release(rel, &rr)
	c.Token = 0
	t.acquire(c, r)
	r.Released = rr.Code == OK
	r.Events = append(rr.Events, r.Events...)
}

func (l *Lock) setLimit(n int64) {
	l.Limit = n
	if n <= 1 {
		l.Limit = 0
	}
}

// holderOfIfAny and waiterOfIfAny accept a nil lock (one not in the table).
func (l *Lock) holderOfIfAny(client string) int {
	if l == nil {
		return -1
	}
	return l.holderOf(client)
}

func (l *Lock) waiterOfIfAny(client string) int {
	if l == nil {
		return -1
	}
	return l.waiterOf(client)
}

// freeFor reports whether a newcomer of mode m may be granted l at once:
// FIFO order (nobody waiting), no lock-delay, room beside the holders.
func (l *Lock) freeFor(m Mode) bool {
	return len(l.Waiters) == 0 && l.DelayedUntil == 0 && l.canHold(m)
}

func queuedEvent(lock string, w Waiter) Event {
	return Event{Kind: EvQueued, Lock: lock, ClientID: w.ClientID, SessionID: w.SessionID,
		Deadline: w.Deadline, Mode: w.Mode, Locks: w.Locks}
}

// regrant refreshes a holder's expiry for an idempotent re-acquire.
func (t *Table) regrant(l *Lock, h *Holder, ttl, now int64, locks []string, ev *[]Event) {
	if ttl > 0 {
		h.TTLms = ttl
	}
	t.dl.setExpiry(l, h, expiry(now, h.TTLms))
	t.touch(l)
	*ev = append(*ev, Event{Kind: EvGranted, Lock: l.Name, ClientID: h.ClientID, SessionID: h.SessionID,
		Token: h.Token, TTLms: h.TTLms, ExpiresAt: h.ExpiresAt, Reason: ReasonRegrant, Mode: h.Mode, Value: h.Value, Locks: locks})
}

// rewait refreshes a waiter's deadline (and TTL) for an idempotent retry.
func (t *Table) rewait(l *Lock, i int, c Command) {
	w := &l.Waiters[i]
	if c.WaitMs > 0 {
		t.dl.setWaitDeadline(l, w, c.Now+c.WaitMs)
		if c.TTLms > 0 { // as for the holder: a retry without a TTL keeps the queued one
			w.TTLms = c.TTLms
		}
		t.touch(l)
	}
}

// enqueue appends w to l's queue and indexes it under its session.
func (t *Table) enqueue(l *Lock, w Waiter, sess *Session) {
	w.Owner = t.chargeLock(w.SessionID, w.Owner, 1)
	w.ClientID, w.SessionID = t.ids.intern(w.ClientID), t.ids.intern(w.SessionID)
	l.Waiters = append(l.Waiters, w)
	t.dl.addWait(l, &l.Waiters[len(l.Waiters)-1])
	t.count.waiters++
	t.count.valueBytes += int64(len(w.Value))
	if sess != nil {
		sess.index(&sess.waits)[l.Name] = struct{}{}
	}
	t.touch(l)
}

func (s *Session) index(m *map[string]struct{}) map[string]struct{} {
	if *m == nil {
		*m = map[string]struct{}{}
	}
	return *m
}

// grant makes w a holder of l with a fresh token.
func (t *Table) grant(l *Lock, w *Waiter, now int64, ev *[]Event) *Holder {
	t.lastToken++
	h := &Holder{ClientID: t.ids.intern(w.ClientID), SessionID: t.ids.intern(w.SessionID), Owner: t.chargeLock(w.SessionID, w.Owner, 1),
		Token: t.lastToken, TTLms: w.TTLms, ExpiresAt: expiry(now, w.TTLms), GrantedAt: now,
		Mode: w.Mode, DelayMs: w.DelayMs, Value: w.Value}
	l.Holders = append(l.Holders, h)
	t.dl.addGrant(l, h)
	t.count.holders++
	t.count.valueBytes += int64(len(h.Value))
	if len(l.Holders) == 1 {
		t.count.held++
	}
	if s, ok := t.sessions[w.SessionID]; ok {
		s.index(&s.holds)[l.Name] = struct{}{}
	}
	t.touch(l)
	*ev = append(*ev, Event{Kind: EvGranted, Lock: l.Name, ClientID: h.ClientID, SessionID: h.SessionID,
		Token: h.Token, TTLms: h.TTLms, ExpiresAt: h.ExpiresAt, Mode: h.Mode, Value: h.Value, Locks: w.Locks})
	return h
}

// unhold removes holder i of l and its session index entry (unless another
// grant of l holds through the same session).
func (t *Table) unhold(l *Lock, i int) *Holder {
	h := l.Holders[i]
	t.dl.removeGrant(h)
	t.count.holders--
	t.count.valueBytes -= int64(len(h.Value))
	l.Holders = append(l.Holders[:i:i], l.Holders[i+1:]...)
	if len(l.Holders) == 0 {
		l.Holders = nil
		t.count.held--
	}
	if s, ok := t.sessions[h.SessionID]; ok && s.holds != nil && !l.heldThrough(h.SessionID) {
		delete(s.holds, l.Name)
	}
	t.chargeLock(h.SessionID, h.Owner, -1)
	t.touch(l)
	return h
}

func (l *Lock) heldThrough(session string) bool {
	for _, o := range l.Holders {
		if o.SessionID == session {
			return true
		}
	}
	return false
}

// endGrant ends holder i of l without a release (expiry, session expiry,
// revocation): the holder is told it lost the lock, and the grant's
// lock-delay starts.
func (t *Table) endGrant(l *Lock, i int, reason string, now int64, ev *[]Event) *Holder {
	h := t.unhold(l, i)
	*ev = append(*ev, Event{Kind: EvLost, Lock: l.Name, ClientID: h.ClientID, SessionID: h.SessionID,
		Token: h.Token, Reason: reason, Mode: h.Mode})
	if h.DelayMs > 0 {
		if until := now + h.DelayMs; until > l.DelayedUntil {
			t.dl.setDelay(l, until)
			*ev = append(*ev, Event{Kind: EvDelayed, Lock: l.Name, ExpiresAt: until})
		}
	}
	return h
}

func (t *Table) release(c Command, r *Result) {
	l, ok := t.locks.get(c.Lock)
	i := -1
	if ok {
		i = l.holderOf(c.ClientID)
	}
	if i < 0 || l.Holders[i].Token != c.Token || !sameOwner(l.Holders[i].Owner, c.Owner) {
		if who, ok := t.memoIdx[memoKey{c.Lock, c.Token}]; ok && who == c.ClientID {
			r.Token = c.Token // a retry of a release that already happened
			return
		}
		r.Code = CodeNotHolder
		return
	}
	h := t.unhold(l, i)
	t.remember(c.Lock, h.Token, h.ClientID)
	r.Token = h.Token
	r.Events = append(r.Events, Event{Kind: EvReleased, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token, Mode: h.Mode})
	t.advance(c.Now, &r.Events, l.Name)
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

// heldBy returns the grant of lock named by client and token, checked
// against the caller's identity, or nil.
func (t *Table) heldBy(c Command) (*Lock, *Holder) {
	l, ok := t.locks.get(c.Lock)
	if !ok {
		return nil, nil
	}
	i := l.holderOf(c.ClientID)
	if i < 0 || l.Holders[i].Token != c.Token || !sameOwner(l.Holders[i].Owner, c.Owner) {
		return nil, nil
	}
	return l, l.Holders[i]
}

func (t *Table) renew(c Command, r *Result) {
	if c.TTLms < 0 {
		r.Code = CodeInvalid
		return
	}
	l, h := t.heldBy(c)
	if h == nil {
		r.Code = CodeNotHolder
		return
	}
	if c.TTLms > 0 {
		h.TTLms = c.TTLms
	}
	t.dl.setExpiry(l, h, expiry(c.Now, h.TTLms))
	t.touch(l)
	r.Token, r.ExpiresAt, r.Mode = h.Token, h.ExpiresAt, h.Mode
	r.Events = append(r.Events, Event{Kind: EvRenewed, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token, TTLms: h.TTLms, ExpiresAt: h.ExpiresAt, Mode: h.Mode})
}

func (t *Table) setValue(c Command, r *Result) {
	if !validValue(c.Value) {
		r.Code = CodeInvalid
		return
	}
	l, h := t.heldBy(c)
	if h == nil {
		r.Code = CodeNotHolder
		return
	}
	if grow := int64(len(c.Value) - len(h.Value)); t.valueOver(c.Quotas, grow) {
		c.Quotas.exhausted(r, QuotaValueBytes)
		return
	}
	t.count.valueBytes += int64(len(c.Value) - len(h.Value))
	h.Value = c.Value
	t.touch(l)
	r.Token, r.ExpiresAt, r.Mode = h.Token, h.ExpiresAt, h.Mode
	r.Events = append(r.Events, Event{Kind: EvValueSet, Lock: l.Name, ClientID: h.ClientID,
		SessionID: h.SessionID, Token: h.Token, Value: h.Value, Mode: h.Mode})
}

// expireLock ends a grant whose TTL ran out. The timer that proposed it
// may be late, duplicated or from a deposed leader: the command only acts if
// the same grant still holds and its replicated expiry has passed.
func (t *Table) expireLock(c Command, r *Result) {
	l, ok := t.locks.get(c.Lock)
	if !ok {
		return
	}
	for i, h := range l.Holders {
		if h.Token != c.Token {
			continue
		}
		if h.ExpiresAt == 0 || h.ExpiresAt > c.Now {
			return
		}
		t.endGrant(l, i, ReasonExpired, c.Now, &r.Events)
		r.Token = h.Token
		t.advance(c.Now, &r.Events, l.Name)
		return
	}
}

// revoke ends every grant of a lock, or the one with c.Token.
func (t *Table) revoke(c Command, r *Result) {
	r.Tokens = []uint64{}
	l, ok := t.locks.get(c.Lock)
	if !ok || len(l.Holders) == 0 {
		if c.Token != 0 {
			r.Code = CodeNotHolder
		}
		return
	}
	if c.Token != 0 {
		i := -1
		for j, h := range l.Holders {
			if h.Token == c.Token {
				i = j
			}
		}
		if i < 0 {
			r.Code = CodeNotHolder
			return
		}
		r.Tokens = append(r.Tokens, t.endGrant(l, i, ReasonRevoked, c.Now, &r.Events).Token)
	} else {
		for len(l.Holders) > 0 {
			r.Tokens = append(r.Tokens, t.endGrant(l, 0, ReasonRevoked, c.Now, &r.Events).Token)
		}
	}
	t.advance(c.Now, &r.Events, l.Name)
}

// endDelay ends a lock-delay whose time has come and grants what its queue
// allows. Like every timer command it re-checks: a delay pushed further by
// a later loss is not ended early.
func (t *Table) endDelay(c Command, r *Result) {
	l, ok := t.locks.get(c.Lock)
	if !ok || l.DelayedUntil == 0 || l.DelayedUntil > c.Now {
		return
	}
	t.dl.setDelay(l, 0)
	t.touch(l)
	r.Events = append(r.Events, Event{Kind: EvDelayEnded, Lock: l.Name})
	t.advance(c.Now, &r.Events, l.Name)
}

// cancel withdraws the client's queued wait on c.Lock, or its multi-acquire
// waiting on exactly c.Locks: the waiting request is told (EvWaitEnded,
// reason cancelled) and the queues move on in this step. A grant already
// made is not undone, and nothing else the client has is touched.
func (t *Table) cancel(c Command, r *Result) {
	name := c.Lock
	if len(c.Locks) > 0 {
		if c.Lock != "" || !validLockSet(c.Locks) {
			r.Code = CodeInvalid
			return
		}
		name = c.Locks[0]
	}
	if name == "" || c.ClientID == "" {
		r.Code = CodeInvalid
		return
	}
	l, ok := t.locks.get(name)
	if !ok {
		return
	}
	i := l.waiterOf(c.ClientID)
	if i < 0 || !sameOwner(l.Waiters[i].Owner, c.Owner) || !sameNames(l.Waiters[i].Locks, c.Locks) {
		return // none queued (a multi-acquire is withdrawn by its own names)
	}
	others := t.dropWait(l, i, ReasonCancelled, &r.Events)
	r.Cancelled = true
	t.advance(c.Now, &r.Events, append([]string{l.Name}, others...)...)
}

func (t *Table) timeoutWaiter(c Command, r *Result) {
	l, ok := t.locks.get(c.Lock)
	if !ok {
		return
	}
	i := l.waiterOf(c.ClientID)
	if i < 0 || l.Waiters[i].Deadline > c.Now {
		return // gone already, or the wait was extended by a retry
	}
	others := t.dropWait(l, i, ReasonWaitTimeout, &r.Events)
	t.advance(c.Now, &r.Events, append([]string{l.Name}, others...)...)
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
	s := &Session{ID: c.SessionID, ClientID: c.ClientID,
		Owner: t.chargeSession(c.Owner, 1), TTLms: c.TTLms, CreatedAt: c.Now}
	t.sessions[c.SessionID] = s
	t.dl.addSession(s)
	r.Events = append(r.Events, Event{Kind: EvSessionCreated, SessionID: c.SessionID,
		ClientID: c.ClientID, TTLms: c.TTLms, ExpiresAt: c.Now + c.TTLms})
}

// endSession ends every grant of the session (an expiry applies their
// lock-delays; a delete is an explicit release and applies none), then
// drops its waits and hands each lock on in this same step. Locks are
// visited in name order so every member issues the same tokens.
func (t *Table) endSession(c Command, r *Result, reason string) {
	s, ok := t.sessions[c.SessionID]
	if !ok {
		r.Code = CodeSessionExpired
		return
	}
	delete(t.sessions, c.SessionID)
	t.dl.removeSession(s)
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
	// End every grant of the session first, on every lock, and only then
	// drop its waits and hand the locks on: dropping a multi-acquire's wait
	// from one lock's queue advances its other locks, which must not be
	// handed on (beside a shared holder of the session) before their own
	// grants of the session have ended and started their lock-delays.
	for _, name := range touched {
		l, ok := t.locks.get(name)
		if !ok {
			continue
		}
		for i := 0; i < len(l.Holders); {
			h := l.Holders[i]
			if h.SessionID != s.ID {
				i++
				continue
			}
			if reason == ReasonDeleted {
				t.unhold(l, i)
				r.Events = append(r.Events, Event{Kind: EvLost, Lock: name, ClientID: h.ClientID,
					SessionID: s.ID, Token: h.Token, Reason: ReasonSessionExpired, Mode: h.Mode})
			} else {
				t.endGrant(l, i, ReasonSessionExpired, c.Now, &r.Events)
			}
		}
	}
	for _, name := range touched {
		l, ok := t.locks.get(name)
		if !ok {
			continue
		}
		work := []string{name}
		for i := 0; i < len(l.Waiters); {
			if l.Waiters[i].SessionID != s.ID {
				i++
				continue
			}
			work = append(work, t.dropWait(l, i, ReasonSessionExpired, &r.Events)...)
		}
		t.advance(c.Now, &r.Events, work...)
	}
	r.Events = append(r.Events, Event{Kind: EvSessionEnded, SessionID: s.ID, ClientID: s.ClientID, Reason: reason})
}

// sameOwner ties a client id to the identity (auth token name) that used it
// first: another identity naming the same client id is another client, so
// it can neither release, renew nor re-acquire that grant. A grant with no
// recorded owner (made without authentication, or before owners were
// recorded) is anybody's, as it was.
func sameOwner(recorded, caller string) bool { return recorded == "" || recorded == caller }

// holderOf names the holder with the lowest token, "" for none.
func holderOf(l *Lock) string {
	if h := l.first(); h != nil {
		return h.ClientID
	}
	return ""
}
