package locktable_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// The lock kinds of SPEC "Lock kinds, values, elections and watches":
// modes, semaphores, multi-lock, tries and queues, lock-delay, revocation,
// values and the per-lock change index. Every command goes through
// kinds.do, which applies it at the next log index and checks, after it,
// the public-API invariants, the invariants Restore enforces, the quota
// counters, the snapshot round trip and the shape of every lock kind.

// Command builders for the lock kinds.

func shared(c lt.Command) lt.Command { c.Mode = lt.Shared; return c }

func withLimit(n int64, c lt.Command) lt.Command { c.Limit = n; return c }

func withDelay(ms int64, c lt.Command) lt.Command { c.DelayMs = ms; return c }

func withValue(v string, c lt.Command) lt.Command { c.Value = v; return c }

func withSession(s string, c lt.Command) lt.Command { c.SessionID = s; return c }

// acqMany is a multi-acquire of locks (given in the order the command
// carries them).
func acqMany(client string, ttl, wait, now int64, locks ...string) lt.Command {
	return lt.Command{Op: lt.OpAcquire, Now: now, ClientID: client, TTLms: ttl, WaitMs: wait, Locks: locks}
}

func revoke(lock string, tok uint64, now int64) lt.Command {
	return lt.Command{Op: lt.OpRevoke, Now: now, Lock: lock, Token: tok}
}

func endDelay(lock string, now int64) lt.Command {
	return lt.Command{Op: lt.OpEndDelay, Now: now, Lock: lock}
}

func setValue(lock, client string, tok uint64, value string, now int64) lt.Command {
	return lt.Command{Op: lt.OpSetValue, Now: now, Lock: lock, ClientID: client, Token: tok, Value: value}
}

// kinds applies commands at rising log indexes and checks everything that
// must hold after each.
type kinds struct {
	t    *testing.T
	tb   *lt.Table
	idx  uint64
	last uint64
}

func newKinds(t *testing.T) *kinds {
	t.Helper()
	return &kinds{t: t, tb: lt.New()}
}

func (h *kinds) do(c lt.Command) lt.Result {
	h.t.Helper()
	h.idx++
	r := h.tb.ApplyAt(h.idx, c)
	h.check(c)
	return r
}

func (h *kinds) check(c lt.Command) {
	h.t.Helper()
	if err := checkTable(h.tb, h.last); err != nil {
		h.t.Fatalf("after %v: %v", describe(c), err)
	}
	h.last = h.tb.LastToken()
}

// checkTable is every check kinds.do makes, for the property tests too.
func checkTable(tb *lt.Table, prevLast uint64) error {
	if err := checkInvariants(tb, prevLast); err != nil {
		return err
	}
	if err := lt.CheckInvariants(tb); err != nil {
		return fmt.Errorf("restore would refuse this table: %v", err)
	}
	if err := lt.CheckCounters(tb); err != nil {
		return err
	}
	if err := checkShapes(tb); err != nil {
		return err
	}
	snap := tb.Snapshot()
	back, err := lt.Restore(snap)
	if err != nil {
		return fmt.Errorf("restore of the snapshot: %v", err)
	}
	if !bytes.Equal(back.Snapshot(), snap) {
		return fmt.Errorf("snapshot -> restore -> snapshot changed the bytes")
	}
	if err := lt.CheckCounters(back); err != nil {
		return fmt.Errorf("restored: %v", err)
	}
	return nil
}

// checkShapes checks the kinds through the read API: at most limit
// holders, all exclusive or all shared, shared ones only on a limit-1 lock,
// multi-acquire waiters only on limit-1 locks.
func checkShapes(tb *lt.Table) error {
	for _, li := range tb.List("", 0) {
		if li.Limit < 1 || li.Limit > lt.MaxLimit {
			return fmt.Errorf("lock %q: limit %d", li.Name, li.Limit)
		}
		if n := int64(len(li.Holders)); n > li.Limit && li.Mode == lt.Exclusive {
			return fmt.Errorf("lock %q: %d exclusive holders, limit %d", li.Name, n, li.Limit)
		}
		for _, h := range li.Holders {
			if h.Mode != li.Mode {
				return fmt.Errorf("lock %q: shared and exclusive holders together: %+v", li.Name, li.Holders)
			}
		}
		if li.Held && li.Mode == lt.Shared && li.Limit != 1 {
			return fmt.Errorf("lock %q: shared holders on a semaphore of %d", li.Name, li.Limit)
		}
		for _, w := range tb.Waiters(li.Name) {
			if w.Locks != nil && li.Limit != 1 {
				return fmt.Errorf("lock %q: multi-acquire waiter on a semaphore of %d", li.Name, li.Limit)
			}
		}
	}
	return nil
}

func (h *kinds) ok(c lt.Command) lt.Result {
	h.t.Helper()
	r := h.do(c)
	if r.Code != lt.OK {
		h.t.Fatalf("%v: code %v (%+v), want ok", describe(c), r.Code, r)
	}
	return r
}

// code applies c and fails unless it gave want.
func (h *kinds) code(c lt.Command, want lt.Code) lt.Result {
	h.t.Helper()
	r := h.do(c)
	if r.Code != want {
		h.t.Fatalf("%v: code %v (%+v), want %v", describe(c), r.Code, r, want)
	}
	return r
}

// unchanged applies c at the index of the last command (so the applied
// index does not move) and fails unless the snapshot stayed byte for byte
// what it was and the result carries no event.
func (h *kinds) unchanged(c lt.Command) lt.Result {
	h.t.Helper()
	before := h.tb.Snapshot()
	r := h.tb.ApplyAt(h.idx, c)
	h.check(c)
	if !bytes.Equal(before, h.tb.Snapshot()) {
		h.t.Fatalf("%v changed the table (result %+v)", describe(c), r)
	}
	if len(r.Events) != 0 {
		h.t.Fatalf("%v: events %+v, want none", describe(c), r.Events)
	}
	return r
}

// granted applies c and fails unless it granted at once.
func (h *kinds) granted(c lt.Command) lt.Result {
	h.t.Helper()
	r := h.ok(c)
	if !r.Granted || r.Queued {
		h.t.Fatalf("%v: %+v, want granted", describe(c), r)
	}
	return r
}

// queued applies c and fails unless it queued at position pos (-1: any).
func (h *kinds) queued(c lt.Command, pos int) lt.Result {
	h.t.Helper()
	r := h.ok(c)
	if !r.Queued || r.Granted || (pos >= 0 && r.Position != pos) {
		h.t.Fatalf("%v: %+v, want queued at %d", describe(c), r, pos)
	}
	return r
}

// held applies a try and fails unless it is lock_held naming holder (and,
// for a multi-acquire, the blocking lock).
func (h *kinds) held(c lt.Command, lock, holder string) lt.Result {
	h.t.Helper()
	r := h.unchanged(c)
	if r.Code != lt.CodeLockHeld || r.Holder != holder || r.Granted || r.Queued || (len(c.Locks) > 0 && r.Lock != lock) {
		h.t.Fatalf("%v: %+v, want lock_held on %q by %q", describe(c), r, lock, holder)
	}
	return r
}

// holders lists a lock's holders as "client/token/mode".
func holders(tb *lt.Table, lock string) []string {
	var out []string
	for _, h := range tb.Get(lock).Holders {
		out = append(out, fmt.Sprintf("%s/%d/%v", h.ClientID, h.Token, h.Mode))
	}
	return out
}

func wantHolders(t *testing.T, tb *lt.Table, lock string, want ...string) {
	t.Helper()
	if got := holders(tb, lock); !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
		t.Fatalf("holders of %q: %v, want %v", lock, got, want)
	}
}

func wantQueue(t *testing.T, tb *lt.Table, lock string, want ...string) {
	t.Helper()
	if got := waiterClients(tb, lock); !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
		t.Fatalf("queue of %q: %v, want %v", lock, got, want)
	}
}

// evs renders events compactly: "kind lock client token [reason]".
func evs(es []lt.Event) []string {
	names := map[lt.EventKind]string{lt.EvGranted: "granted", lt.EvQueued: "queued", lt.EvRenewed: "renewed",
		lt.EvReleased: "released", lt.EvLost: "lost", lt.EvWaitEnded: "wait_ended", lt.EvSessionCreated: "session_created",
		lt.EvSessionEnded: "session_ended", lt.EvValueSet: "value_set", lt.EvDelayed: "delayed", lt.EvDelayEnded: "delay_ended"}
	var out []string
	for _, e := range es {
		s := fmt.Sprintf("%s %s %s %d", names[e.Kind], e.Lock, e.ClientID, e.Token)
		if e.Reason != "" {
			s += " " + e.Reason
		}
		out = append(out, strings.TrimSpace(s))
	}
	return out
}

func wantEvs(t *testing.T, what string, got []lt.Event, want ...string) {
	t.Helper()
	if g := evs(got); !reflect.DeepEqual(g, want) && (len(g) > 0 || len(want) > 0) {
		t.Fatalf("%s: events\n got  %q\n want %q", what, g, want)
	}
}

func TestKinds(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *kinds)
	}{
		// Modes.
		{"shared holders coexist, each with its own token", func(t *testing.T, h *kinds) {
			for i, c := range []string{"r1", "r2", "r3"} {
				r := h.granted(shared(acq("a", c, 1000, 0, t0+int64(i))))
				if r.Token != uint64(i+1) || r.Mode != lt.Shared {
					t.Fatalf("%s: %+v, want shared token %d", c, r, i+1)
				}
				if len(r.Events) != 1 || r.Events[0].Mode != lt.Shared {
					t.Fatalf("%s: events %+v, want one shared grant", c, r.Events)
				}
			}
			wantHolders(t, h.tb, "a", "r1/1/shared", "r2/2/shared", "r3/3/shared")
			li := h.tb.Get("a")
			if !li.Held || li.ClientID != "r1" || li.Token != 1 || li.Mode != lt.Shared || li.Limit != 1 {
				t.Fatalf("status %+v: want the lowest token's holder, shared, limit 1", li)
			}
			h.held(acq("a", "w", 1000, 0, t0+5), "a", "r1") // an exclusive try
			// One shared holder leaving keeps the others.
			h.ok(rel("a", "r2", 2, t0+6))
			wantHolders(t, h.tb, "a", "r1/1/shared", "r3/3/shared")
			h.ok(expLock("a", 1, t0+1000))
			wantHolders(t, h.tb, "a", "r3/3/shared")
			if li := h.tb.Get("a"); li.ClientID != "r3" || li.Token != 3 {
				t.Fatalf("status %+v: want r3 named as the holder now", li)
			}
		}},
		{"an exclusive holder keeps shared ones out and the other way round", func(t *testing.T, h *kinds) {
			h.granted(acq("a", "x", 1000, 0, t0))
			h.held(shared(acq("a", "r", 1000, 0, t0)), "a", "x")
			h.granted(shared(acq("b", "r", 1000, 0, t0)))
			h.held(acq("b", "x", 1000, 0, t0), "b", "r")
		}},
		{"FIFO across modes: an exclusive waiter blocks later shared ones; shared heads are granted together", func(t *testing.T, h *kinds) {
			h.granted(shared(acq("a", "r1", 10000, 0, t0)))
			h.queued(acq("a", "x1", 10000, 60000, t0+1), 0)
			// A shared acquire on a shared-held lock waits behind the
			// writer: writers do not starve.
			h.held(shared(acq("a", "r2", 10000, 0, t0+2)), "a", "r1")
			h.queued(shared(acq("a", "r2", 10000, 60000, t0+2)), 1)
			h.queued(shared(acq("a", "r3", 10000, 60000, t0+3)), 2)
			h.queued(acq("a", "x2", 10000, 60000, t0+4), 3)
			h.queued(shared(acq("a", "r4", 10000, 60000, t0+5)), 4)

			r := h.ok(rel("a", "r1", 1, t0+10))
			wantEvs(t, "r1 releases", r.Events, "released a r1 1", "granted a x1 2")
			r = h.ok(rel("a", "x1", 2, t0+11))
			wantEvs(t, "x1 releases", r.Events, "released a x1 2", "granted a r2 3", "granted a r3 4")
			for _, e := range r.Events[1:] {
				if e.Mode != lt.Shared {
					t.Fatalf("grant %+v: want mode shared", e)
				}
			}
			wantHolders(t, h.tb, "a", "r2/3/shared", "r3/4/shared")
			wantQueue(t, h.tb, "a", "x2", "r4")
			wantEvs(t, "r2 releases", h.ok(rel("a", "r2", 3, t0+12)).Events, "released a r2 3")
			wantEvs(t, "r3 releases", h.ok(rel("a", "r3", 4, t0+13)).Events, "released a r3 4", "granted a x2 5")
			wantEvs(t, "x2 releases", h.ok(rel("a", "x2", 5, t0+14)).Events, "released a x2 5", "granted a r4 6")
		}},
		{"a shared waiter at the head is granted beside shared holders when the writer ahead leaves", func(t *testing.T, h *kinds) {
			h.granted(shared(acq("a", "r1", 10000, 0, t0)))
			h.queued(acq("a", "x", 10000, 100, t0), 0)
			h.queued(shared(acq("a", "r2", 10000, 60000, t0)), 1)
			h.queued(shared(acq("a", "r3", 10000, 60000, t0)), 2)
			r := h.ok(tmo("a", "x", t0+100))
			wantEvs(t, "writer times out", r.Events, "wait_ended a x 0 wait_timeout", "granted a r2 2", "granted a r3 3")
			wantHolders(t, h.tb, "a", "r1/1/shared", "r2/2/shared", "r3/3/shared")
		}},

		// Semaphores.
		{"a semaphore of N admits N, queues the next, hands a permit on", func(t *testing.T, h *kinds) {
			for i, c := range []string{"p1", "p2", "p3"} {
				r := h.granted(withLimit(3, acq("s", c, 1000, 0, t0)))
				if r.Token != uint64(i+1) || r.Mode != lt.Exclusive {
					t.Fatalf("%s: %+v", c, r)
				}
			}
			if li := h.tb.Get("s"); li.Limit != 3 || len(li.Holders) != 3 {
				t.Fatalf("status %+v: want 3 holders of 3", li)
			}
			h.held(withLimit(3, acq("s", "p4", 1000, 0, t0)), "s", "p1")
			h.queued(withLimit(3, acq("s", "p4", 1000, 5000, t0)), 0)
			h.queued(acq("s", "p5", 1000, 5000, t0), 1) // no limit: joins what the lock has
			r := h.ok(rel("s", "p2", 2, t0+1))
			wantEvs(t, "a permit returned", r.Events, "released s p2 2", "granted s p4 4")
			wantHolders(t, h.tb, "s", "p1/1/exclusive", "p3/3/exclusive", "p4/4/exclusive")
			r = h.ok(revoke("s", 0, t0+2))
			if !reflect.DeepEqual(r.Tokens, []uint64{1, 3, 4}) {
				t.Fatalf("revoke: tokens %v", r.Tokens)
			}
			wantHolders(t, h.tb, "s", "p5/5/exclusive")
		}},
		{"another limit is limit_mismatch while the lock has holders or waiters", func(t *testing.T, h *kinds) {
			h.granted(withLimit(2, withDelay(100, acq("s", "p1", 1000, 0, t0))))
			for _, n := range []int64{1, 3, lt.MaxLimit} {
				r := h.unchanged(withLimit(n, acq("s", "x", 1000, 5000, t0)))
				if r.Code != lt.CodeLimitMismatch || r.Lock != "s" {
					t.Fatalf("limit %d: %+v, want limit_mismatch on s", n, r)
				}
			}
			h.granted(withLimit(2, acq("s", "p2", 1000, 0, t0)))
			h.queued(acq("s", "w", 1000, 60000, t0), 0)
			// The holders go; the lock-delay keeps the waiter waiting, and
			// a waiter alone still fixes the size.
			h.ok(revoke("s", 0, t0+1))
			if li := h.tb.Get("s"); li.Held || li.Waiters != 1 || li.Limit != 2 {
				t.Fatalf("status %+v: want a delayed lock of 2 with one waiter", li)
			}
			if r := h.unchanged(withLimit(5, acq("s", "x", 1000, 5000, t0+2))); r.Code != lt.CodeLimitMismatch {
				t.Fatalf("limit 5 with a waiter: %+v", r)
			}
			// An ordinary lock, held: a semaphore acquire does not fit it.
			h.granted(acq("o", "x", 1000, 0, t0))
			if r := h.unchanged(withLimit(2, acq("o", "y", 1000, 5000, t0))); r.Code != lt.CodeLimitMismatch || r.Lock != "o" {
				t.Fatalf("limit 2 on an ordinary lock: %+v", r)
			}
			h.queued(withLimit(1, acq("o", "y", 1000, 5000, t0)), 0) // limit 1 is what it has
		}},
		{"a semaphore's size is forgotten once it is free", func(t *testing.T, h *kinds) {
			h.granted(withLimit(2, acq("s", "p1", 1000, 0, t0)))
			h.ok(rel("s", "p1", 1, t0+1))
			if got := h.tb.List("", 0); len(got) != 0 {
				t.Fatalf("free lock kept: %+v", got)
			}
			h.granted(withLimit(3, acq("s", "p1", 1000, 0, t0+2)))
			if li := h.tb.Get("s"); li.Limit != 3 {
				t.Fatalf("limit %d, want 3", li.Limit)
			}
		}},
		{"shared on a semaphore is limit_mismatch; shared with a limit above 1 is invalid", func(t *testing.T, h *kinds) {
			h.granted(withLimit(2, acq("s", "p1", 1000, 0, t0)))
			for _, c := range []lt.Command{
				shared(acq("s", "r", 1000, 0, t0)),
				shared(acq("s", "r", 1000, 5000, t0)),
				shared(withLimit(1, acq("s", "r", 1000, 5000, t0))),
			} {
				if r := h.unchanged(c); r.Code != lt.CodeLimitMismatch || r.Lock != "s" {
					t.Fatalf("%v: %+v, want limit_mismatch", describe(c), r)
				}
			}
			for _, c := range []lt.Command{
				shared(withLimit(2, acq("s", "r", 1000, 0, t0))),
				shared(withLimit(2, acq("new", "r", 1000, 0, t0))), // even on a free lock
			} {
				if r := h.unchanged(c); r.Code != lt.CodeInvalid {
					t.Fatalf("%v: %+v, want invalid", describe(c), r)
				}
			}
			if r := h.granted(shared(withLimit(1, acq("new", "r", 1000, 0, t0)))); r.Mode != lt.Shared {
				t.Fatalf("shared with limit 1: %+v", r)
			}
			// A shared-held lock refuses a semaphore acquire.
			if r := h.unchanged(withLimit(2, acq("new", "p", 1000, 5000, t0))); r.Code != lt.CodeLimitMismatch {
				t.Fatalf("semaphore on a shared lock: %+v", r)
			}
		}},

		// Multi-lock.
		{"a multi-acquire of free locks is granted in one step, in name order", func(t *testing.T, h *kinds) {
			r := h.granted(acqMany("m", 1000, 0, t0, "a", "b", "c"))
			want := []lt.Grant{{Lock: "a", Token: 1, ExpiresAt: t0 + 1000}, {Lock: "b", Token: 2, ExpiresAt: t0 + 1000},
				{Lock: "c", Token: 3, ExpiresAt: t0 + 1000}}
			if !reflect.DeepEqual(r.Grants, want) {
				t.Fatalf("grants %+v, want %+v", r.Grants, want)
			}
			wantEvs(t, "grant", r.Events, "granted a m 1", "granted b m 2", "granted c m 3")
			for _, e := range r.Events {
				if !reflect.DeepEqual(e.Locks, []string{"a", "b", "c"}) {
					t.Fatalf("event %+v: want the whole list of locks", e)
				}
			}
			// A retry gets the same grants, expiries refreshed.
			r = h.granted(acqMany("m", 2000, 0, t0+10, "a", "b", "c"))
			if len(r.Grants) != 3 || r.Grants[1].Token != 2 || r.Grants[1].ExpiresAt != t0+2010 || h.tb.LastToken() != 3 {
				t.Fatalf("retry: %+v", r)
			}
			// Each lock is then released on its own.
			h.ok(rel("b", "m", 2, t0+20))
			wantHolders(t, h.tb, "a", "m/1/exclusive")
			wantHolders(t, h.tb, "b")
			// Holding only some of the locks is no retry.
			if r := h.unchanged(acqMany("m", 1000, 0, t0+30, "a", "b", "c")); r.Code != lt.CodeLockHeld || r.Lock != "a" {
				t.Fatalf("partial retry: %+v", r)
			}
		}},
		{"a refused multi-try takes nothing and names the first blocking lock", func(t *testing.T, h *kinds) {
			h.granted(acq("c", "y", 1000, 0, t0))
			h.granted(acq("b", "x", 1000, 0, t0))
			h.held(acqMany("m", 1000, 0, t0, "a", "b", "c", "d"), "b", "x")
			for _, n := range []string{"a", "d"} {
				if li := h.tb.Get(n); li.Held || li.Waiters != 0 {
					t.Fatalf("%s: %+v, want untouched", n, li)
				}
			}
			if h.tb.LastToken() != 2 {
				t.Fatalf("LastToken %d: a refused try spent tokens", h.tb.LastToken())
			}
		}},
		{"a waiting multi-acquire sits in every queue and is granted when it heads them all and all are free", func(t *testing.T, h *kinds) {
			h.granted(acq("a", "x", 10000, 0, t0))
			h.granted(acq("c", "y", 10000, 0, t0))
			r := h.ok(acqMany("m", 1000, 60000, t0, "a", "b", "c"))
			if !r.Queued || r.Granted || len(r.Grants) != 0 {
				t.Fatalf("multi: %+v, want queued", r)
			}
			wantEvs(t, "queued", r.Events, "queued a m 0", "queued b m 0", "queued c m 0")
			for _, n := range []string{"a", "b", "c"} {
				wantQueue(t, h.tb, n, "m")
				if w := h.tb.Waiters(n)[0]; !reflect.DeepEqual(w.Locks, []string{"a", "b", "c"}) || w.Deadline != t0+60000 {
					t.Fatalf("waiter on %s: %+v", n, w)
				}
			}
			// b is free, yet not for a newcomer: m is ahead.
			if li := h.tb.Get("b"); li.Held || li.Waiters != 1 {
				t.Fatalf("b: %+v, want free with one waiter", li)
			}
			h.held(acq("b", "z", 1000, 0, t0+1), "b", "")
			h.held(shared(acq("b", "z", 1000, 0, t0+1)), "b", "")
			h.queued(acq("b", "z", 1000, 60000, t0+1), 1)
			// A retry keeps its places.
			r = h.ok(acqMany("m", 1000, 60000, t0+2, "a", "b", "c"))
			if !r.Queued || r.Granted {
				t.Fatalf("retry: %+v", r)
			}
			wantQueue(t, h.tb, "b", "m", "z")

			wantEvs(t, "a freed", h.ok(rel("a", "x", 1, t0+10)).Events, "released a x 1")
			if li := h.tb.Get("a"); li.Held || li.Waiters != 1 {
				t.Fatalf("a: %+v, want free, m waiting for c", li)
			}
			r = h.ok(rel("c", "y", 2, t0+20))
			wantEvs(t, "c freed", r.Events, "released c y 2", "granted a m 3", "granted b m 4", "granted c m 5")
			wantQueue(t, h.tb, "b", "z")
			r = h.ok(rel("b", "m", 4, t0+30))
			wantEvs(t, "b released", r.Events, "released b m 4", "granted b z 6")
		}},
		{"a multi-acquire and a single one queued on a multi-free lock wait in commit order", func(t *testing.T, h *kinds) {
			h.granted(acq("b", "y", 10000, 0, t0))
			h.queued(acqMany("m", 1000, 60000, t0, "a", "b"), -1) // heads a, a stays free
			h.queued(acq("a", "z", 1000, 120000, t0), 1)
			// m's wait ends: z heads a, which is free: granted in that step.
			r := h.ok(tmo("b", "m", t0+60000))
			wantEvs(t, "m times out", r.Events, "wait_ended b m 0 wait_timeout", "wait_ended a m 0 wait_timeout", "granted a z 2")
			for _, e := range r.Events[:2] {
				if !reflect.DeepEqual(e.Locks, []string{"a", "b"}) {
					t.Fatalf("event %+v: want the whole list", e)
				}
			}
		}},
		{"two multi-acquires over the same locks never wait on each other", func(t *testing.T, h *kinds) {
			// The API sorts the names; a command with them out of order is
			// invalid, so "b,a" and "a,b" are the same request.
			if r := h.unchanged(acqMany("m2", 1000, 60000, t0, "b", "a")); r.Code != lt.CodeInvalid {
				t.Fatalf("unsorted names: %+v, want invalid", r)
			}
			h.granted(acq("a", "x", 10000, 0, t0))
			h.granted(acq("b", "y", 10000, 0, t0))
			h.queued(acqMany("m1", 1000, 60000, t0+1, "a", "b"), -1)
			h.queued(acqMany("m2", 1000, 60000, t0+2, "a", "b"), -1)
			wantEvs(t, "b freed", h.ok(rel("b", "y", 2, t0+3)).Events, "released b y 2")
			r := h.ok(rel("a", "x", 1, t0+4))
			wantEvs(t, "a freed", r.Events, "released a x 1", "granted a m1 3", "granted b m1 4")
			wantEvs(t, "m1 releases b", h.ok(rel("b", "m1", 4, t0+5)).Events, "released b m1 4")
			r = h.ok(rel("a", "m1", 3, t0+6))
			wantEvs(t, "m1 releases a", r.Events, "released a m1 3", "granted a m2 5", "granted b m2 6")
		}},
		{"three multi-acquires over overlapping pairs all get through", func(t *testing.T, h *kinds) {
			for _, n := range []string{"a", "b", "c"} {
				h.granted(acq(n, "x"+n, 10000, 0, t0))
			}
			h.queued(acqMany("m1", 1000, 60000, t0+1, "a", "b"), -1)
			h.queued(acqMany("m2", 1000, 60000, t0+2, "b", "c"), -1)
			h.queued(acqMany("m3", 1000, 60000, t0+3, "a", "c"), -1)
			// Free them in the order that would deadlock lockers taking one
			// lock at a time.
			h.ok(rel("c", "xc", 3, t0+10))
			h.ok(rel("b", "xb", 2, t0+11))
			r := h.ok(rel("a", "xa", 1, t0+12))
			wantEvs(t, "a freed", r.Events, "released a xa 1", "granted a m1 4", "granted b m1 5")
			wantQueue(t, h.tb, "c", "m2", "m3") // m2 heads c, waits for b
			r = h.ok(rel("b", "m1", 5, t0+13))
			wantEvs(t, "m1 releases b", r.Events, "released b m1 5", "granted b m2 6", "granted c m2 7")
			h.ok(rel("a", "m1", 4, t0+14)) // m3 heads a now, c is m2's
			h.ok(rel("b", "m2", 6, t0+15))
			r = h.ok(rel("c", "m2", 7, t0+16))
			wantEvs(t, "m2 releases c", r.Events, "released c m2 7", "granted a m3 8", "granted c m3 9")
		}},
		{"a shared multi-acquire is granted beside shared holders", func(t *testing.T, h *kinds) {
			h.granted(shared(acq("a", "r", 1000, 0, t0)))
			r := h.granted(shared(acqMany("m", 1000, 0, t0, "a", "b")))
			if r.Mode != lt.Shared || len(r.Grants) != 2 || r.Grants[0].Mode != lt.Shared {
				t.Fatalf("shared multi: %+v", r)
			}
			wantHolders(t, h.tb, "a", "r/1/shared", "m/2/shared")
			h.held(acqMany("n", 1000, 0, t0, "a", "b"), "a", "r") // exclusive
		}},
		{"a multi-acquire naming a semaphore is limit_mismatch", func(t *testing.T, h *kinds) {
			h.granted(withLimit(2, acq("s", "p", 1000, 0, t0)))
			if r := h.unchanged(acqMany("m", 1000, 5000, t0, "a", "s")); r.Code != lt.CodeLimitMismatch || r.Lock != "s" {
				t.Fatalf("%+v, want limit_mismatch on s", r)
			}
			// And a semaphore acquire on a lock a multi-acquire waits for.
			h.granted(acq("b", "x", 1000, 0, t0))
			h.queued(acqMany("m", 1000, 5000, t0, "a", "b"), -1)
			if r := h.unchanged(withLimit(2, acq("a", "p", 1000, 5000, t0))); r.Code != lt.CodeLimitMismatch || r.Lock != "a" {
				t.Fatalf("%+v, want limit_mismatch on a", r)
			}
		}},
		{"session expiry with a multi-acquire waiting removes it from every queue", func(t *testing.T, h *kinds) {
			h.ok(mkSess("s", "m", 15000, t0))
			h.granted(acq("a", "x", 10000, 0, t0))
			h.granted(acq("c", "y", 10000, 0, t0))
			h.queued(withSession("s", acqMany("m", 0, 60000, t0, "a", "b", "c")), -1)
			h.queued(acq("b", "z", 1000, 60000, t0), 1)
			r := h.ok(expSess("s", t0+100))
			wantEvs(t, "session expires", r.Events,
				"wait_ended a m 0 session_expired", "wait_ended b m 0 session_expired", "wait_ended c m 0 session_expired",
				"granted b z 3", "session_ended  m 0 session_expired")
			for _, n := range []string{"a", "c"} {
				wantQueue(t, h.tb, n)
			}
			wantHolders(t, h.tb, "b", "z/3/exclusive")
			if n := h.tb.SessionUsage("s"); n != 0 {
				t.Fatalf("session usage %d", n)
			}
		}},
		{"a multi-acquire through a session is released lock by lock when the session is deleted", func(t *testing.T, h *kinds) {
			h.ok(mkSess("s", "m", 15000, t0))
			h.granted(withSession("s", withDelay(1000, acqMany("m", 0, 0, t0, "a", "b"))))
			h.queued(acq("b", "z", 1000, 60000, t0), 0)
			r := h.ok(delSess("s", t0+1))
			wantEvs(t, "session deleted", r.Events, "lost a m 1 session_expired", "lost b m 2 session_expired",
				"granted b z 3", "session_ended  m 0 deleted")
		}},
		{"multi-acquire refusals", func(t *testing.T, h *kinds) {
			many := make([]string, lt.MaxMultiLocks+1)
			for i := range many {
				many[i] = fmt.Sprintf("l%03d", i)
			}
			for name, c := range map[string]lt.Command{
				"one name":            acqMany("m", 1000, 0, t0, "a"),
				"65 names":            acqMany("m", 1000, 0, t0, many...),
				"a duplicate":         acqMany("m", 1000, 0, t0, "a", "a"),
				"out of order":        acqMany("m", 1000, 0, t0, "b", "a"),
				"a bad name":          acqMany("m", 1000, 0, t0, "a", "b c"),
				"an empty name":       acqMany("m", 1000, 0, t0, "", "a"),
				"lock and locks":      {Op: lt.OpAcquire, Now: t0, Lock: "a", Locks: []string{"b", "c"}, ClientID: "m", TTLms: 1000},
				"a limit above 1":     withLimit(2, acqMany("m", 1000, 0, t0, "a", "b")),
				"no client":           acqMany("", 1000, 0, t0, "a", "b"),
				"no TTL nor session":  acqMany("m", 0, 0, t0, "a", "b"),
				"negative wait":       acqMany("m", 1000, -1, t0, "a", "b"),
				"an unknown mode":     {Op: lt.OpAcquire, Now: t0, Locks: []string{"a", "b"}, ClientID: "m", TTLms: 1000, Mode: 2},
				"a long lock-delay":   withDelay(lt.MaxLockDelayMs+1, acqMany("m", 1000, 0, t0, "a", "b")),
				"a value too long":    withValue(strings.Repeat("v", lt.MaxValueBytes+1), acqMany("m", 1000, 0, t0, "a", "b")),
				"shared with a limit": shared(withLimit(2, acqMany("m", 1000, 0, t0, "a", "b"))),
			} {
				if r := h.unchanged(c); r.Code != lt.CodeInvalid {
					t.Fatalf("%s: %+v, want invalid", name, r)
				}
			}
			if r := h.granted(acqMany("m", 1000, 0, t0, many[:lt.MaxMultiLocks]...)); len(r.Grants) != lt.MaxMultiLocks {
				t.Fatalf("64 names: %d grants", len(r.Grants))
			}
			if r := h.unchanged(withSession("gone", acqMany("n", 0, 0, t0, "x", "y"))); r.Code != lt.CodeSessionExpired {
				t.Fatalf("missing session: %+v", r)
			}
		}},

		// Lock-delay.
		{"lock-delay after a TTL expiry; waiters keep their places and get it when the delay ends", func(t *testing.T, h *kinds) {
			h.granted(withDelay(500, acq("a", "c1", 1000, 0, t0)))
			h.queued(acq("a", "w", 1000, 60000, t0), 0)
			r := h.ok(expLock("a", 1, t0+1000))
			wantEvs(t, "expiry", r.Events, "lost a c1 1 expired", "delayed a  0")
			if r.Events[1].ExpiresAt != t0+1500 {
				t.Fatalf("delayed event %+v, want the delay's end t0+1500", r.Events[1])
			}
			if li := h.tb.Get("a"); li.Held || li.DelayedUntil != t0+1500 || li.Waiters != 1 {
				t.Fatalf("status %+v: want delayed until t0+1500 with the waiter kept", li)
			}
			h.held(acq("a", "z", 1000, 0, t0+1100), "a", "")
			h.unchanged(endDelay("a", t0+1499)) // too early: no-op
			h.unchanged(endDelay("b", t0+1500)) // no such lock
			r = h.ok(endDelay("a", t0+1500))
			wantEvs(t, "delay ends", r.Events, "delay_ended a  0", "granted a w 2")
			if li := h.tb.Get("a"); li.DelayedUntil != 0 {
				t.Fatalf("status %+v: still delayed", li)
			}
			h.unchanged(endDelay("a", t0+1600)) // duplicate timer
		}},
		{"lock-delay after a session expiry", func(t *testing.T, h *kinds) {
			h.ok(mkSess("s", "c1", 15000, t0))
			h.granted(withSession("s", withDelay(300, acq("a", "c1", 0, 0, t0))))
			h.queued(acq("a", "w", 1000, 60000, t0), 0)
			r := h.ok(expSess("s", t0+15000))
			wantEvs(t, "session expiry", r.Events, "lost a c1 1 session_expired", "delayed a  0", "session_ended  c1 0 session_expired")
			if li := h.tb.Get("a"); li.DelayedUntil != t0+15300 || li.Waiters != 1 {
				t.Fatalf("status %+v", li)
			}
			wantEvs(t, "delay ends", h.ok(endDelay("a", t0+15300)).Events, "delay_ended a  0", "granted a w 2")
		}},
		{"lock-delay after a revocation", func(t *testing.T, h *kinds) {
			h.granted(withDelay(200, acq("a", "c1", 1000, 0, t0)))
			r := h.ok(revoke("a", 1, t0+10))
			wantEvs(t, "revoke", r.Events, "lost a c1 1 revoked", "delayed a  0")
			if li := h.tb.Get("a"); li.DelayedUntil != t0+210 {
				t.Fatalf("status %+v", li)
			}
			// Nobody waits: the lock exists only for its delay, and goes
			// when the delay ends.
			h.held(acq("a", "z", 1000, 0, t0+100), "a", "")
			wantEvs(t, "delay ends", h.ok(endDelay("a", t0+210)).Events, "delay_ended a  0")
			if got := h.tb.List("", 0); len(got) != 0 {
				t.Fatalf("lock kept after its delay: %+v", got)
			}
			h.granted(acq("a", "z", 1000, 0, t0+211))
		}},
		{"no lock-delay after a release or a session delete", func(t *testing.T, h *kinds) {
			h.granted(withDelay(500, acq("a", "c1", 1000, 0, t0)))
			h.queued(acq("a", "w", 1000, 60000, t0), 0)
			wantEvs(t, "release", h.ok(rel("a", "c1", 1, t0+1)).Events, "released a c1 1", "granted a w 2")
			h.ok(mkSess("s", "c2", 15000, t0))
			h.granted(withSession("s", withDelay(500, acq("b", "c2", 0, 0, t0))))
			h.queued(acq("b", "w", 1000, 60000, t0), 0)
			r := h.ok(delSess("s", t0+2))
			wantEvs(t, "session delete", r.Events, "lost b c2 3 session_expired", "granted b w 4", "session_ended  c2 0 deleted")
			for _, n := range []string{"a", "b"} {
				if li := h.tb.Get(n); li.DelayedUntil != 0 {
					t.Fatalf("%s delayed: %+v", n, li)
				}
			}
		}},
		{"a session expiry ends all of the session's grants before it hands any lock on", func(t *testing.T, h *kinds) {
			// The session holds b (shared, with a lock-delay) and waits,
			// through another client, for a and b together. Dropping that
			// wait from a's queue, visited first, frees b's queue for r;
			// yet b's grant ends in this same step, so its lock-delay
			// applies to r too, whatever the names' order.
			h.ok(mkSess("s", "cs", 15000, t0))
			h.granted(withSession("s", withDelay(1000, shared(acq("b", "h1", 0, 0, t0)))))
			h.granted(acq("a", "y", 60000, 0, t0))
			h.queued(withSession("s", acqMany("x", 0, 60000, t0, "a", "b")), -1)
			h.queued(shared(acq("b", "r", 1000, 60000, t0)), 1)
			r := h.ok(expSess("s", t0+100))
			for _, e := range r.Events {
				if e.Kind == lt.EvGranted {
					t.Fatalf("granted during the lock-delay the step started: %q", evs(r.Events))
				}
			}
			if li := h.tb.Get("b"); li.Held || li.DelayedUntil != t0+1100 || li.Waiters != 1 {
				t.Fatalf("b: %+v, want delayed until t0+1100 with r waiting", li)
			}
			wantEvs(t, "delay ends", h.ok(endDelay("b", t0+1100)).Events, "delay_ended b  0", "granted b r 3")
		}},
		{"waiters are granted in the step that ends the delay, deadlines checked", func(t *testing.T, h *kinds) {
			h.granted(withDelay(1000, acq("a", "c1", 100, 0, t0)))
			h.queued(acq("a", "early", 1000, 500, t0), 0)       // deadline t0+500
			h.queued(acq("a", "w", 1000, 1100, t0), 1)          // deadline t0+1100: exactly the delay's end
			h.queued(shared(acq("a", "r1", 1000, 5000, t0)), 2) // granted, and the next shared with it
			h.queued(shared(acq("a", "r2", 1000, 5000, t0)), 3)
			h.queued(acq("a", "x", 1000, 5000, t0), 4)
			h.ok(expLock("a", 1, t0+100)) // delayed until t0+1100
			wantQueue(t, h.tb, "a", "early", "w", "r1", "r2", "x")
			// The early waiter's own timer, during the delay: no grant.
			wantEvs(t, "timeout during the delay", h.ok(tmo("a", "early", t0+500)).Events, "wait_ended a early 0 wait_timeout")
			r := h.ok(endDelay("a", t0+1100))
			wantEvs(t, "delay ends", r.Events, "delay_ended a  0", "wait_ended a w 0 wait_timeout",
				"granted a r1 2", "granted a r2 3")
			wantQueue(t, h.tb, "a", "x")
		}},
		{"the longest lock-delay wins and a later loss pushes it out", func(t *testing.T, h *kinds) {
			h.granted(withDelay(500, shared(acq("a", "r1", 1000, 0, t0))))
			h.granted(withDelay(100, shared(acq("a", "r2", 1000, 0, t0))))
			h.granted(shared(acq("a", "r3", 1000, 0, t0)))
			r := h.ok(revoke("a", 0, t0+10))
			wantEvs(t, "revoke all", r.Events, "lost a r1 1 revoked", "delayed a  0", "lost a r2 2 revoked", "lost a r3 3 revoked")
			if !reflect.DeepEqual(r.Tokens, []uint64{1, 2, 3}) || h.tb.Get("a").DelayedUntil != t0+510 {
				t.Fatalf("revoke: %+v, status %+v", r, h.tb.Get("a"))
			}
			// A shared holder losing its grant delays the lock for the
			// others too, until the end.
			h.granted(withDelay(300, acq("b", "x1", 1000, 0, t0)))
			h.ok(expLock("b", 4, t0+1000)) // delayed until t0+1300
			h.queued(acq("b", "w", 1000, 60000, t0+1000), 0)
			h.unchanged(endDelay("b", t0+1299))
			h.ok(endDelay("b", t0+1300))
			wantHolders(t, h.tb, "b", "w/5/exclusive")
		}},
		{"a delay runs on with a multi-acquire waiting; its other locks wait for it", func(t *testing.T, h *kinds) {
			h.granted(withDelay(500, acq("a", "x", 100, 0, t0)))
			h.ok(expLock("a", 1, t0+100)) // delayed until t0+600
			h.queued(acqMany("m", 1000, 60000, t0+200, "a", "b"), -1)
			if li := h.tb.Get("b"); li.Held || li.Waiters != 1 {
				t.Fatalf("b: %+v", li)
			}
			h.held(acq("b", "z", 1000, 0, t0+300), "b", "")
			r := h.ok(endDelay("a", t0+600))
			wantEvs(t, "delay ends", r.Events, "delay_ended a  0", "granted a m 2", "granted b m 3")
		}},

		// Revocation.
		{"revoke ends every grant, or the one named; hands off", func(t *testing.T, h *kinds) {
			h.granted(withLimit(3, acq("s", "p1", 1000, 0, t0)))
			h.granted(withLimit(3, acq("s", "p2", 1000, 0, t0)))
			h.granted(withLimit(3, acq("s", "p3", 1000, 0, t0)))
			h.queued(acq("s", "w", 1000, 60000, t0), 0)
			r := h.ok(revoke("s", 2, t0+1))
			if !reflect.DeepEqual(r.Tokens, []uint64{2}) {
				t.Fatalf("tokens %v", r.Tokens)
			}
			wantEvs(t, "revoke one", r.Events, "lost s p2 2 revoked", "granted s w 4")
			wantHolders(t, h.tb, "s", "p1/1/exclusive", "p3/3/exclusive", "w/4/exclusive")
			// The revoked holder's release is not_holder; its renew too.
			h.code(rel("s", "p2", 2, t0+2), lt.CodeNotHolder)
			h.code(renew("s", "p2", 2, 1000, t0+2), lt.CodeNotHolder)
			r = h.ok(revoke("s", 0, t0+3))
			if !reflect.DeepEqual(r.Tokens, []uint64{1, 3, 4}) {
				t.Fatalf("tokens %v", r.Tokens)
			}
			if got := h.tb.List("", 0); len(got) != 0 {
				t.Fatalf("revoked lock kept: %+v", got)
			}
		}},
		{"revoke of a wrong token is not_holder; of a free lock []", func(t *testing.T, h *kinds) {
			h.granted(acq("a", "c1", 1000, 0, t0))
			for _, tok := range []uint64{2, 99} {
				if r := h.unchanged(revoke("a", tok, t0)); r.Code != lt.CodeNotHolder {
					t.Fatalf("token %d: %+v", tok, r)
				}
			}
			for _, c := range []lt.Command{revoke("free", 0, t0), revoke("free", 0, t0)} {
				r := h.unchanged(c)
				if r.Code != lt.OK || r.Tokens == nil || len(r.Tokens) != 0 {
					t.Fatalf("free lock: %+v, want ok and []", r)
				}
			}
			if r := h.unchanged(revoke("free", 1, t0)); r.Code != lt.CodeNotHolder {
				t.Fatalf("a token on a free lock: %+v", r)
			}
			// A lock with a multi-acquire waiting but no holder: nothing to revoke.
			h.queued(acqMany("m", 1000, 60000, t0, "a", "b"), -1)
			if r := h.unchanged(revoke("b", 0, t0)); r.Code != lt.OK || len(r.Tokens) != 0 {
				t.Fatalf("held by nobody: %+v", r)
			}
		}},

		// Values.
		{"values: set by the acquire, changed by the holder only", func(t *testing.T, h *kinds) {
			r := h.granted(withValue("10.0.0.1:7070", acq("leader", "c1", 1000, 0, t0)))
			if r.Events[0].Value != "10.0.0.1:7070" {
				t.Fatalf("grant event %+v: want the value", r.Events[0])
			}
			if li := h.tb.Get("leader"); li.Value != "10.0.0.1:7070" || li.Holders[0].Value != "10.0.0.1:7070" {
				t.Fatalf("status %+v", li)
			}
			r = h.ok(setValue("leader", "c1", 1, "10.0.0.1:7171", t0+1))
			wantEvs(t, "set value", r.Events, "value_set leader c1 1")
			if r.Events[0].Value != "10.0.0.1:7171" || h.tb.Get("leader").Value != "10.0.0.1:7171" || r.Token != 1 {
				t.Fatalf("set value: %+v, status %+v", r, h.tb.Get("leader"))
			}
			for _, c := range []lt.Command{
				setValue("leader", "c2", 1, "x", t0+2), // not the holder
				setValue("leader", "c1", 2, "x", t0+2), // wrong token
				setValue("other", "c1", 1, "x", t0+2),  // no such lock
			} {
				if r := h.unchanged(c); r.Code != lt.CodeNotHolder {
					t.Fatalf("%v: %+v, want not_holder", describe(c), r)
				}
			}
			if r := h.unchanged(setValue("leader", "c1", 1, strings.Repeat("v", lt.MaxValueBytes+1), t0+2)); r.Code != lt.CodeInvalid {
				t.Fatalf("value too long: %+v", r)
			}
			h.ok(setValue("leader", "c1", 1, strings.Repeat("v", lt.MaxValueBytes), t0+2))
			h.ok(setValue("leader", "c1", 1, "", t0+3)) // clearing it
			if li := h.tb.Get("leader"); li.Value != "" {
				t.Fatalf("status %+v", li)
			}
			if r := h.unchanged(withValue(strings.Repeat("v", lt.MaxValueBytes+1), acq("x", "c1", 1000, 0, t0))); r.Code != lt.CodeInvalid {
				t.Fatalf("acquire value too long: %+v", r)
			}
		}},
		{"a waiter's value goes with its grant", func(t *testing.T, h *kinds) {
			h.granted(withValue("one", acq("e", "c1", 1000, 0, t0)))
			h.queued(withValue("two", acq("e", "c2", 1000, 60000, t0)), 0)
			r := h.ok(rel("e", "c1", 1, t0+1))
			if g := r.Events[1]; g.Kind != lt.EvGranted || g.Value != "two" || h.tb.Get("e").Value != "two" {
				t.Fatalf("hand-off %+v, status %+v", r.Events, h.tb.Get("e"))
			}
		}},

		// The change index.
		{"ApplyAt records the index of every change on the lock it changed", func(t *testing.T, h *kinds) {
			index := func(lock string) uint64 { return h.tb.Get(lock).Index }
			want := func(lock string, idx uint64) {
				t.Helper()
				if got := index(lock); got != idx {
					t.Fatalf("index of %s: %d, want %d", lock, got, idx)
				}
			}
			h.ok(mkSess("s", "c9", 15000, t0))     // 1
			h.granted(acq("a", "c1", 1000, 0, t0)) // 2
			h.granted(acq("b", "c1", 1000, 0, t0)) // 3
			want("a", 2)
			want("b", 3)
			h.ok(renew("a", "c1", 1, 2000, t0+1)) // 4: renewal
			want("a", 4)
			want("b", 3)
			h.queued(acq("a", "w", 1000, 60000, t0), 0) // 5: queue change
			want("a", 5)
			h.queued(acq("a", "w", 1000, 70000, t0), 0) // 6: a retry moves the deadline
			want("a", 6)
			h.ok(setValue("a", "c1", 1, "v", t0+2)) // 7: value
			want("a", 7)
			h.code(rel("a", "c9", 1, t0+3), lt.CodeNotHolder) // 8: no change
			want("a", 7)
			h.granted(acq("a", "c1", 1000, 0, t0+4)) // 9: re-grant
			want("a", 9)
			h.ok(rel("a", "c1", 1, t0+5)) // 10: release and hand-off
			want("a", 10)
			h.granted(withDelay(100, acq("d", "c1", 50, 0, t0+5)))
			h.ok(expLock("d", 4, t0+55)) // 12: loss and delay
			want("d", 12)
			h.ok(endDelay("d", t0+100)) // 13: too early
			want("d", 12)
			h.queued(acqMany("m", 1000, 60000, t0+100, "b", "c"), -1) // 14: both queues
			want("b", 14)
			want("c", 14)
			h.ok(rel("b", "c1", 2, t0+101)) // 15: hand-off to m on b and c
			want("b", 15)
			want("c", 15)
			h.ok(endDelay("d", t0+155)) // 16: the delay ends, the lock goes
			want("d", 16)               // a lock with no state: the last change to any lock
			if h.tb.LastChange() != 16 {
				t.Fatalf("last change %d", h.tb.LastChange())
			}
			h.ok(revoke("c", 0, t0+200)) // 17
			want("b", 15)
			want("c", 17)
			// The index survives a snapshot.
			back, err := lt.Restore(h.tb.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			if back.Get("b").Index != 15 || back.LastChange() != 17 {
				t.Fatalf("restored: index %d, last change %d", back.Get("b").Index, back.LastChange())
			}
		}},

		// Invalid kinds.
		{"acquire refusals for the kinds' fields", func(t *testing.T, h *kinds) {
			for name, c := range map[string]lt.Command{
				"an unknown mode":    {Op: lt.OpAcquire, Now: t0, Lock: "a", ClientID: "c", TTLms: 1000, Mode: 2},
				"a negative limit":   withLimit(-1, acq("a", "c", 1000, 0, t0)),
				"a limit too large":  withLimit(lt.MaxLimit+1, acq("a", "c", 1000, 0, t0)),
				"a negative delay":   withDelay(-1, acq("a", "c", 1000, 0, t0)),
				"a delay too long":   withDelay(lt.MaxLockDelayMs+1, acq("a", "c", 1000, 0, t0)),
				"a value too long":   withValue(strings.Repeat("v", lt.MaxValueBytes+1), acq("a", "c", 1000, 0, t0)),
				"shared, limit 2":    shared(withLimit(2, acq("a", "c", 1000, 0, t0))),
				"shared, limit 1000": shared(withLimit(1000, acq("a", "c", 1000, 0, t0))),
			} {
				if r := h.unchanged(c); r.Code != lt.CodeInvalid {
					t.Fatalf("%s: %+v, want invalid", name, r)
				}
			}
			h.granted(withLimit(lt.MaxLimit, withDelay(lt.MaxLockDelayMs, acq("a", "c", 1000, 0, t0))))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newKinds(t)) })
	}
}
