package locktable

import "fmt"

// CheckCounters recounts, by walking the whole table, what the quota
// counters keep incrementally (sessions and locks held plus waits queued
// per owner, locks held plus waits queued per session) and checks the
// deadline index against the state, and reports the first difference. Tests run it after random command sequences and after
// restores.
func CheckCounters(t *Table) error {
	type count struct{ sessions, locks int }
	owners := map[string]*count{}
	of := func(o string) *count {
		c, ok := owners[o]
		if !ok {
			c = &count{}
			owners[o] = c
		}
		return c
	}
	perSession := map[string]int{}
	for _, s := range t.sessions {
		of(s.Owner).sessions++
		perSession[s.ID] = 0
	}
	charge := func(session, owner string) {
		of(owner).locks++
		if _, ok := perSession[session]; ok {
			perSession[session]++
		}
	}
	for l := range t.locks.all {
		for _, h := range l.Holders {
			charge(h.SessionID, h.Owner)
		}
		for _, w := range l.Waiters {
			charge(w.SessionID, w.Owner)
		}
	}
	for o, c := range owners {
		u, ok := t.usage[o]
		if !ok {
			return fmt.Errorf("owner %q: %d sessions and %d locks, but no usage kept", o, c.sessions, c.locks)
		}
		if u.sessions != c.sessions || u.locks != c.locks {
			return fmt.Errorf("owner %q: kept %d sessions, %d locks; recount %d, %d", o, u.sessions, u.locks, c.sessions, c.locks)
		}
		if u.owner != o {
			return fmt.Errorf("owner %q: usage names %q", o, u.owner)
		}
	}
	for o, u := range t.usage {
		if _, ok := owners[o]; !ok {
			return fmt.Errorf("owner %q: usage kept (%d sessions, %d locks) for an owner with nothing", o, u.sessions, u.locks)
		}
	}
	for id, n := range perSession {
		if got := t.sessions[id].used; got != n {
			return fmt.Errorf("session %q: kept %d locks and waits, recount %d", id, got, n)
		}
	}
	kept := t.count
	t.recount()
	if kept != t.count {
		return fmt.Errorf("counts kept %+v, recount %+v", kept, t.count)
	}
	return t.checkDeadlines()
}

// CheckInvariants runs the checks Restore makes (checkInvariants) on a
// table Apply made: tests run it after every command of the lock-kind
// scenarios and properties.
func CheckInvariants(t *Table) error { return t.checkInvariants() }
