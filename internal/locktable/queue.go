package locktable

// advance grants what the queues of the named locks allow, in the step that
// allows it, and drops dead waiters at their heads. Strict FIFO across
// modes: only a queue's head is ever granted; consecutive shared heads are
// granted together; a multi-acquire is granted when it heads every one of
// its queues and every one of its locks can take it. Granting or dropping a
// multi-acquire changes its other queues too, so their names join the work
// list. Every step removes a waiter or stops, so it ends; the work list is
// processed in order, so every member grants alike.
func (t *Table) advance(now int64, ev *[]Event, names ...string) {
	work := names
	for len(work) > 0 {
		name := work[0]
		work = work[1:]
		l, ok := t.locks.get(name)
		if !ok {
			continue
		}
		for len(l.Waiters) > 0 && l.DelayedUntil == 0 {
			w := &l.Waiters[0]
			if !l.canHold(w.Mode) {
				break // a dead head waits here for its own timer
			}
			if reason := t.deadReason(w, now); reason != "" {
				work = append(work, t.dropWait(l, 0, reason, ev)...)
				continue
			}
			if w.Locks == nil {
				g := *w
				l.Waiters = l.Waiters[1:]
				t.unwait(l, g)
				t.grant(l, &g, now, ev)
				continue
			}
			if !t.multiReady(w) {
				break
			}
			g := *w
			for _, n := range g.Locks {
				ol, _ := t.locks.get(n)
				ol.Waiters = ol.Waiters[1:]
				t.unwait(ol, g)
				t.grant(ol, &g, now, ev)
				if n != name {
					work = append(work, n)
				}
			}
		}
		if len(l.Waiters) == 0 {
			l.Waiters = nil // let the backing array go
		}
		t.dropIfEmpty(l)
	}
}

// deadReason says why a waiter must never be granted ("" if it may be): its
// deadline passed or its session is gone.
func (t *Table) deadReason(w *Waiter, now int64) string {
	if w.Deadline <= now {
		return ReasonWaitTimeout
	}
	if w.SessionID != "" {
		if _, ok := t.sessions[w.SessionID]; !ok {
			return ReasonSessionExpired
		}
	}
	return ""
}

// multiReady reports whether a multi-acquire heads every one of its queues
// and every one of its locks can take it now.
func (t *Table) multiReady(w *Waiter) bool {
	for _, n := range w.Locks {
		l, ok := t.locks.get(n)
		if !ok || l.DelayedUntil != 0 || len(l.Waiters) == 0 || l.Waiters[0].ClientID != w.ClientID || !l.canHold(w.Mode) {
			return false
		}
	}
	return true
}

// dropWait removes the waiter at position i of l's queue without a grant
// (reason: wait_timeout, session_expired), and a multi-acquire from its
// other queues too. It returns those other locks' names: their queues
// changed, so they may advance.
func (t *Table) dropWait(l *Lock, i int, reason string, ev *[]Event) []string {
	w := l.Waiters[i]
	t.removeWaiter(l, i)
	*ev = append(*ev, Event{Kind: EvWaitEnded, Lock: l.Name, ClientID: w.ClientID, SessionID: w.SessionID,
		Deadline: w.Deadline, Reason: reason, Mode: w.Mode, Locks: w.Locks})
	var others []string
	for _, n := range w.Locks {
		if n == l.Name {
			continue
		}
		ol, ok := t.locks.get(n)
		if !ok {
			continue
		}
		if j := ol.waiterOf(w.ClientID); j >= 0 {
			t.removeWaiter(ol, j)
			*ev = append(*ev, Event{Kind: EvWaitEnded, Lock: n, ClientID: w.ClientID, SessionID: w.SessionID,
				Deadline: w.Deadline, Reason: reason, Mode: w.Mode, Locks: w.Locks})
			others = append(others, n)
		}
	}
	return others
}

// removeWaiter takes position i out of l's queue (keeping order) and out of
// its session's index and quota counts.
func (t *Table) removeWaiter(l *Lock, i int) {
	w := l.Waiters[i]
	l.Waiters = append(l.Waiters[:i:i], l.Waiters[i+1:]...)
	t.unwait(l, w)
}

// unwait updates the session index and quota counts for a waiter already
// taken out of l's queue: the session keeps l in its index while another
// client still waits there through it (a session is not tied to one
// client). The index must match what Restore rebuilds, or a restored member
// would diverge.
func (t *Table) unwait(l *Lock, w Waiter) {
	t.dl.removeWait(l, &w)
	t.count.waiters--
	t.count.valueBytes -= int64(len(w.Value))
	t.touch(l)
	t.chargeLock(w.SessionID, w.Owner, -1)
	s, ok := t.sessions[w.SessionID]
	if !ok || s.waits == nil {
		return
	}
	for _, o := range l.Waiters {
		if o.SessionID == w.SessionID {
			return
		}
	}
	delete(s.waits, l.Name)
}
