package lockdtest

import (
	"fmt"
	"sort"
	"strings"
	"time"

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

type holder struct {
	name      string
	clientID  string
	sessionID string
	token     uint64
	ttl       time.Duration // 0: no TTL of its own
	expires   time.Time
	proof     string
}

type waiter struct {
	clientID  string
	sessionID string
	ttl       time.Duration
	deadline  time.Time
	reqID     uint64           // WebSocket: the request the grant answers
	notify    chan acquireDone // HTTP: the blocked request
}

type lock struct {
	name   string
	holder *holder
	queue  []*waiter
}

type acquireDone struct {
	h    *holder
	code string // error code when h is nil
}

// The state is guarded by Cluster.mu.

func (c *Cluster) lockLocked(name string) *lock {
	l := c.locks[name]
	if l == nil {
		l = &lock{name: name}
		c.locks[name] = l
	}
	return l
}

func (c *Cluster) grantLocked(l *lock, clientID, sessionID string, ttl time.Duration, now time.Time) *holder {
	c.lastToken++
	h := &holder{name: l.name, clientID: clientID, sessionID: sessionID, token: c.lastToken, ttl: ttl}
	if ttl > 0 {
		h.expires = now.Add(ttl)
	}
	if c.opts.Proofs {
		h.proof = fmt.Sprintf("proof:%s:%d", l.name, h.token)
	}
	l.holder = h
	return h
}

// acquireLocked runs one acquire. It returns the grant, or an error code, or
// neither when the request waits in the queue.
func (c *Cluster) acquireLocked(name, clientID, sessionID string, ttl, wait time.Duration, reqID uint64, notify chan acquireDone) (h *holder, code, holderID string) {
	now := time.Now()
	l := c.lockLocked(name)
	if h := l.holder; h != nil && h.clientID == clientID {
		if ttl > 0 {
			h.ttl = ttl
		}
		if h.ttl > 0 {
			h.expires = now.Add(h.ttl)
		}
		return h, "", ""
	}
	for i, w := range l.queue {
		if w.clientID != clientID {
			continue
		}
		if wait == 0 {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			return nil, api.CodeLockHeld, l.holder.clientID
		}
		w.reqID, w.notify, w.sessionID = reqID, notify, sessionID
		if ttl > 0 { // as lockd does: a retry without a TTL keeps the queued one
			w.ttl = ttl
		}
		w.deadline = now.Add(wait)
		return nil, "", ""
	}
	if l.holder == nil && len(l.queue) == 0 {
		return c.grantLocked(l, clientID, sessionID, ttl, now), "", ""
	}
	if wait == 0 {
		hid := ""
		if l.holder != nil {
			hid = l.holder.clientID
		}
		return nil, api.CodeLockHeld, hid
	}
	l.queue = append(l.queue, &waiter{clientID: clientID, sessionID: sessionID, ttl: ttl, deadline: now.Add(wait), reqID: reqID, notify: notify})
	return nil, "", ""
}

func (c *Cluster) releaseLocked(name, clientID string, token uint64) bool {
	l := c.locks[name]
	if l == nil || l.holder == nil || l.holder.clientID != clientID || l.holder.token != token {
		return false
	}
	l.holder = nil
	c.handoffLocked(l)
	return true
}

func (c *Cluster) renewLocked(name, clientID string, token uint64, ttl time.Duration) (*holder, bool) {
	l := c.locks[name]
	if l == nil || l.holder == nil || l.holder.clientID != clientID || l.holder.token != token {
		return nil, false
	}
	h := l.holder
	if ttl > 0 {
		h.ttl = ttl
	}
	if h.ttl > 0 {
		h.expires = time.Now().Add(h.ttl)
	}
	return h, true
}

// handoffLocked grants a free lock to the first waiter still entitled.
func (c *Cluster) handoffLocked(l *lock) {
	now := time.Now()
	for l.holder == nil && len(l.queue) > 0 {
		w := l.queue[0]
		l.queue = l.queue[1:]
		if !now.Before(w.deadline) {
			c.notifyLocked(w, acquireDone{code: api.CodeWaitTimeout})
			continue
		}
		if w.sessionID != "" && c.sessions[w.sessionID] == nil {
			continue
		}
		h := c.grantLocked(l, w.clientID, w.sessionID, w.ttl, now)
		c.notifyLocked(w, acquireDone{h: h})
	}
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
	if d.h != nil {
		s.conn.pushLocked(grantedMsg(w.reqID, d.h))
	} else {
		s.conn.pushLocked(api.WSMessage{ID: w.reqID, Type: api.TypeError, Error: &api.Error{Code: d.code, Message: "the wait for the lock ended"}})
	}
}

func grantedMsg(id uint64, h *holder) api.WSMessage {
	return api.WSMessage{ID: id, Type: api.TypeGranted, Lock: h.name, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), FencingProof: h.proof}
}

func grantLost(h *holder) api.WSMessage {
	return api.WSMessage{Type: api.TypeLost, Lock: h.name, FencingToken: h.token, Reason: api.ReasonExpired}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return api.FormatTime(t.UnixMilli())
}

// endSessionLocked ends a session: its locks go to the next waiters, its
// waits are dropped, and its connection hears "lost".
func (c *Cluster) endSessionLocked(s *session) {
	delete(c.sessions, s.id)
	c.ended[s.id] = time.Now()
	names := make([]string, 0, len(c.locks))
	for n := range c.locks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		l := c.locks[n]
		q := l.queue[:0]
		for _, w := range l.queue {
			if w.sessionID == s.id {
				if s.conn != nil {
					s.conn.pushLocked(api.WSMessage{ID: w.reqID, Type: api.TypeError, Error: &api.Error{Code: api.CodeSessionExpired, Message: "session ended"}})
				}
				continue
			}
			q = append(q, w)
		}
		l.queue = q
		if h := l.holder; h != nil && h.sessionID == s.id {
			if s.conn != nil {
				s.conn.pushLocked(api.WSMessage{Type: api.TypeLost, Lock: n, FencingToken: h.token, Reason: api.ReasonSessionExpired})
			}
			l.holder = nil
			c.handoffLocked(l)
		}
	}
	c.logf("lockdtest: session %s ended", s.id)
}

// sweepLocked does what the leader's timers do: expire sessions, lock TTLs
// and waits.
func (c *Cluster) sweepLocked(now time.Time) {
	for _, s := range c.sessions {
		if !now.Before(s.deadline) {
			c.endSessionLocked(s)
		}
	}
	for _, l := range c.locks {
		if h := l.holder; h != nil && !h.expires.IsZero() && !now.Before(h.expires) {
			if s := c.sessions[h.sessionID]; s != nil && s.conn != nil {
				s.conn.pushLocked(grantLost(h))
			}
			l.holder = nil
			c.handoffLocked(l)
		}
		q := l.queue[:0]
		for _, w := range l.queue {
			if !now.Before(w.deadline) {
				c.notifyLocked(w, acquireDone{code: api.CodeWaitTimeout})
				continue
			}
			q = append(q, w)
		}
		l.queue = q
	}
}

func (c *Cluster) statusLocked(name string) api.LockStatus {
	st := api.LockStatus{Lock: name}
	if l := c.locks[name]; l != nil {
		st.Waiters = len(l.queue)
		if h := l.holder; h != nil {
			// No session id: it is a capability, shown only to its owner.
			st.Held, st.ClientID, st.FencingToken, st.ExpiresAt = true, h.clientID, h.token, fmtTime(h.expires)
		}
	}
	return st
}

func (c *Cluster) listLocked(prefix string) []api.LockStatus {
	out := []api.LockStatus{}
	for n := range c.locks {
		if strings.HasPrefix(n, prefix) {
			if st := c.statusLocked(n); st.Held || st.Waiters > 0 {
				out = append(out, st)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lock < out[j].Lock })
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
