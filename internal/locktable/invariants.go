package locktable

import (
	"cmp"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// Limits the state machine keeps for what it stores. The API refuses
// anything outside them at the door (SPEC limits); Restore refuses a
// snapshot or backup that holds anything outside them.
const (
	maxLockName = 256
	maxClientID = 128
	maxTTLms    = 86_400_000
)

// checkInvariants reports the first way the table breaks an invariant that
// Apply keeps, so a hand-made or corrupted backup can never be restored
// into a cluster: names and ids as the API admits them, one token per
// grant, every holder's and waiter's session alive, no lock that could
// never expire, no free lock with waiters (hand-off happens in the step
// that frees a lock), no client twice in one queue.
func (t *Table) checkInvariants() error {
	for id, s := range t.sessions {
		if err := checkID("session id", id, true); err != nil {
			return err
		}
		if err := checkID("client id of session "+id, s.ClientID, false); err != nil {
			return err
		}
		if s.TTLms <= 0 || s.TTLms > maxTTLms {
			return fmt.Errorf("session %s has TTL %d ms", id, s.TTLms)
		}
	}
	// Tokens are checked for repeats by sorting them, not through a map:
	// this runs on every snapshot a member restores, and a million map
	// inserts cost more than the sort.
	type held struct {
		token uint64
		lock  string
	}
	tokens := make([]held, 0, t.locks.Len())
	multi := map[string][]string{} // "client\x00first lock" -> the locks whose queues hold it
	for l := range t.locks.all {
		name := l.Name
		if err := checkLockName(name); err != nil {
			return err
		}
		if l.Limit < 0 || l.Limit == 1 || l.Limit > MaxLimit {
			return fmt.Errorf("lock %s: limit %d", name, l.Limit)
		}
		if l.DelayedUntil < 0 {
			return fmt.Errorf("lock %s: delayed until %d", name, l.DelayedUntil)
		}
		if len(l.Holders) == 0 && len(l.Waiters) == 0 && l.DelayedUntil == 0 {
			return fmt.Errorf("lock %s has neither holders, waiters nor a lock-delay", name)
		}
		if len(l.Holders) == 0 && len(l.Waiters) > 0 && l.DelayedUntil == 0 && l.Waiters[0].Locks == nil {
			return fmt.Errorf("lock %s is free with %d waiters", name, len(l.Waiters))
		}
		clients := make(map[string]bool, len(l.Holders)+len(l.Waiters))
		var prev uint64
		for _, h := range l.Holders {
			if err := t.checkHolder(name, l, h, prev); err != nil {
				return err
			}
			prev = h.Token
			tokens = append(tokens, held{h.Token, name})
			if clients[h.ClientID] {
				return fmt.Errorf("lock %s: client %q holds it twice", name, h.ClientID)
			}
			clients[h.ClientID] = true
		}
		if n := int64(len(l.Holders)); n > 1 && l.Holders[0].Mode == Exclusive && n > l.limit() {
			return fmt.Errorf("lock %s: %d exclusive holders, limit %d", name, n, l.limit())
		}
		for _, w := range l.Waiters {
			if err := checkID("waiter of "+name, w.ClientID, false); err != nil {
				return err
			}
			if clients[w.ClientID] {
				return fmt.Errorf("lock %s: client %q is in its queue twice or waits for its own lock", name, w.ClientID)
			}
			clients[w.ClientID] = true
			if err := t.checkSession(name, w.SessionID); err != nil {
				return err
			}
			if w.TTLms < 0 || w.TTLms > maxTTLms || (w.TTLms == 0 && w.SessionID == "") {
				return fmt.Errorf("lock %s: waiter %q with TTL %d ms and no session", name, w.ClientID, w.TTLms)
			}
			if err := checkKinds(name, w.Mode, w.DelayMs, w.Value); err != nil {
				return err
			}
			if w.Locks != nil {
				if !validLockSet(w.Locks) || !contains(w.Locks, name) || l.limit() > 1 {
					return fmt.Errorf("lock %s: multi-lock waiter %q names locks %q", name, w.ClientID, w.Locks)
				}
				k := w.ClientID + "\x00" + w.Locks[0]
				multi[k] = append(multi[k], name)
			}
		}
	}
	slices.SortFunc(tokens, func(a, b held) int { return cmp.Compare(a.token, b.token) })
	for i := 1; i < len(tokens); i++ {
		if tokens[i].token == tokens[i-1].token {
			return fmt.Errorf("token %d held on both %s and %s", tokens[i].token, tokens[i-1].lock, tokens[i].lock)
		}
	}
	// Every multi-lock waiter sits in the queue of each of its locks.
	for l := range t.locks.all {
		for _, w := range l.Waiters {
			if w.Locks != nil && len(multi[w.ClientID+"\x00"+w.Locks[0]]) != len(w.Locks) {
				return fmt.Errorf("multi-lock waiter %q is missing from some of the queues of %q", w.ClientID, w.Locks)
			}
		}
	}
	return nil
}

func (t *Table) checkHolder(name string, l *Lock, h *Holder, prev uint64) error {
	if err := checkID("holder of "+name, h.ClientID, false); err != nil {
		return err
	}
	if h.Token == 0 || h.Token > t.lastToken || h.Token <= prev {
		return fmt.Errorf("lock %s: holder token %d outside %d..%d", name, h.Token, prev+1, t.lastToken)
	}
	if err := t.checkSession(name, h.SessionID); err != nil {
		return err
	}
	if h.TTLms < 0 || h.TTLms > maxTTLms || (h.TTLms == 0) != (h.ExpiresAt == 0) {
		return fmt.Errorf("lock %s: TTL %d ms with expiry %d", name, h.TTLms, h.ExpiresAt)
	}
	if h.TTLms == 0 && h.SessionID == "" {
		return fmt.Errorf("lock %s: held with neither a TTL nor a session, it would never be freed", name)
	}
	if h.Mode != l.Holders[0].Mode || (h.Mode == Shared && l.limit() > 1) {
		return fmt.Errorf("lock %s: holders of mixed modes, or shared holders of a semaphore", name)
	}
	return checkKinds(name, h.Mode, h.DelayMs, h.Value)
}

func checkKinds(name string, m Mode, delay int64, value string) error {
	if m > Shared || delay < 0 || delay > MaxLockDelayMs || len(value) > MaxValueBytes || !utf8.ValidString(value) {
		return fmt.Errorf("lock %s: mode %d, lock-delay %d ms or a value of %d bytes out of bounds", name, m, delay, len(value))
	}
	return nil
}

func contains(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func (t *Table) checkSession(lock, id string) error {
	if id == "" {
		return nil
	}
	if _, ok := t.sessions[id]; !ok {
		return fmt.Errorf("lock %s names session %s, which does not exist (it would never expire)", lock, id)
	}
	return nil
}

func checkLockName(name string) error {
	if why := LockNameProblem(name); why != "" {
		return fmt.Errorf("%s: %q", why, name)
	}
	return nil
}

// LockNameProblem reports why a lock name breaks the limits ("" = ok):
// 1–256 bytes of [A-Za-z0-9._:/-].
func LockNameProblem(name string) string {
	if len(name) == 0 {
		return "lock name is empty"
	}
	if len(name) > maxLockName {
		return fmt.Sprintf("lock name is %d bytes, the limit is %d", len(name), maxLockName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '/', c == '-':
		default:
			return fmt.Sprintf("lock name has character %q at byte %d; allowed are [A-Za-z0-9._:/-]", c, i)
		}
	}
	return ""
}

// checkID: 1–128 bytes; printable UTF-8, or printable ASCII without spaces
// for session ids.
func checkID(what, id string, ascii bool) error {
	if id == "" || len(id) > maxClientID {
		return fmt.Errorf("%s of %d bytes", what, len(id))
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for _, r := range id {
		if ascii && (r < 0x21 || r > 0x7e) || !unicode.IsPrint(r) {
			return fmt.Errorf("%s has character %q", what, r)
		}
	}
	return nil
}
