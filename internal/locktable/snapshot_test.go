package locktable_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// churn is how many acquire/release pairs richLog starts with: more than
// the release memo holds, so its ring has wrapped.
const churn = 4096 + 123

// richLog builds a state with every kind of thing the snapshot carries:
// sessions (busy and idle), locks held with and without a TTL, with and
// without a session, waiters with and without a session, members, and a
// release memo whose ring has wrapped.
func richLog() []lt.Command {
	var log []lt.Command
	now := t0
	for i := 0; i < churn; i++ {
		lock := fmt.Sprintf("memo/%d", i%7)
		log = append(log, acq(lock, "churn", 1000, 0, now), rel(lock, "churn", uint64(i+1), now))
		now++
	}
	tok := uint64(churn)
	log = append(log,
		setMember("n2", "127.0.0.1:7171", "http://127.0.0.1:7170", now),
		setMember("n1", "127.0.0.1:7071", "http://127.0.0.1:7070", now),
		setMember("n3", "127.0.0.1:7271", "", now),
		mkSess("s1", "cs1", 15000, now),
		mkSess("s2", "cs2", 20000, now),
		mkSess("s3", "idle", 1000, now),
		acq("ttl", "c1", 30000, 0, now),              // tok+1
		acq("ttl", "w1", 1000, 60000, now),           // queued
		acqS("ttl", "cs2", "s2", 0, 60000, now),      // queued via s2
		acqS("ttl", "cs1", "s1", 500, 60000, now),    // queued via s1
		acqS("sess", "cs1", "s1", 0, 0, now),         // tok+2, no TTL
		acq("sess", "w4", 1000, 60000, now),          // queued
		acqS("sess.ttl", "cs2", "s2", 10000, 0, now), // tok+3
		acq("jobs/nightly", "c1", 5000, 0, now),      // tok+4
		acq("jobs/nightly", "c2", 5000, 60000, now),  // queued
		rel("jobs/nightly", "c1", tok+4, now+10),     // hand-off: c2 gets tok+5
		acq("renewed", "c3", 1000, 0, now+10),        // tok+6
		renew("renewed", "c3", tok+6, 9000, now+20),  // moves ExpiresAt
		acq("short", "c4", 100, 0, now+20),           // tok+7
		acq("short", "w5", 100, 50, now+20),          // queued, deadline now+70
		acq("gone", "c5", 1000, 0, now+30),           // tok+8
		rel("gone", "c5", tok+8, now+40),             // freed, remembered
		acq("a", "c6", 1000, 0, now+40),              // tok+9
		lt.Command{Op: lt.OpBatch, Now: now + 50, Batch: []lt.Command{
			acq("batched", "c7", 1000, 0, now+50),   // tok+10
			acq("batched", "c8", 1000, 100, now+50), // queued
		}},
	)
	return log
}

func applyAll(t *testing.T, tb *lt.Table, log []lt.Command) []lt.Result {
	t.Helper()
	out := make([]lt.Result, 0, len(log))
	for _, c := range log {
		out = append(out, tb.Apply(c))
	}
	return out
}

func richTable(t *testing.T) *lt.Table {
	t.Helper()
	tb := lt.New()
	for _, r := range applyAll(t, tb, richLog()) {
		if r.Code != lt.OK {
			t.Fatalf("rich log: %+v", r)
		}
	}
	if err := checkInvariants(tb, 0); err != nil {
		t.Fatal(err)
	}
	return tb
}

// view gathers everything the read API shows, to compare two tables by
// more than their snapshot bytes.
func view(tb *lt.Table) map[string]any {
	v := map[string]any{
		"last":    tb.LastToken(),
		"list":    tb.List("", 0),
		"members": tb.Members(),
		"stats":   tb.Stats(),
	}
	v["held"] = sortedHeld(tb)
	v["waiters"] = sortedWaiters(tb)
	v["sessions"] = sortedSessions(tb)
	return v
}

func TestSnapshotRoundTrip(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		s := lt.New().Snapshot()
		r, err := lt.Restore(s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Snapshot(), s) {
			t.Fatal("empty table does not round-trip")
		}
	})
	t.Run("rich", func(t *testing.T) {
		tb := richTable(t)
		st := tb.Stats()
		if st.Sessions != 3 || st.Waiters < 6 || st.Held < 8 || len(tb.Members()) != 3 {
			t.Fatalf("rich state is not rich: %+v", st)
		}
		s1 := tb.Snapshot()
		if !bytes.Equal(s1, tb.Snapshot()) {
			t.Fatal("two snapshots of one table differ")
		}
		r, err := lt.Restore(s1)
		if err != nil {
			t.Fatal(err)
		}
		if s2 := r.Snapshot(); !bytes.Equal(s1, s2) {
			t.Fatalf("snapshot -> restore -> snapshot changed the bytes (%d vs %d bytes)", len(s1), len(s2))
		}
		if a, b := view(tb), view(r); !reflect.DeepEqual(a, b) {
			t.Fatalf("restored table reads differently:\n orig     %+v\n restored %+v", a, b)
		}
	})
}

// TestSnapshotDeterministic: the same log applied to fresh tables gives the
// same results and byte-identical snapshots. Repeated, because Go randomises
// map iteration: an order leak would show up as a difference.
func TestSnapshotDeterministic(t *testing.T) {
	log := richLog()
	// Add work whose order depends on map iteration inside Apply.
	now := t0 + 100000
	log = append(log, expSess("s1", now), delSess("s2", now+1), expLock("ttl", uint64(churn+1), now+2))
	ref := lt.New()
	refRes := applyAll(t, ref, log)
	refSnap := ref.Snapshot()
	for i := 0; i < 10; i++ {
		tb := lt.New()
		res := applyAll(t, tb, log)
		if !reflect.DeepEqual(res, refRes) {
			t.Fatalf("run %d: results differ", i)
		}
		if !bytes.Equal(tb.Snapshot(), refSnap) {
			t.Fatalf("run %d: snapshots differ", i)
		}
	}
}

// TestRestoredBehavesIdentically: a member that restored a snapshot must
// follow the log exactly like one that replayed it.
func TestRestoredBehavesIdentically(t *testing.T) {
	orig := richTable(t)
	restored, err := lt.Restore(orig.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string) {
		t.Helper()
		if !bytes.Equal(orig.Snapshot(), restored.Snapshot()) {
			t.Fatalf("%s: states diverged", what)
		}
	}
	steps := 0
	step := func(c lt.Command) lt.Result {
		t.Helper()
		r1, r2 := orig.Apply(c), restored.Apply(c)
		if !reflect.DeepEqual(r1, r2) {
			t.Fatalf("%v: results differ\n orig     %+v\n restored %+v", describe(c), r1, r2)
		}
		if steps++; steps%16 == 0 || steps < 30 {
			same(describe(c))
		}
		return r1
	}
	memoLock := func(tok uint64) string { return fmt.Sprintf("memo/%d", (tok-1)%7) }
	ttlTok, sessTok, last := orig.Get("ttl").Token, orig.Get("sess").Token, orig.LastToken()
	// The memo holds the last 4096 releases: the churn's, then two more.
	oldest := uint64(churn - 4096 + 1 + 2)
	now := t0 + 10000
	for i, s := range []struct {
		c    lt.Command
		want lt.Code
	}{
		{rel(memoLock(oldest-1), "churn", oldest-1, now), lt.CodeNotHolder}, // evicted from the memo
		{rel(memoLock(oldest), "churn", oldest, now), lt.OK},                // oldest remembered
		{rel(memoLock(churn), "churn", churn, now), lt.OK},
		{rel("gone", "c5", uint64(churn+8), now), lt.OK},           // remembered release of a freed lock
		{acq("ttl", "cs1", 500, 60000, now), lt.OK},                // waiter retry: keeps its place
		{acq("ttl", "c1", 30000, 0, now), lt.OK},                   // holder re-acquire
		{expSess("s3", now), lt.OK},                                // idle session
		{expSess("s1", now+1), lt.OK},                              // frees "sess" -> w4, drops cs1's wait on ttl
		{tmo("short", "w5", now+2), lt.OK},                         // past its deadline
		{expLock("ttl", ttlTok, now+2), lt.OK},                     // stale: re-acquire moved the expiry
		{expLock("ttl", ttlTok, now+30000), lt.OK},                 // hands off to w1
		{rel("sess", "cs1", sessTok, now+30001), lt.CodeNotHolder}, // lost with its session
		{delSess("s2", now+30002), lt.OK},                          // frees sess.ttl, drops cs2's wait on ttl
		{expLock("batched", last, now+30003), lt.OK},               // c7 expires; c8's wait has passed
		{acqS("x", "cs1", "s1", 0, 0, now+30004), lt.CodeSessionExpired},
		{setMember("n4", "r4", "h4", now+30005), lt.OK},
		{rmMember("n1", now+30005), lt.OK},
	} {
		if r := step(s.c); r.Code != s.want {
			t.Fatalf("step %d %v: %v, want %v", i, describe(s.c), r.Code, s.want)
		}
	}
	if got := orig.Get("sess"); got.ClientID != "w4" {
		t.Errorf("sess: %+v, want held by w4", got)
	}
	if got := orig.Get("ttl"); got.ClientID != "w1" || got.Waiters != 0 {
		t.Errorf("ttl: %+v, want held by w1 with nobody waiting", got)
	}
	if got := orig.Get("batched"); got.Held {
		t.Errorf("batched: %+v, want free", got)
	}
	// More churn: the ring evicts in the same order on both tables.
	for i := 0; i < 300; i++ {
		lock := fmt.Sprintf("late/%d", i%5)
		r := step(acq(lock, "c9", 1000, 0, now+40000))
		step(rel(lock, "c9", r.Token, now+40000))
	}
	for tok := oldest - 50; tok < oldest+400; tok += 7 {
		step(rel(memoLock(tok), "churn", tok, now+50000))
	}
	same("the end")
}

func TestRestoreRejects(t *testing.T) {
	small := lt.New()
	for _, c := range []lt.Command{
		mkSess("s", "c", 15000, t0),
		acqS("a", "c", "s", 0, 0, t0),
		acq("a", "w", 1000, 5000, t0),
		acq("b", "c2", 1000, 0, t0),
		rel("b", "c2", 2, t0),
		setMember("n1", "r", "h", t0),
	} {
		small.Apply(c)
	}
	good := small.Snapshot()

	// Hand-made snapshots, each a valid prefix followed by one bad part.
	bigString := newSnapWriter(1, 0)
	bigString.uvarint(1)
	bigString.uvarint(1<<16 + 1)
	bigString.b = append(bigString.b, make([]byte, 1<<16+1)...)
	bigString.strs("c")
	bigString.varint(1)
	bigString.varint(1)
	bigString.uvarint(0)
	bigString.uvarint(0)
	bigString.uvarint(0)

	hugeCount := newSnapWriter(1, 0)
	hugeCount.uvarint(1 << 62) // sessions

	hugeWaiters := newSnapWriter(1, 1)
	hugeWaiters.uvarint(0)
	hugeWaiters.uvarint(1)
	hugeWaiters.str("a")
	hugeWaiters.byte(0)
	hugeWaiters.uvarint(1 << 40)

	tokenAbove := newSnapWriter(1, 5)
	tokenAbove.uvarint(0)
	tokenAbove.uvarint(1)
	tokenAbove.str("a")
	tokenAbove.byte(1)
	tokenAbove.strs("c", "")
	tokenAbove.uvarint(6) // above the counter: a token that was never issued
	tokenAbove.varint(1000)
	tokenAbove.varint(t0)
	tokenAbove.varint(t0)
	tokenAbove.uvarint(0)
	tokenAbove.uvarint(0)
	tokenAbove.uvarint(0)

	memoTooBig := newSnapWriter(1, 0)
	memoTooBig.uvarint(0)
	memoTooBig.uvarint(0)
	memoTooBig.uvarint(0)
	memoTooBig.uvarint(4097)
	for i := 0; i < 4097; i++ {
		memoTooBig.str("a")
		memoTooBig.uvarint(uint64(i + 1))
		memoTooBig.str("c")
	}

	cases := []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"bad magic", append([]byte("LOCKDSNQ"), good[8:]...)},
		{"magic only", []byte("LOCKDSNP")},
		{"version 0", append(append([]byte("LOCKDSNP"), 0), good[9:]...)},
		{"newer version", append(append([]byte("LOCKDSNP"), 4), good[9:]...)},
		{"trailing zero", append(append([]byte(nil), good...), 0)},
		{"two snapshots", append(append([]byte(nil), good...), good...)},
		{"string over 64 KiB", bigString.b},
		{"count beyond the bytes", hugeCount.b},
		{"waiter count beyond the bytes", hugeWaiters.b},
		{"holder token above the counter", tokenAbove.b},
		{"release memo over 4096", memoTooBig.b},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := lt.Restore(tc.b)
			if err == nil || tb != nil {
				t.Fatalf("Restore accepted it (table %v)", tb != nil)
			}
			if !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
		})
	}
	t.Run("every truncation", func(t *testing.T) {
		for n := 0; n < len(good); n++ {
			if _, err := lt.Restore(good[:n]); !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("prefix of %d/%d bytes: err %v, want ErrCorrupt", n, len(good), err)
			}
		}
		// The big snapshot: sampled cuts, including the last byte.
		rich := richTable(t).Snapshot()
		for n := len(rich) - 1; n > 0; n -= 997 {
			if _, err := lt.Restore(rich[:n]); !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("prefix of %d/%d bytes: err %v, want ErrCorrupt", n, len(rich), err)
			}
		}
	})
	t.Run("the hand-made writer matches the format", func(t *testing.T) {
		// Guards the cases above (format 1, which Restore still reads):
		// the same writer with good parts restores, and in the current
		// format (3: an owner after the client and session ids, the
		// applied index, per lock its kind fields and a holder count, per
		// holder its mode, lock-delay and value) it restores to the same
		// bytes.
		for _, version := range []byte{1, 2, 3} {
			w := newSnapWriter(version, 5)
			if version >= 3 {
				w.uvarint(7) // applied index
			}
			w.uvarint(0)
			w.uvarint(1)
			w.str("a")
			if version >= 3 {
				w.varint(0)  // limit
				w.varint(0)  // delayed until
				w.uvarint(7) // index
				w.uvarint(1) // holders
			} else {
				w.byte(1)
			}
			w.strs("c", "")
			if version >= 2 {
				w.str("owner")
			}
			w.uvarint(5)
			w.varint(1000)
			w.varint(t0)
			w.varint(t0)
			if version >= 3 {
				w.byte(0)   // mode
				w.varint(0) // lock-delay
				w.str("")   // value
			}
			w.uvarint(0)
			w.uvarint(0)
			w.uvarint(0)
			tb, err := lt.Restore(w.b)
			if err != nil {
				t.Fatalf("format %d: %v", version, err)
			}
			if got := tb.Get("a"); got.Token != 5 || got.ClientID != "c" {
				t.Fatalf("format %d: restored %+v", version, got)
			}
			if version == 3 && !bytes.Equal(tb.Snapshot(), w.b) {
				t.Fatalf("format 3 does not snapshot to the same bytes")
			}
		}
	})
}

// TestPrepareRestore: a restored backup keeps the running cluster's member
// addresses and never lowers its token counter.
func TestPrepareRestore(t *testing.T) {
	backup := lt.New()
	backup.Apply(lt.Command{Op: lt.OpSetMember, MemberID: "old", RaftAddr: "10.0.0.1:7071", HTTPAddr: "http://10.0.0.1:7070"})
	backup.Apply(lt.Command{Op: lt.OpAcquire, Lock: "a", ClientID: "c", TTLms: 60000, Now: 1000})
	current := lt.New()
	current.Apply(lt.Command{Op: lt.OpSetMember, MemberID: "n1", RaftAddr: "127.0.0.1:7071", HTTPAddr: "http://127.0.0.1:7070"})
	for i, lock := range []string{"x", "y", "z"} {
		current.Apply(lt.Command{Op: lt.OpAcquire, Lock: lock, ClientID: "c", TTLms: 60000, Now: int64(1000 + i)})
	}
	if backup.LastToken() >= current.LastToken() {
		t.Fatalf("setup: backup token %d not below the running one %d", backup.LastToken(), current.LastToken())
	}
	backup.PrepareRestore(current, 0)
	if backup.LastToken() != current.LastToken() {
		t.Fatalf("token counter %d after restore, want the running cluster's %d", backup.LastToken(), current.LastToken())
	}
	if got, want := backup.Members(), current.Members(); !reflect.DeepEqual(got, want) {
		t.Fatalf("members %v after restore, want the running cluster's %v", got, want)
	}
	if backup.Get("a").ClientID != "c" {
		t.Fatal("the backup's locks were lost")
	}
}
