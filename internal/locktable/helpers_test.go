package locktable_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// t0 is an arbitrary wall-clock base (unix ms) for hand-written logs.
const t0 int64 = 1_700_000_000_000

// Command builders: short names keep the scenario tables readable.

func acq(lock, client string, ttl, wait, now int64) lt.Command {
	return lt.Command{Op: lt.OpAcquire, Now: now, Lock: lock, ClientID: client, TTLms: ttl, WaitMs: wait}
}

func acqS(lock, client, sess string, ttl, wait, now int64) lt.Command {
	c := acq(lock, client, ttl, wait, now)
	c.SessionID = sess
	return c
}

func rel(lock, client string, tok uint64, now int64) lt.Command {
	return lt.Command{Op: lt.OpRelease, Now: now, Lock: lock, ClientID: client, Token: tok}
}

func renew(lock, client string, tok uint64, ttl, now int64) lt.Command {
	return lt.Command{Op: lt.OpRenew, Now: now, Lock: lock, ClientID: client, Token: tok, TTLms: ttl}
}

func expLock(lock string, tok uint64, now int64) lt.Command {
	return lt.Command{Op: lt.OpExpireLock, Now: now, Lock: lock, Token: tok}
}

func tmo(lock, client string, now int64) lt.Command {
	return lt.Command{Op: lt.OpTimeoutWaiter, Now: now, Lock: lock, ClientID: client}
}

func mkSess(id, client string, ttl, now int64) lt.Command {
	return lt.Command{Op: lt.OpCreateSession, Now: now, SessionID: id, ClientID: client, TTLms: ttl}
}

func delSess(id string, now int64) lt.Command {
	return lt.Command{Op: lt.OpDeleteSession, Now: now, SessionID: id}
}

func expSess(id string, now int64) lt.Command {
	return lt.Command{Op: lt.OpExpireSession, Now: now, SessionID: id}
}

func setMember(id, raft, http string, now int64) lt.Command {
	return lt.Command{Op: lt.OpSetMember, Now: now, MemberID: id, RaftAddr: raft, HTTPAddr: http}
}

func rmMember(id string, now int64) lt.Command {
	return lt.Command{Op: lt.OpRemoveMember, Now: now, MemberID: id}
}

// Event builders.

func evGranted(lock, client, sess string, tok uint64, ttl, exp int64) lt.Event {
	return lt.Event{Kind: lt.EvGranted, Lock: lock, ClientID: client, SessionID: sess, Token: tok, TTLms: ttl, ExpiresAt: exp}
}

func evQueued(lock, client, sess string, deadline int64) lt.Event {
	return lt.Event{Kind: lt.EvQueued, Lock: lock, ClientID: client, SessionID: sess, Deadline: deadline}
}

func evReleased(lock, client, sess string, tok uint64) lt.Event {
	return lt.Event{Kind: lt.EvReleased, Lock: lock, ClientID: client, SessionID: sess, Token: tok}
}

func evLost(lock, client, sess string, tok uint64, reason string) lt.Event {
	return lt.Event{Kind: lt.EvLost, Lock: lock, ClientID: client, SessionID: sess, Token: tok, Reason: reason}
}

func evWaitEnded(lock, client, sess, reason string) lt.Event {
	return lt.Event{Kind: lt.EvWaitEnded, Lock: lock, ClientID: client, SessionID: sess, Reason: reason}
}

func evSessionEnded(id, client, reason string) lt.Event {
	return lt.Event{Kind: lt.EvSessionEnded, SessionID: id, ClientID: client, Reason: reason}
}

// harness applies commands to one table and checks the structural
// invariants after every command, so every scenario test also proves them.
type harness struct {
	t    *testing.T
	tb   *lt.Table
	last uint64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{t: t, tb: lt.New()}
}

// do applies c and checks the invariants.
func (h *harness) do(c lt.Command) lt.Result {
	h.t.Helper()
	r := h.tb.Apply(c)
	if err := checkInvariants(h.tb, h.last); err != nil {
		h.t.Fatalf("after %v: %v", describe(c), err)
	}
	h.last = h.tb.LastToken()
	return r
}

// ok applies c and fails the test unless it succeeded.
func (h *harness) ok(c lt.Command) lt.Result {
	h.t.Helper()
	r := h.do(c)
	if r.Code != lt.OK {
		h.t.Fatalf("%v: code %v, want ok", describe(c), r.Code)
	}
	return r
}

// unchanged applies c and fails unless the table's snapshot is byte-for-byte
// what it was and the result carries no event. It returns the result.
func (h *harness) unchanged(c lt.Command) lt.Result {
	h.t.Helper()
	before := h.tb.Snapshot()
	r := h.do(c)
	if after := h.tb.Snapshot(); !bytes.Equal(before, after) {
		h.t.Fatalf("%v changed the table (result %+v)", describe(c), r)
	}
	if len(r.Events) != 0 {
		h.t.Fatalf("%v: events %+v, want none", describe(c), r.Events)
	}
	return r
}

// checkInvariants checks what must hold after every command, through the
// public API only.
func checkInvariants(tb *lt.Table, prevLast uint64) error {
	if tb.LastToken() < prevLast {
		return fmt.Errorf("LastToken went back from %d to %d", prevLast, tb.LastToken())
	}
	if err := lt.CheckCounters(tb); err != nil {
		return err
	}
	tokens := map[uint64]string{}
	for _, li := range tb.List("", 0) {
		ws := tb.Waiters(li.Name)
		// Hand-off happens in the step that frees a lock and empty locks are
		// dropped, so every lock that exists is held, unless a lock-delay
		// runs or a multi-acquire heads its queue (waiting for its other
		// locks).
		if !li.Held && li.DelayedUntil == 0 && (len(ws) == 0 || ws[0].Locks == nil) {
			return fmt.Errorf("lock %q exists but is free (waiters %d)", li.Name, li.Waiters)
		}
		if li.Held != (len(li.Holders) > 0) || (li.Held && li.Token != li.Holders[0].Token) {
			return fmt.Errorf("lock %q: Held %v, token %d, holders %+v", li.Name, li.Held, li.Token, li.Holders)
		}
		seen := map[string]bool{}
		for _, h := range li.Holders {
			if h.Token == 0 || h.Token > tb.LastToken() {
				return fmt.Errorf("lock %q token %d outside (0, %d]", li.Name, h.Token, tb.LastToken())
			}
			if other, dup := tokens[h.Token]; dup {
				return fmt.Errorf("token %d held on %q and %q", h.Token, other, li.Name)
			}
			tokens[h.Token] = li.Name
			if h.SessionID != "" {
				if _, ok := tb.Session(h.SessionID); !ok {
					return fmt.Errorf("lock %q held by %q via missing session %q", li.Name, h.ClientID, h.SessionID)
				}
			} else if h.TTLms <= 0 {
				return fmt.Errorf("lock %q held by %q with neither a session nor a TTL: %+v", li.Name, h.ClientID, li)
			}
			if seen[h.ClientID] {
				return fmt.Errorf("lock %q: client %q holds it twice", li.Name, h.ClientID)
			}
			seen[h.ClientID] = true
		}
		if len(ws) != li.Waiters {
			return fmt.Errorf("lock %q: Get says %d waiters, Waiters says %d", li.Name, li.Waiters, len(ws))
		}
		for _, w := range ws {
			if seen[w.ClientID] {
				return fmt.Errorf("lock %q: client %q is holder or queued twice", li.Name, w.ClientID)
			}
			seen[w.ClientID] = true
			if w.SessionID != "" {
				if _, ok := tb.Session(w.SessionID); !ok {
					return fmt.Errorf("lock %q: waiter %q still queued via ended session %q", li.Name, w.ClientID, w.SessionID)
				}
			}
		}
	}
	return nil
}

func describe(c lt.Command) string {
	if c.Op == lt.OpBatch {
		parts := make([]string, len(c.Batch))
		for i, s := range c.Batch {
			parts[i] = describe(s)
		}
		return "batch[" + strings.Join(parts, "; ") + "]"
	}
	var f []string
	add := func(k string, v any, set bool) {
		if set {
			f = append(f, fmt.Sprintf("%s=%v", k, v))
		}
	}
	add("lock", c.Lock, c.Lock != "")
	add("client", c.ClientID, c.ClientID != "")
	add("session", c.SessionID, c.SessionID != "")
	add("token", c.Token, c.Token != 0)
	add("ttl", c.TTLms, c.TTLms != 0)
	add("wait", c.WaitMs, c.WaitMs != 0)
	add("member", c.MemberID, c.MemberID != "")
	add("mode", c.Mode, c.Mode != lt.Exclusive)
	add("limit", c.Limit, c.Limit != 0)
	add("delay", c.DelayMs, c.DelayMs != 0)
	add("value", fmt.Sprintf("%q", c.Value), c.Value != "")
	add("locks", c.Locks, len(c.Locks) > 0)
	add("now", c.Now, true)
	return fmt.Sprintf("%v{%s}", c.Op, strings.Join(f, " "))
}

func wantEvents(t *testing.T, what string, got, want []lt.Event) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	// An EvWaitEnded names the wait that ended by its deadline; tables that
	// do not set one in want compare without it (TestWaitEndedNamesItsWait
	// checks it).
	got = append([]lt.Event(nil), got...)
	for i := range got {
		if i < len(want) && got[i].Kind == lt.EvWaitEnded && want[i].Deadline == 0 {
			got[i].Deadline = 0
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: events\n got  %+v\n want %+v", what, got, want)
	}
}

func wantInfo(t *testing.T, tb *lt.Table, want lt.LockInfo) {
	t.Helper()
	// The fields of an exclusive lock's status; the lock kinds' own tests
	// check holders, limits and indexes.
	got := tb.Get(want.Name)
	got.Holders, got.Index, got.HoldersTotal = nil, 0, 0
	if want.Limit == 0 {
		got.Limit = 0
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Get(%q)\n got  %+v\n want %+v", want.Name, got, want)
	}
}

func waiterClients(tb *lt.Table, lock string) []string {
	var out []string
	for _, w := range tb.Waiters(lock) {
		out = append(out, w.ClientID)
	}
	return out
}

// snapWriter writes the snapshot format by hand, so tests can build states
// (and corruptions) that no command log produces. It mirrors snapshot.go on
// purpose: a change to the format must show up here as a failing test.
type snapWriter struct{ b []byte }

func newSnapWriter(version byte, lastToken uint64) *snapWriter {
	w := &snapWriter{b: []byte("LOCKDSNP")}
	w.byte(version)
	w.uvarint(lastToken)
	return w
}

func (w *snapWriter) byte(v byte)      { w.b = append(w.b, v) }
func (w *snapWriter) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *snapWriter) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *snapWriter) str(s string)     { w.uvarint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *snapWriter) strs(ss ...string) {
	for _, s := range ss {
		w.str(s)
	}
}

// ForEach* visit in no particular order; tests read them sorted.
func sortedHeld(tb *lt.Table) []lt.LockInfo {
	var out []lt.LockInfo
	seen := map[string]bool{}
	tb.ForEachHolder(func(name string, _ lt.Holder) {
		if !seen[name] {
			seen[name] = true
			out = append(out, tb.Get(name))
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func sortedWaiters(tb *lt.Table) []lt.WaiterInfo {
	var out []lt.WaiterInfo
	tb.ForEachWaiter(func(w lt.WaiterInfo) { out = append(out, w) })
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Lock != out[j].Lock {
			return out[i].Lock < out[j].Lock
		}
		return out[i].Position < out[j].Position
	})
	return out
}

func sortedSessions(tb *lt.Table) []lt.Session {
	var out []lt.Session
	tb.ForEachSession(func(s lt.Session) { out = append(out, s) })
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
