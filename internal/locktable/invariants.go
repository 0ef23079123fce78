package locktable

import (
	"fmt"
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
	tokens := make(map[uint64]string, len(t.locks))
	for name, l := range t.locks {
		if err := checkLockName(name); err != nil {
			return err
		}
		if h := l.Holder; h != nil {
			if err := checkID("holder of "+name, h.ClientID, false); err != nil {
				return err
			}
			if h.Token == 0 || h.Token > t.lastToken {
				return fmt.Errorf("lock %s: holder token %d outside 1..%d", name, h.Token, t.lastToken)
			}
			if other, dup := tokens[h.Token]; dup {
				return fmt.Errorf("token %d held on both %s and %s", h.Token, other, name)
			}
			tokens[h.Token] = name
			if err := t.checkSession(name, h.SessionID); err != nil {
				return err
			}
			if h.TTLms < 0 || h.TTLms > maxTTLms || (h.TTLms == 0) != (h.ExpiresAt == 0) {
				return fmt.Errorf("lock %s: TTL %d ms with expiry %d", name, h.TTLms, h.ExpiresAt)
			}
			if h.TTLms == 0 && h.SessionID == "" {
				return fmt.Errorf("lock %s: held with neither a TTL nor a session, it would never be freed", name)
			}
		} else if len(l.Waiters) > 0 {
			return fmt.Errorf("lock %s is free with %d waiters", name, len(l.Waiters))
		} else {
			return fmt.Errorf("lock %s has neither holder nor waiters", name)
		}
		seen := make(map[string]bool, len(l.Waiters))
		for _, w := range l.Waiters {
			if err := checkID("waiter of "+name, w.ClientID, false); err != nil {
				return err
			}
			if seen[w.ClientID] || w.ClientID == l.Holder.ClientID {
				return fmt.Errorf("lock %s: client %q is in its queue twice or waits for its own lock", name, w.ClientID)
			}
			seen[w.ClientID] = true
			if err := t.checkSession(name, w.SessionID); err != nil {
				return err
			}
			if w.TTLms < 0 || w.TTLms > maxTTLms || (w.TTLms == 0 && w.SessionID == "") {
				return fmt.Errorf("lock %s: waiter %q with TTL %d ms and no session", name, w.ClientID, w.TTLms)
			}
		}
	}
	return nil
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
