package locktable_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	lt "github.com/lockd/lockd/internal/locktable"
)

// owned sets the owner identity and quotas of a command, as the leader
// does for a request that came with that token.
func owned(c lt.Command, owner string, q lt.Quotas) lt.Command {
	c.Owner, c.Quotas = owner, q
	return c
}

// exhausted applies c and fails unless it is refused for quota q with
// nothing changed.
func (h *harness) exhausted(c lt.Command, q lt.Quota) {
	h.t.Helper()
	r := h.unchanged(c)
	if r.Code != lt.CodeResourceExhausted || r.Quota != q || r.QuotaLimit != c.Quotas.Limit(q) {
		h.t.Fatalf("%v: %v quota %v (limit %d), want resource_exhausted on %v", describe(c), r.Code, r.Quota, r.QuotaLimit, q)
	}
	if err := lt.CheckCounters(h.tb); err != nil {
		h.t.Fatal(err)
	}
}

// TestQuotas: each quota refuses the command that would go past it, with
// nothing changed, and names itself; retries of what is already there and
// hand-offs are never refused; 0 means no limit.
func TestQuotas(t *testing.T) {
	t.Run("sessions in the cluster", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{Sessions: 2}
		h.ok(owned(mkSess("s1", "c1", 15000, t0), "a", q))
		h.ok(owned(mkSess("s2", "c2", 15000, t0), "b", q))
		h.exhausted(owned(mkSess("s3", "c3", 15000, t0), "c", q), lt.QuotaSessions)
		h.unchanged(owned(mkSess("s2", "c2", 15000, t0), "b", q)) // a retried create finds its session
		h.ok(delSess("s1", t0))
		h.ok(owned(mkSess("s3", "c3", 15000, t0), "c", q))
		h.ok(owned(mkSess("s4", "c4", 15000, t0), "c", lt.Quotas{})) // no limit
	})
	t.Run("sessions per owner", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{Sessions: 100, SessionsPerOwner: 2}
		h.ok(owned(mkSess("a1", "c", 15000, t0), "alice", q))
		h.ok(owned(mkSess("a2", "c", 15000, t0), "alice", q))
		h.exhausted(owned(mkSess("a3", "c", 15000, t0), "alice", q), lt.QuotaSessionsPerOwner)
		h.ok(owned(mkSess("b1", "c", 15000, t0), "bob", q)) // another tenant is not starved
		h.ok(expSess("a1", t0+15000))
		h.ok(owned(mkSess("a3", "c", 15000, t0), "alice", q))
		if s, ok := h.tb.Session("a3"); !ok || s.Owner != "alice" {
			t.Fatalf("session a3: %+v, want owner alice", s)
		}
	})
	t.Run("locks in the table", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{Locks: 2}
		h.ok(owned(acq("a", "c1", 1000, 0, t0), "", q))
		h.ok(owned(acq("b", "c1", 1000, 0, t0), "", q))
		h.exhausted(owned(acq("c", "c1", 1000, 0, t0), "", q), lt.QuotaLocks)
		h.exhausted(owned(acq("c", "c1", 1000, 5000, t0), "", q), lt.QuotaLocks)
		h.ok(owned(acq("a", "c2", 1000, 5000, t0), "", q)) // waiting on a lock that exists adds none
		h.ok(owned(acq("a", "c1", 1000, 0, t0), "", q))    // the holder re-acquires
		h.ok(rel("b", "c1", 2, t0))
		h.ok(owned(acq("c", "c1", 1000, 0, t0), "", q))
	})
	t.Run("waiters per lock", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{WaitersPerLock: 2}
		h.ok(owned(acq("x", "holder", 1000, 0, t0), "", q))
		h.ok(owned(acq("x", "w1", 1000, 5000, t0), "", q))
		h.ok(owned(acq("x", "w2", 1000, 5000, t0), "", q))
		h.exhausted(owned(acq("x", "w3", 1000, 5000, t0), "", q), lt.QuotaWaitersPerLock)
		if r := h.ok(owned(acq("x", "w2", 1000, 9000, t0), "", q)); !r.Queued || r.Position != 1 {
			t.Fatalf("waiter retry at the limit: %+v", r)
		}
		h.ok(owned(acq("y", "w3", 1000, 5000, t0), "", q)) // another lock has room
		// A try of a held lock is lock_held, not a quota matter.
		if r := h.unchanged(owned(acq("x", "w3", 1000, 0, t0), "", q)); r.Code != lt.CodeLockHeld {
			t.Fatalf("try: %v", r.Code)
		}
		h.ok(rel("x", "holder", 1, t0+1)) // hand-off to w1 is never refused
		if got := h.tb.Get("x"); got.ClientID != "w1" || got.Waiters != 1 {
			t.Fatalf("after hand-off: %+v", got)
		}
		h.ok(owned(acq("x", "w3", 1000, 5000, t0+1), "", q))
	})
	t.Run("locks and waits per session", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{LocksPerSession: 2}
		h.ok(mkSess("s", "c", 15000, t0))
		h.ok(mkSess("other", "d", 15000, t0))
		h.ok(owned(acq("held", "x", 1000, 0, t0), "", q))
		h.ok(owned(acqS("a", "c", "s", 0, 0, t0), "", q))       // a hold
		h.ok(owned(acqS("held", "c", "s", 0, 5000, t0), "", q)) // a wait
		if n := h.tb.SessionUsage("s"); n != 2 {
			t.Fatalf("session usage %d, want 2", n)
		}
		h.exhausted(owned(acqS("b", "c", "s", 0, 0, t0), "", q), lt.QuotaLocksPerSession)
		h.exhausted(owned(acqS("held", "c2", "s", 0, 5000, t0), "", q), lt.QuotaLocksPerSession)
		h.ok(owned(acqS("a", "c", "s", 0, 0, t0), "", q))       // the holder re-acquires
		h.ok(owned(acqS("held", "c", "s", 0, 9000, t0), "", q)) // the waiter retries
		h.ok(owned(acqS("b", "d", "other", 0, 0, t0), "", q))   // another session has room
		h.ok(owned(acq("b2", "c", 1000, 0, t0), "", q))         // without the session: not its quota
		h.ok(rel("held", "x", 1, t0+1))                         // hand-off: the wait becomes a hold
		if n := h.tb.SessionUsage("s"); n != 2 || h.tb.Get("held").ClientID != "c" {
			t.Fatalf("after hand-off: session usage %d, holder %q", n, h.tb.Get("held").ClientID)
		}
		h.ok(delSess("s", t0+2))
		if n := h.tb.SessionUsage("s"); n != 0 {
			t.Fatalf("ended session usage %d", n)
		}
	})
	t.Run("locks and waits per owner", func(t *testing.T) {
		h := newHarness(t)
		q := lt.Quotas{LocksPerOwner: 3}
		h.ok(owned(mkSess("s", "c", 15000, t0), "alice", q))
		h.ok(owned(acq("a", "c1", 1000, 0, t0), "alice", q))
		h.ok(owned(acqS("b", "c2", "s", 0, 0, t0), "alice", q))
		h.ok(owned(acq("b", "c3", 1000, 5000, t0), "alice", q))
		if _, n := h.tb.OwnerUsage("alice"); n != 3 {
			t.Fatalf("alice's usage %d, want 3", n)
		}
		h.exhausted(owned(acq("c", "c4", 1000, 0, t0), "alice", q), lt.QuotaLocksPerOwner)
		h.exhausted(owned(acq("a", "c4", 1000, 5000, t0), "alice", q), lt.QuotaLocksPerOwner)
		h.ok(owned(acq("c", "c4", 1000, 0, t0), "bob", q)) // another tenant is not starved
		h.ok(expLock("a", 1, t0+1000))
		h.ok(owned(acq("c", "c5", 1000, 5000, t0+1000), "alice", q))
		if got := h.tb.Waiters("c"); len(got) != 1 || got[0].Owner != "alice" {
			t.Fatalf("waiters %+v, want one of alice", got)
		}
		if _, n := h.tb.OwnerUsage("bob"); n != 1 {
			t.Fatalf("bob's usage %d, want 1", n)
		}
	})
	t.Run("the order of the checks", func(t *testing.T) {
		h := newHarness(t)
		// A malformed acquire and a dead session are answered as before.
		q := lt.Quotas{Locks: 1, LocksPerOwner: 1}
		h.ok(owned(acq("a", "c", 1000, 0, t0), "o", q))
		if r := h.unchanged(owned(acq("b", "c", 0, 0, t0), "o", q)); r.Code != lt.CodeInvalid {
			t.Fatalf("malformed: %v", r.Code)
		}
		if r := h.unchanged(owned(acqS("b", "c", "gone", 0, 0, t0), "o", q)); r.Code != lt.CodeSessionExpired {
			t.Fatalf("dead session: %v", r.Code)
		}
		h.exhausted(owned(acq("b", "c", 1000, 0, t0), "o", q), lt.QuotaLocks)
	})
}

// TestOwnerRecorded: sessions, holders and waiters keep the owner of the
// command that made them, hand-off carries it from waiter to holder, and
// snapshots keep it.
func TestOwnerRecorded(t *testing.T) {
	h := newHarness(t)
	h.ok(owned(mkSess("s", "c", 15000, t0), "alice", lt.Quotas{}))
	h.ok(owned(acqS("x", "c", "s", 0, 0, t0), "alice", lt.Quotas{}))
	h.ok(owned(acq("x", "w", 1000, 5000, t0), "bob", lt.Quotas{}))
	if s, _ := h.tb.Session("s"); s.Owner != "alice" {
		t.Fatalf("session owner %q", s.Owner)
	}
	if w := h.tb.Waiters("x"); len(w) != 1 || w[0].Owner != "bob" {
		t.Fatalf("waiters %+v", w)
	}
	back, err := lt.Restore(h.tb.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := lt.CheckCounters(back); err != nil {
		t.Fatal(err)
	}
	if a, b := view(h.tb), view(back); !reflect.DeepEqual(a, b) {
		t.Fatalf("restored table reads differently:\n %+v\n %+v", a, b)
	}
	for _, tb := range []*lt.Table{h.tb, back} {
		tb.Apply(delSess("s", t0+1))
		if s, n := tb.OwnerUsage("bob"); s != 0 || n != 1 {
			t.Fatalf("bob holds %d sessions, %d locks after the hand-off; want 0, 1", s, n)
		}
		if s, n := tb.OwnerUsage("alice"); s != 0 || n != 0 {
			t.Fatalf("alice holds %d sessions, %d locks after her session ended", s, n)
		}
	}
	if !bytes.Equal(h.tb.Snapshot(), back.Snapshot()) {
		t.Fatal("restored table diverged")
	}
}

// TestRestoreFormat1: a snapshot written before owners were recorded
// (format 1) still restores, with every owner "" and the counters right,
// and snapshots again in the current format.
func TestRestoreFormat1(t *testing.T) {
	w := newSnapWriter(1, 7)
	w.uvarint(1) // sessions
	w.strs("s", "c")
	w.varint(15000)
	w.varint(t0)
	w.uvarint(2) // locks
	w.str("a")
	w.byte(1)
	w.strs("c", "s")
	w.uvarint(6)
	w.varint(0)
	w.varint(0)
	w.varint(t0)
	w.uvarint(1) // a's waiters
	w.strs("w", "")
	w.varint(1000)
	w.varint(t0 + 5000)
	w.varint(t0)
	w.str("b")
	w.byte(1)
	w.strs("d", "")
	w.uvarint(7)
	w.varint(1000)
	w.varint(t0 + 1000)
	w.varint(t0)
	w.uvarint(1) // b's waiters
	w.strs("c", "s")
	w.varint(0)
	w.varint(t0 + 5000)
	w.varint(t0)
	w.uvarint(0) // members
	w.uvarint(0) // memo
	tb, err := lt.Restore(w.b)
	if err != nil {
		t.Fatal(err)
	}
	if err := lt.CheckCounters(tb); err != nil {
		t.Fatal(err)
	}
	if s, ok := tb.Session("s"); !ok || s.Owner != "" || tb.SessionUsage("s") != 2 {
		t.Fatalf("session %+v, usage %d", s, tb.SessionUsage("s"))
	}
	if s, n := tb.OwnerUsage(""); s != 1 || n != 4 {
		t.Fatalf("owner \"\": %d sessions, %d locks; want 1, 4", s, n)
	}
	s2 := tb.Snapshot()
	if s2[8] != 3 {
		t.Fatalf("re-snapshot in format %d", s2[8])
	}
	back, err := lt.Restore(s2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(view(tb), view(back)) || !bytes.Equal(back.Snapshot(), s2) {
		t.Fatal("format 1 -> 3 -> restore changed the table")
	}
	// The FuzzRestore seeds written in format 1 still restore.
	for _, name := range []string{"seed-busy", "seed-rich", "seed-empty"} {
		b := readSeed(t, "FuzzRestore", name)
		if b[8] != 1 {
			t.Fatalf("%s is format %d; this test wants format 1 seeds", name, b[8])
		}
		tb, err := lt.Restore(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := lt.CheckCounters(tb); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// TestRestoreRejectsDuplicates: a snapshot naming a session or a lock twice
// is corrupt (Snapshot writes each once; counting them twice would break
// the quota counts).
func TestRestoreRejectsDuplicates(t *testing.T) {
	dupSession := newSnapWriter(2, 0)
	dupSession.uvarint(2)
	for i := 0; i < 2; i++ {
		dupSession.strs("s", "c", "o")
		dupSession.varint(15000)
		dupSession.varint(t0)
	}
	dupSession.uvarint(0)
	dupSession.uvarint(0)
	dupSession.uvarint(0)

	dupLock := newSnapWriter(2, 1)
	dupLock.uvarint(0)
	dupLock.uvarint(2)
	for i := 0; i < 2; i++ {
		dupLock.str("a")
		dupLock.byte(1)
		dupLock.strs("c", "", "o")
		dupLock.uvarint(1)
		dupLock.varint(1000)
		dupLock.varint(t0)
		dupLock.varint(t0)
		dupLock.uvarint(0)
	}
	dupLock.uvarint(0)
	dupLock.uvarint(0)
	for name, b := range map[string][]byte{"session": dupSession.b, "lock": dupLock.b} {
		if _, err := lt.Restore(b); err == nil {
			t.Errorf("a %s listed twice restored", name)
		}
	}
}

// TestRestoreOrdersLocks: the lock index is loaded from the snapshot's
// list in one go; a list out of name order (Snapshot writes name order,
// but a backup is outside input) is sorted first, every lock is then
// found by name and listed in order, and a name listed twice apart from
// itself is still refused.
func TestRestoreOrdersLocks(t *testing.T) {
	snap := func(names ...string) []byte {
		w := newSnapWriter(2, uint64(len(names)))
		w.uvarint(0) // no sessions
		w.uvarint(uint64(len(names)))
		for i, n := range names {
			w.str(n)
			w.byte(1)
			w.strs("c", "", "o")
			w.uvarint(uint64(i + 1))
			w.varint(1000)
			w.varint(t0)
			w.varint(t0)
			w.uvarint(0)
		}
		w.uvarint(0)
		w.uvarint(0)
		return w.b
	}
	tb, err := lt.Restore(snap("c", "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"c", "a", "b"} {
		if st := tb.Get(n); !st.Held || st.Token != uint64(i+1) {
			t.Fatalf("lock %s after restore: %+v", n, st)
		}
	}
	var names []string
	for _, li := range tb.List("", 0) {
		names = append(names, li.Name)
	}
	if strings.Join(names, ",") != "a,b,c" {
		t.Fatalf("listed %v", names)
	}
	if err := lt.CheckInvariants(tb); err != nil {
		t.Fatal(err)
	}
	if _, err := lt.Restore(snap("a", "b", "a")); err == nil {
		t.Fatal("a lock listed twice, apart, restored")
	}
}

var (
	pOwners = []string{"", "alice", "bob"}
	pLimits = []int64{0, 0, 1, 2, 3}
)

func (g *gen) quotas(t *rapid.T) lt.Quotas {
	d := func(label string) int64 { return rapid.SampledFrom(pLimits).Draw(t, label) }
	return lt.Quotas{Sessions: d("qSessions"), SessionsPerOwner: d("qSessionsPerOwner"), Locks: d("qLocks"),
		WaitersPerLock: d("qWaitersPerLock"), LocksPerSession: d("qLocksPerSession"), LocksPerOwner: d("qLocksPerOwner"),
		Grants:     rapid.SampledFrom([]int64{0, 0, 2, 4, 6}).Draw(t, "qGrants"),
		ValueBytes: rapid.SampledFrom([]int64{0, 0, 2, 4, 8}).Draw(t, "qValueBytes")}
}

// owned gives acquires and session creates an owner and small quotas, so
// that quotas bite often.
func (g *gen) owned(t *rapid.T, c lt.Command) lt.Command {
	switch c.Op {
	case lt.OpAcquire, lt.OpCreateSession:
		return owned(c, rapid.SampledFrom(pOwners).Draw(t, "owner"), g.quotas(t))
	case lt.OpBatch:
		for i := range c.Batch {
			c.Batch[i] = g.owned(t, c.Batch[i])
		}
	}
	return c
}

// counts are the numbers the quotas bound, as the read API shows them.
type counts struct {
	sessions, locks, waiters, session int
	grants, valueBytes                int
	ownerSessions, ownerLocks         int
}

func countsFor(tb *lt.Table, c lt.Command) counts {
	locks, sessions := tb.Size()
	k := counts{sessions: sessions, locks: locks, waiters: len(tb.Waiters(c.Lock)), session: tb.SessionUsage(c.SessionID)}
	k.ownerSessions, k.ownerLocks = tb.OwnerUsage(c.Owner)
	st := tb.Stats()
	k.grants, k.valueBytes = st.Holders+st.Waiters, int(st.ValueBytes)
	return k
}

// grewPast reports a count that c made grow beyond the quota it carried.
func grewPast(c lt.Command, before, after counts) error {
	q := c.Quotas
	for _, x := range []struct {
		quota         lt.Quota
		before, after int
	}{
		{lt.QuotaSessions, before.sessions, after.sessions},
		{lt.QuotaSessionsPerOwner, before.ownerSessions, after.ownerSessions},
		{lt.QuotaLocks, before.locks, after.locks},
		{lt.QuotaWaitersPerLock, before.waiters, after.waiters},
		{lt.QuotaLocksPerSession, before.session, after.session},
		{lt.QuotaLocksPerOwner, before.ownerLocks, after.ownerLocks},
		{lt.QuotaGrants, before.grants, after.grants},
		{lt.QuotaValueBytes, before.valueBytes, after.valueBytes},
	} {
		if lim := q.Limit(x.quota); lim > 0 && x.after > x.before && int64(x.after) > lim {
			return fmt.Errorf("%v grew from %d to %d, past its limit %d", x.quota, x.before, x.after, lim)
		}
	}
	return nil
}

// TestPropertyQuotaCounters drives the table with random commands carrying
// owners and small quotas. After every command the incremental counters
// must equal a recount of the whole table, on the table and on a copy
// restored from its snapshot at a random step; a refusal must change
// nothing; and no acquire or session create may grow a count past the
// quota it carries.
func TestPropertyQuotaCounters(t *testing.T) {
	refusals := 0
	rapid.Check(t, func(t *rapid.T) {
		tb := lt.New()
		g := &gen{tb: tb, now: t0}
		n := rapid.IntRange(50, 400).Draw(t, "steps")
		restoreAt := rapid.IntRange(0, n).Draw(t, "restoreAt")
		var clone *lt.Table
		for i := 0; i < n; i++ {
			if i == restoreAt {
				var err error
				if clone, err = lt.Restore(tb.Snapshot()); err != nil {
					t.Fatalf("restore at step %d: %v", i, err)
				}
				if err := lt.CheckCounters(clone); err != nil {
					t.Fatalf("restored at step %d: %v", i, err)
				}
			}
			g.advance(t)
			c := g.owned(t, g.command(t, true))
			before, snap := countsFor(tb, c), tb.Snapshot()
			r := tb.Apply(c)
			if err := lt.CheckCounters(tb); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			if c.Op != lt.OpBatch {
				if err := grewPast(c, before, countsFor(tb, c)); err != nil {
					t.Fatalf("step %d %v: %v", i, describe(c), err)
				}
			}
			if r.Code == lt.CodeResourceExhausted {
				refusals++
				if err := refusedChangedNothing(c, r, snap, tb); err != nil {
					t.Fatalf("step %d %v: %v", i, describe(c), err)
				}
			}
			if clone != nil {
				if r2 := clone.Apply(c); !reflect.DeepEqual(r, r2) {
					t.Fatalf("step %d %v: restored table answers differently\n orig     %+v\n restored %+v", i, describe(c), r, r2)
				}
				if err := lt.CheckCounters(clone); err != nil {
					t.Fatalf("step %d %v: restored table: %v", i, describe(c), err)
				}
			}
		}
		back, err := lt.Restore(tb.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := lt.CheckCounters(back); err != nil {
			t.Fatalf("restored at the end: %v", err)
		}
		if clone != nil && !bytes.Equal(clone.Snapshot(), tb.Snapshot()) {
			t.Fatal("restored table diverged")
		}
	})
	if refusals == 0 {
		t.Fatal("no command was refused: the quotas never bit, so the test proved little")
	}
}

// readSeed reads one []byte value from a file of the fuzz corpus format
// ("go test fuzz v1" and one []byte("...") line).
func readSeed(t *testing.T, target, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "fuzz", target, name))
	if err != nil {
		t.Fatal(err)
	}
	header, body, _ := strings.Cut(string(raw), "\n")
	lit, ok := strings.CutPrefix(strings.TrimSpace(body), "[]byte(")
	if header != "go test fuzz v1" || !ok || !strings.HasSuffix(lit, ")") {
		t.Fatalf("%s/%s: not a one-value corpus file", target, name)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	if err != nil {
		t.Fatalf("%s/%s: %v", target, name, err)
	}
	return []byte(s)
}

// TestGrantAndValueQuotas (SPEC 16): grants held plus waits queued, and the
// bytes of their values, count against cluster quotas; a refusal changes
// nothing and names the quota; hand-offs are never refused; what adds no
// value bytes is never refused by the value quota, even above it.
func TestGrantAndValueQuotas(t *testing.T) {
	q := lt.Quotas{Grants: 3, ValueBytes: 10}
	h := newHarness(t)
	// A semaphore's holders each count.
	for i := 0; i < 3; i++ {
		h.ok(owned(withLimit(5, acq("sem", fmt.Sprintf("c%d", i), 10_000, 0, t0)), "", q))
	}
	h.exhausted(owned(withLimit(5, acq("sem", "c3", 10_000, 0, t0)), "", q), lt.QuotaGrants)
	h.exhausted(owned(acq("other", "c3", 10_000, 60_000, t0), "", q), lt.QuotaGrants) // a wait counts too
	// A retry of what exists is never refused.
	h.ok(owned(withLimit(5, acq("sem", "c0", 10_000, 0, t0+1)), "", q))
	h.ok(rel("sem", "c0", 1, t0+2))

	// Values.
	h = newHarness(t)
	h.ok(owned(withValue("12345678", acq("v", "a", 10_000, 0, t0)), "", q))
	h.exhausted(owned(withValue("123", acq("w", "b", 10_000, 0, t0)), "", q), lt.QuotaValueBytes)
	h.ok(owned(acq("w", "b", 10_000, 0, t0), "", q)) // no value: no bytes added
	set := setValue("v", "a", 1, "1234567890x", t0+1)
	set.Quotas = q
	h.exhausted(set, lt.QuotaValueBytes)
	set.Value = "1234567890" // exactly the quota
	h.ok(set)
	// A multi-acquire counts its value once per lock.
	h = newHarness(t)
	m := owned(withValue("abcdef", acqMany("m", 10_000, 0, t0, "x", "y")), "", q)
	h.exhausted(m, lt.QuotaValueBytes)
	m.Value = "abcde"
	h.ok(m)
	if st := h.tb.Stats(); st.ValueBytes != 10 || st.Holders != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestClusterUse: every quota is listed once, in field order; the
// cluster-wide ones report the count their check uses (the quota refuses
// exactly when the use reaches the limit), the per-key ones report none.
func TestClusterUse(t *testing.T) {
	want := []lt.Quota{lt.QuotaSessions, lt.QuotaSessionsPerOwner, lt.QuotaLocks, lt.QuotaWaitersPerLock,
		lt.QuotaLocksPerSession, lt.QuotaLocksPerOwner, lt.QuotaGrants, lt.QuotaValueBytes}
	if got := lt.QuotaList(); !reflect.DeepEqual(got, want) {
		t.Fatalf("QuotaList() = %v, want %v", got, want)
	}
	h := newHarness(t)
	q := lt.Quotas{Sessions: 2, Locks: 3}
	use := func(quota lt.Quota) int64 {
		t.Helper()
		n, ok := h.tb.ClusterUse(quota)
		if !ok {
			t.Fatalf("%v: no cluster use", quota)
		}
		return n
	}
	h.ok(owned(mkSess("s1", "c1", 15000, t0), "a", q))
	h.ok(owned(mkSess("s2", "c2", 15000, t0), "a", q))
	if use(lt.QuotaSessions) != q.Sessions {
		t.Fatalf("sessions use %d at the limit %d", use(lt.QuotaSessions), q.Sessions)
	}
	h.exhausted(owned(mkSess("s3", "c3", 15000, t0), "a", q), lt.QuotaSessions)
	for i, name := range []string{"a", "b", "c"} {
		h.ok(owned(acq(name, "c1", 30000, 0, t0), "a", q))
		if got := use(lt.QuotaLocks); got != int64(i+1) {
			t.Fatalf("locks use %d after %d locks", got, i+1)
		}
	}
	h.exhausted(owned(acq("d", "c1", 30000, 0, t0), "a", q), lt.QuotaLocks)
	if st := h.tb.Stats(); use(lt.QuotaLocks) != int64(st.Locks) || use(lt.QuotaSessions) != int64(st.Sessions) {
		t.Fatalf("use %d locks %d sessions, stats %+v", use(lt.QuotaLocks), use(lt.QuotaSessions), st)
	}
	// Grants held plus waits queued, and their value bytes.
	g := lt.Quotas{Grants: 3, ValueBytes: 10}
	h = newHarness(t)
	h.ok(owned(withValue("1234", acq("x", "a", 10_000, 0, t0)), "", g))
	h.ok(owned(withValue("123456", acq("x", "b", 10_000, 60_000, t0)), "", g)) // queued, its value counted
	h.ok(owned(acq("y", "a", 10_000, 0, t0), "", g))
	if use(lt.QuotaGrants) != 3 || use(lt.QuotaValueBytes) != 10 {
		t.Fatalf("grants use %d, value bytes %d; want 3 and 10", use(lt.QuotaGrants), use(lt.QuotaValueBytes))
	}
	h.exhausted(owned(acq("z", "c", 10_000, 0, t0), "", g), lt.QuotaGrants)
	for _, quota := range []lt.Quota{lt.QuotaSessionsPerOwner, lt.QuotaWaitersPerLock, lt.QuotaLocksPerSession, lt.QuotaLocksPerOwner} {
		if _, ok := h.tb.ClusterUse(quota); ok {
			t.Errorf("%v reports a cluster use; it is a quota per key", quota)
		}
	}
}
