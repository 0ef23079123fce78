package locktable_test

import (
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

func cancelWait(lock, client string, now int64) lt.Command {
	return lt.Command{Op: lt.OpCancel, Now: now, Lock: lock, ClientID: client}
}

// SPEC 18: a client withdraws its queued wait; the queue moves on in the
// same step, a grant already made is not undone, and nothing else is
// touched.
func TestCancel(t *testing.T) {
	t.Run("withdraws the wait and hands on", func(t *testing.T) {
		h := newHarness(t)
		h.ok(acq("x", "a", 10_000, 0, t0))
		h.ok(acq("x", "b", 10_000, 60_000, t0+1))
		h.ok(acq("x", "c", 10_000, 60_000, t0+2))
		r := h.ok(cancelWait("x", "b", t0+3))
		if !r.Cancelled || len(r.Events) != 1 || r.Events[0].Kind != lt.EvWaitEnded ||
			r.Events[0].Reason != lt.ReasonCancelled || r.Events[0].ClientID != "b" || r.Events[0].Deadline != t0+1+60_000 {
			t.Fatalf("cancel: %+v", r)
		}
		if ws := h.tb.Waiters("x"); len(ws) != 1 || ws[0].ClientID != "c" {
			t.Fatalf("queue after the cancel: %+v", ws)
		}
		if li := h.tb.Get("x"); li.ClientID != "a" || li.Token != 1 {
			t.Fatalf("the holder changed: %+v", li)
		}
		// The next in line is granted on release; b never is.
		r = h.ok(rel("x", "a", 1, t0+4))
		if li := h.tb.Get("x"); li.ClientID != "c" {
			t.Fatalf("after release: %+v (events %+v)", li, r.Events)
		}
	})
	t.Run("a head whose withdrawal frees a shared lock", func(t *testing.T) {
		h := newHarness(t)
		h.ok(shared(acq("x", "r1", 10_000, 0, t0)))
		h.ok(acq("x", "w", 10_000, 60_000, t0+1))          // a writer waits behind the reader
		h.ok(shared(acq("x", "r2", 10_000, 60_000, t0+2))) // a reader behind the writer
		r := h.ok(cancelWait("x", "w", t0+3))
		if !r.Cancelled {
			t.Fatalf("not cancelled: %+v", r)
		}
		// With the writer gone, r2 joins r1 in the same step.
		if li := h.tb.Get("x"); len(li.Holders) != 2 || li.Holders[1].ClientID != "r2" || li.Waiters != 0 {
			t.Fatalf("r2 not granted in the cancel's step: %+v", li)
		}
	})
	t.Run("nothing queued", func(t *testing.T) {
		h := newHarness(t)
		h.ok(acq("x", "a", 10_000, 0, t0))
		for _, c := range []lt.Command{
			cancelWait("x", "a", t0+1),    // the holder: a grant is not undone
			cancelWait("x", "zed", t0+1),  // never asked
			cancelWait("nope", "a", t0+1), // no such lock
		} {
			if r := h.unchanged(c); r.Code != lt.OK || r.Cancelled {
				t.Fatalf("%s: %+v", describe(c), r)
			}
		}
	})
	t.Run("another identity's client id", func(t *testing.T) {
		h := newHarness(t)
		h.ok(acq("x", "a", 10_000, 0, t0))
		w := acq("x", "b", 10_000, 60_000, t0+1)
		w.Owner = "tenant-1"
		h.ok(w)
		c := cancelWait("x", "b", t0+2)
		c.Owner = "tenant-2"
		if r := h.unchanged(c); r.Cancelled {
			t.Fatalf("another identity withdrew the wait: %+v", r)
		}
		c.Owner = "tenant-1"
		if r := h.ok(c); !r.Cancelled {
			t.Fatalf("the owner could not withdraw its wait: %+v", r)
		}
	})
	t.Run("multi-acquire by its names only", func(t *testing.T) {
		h := newHarness(t)
		h.ok(acq("b", "holder", 10_000, 0, t0))
		h.ok(acqMany("m", 10_000, 60_000, t0+1, "a", "b"))
		// One of its locks alone does not name the multi-acquire.
		if r := h.unchanged(cancelWait("a", "m", t0+2)); r.Cancelled {
			t.Fatalf("a single-lock cancel withdrew a multi-acquire: %+v", r)
		}
		other := lt.Command{Op: lt.OpCancel, Now: t0 + 2, ClientID: "m", Locks: []string{"a", "c"}}
		if r := h.unchanged(other); r.Cancelled {
			t.Fatalf("other names withdrew the multi-acquire: %+v", r)
		}
		c := lt.Command{Op: lt.OpCancel, Now: t0 + 3, ClientID: "m", Locks: []string{"a", "b"}}
		r := h.ok(c)
		if !r.Cancelled || len(r.Events) != 2 {
			t.Fatalf("multi cancel: %+v", r)
		}
		if h.tb.Get("a").Waiters != 0 || h.tb.Get("b").Waiters != 0 {
			t.Fatal("the multi-acquire still waits somewhere")
		}
	})
	t.Run("invalid", func(t *testing.T) {
		h := newHarness(t)
		for _, c := range []lt.Command{
			{Op: lt.OpCancel, Now: t0, Lock: "x"},                                           // no client
			{Op: lt.OpCancel, Now: t0, ClientID: "c"},                                       // no lock
			{Op: lt.OpCancel, Now: t0, ClientID: "c", Locks: []string{"b", "a"}},            // unsorted
			{Op: lt.OpCancel, Now: t0, ClientID: "c", Lock: "a", Locks: []string{"a", "b"}}, // both
			{Op: lt.OpCancel, Now: t0, ClientID: "c", Locks: []string{"a"}},                 // one name
		} {
			if r := h.unchanged(c); r.Code != lt.CodeInvalid {
				t.Fatalf("%+v: %v, want invalid", c, r.Code)
			}
		}
	})
}

// Issue: an expiry decided by a leader's timer must not act when its entry
// lands in another term (a leader that lost office and won it back, its
// old timers still proposing; or a proposal racing the change).
func TestTimerCommandsOfAnotherTermAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []lt.Command
		timer lt.Command
	}{
		{"expire session", []lt.Command{mkSess("s", "c", 1000, t0), acqS("x", "c", "s", 0, 0, t0)}, expSess("s", t0+5000)},
		{"expire lock", []lt.Command{acq("x", "c", 1000, 0, t0)}, expLock("x", 1, t0+5000)},
		{"time out waiter", []lt.Command{acq("x", "c", 10_000, 0, t0), acq("x", "w", 1000, 1000, t0)}, tmo("x", "w", t0+5000)},
		{"end delay", []lt.Command{withDelay(1000, acq("x", "c", 1000, 0, t0)), expLock("x", 1, t0+1000)}, endDelay("x", t0+5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := lt.New()
			idx := uint64(0)
			for _, c := range tc.setup {
				idx++
				if r := tb.ApplyEntry(idx, 3, c); r.Code != lt.OK {
					t.Fatalf("setup %s: %v", describe(c), r.Code)
				}
			}
			before := tb.Snapshot()
			stale := tc.timer
			stale.Term = 2 // decided in term 2, appended in term 3
			idx++
			r := tb.ApplyEntry(idx, 3, stale)
			if r.Code != lt.CodeStale || len(r.Events) != 0 || string(tb.Snapshot()) != string(before) {
				t.Fatalf("stale %s: %+v (changed: %v)", describe(stale), r, string(tb.Snapshot()) != string(before))
			}
			// In a batch too.
			idx++
			r = tb.ApplyEntry(idx, 3, lt.Command{Op: lt.OpBatch, Now: stale.Now, Batch: []lt.Command{stale}})
			if r.Batch[0].Code != lt.CodeStale || string(tb.Snapshot()) != string(before) {
				t.Fatalf("stale in a batch: %+v", r)
			}
			// Decided in the entry's own term: it acts.
			current := tc.timer
			current.Term = 3
			idx++
			if r := tb.ApplyEntry(idx, 3, current); r.Code != lt.OK || len(r.Events) == 0 {
				t.Fatalf("current %s: %+v", describe(current), r)
			}
			// Round trip of the term through the log format.
			back, err := lt.DecodeCommand(current.Encode())
			if err != nil || back.Term != 3 {
				t.Fatalf("decoded %+v, %v", back, err)
			}
		})
	}
}
