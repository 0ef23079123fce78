package lockdtest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
)

// session is a server session, WebSocket or HTTP.
type session struct {
	id       string
	clientID string
	ttl      time.Duration
	deadline time.Time // last keepalive received + ttl
	conn     *conn     // the WebSocket attached, nil when none
}

// holder is one grant of a lock.
type holder struct {
	name      string
	clientID  string
	sessionID string
	token     uint64
	ttl       time.Duration // 0: no TTL of its own
	expires   time.Time
	proof     string
	mode      string
	value     string
	delay     time.Duration // lock-delay when the grant ends without a release
	renewals  int           // renews so far (a fresh proof each)
}

// waiter is a queued acquire. A multi-acquire's waiter sits in the queue
// of every lock it names (one pointer shared by all of them).
type waiter struct {
	names     []string // the lock, or a multi-acquire's locks in name order
	clientID  string
	sessionID string
	ttl       time.Duration
	deadline  time.Time
	mode      string
	delay     time.Duration
	value     string
	reqID     uint64           // WebSocket: the request the grant answers
	notify    chan acquireDone // HTTP: the blocked request
}

func (w *waiter) multi() bool { return len(w.names) > 1 }

type lock struct {
	name         string
	limit        int       // semaphore size, 1 for a plain lock
	holders      []*holder // in token order
	queue        []*waiter
	delayedUntil time.Time // a lock-delay runs until then
	index        uint64    // the fake's change counter at the last change
}

// acquireDone is how an acquire ended: its grants (one per lock), or an
// error code with the blocking lock and its holder.
type acquireDone struct {
	hs     []*holder
	code   string
	lock   string
	holder string
}

// acquireReq is one acquire, single or multi, HTTP or WebSocket.
type acquireReq struct {
	names     []string // one name, or a multi-acquire's (sorted, distinct)
	clientID  string
	sessionID string
	ttl, wait time.Duration
	mode      string
	limit     int // 0: not given
	delay     time.Duration
	value     *string
	reqID     uint64
	notify    chan acquireDone
}

// The state is guarded by Cluster.mu.

func (l *lock) holderOf(clientID string) *holder {
	if l == nil {
		return nil
	}
	for _, h := range l.holders {
		if h.clientID == clientID {
			return h
		}
	}
	return nil
}

func (l *lock) waiterOf(clientID string) int {
	if l == nil {
		return -1
	}
	for i, w := range l.queue {
		if w.clientID == clientID {
			return i
		}
	}
	return -1
}

func (l *lock) delayed(now time.Time) bool {
	return !l.delayedUntil.IsZero() && now.Before(l.delayedUntil)
}

// canHold reports room for one more holder of mode beside the holders.
func (l *lock) canHold(mode string) bool {
	if len(l.holders) == 0 {
		return true
	}
	if mode == api.ModeShared {
		return l.holders[0].mode == api.ModeShared
	}
	return l.holders[0].mode != api.ModeShared && len(l.holders) < l.limit
}

// freeFor reports whether a newcomer of mode is granted at once: FIFO
// (nobody waiting), no lock-delay, room.
func (l *lock) freeFor(mode string, now time.Time) bool {
	return len(l.queue) == 0 && !l.delayed(now) && l.canHold(mode)
}

func (l *lock) holderID() string {
	if len(l.holders) > 0 {
		return l.holders[0].clientID
	}
	return ""
}

func (c *Cluster) touchLocked(l *lock) {
	c.index++
	l.index = c.index
	c.changedLocked(l.name)
}

// dropIfEmptyLocked forgets a lock without holders, waiters or delay.
func (c *Cluster) dropIfEmptyLocked(l *lock) {
	if len(l.holders) == 0 && len(l.queue) == 0 && l.delayedUntil.IsZero() && c.locks[l.name] == l {
		delete(c.locks, l.name)
		if l.index > c.dropped[l.name] {
			c.dropped[l.name] = l.index
		}
	}
}

func (c *Cluster) newLockLocked(name string, limit int) *lock {
	if limit < 1 {
		limit = 1
	}
	l := &lock{name: name, limit: limit}
	c.locks[name] = l
	return l
}

func (c *Cluster) grantLocked(l *lock, w *waiter, now time.Time) *holder {
	c.lastToken++
	mode := w.mode
	if mode == "" {
		mode = api.ModeExclusive
	}
	h := &holder{name: l.name, clientID: w.clientID, sessionID: w.sessionID, token: c.lastToken, ttl: w.ttl,
		mode: mode, value: w.value, delay: w.delay}
	if w.ttl > 0 {
		h.expires = now.Add(w.ttl)
	}
	if c.opts.Proofs {
		h.proof = fmt.Sprintf("proof:%s:%d", l.name, h.token)
	}
	l.holders = append(l.holders, h)
	c.touchLocked(l)
	return h
}

func (r *acquireReq) waiter(now time.Time) *waiter {
	w := &waiter{names: r.names, clientID: r.clientID, sessionID: r.sessionID, ttl: r.ttl, deadline: now.Add(r.wait),
		mode: r.mode, delay: r.delay, reqID: r.reqID, notify: r.notify}
	if r.value != nil {
		w.value = *r.value
	}
	return w
}

// regrantLocked is an idempotent re-acquire by the holder.
func regrantLocked(h *holder, ttl time.Duration, now time.Time) {
	if ttl > 0 {
		h.ttl = ttl
	}
	if h.ttl > 0 {
		h.expires = now.Add(h.ttl)
	}
}

// rewaitLocked is an idempotent retry by a waiter: it keeps its place.
func rewaitLocked(w *waiter, r *acquireReq, now time.Time) {
	w.reqID, w.notify, w.sessionID = r.reqID, r.notify, r.sessionID
	if r.ttl > 0 { // as lockd does: a retry without a TTL keeps the queued one
		w.ttl = r.ttl
	}
	w.deadline = now.Add(r.wait)
}

// acquireLocked runs one acquire. It returns the grants, or an error, or
// neither (done.code == "" and no grants) when the request waits.
func (c *Cluster) acquireLocked(r acquireReq) acquireDone {
	if len(r.names) > 1 {
		return c.acquireManyLocked(r)
	}
	now := time.Now()
	name := r.names[0]
	l := c.locks[name]
	if l != nil && (len(l.holders) > 0 || len(l.queue) > 0) &&
		((r.limit != 0 && r.limit != l.limit) || (r.mode == api.ModeShared && l.limit > 1)) {
		return acquireDone{code: api.CodeLimitMismatch, lock: name}
	}
	if h := l.holderOf(r.clientID); h != nil {
		regrantLocked(h, r.ttl, now)
		return acquireDone{hs: []*holder{h}}
	}
	if i := l.waiterOf(r.clientID); i >= 0 {
		w := l.queue[i]
		if w.multi() {
			return acquireDone{code: api.CodeLockHeld, holder: l.holderID()}
		}
		if r.wait == 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
			c.touchLocked(l)
			c.advanceLocked(now, name)
			return acquireDone{code: api.CodeLockHeld, holder: l.holderID()}
		}
		rewaitLocked(w, &r, now)
		return acquireDone{}
	}
	if l == nil {
		l = c.newLockLocked(name, r.limit)
	} else if r.limit != 0 && len(l.holders) == 0 && len(l.queue) == 0 {
		l.limit = r.limit // a delayed lock takes the size asked for
	}
	w := r.waiter(now)
	if l.freeFor(w.mode, now) {
		return acquireDone{hs: []*holder{c.grantLocked(l, w, now)}}
	}
	if r.wait == 0 {
		c.dropIfEmptyLocked(l)
		return acquireDone{code: api.CodeLockHeld, holder: l.holderID()}
	}
	l.queue = append(l.queue, w)
	c.touchLocked(l)
	return acquireDone{}
}

// acquireManyLocked is a multi-acquire: every lock at once, or none.
func (c *Cluster) acquireManyLocked(r acquireReq) acquireDone {
	now := time.Now()
	locks := make([]*lock, len(r.names))
	for i, n := range r.names {
		locks[i] = c.locks[n]
		if l := locks[i]; l != nil && l.limit > 1 {
			return acquireDone{code: api.CodeLimitMismatch, lock: n}
		}
	}
	held := 0
	for _, l := range locks {
		if l.holderOf(r.clientID) != nil {
			held++
		}
	}
	if held == len(locks) {
		var hs []*holder
		for _, l := range locks {
			h := l.holderOf(r.clientID)
			regrantLocked(h, r.ttl, now)
			hs = append(hs, h)
		}
		return acquireDone{hs: hs}
	}
	for i, l := range locks {
		if l.holderOf(r.clientID) != nil {
			return acquireDone{code: api.CodeLockHeld, lock: r.names[i], holder: r.clientID}
		}
	}
	var mine *waiter
	for i, l := range locks {
		if j := l.waiterOf(r.clientID); j >= 0 {
			w := l.queue[j]
			if !slices.Equal(w.names, r.names) {
				return acquireDone{code: api.CodeLockHeld, lock: r.names[i], holder: l.holderID()}
			}
			mine = w
		}
	}
	if mine != nil {
		if r.wait == 0 {
			c.removeWaiterLocked(mine)
			c.advanceLocked(now, mine.names...)
			return acquireDone{code: api.CodeLockHeld, lock: r.names[0]}
		}
		rewaitLocked(mine, &r, now)
		return acquireDone{}
	}
	w := r.waiter(now)
	blocked := -1
	for i, l := range locks {
		if l != nil && !l.freeFor(w.mode, now) {
			blocked = i
			break
		}
	}
	if blocked < 0 {
		var hs []*holder
		for i, n := range r.names {
			if locks[i] == nil {
				locks[i] = c.newLockLocked(n, 1)
			}
			hs = append(hs, c.grantLocked(locks[i], w, now))
		}
		return acquireDone{hs: hs}
	}
	if r.wait == 0 {
		return acquireDone{code: api.CodeLockHeld, lock: r.names[blocked], holder: locks[blocked].holderID()}
	}
	for i, n := range r.names {
		if locks[i] == nil {
			locks[i] = c.newLockLocked(n, 1)
		}
		locks[i].queue = append(locks[i].queue, w)
		c.touchLocked(locks[i])
	}
	c.advanceLocked(now, r.names...)
	return acquireDone{}
}

// removeWaiterLocked takes w out of every queue it is in.
func (c *Cluster) removeWaiterLocked(w *waiter) {
	for _, n := range w.names {
		l := c.locks[n]
		if l == nil {
			continue
		}
		if i := slices.Index(l.queue, w); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
			c.touchLocked(l)
		}
		c.dropIfEmptyLocked(l)
	}
}

// advanceLocked grants what the queues of the named locks allow now, in
// FIFO order: a single waiter when its lock has room for it (consecutive
// shared waiters together), a multi-acquire when it heads every queue it
// is in and every lock has room.
func (c *Cluster) advanceLocked(now time.Time, names ...string) {
	work := append([]string(nil), names...)
	for len(work) > 0 {
		name := work[0]
		work = work[1:]
		l := c.locks[name]
		if l == nil {
			continue
		}
		for len(l.queue) > 0 {
			w := l.queue[0]
			if !now.Before(w.deadline) || (w.sessionID != "" && c.sessions[w.sessionID] == nil) {
				c.removeWaiterLocked(w)
				if !now.Before(w.deadline) {
					c.notifyLocked(w, acquireDone{code: api.CodeWaitTimeout})
				}
				work = append(work, w.names...)
				continue
			}
			if l.delayed(now) {
				break
			}
			ready := true
			for _, n := range w.names {
				ml := c.locks[n]
				if ml == nil || len(ml.queue) == 0 || ml.queue[0] != w || ml.delayed(now) || !ml.canHold(w.mode) {
					ready = false
					break
				}
			}
			if !ready {
				break
			}
			var hs []*holder
			for _, n := range w.names {
				ml := c.locks[n]
				ml.queue = ml.queue[1:]
				hs = append(hs, c.grantLocked(ml, w, now))
				if n != name {
					work = append(work, n)
				}
			}
			c.notifyLocked(w, acquireDone{hs: hs})
		}
		if c.locks[name] == l {
			c.dropIfEmptyLocked(l)
		}
	}
}

// endGrantLocked ends a grant that was not released: its connection hears
// "lost" for reason, and its lock-delay starts. The caller advances.
func (c *Cluster) endGrantLocked(l *lock, h *holder, reason string, now time.Time) {
	i := slices.Index(l.holders, h)
	if i < 0 {
		return
	}
	l.holders = slices.Delete(l.holders, i, i+1)
	if reason != "" {
		if s := c.sessions[h.sessionID]; s != nil && s.conn != nil {
			s.conn.pushLocked(api.WSMessage{Type: api.TypeLost, Lock: h.name, FencingToken: h.token, Reason: reason})
		}
	}
	if h.delay > 0 {
		if d := now.Add(h.delay); d.After(l.delayedUntil) {
			l.delayedUntil = d
		}
	}
	c.touchLocked(l)
}

func (c *Cluster) findGrantLocked(name, clientID string, token uint64) (*lock, *holder) {
	l := c.locks[name]
	h := l.holderOf(clientID)
	if h == nil || h.token != token {
		return nil, nil
	}
	return l, h
}

func (c *Cluster) releaseLocked(name, clientID string, token uint64) bool {
	l, h := c.findGrantLocked(name, clientID, token)
	if h == nil {
		return false
	}
	l.holders = slices.DeleteFunc(l.holders, func(x *holder) bool { return x == h })
	c.touchLocked(l)
	c.advanceLocked(time.Now(), name)
	return true
}

func (c *Cluster) renewLocked(name, clientID string, token uint64, ttl time.Duration) (*holder, bool) {
	_, h := c.findGrantLocked(name, clientID, token)
	if h == nil {
		return nil, false
	}
	regrantLocked(h, ttl, time.Now())
	if c.opts.Proofs {
		// Signed anew for the new expiry, as lockd does.
		h.renewals++
		h.proof = fmt.Sprintf("proof:%s:%d:r%d", name, h.token, h.renewals)
	}
	return h, true
}

// cancelLocked withdraws clientID's queued wait on names (one lock, or a
// multi-acquire's by all its names): the waiting acquire is answered
// cancelled, and the queues move on. It reports whether there was one.
func (c *Cluster) cancelLocked(names []string, clientID string) bool {
	l := c.locks[names[0]]
	if l == nil {
		return false
	}
	for _, w := range l.queue {
		if w.clientID == clientID && slices.Equal(w.names, names) {
			c.removeWaiterLocked(w)
			c.notifyLocked(w, acquireDone{code: api.CodeCancelled})
			c.advanceLocked(time.Now(), names...)
			c.cancelled++
			return true
		}
	}
	return false
}

func (c *Cluster) setValueLocked(name, clientID string, token uint64, value string) bool {
	l, h := c.findGrantLocked(name, clientID, token)
	if h == nil {
		return false
	}
	h.value = value
	c.touchLocked(l)
	return true
}

// revokeLocked ends the lock's grants (only the one of token, if not 0):
// the holders hear "lost" (reason revoked), lock-delays start, waiters
// are granted. ok is false when token names no current grant.
func (c *Cluster) revokeLocked(name string, token uint64) (revoked []uint64, ok bool) {
	revoked = []uint64{}
	l := c.locks[name]
	if l == nil {
		return revoked, token == 0
	}
	now := time.Now()
	for _, h := range slices.Clone(l.holders) {
		if token == 0 || h.token == token {
			c.endGrantLocked(l, h, api.ReasonRevoked, now)
			revoked = append(revoked, h.token)
		}
	}
	if token != 0 && len(revoked) == 0 {
		return revoked, false
	}
	c.advanceLocked(now, name)
	return revoked, true
}

func (c *Cluster) notifyLocked(w *waiter, d acquireDone) {
	if w.notify != nil {
		select {
		case w.notify <- d:
		default:
		}
		return
	}
	s := c.sessions[w.sessionID]
	if s == nil || s.conn == nil {
		return // the client re-sends its acquire when it comes back
	}
	if d.hs != nil {
		s.conn.pushLocked(grantedMsg(w.reqID, d.hs, w.multi()))
	} else {
		s.conn.pushLocked(api.WSMessage{ID: w.reqID, Type: api.TypeError, Error: &api.Error{Code: d.code, Message: "the wait for the lock ended"}})
	}
}

// grantedMsg is the WebSocket grant: the old fields for one lock, grants
// for a multi-acquire.
func grantedMsg(id uint64, hs []*holder, multi bool) api.WSMessage {
	if !multi {
		h := hs[0]
		return api.WSMessage{ID: id, Type: api.TypeGranted, Lock: h.name, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), FencingProof: h.proof, Mode: h.mode}
	}
	return api.WSMessage{ID: id, Type: api.TypeGranted, Grants: grants(hs), Mode: hs[0].mode}
}

func grants(hs []*holder) []api.Grant {
	out := make([]api.Grant, len(hs))
	for i, h := range hs {
		out[i] = api.Grant{Lock: h.name, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), Mode: h.mode, FencingProof: h.proof}
	}
	return out
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return api.FormatTime(t.UnixMilli())
}

func (c *Cluster) sortedNamesLocked() []string {
	names := make([]string, 0, len(c.locks))
	for n := range c.locks {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// endSessionLocked ends a session: its locks go to the next waiters, its
// waits are dropped, and its connection hears "lost".
func (c *Cluster) endSessionLocked(s *session) {
	now := time.Now()
	c.ended[s.id] = now
	names := c.sortedNamesLocked()
	for _, n := range names {
		l := c.locks[n]
		if l == nil {
			continue
		}
		for _, w := range slices.Clone(l.queue) {
			if w.sessionID == s.id {
				if s.conn != nil {
					s.conn.pushLocked(api.WSMessage{ID: w.reqID, Type: api.TypeError, Error: &api.Error{Code: api.CodeSessionExpired, Message: "session ended"}})
				}
				c.removeWaiterLocked(w)
			}
		}
		for _, h := range slices.Clone(l.holders) {
			if h.sessionID == s.id {
				c.endGrantLocked(l, h, api.ReasonSessionExpired, now)
			}
		}
	}
	delete(c.sessions, s.id)
	c.advanceLocked(now, names...)
	c.logf("lockdtest: session %s ended", s.id)
}

// deleteSessionLocked ends a session as DELETE /api/v1/sessions/{id}
// does: its locks are released (no lock-delay) and its waits dropped.
func (c *Cluster) deleteSessionLocked(s *session) {
	for _, l := range c.locks {
		for _, h := range l.holders {
			if h.sessionID == s.id {
				h.delay = 0
			}
		}
	}
	c.endSessionLocked(s)
}

// sweepLocked does what the leader's timers do: expire sessions, lock TTLs,
// waits and lock-delays.
func (c *Cluster) sweepLocked(now time.Time) {
	for _, s := range c.sessions {
		if !now.Before(s.deadline) {
			c.endSessionLocked(s)
		}
	}
	names := c.sortedNamesLocked()
	for _, n := range names {
		l := c.locks[n]
		if l == nil {
			continue
		}
		for _, h := range slices.Clone(l.holders) {
			if !h.expires.IsZero() && !now.Before(h.expires) {
				c.endGrantLocked(l, h, api.ReasonExpired, now)
			}
		}
		if !l.delayedUntil.IsZero() && !now.Before(l.delayedUntil) {
			l.delayedUntil = time.Time{}
			c.touchLocked(l)
		}
		for _, w := range slices.Clone(l.queue) {
			if !now.Before(w.deadline) {
				c.removeWaiterLocked(w)
				c.notifyLocked(w, acquireDone{code: api.CodeWaitTimeout})
			}
		}
	}
	c.advanceLocked(now, names...)
}

func (c *Cluster) statusLocked(name string) api.LockStatus {
	// A lock without state: the index of its last change (0 for one never
	// used), as lockd remembers it for recently dropped locks.
	st := api.LockStatus{Lock: name, Mode: api.ModeNone, Limit: 1, Index: c.dropped[name]}
	l := c.locks[name]
	if l == nil {
		return st
	}
	st.Limit, st.Index, st.Waiters = int64(l.limit), l.index, len(l.queue)
	if l.delayed(time.Now()) {
		st.DelayedUntil = fmtTime(l.delayedUntil)
	}
	for _, h := range l.holders {
		st.Holders = append(st.Holders, api.HolderStatus{ClientID: h.clientID, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), Mode: h.mode, Value: h.value})
	}
	if len(l.holders) > 0 {
		// No session id: it is a capability, shown only to its owner.
		h := l.holders[0]
		st.Held, st.Mode, st.ClientID, st.FencingToken, st.ExpiresAt, st.Value = true, h.mode, h.clientID, h.token, fmtTime(h.expires), h.value
	}
	return st
}

func (c *Cluster) listLocked(prefix string) []api.LockStatus {
	out := []api.LockStatus{}
	for _, n := range c.sortedNamesLocked() {
		if strings.HasPrefix(n, prefix) {
			out = append(out, c.statusLocked(n))
		}
	}
	return out
}

func validName(n string) bool {
	if len(n) == 0 || len(n) > api.MaxLockName {
		return false
	}
	for _, r := range n {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:/-", r)
		if !ok {
			return false
		}
	}
	return true
}

// kinds checks the lock-kind fields of an acquire as lockd does at
// the door and fills them in r; it returns a message for a 400.
func kinds(r *acquireReq, mode string, limit, delayMs *int64, value *string) string {
	switch mode {
	case "", api.ModeExclusive, api.ModeShared:
	default:
		return "mode must be exclusive or shared, got " + mode
	}
	r.mode = mode
	if limit != nil {
		if *limit < 1 || *limit > api.MaxLimit {
			return "limit must be 1 to 10000"
		}
		if mode == api.ModeShared && *limit > 1 {
			return "mode shared takes no limit above 1"
		}
		if len(r.names) > 1 && *limit > 1 {
			return "a multi-acquire takes limit-1 locks only"
		}
		r.limit = int(*limit)
	}
	if delayMs != nil {
		if *delayMs < 0 || *delayMs > api.MaxLockDelayMs {
			return "lock_delay_ms must be 0 to 60000"
		}
		r.delay = time.Duration(*delayMs) * time.Millisecond
	}
	if value != nil {
		if msg := badValue(*value); msg != "" {
			return msg
		}
		r.value = value
	}
	return ""
}

func badValue(v string) string {
	if len(v) > api.MaxValueBytes || !utf8.ValidString(v) {
		return fmt.Sprintf("value must be valid UTF-8 of at most %d bytes", api.MaxValueBytes)
	}
	return ""
}

// lockSet checks and sorts a multi-acquire's names.
func lockSet(names []string) ([]string, string) {
	if len(names) < api.MinMultiLocks || len(names) > api.MaxMultiLocks {
		return nil, "locks: a multi-acquire takes 2 to 64 distinct names"
	}
	out := slices.Clone(names)
	sort.Strings(out)
	for i, n := range out {
		if !validName(n) {
			return nil, "locks: bad name " + n
		}
		if i > 0 && out[i-1] == n {
			return nil, "locks names " + n + " twice"
		}
	}
	return out, ""
}
