package locktable_test

import (
	"bytes"
	"reflect"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// TestApply holds the semantic scenarios of SPEC.md "Semantics", one
// sub-test each. Every command goes through harness.do, which also checks
// the structural invariants after it.
func TestApply(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"grant to a free lock", func(t *testing.T, h *harness) {
			r := h.ok(acq("a", "c1", 1000, 0, t0))
			if !r.Granted || r.Queued || r.Token != 1 || r.ExpiresAt != t0+1000 {
				t.Fatalf("result %+v, want granted token 1 expiring at t0+1000", r)
			}
			wantEvents(t, "acquire", r.Events, []lt.Event{evGranted("a", "c1", "", 1, 1000, t0+1000)})
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "c1", Token: 1, TTLms: 1000, ExpiresAt: t0 + 1000})
			if h.tb.LastToken() != 1 {
				t.Fatalf("LastToken %d, want 1", h.tb.LastToken())
			}
		}},
		{"acquire with wait on a free lock grants at once", func(t *testing.T, h *harness) {
			r := h.ok(acq("a", "c1", 1000, 5000, t0))
			if !r.Granted || r.Queued || r.Token != 1 {
				t.Fatalf("result %+v, want an immediate grant", r)
			}
		}},
		{"try-acquire of a held lock is lock_held naming the holder", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			r := h.unchanged(acq("a", "c2", 1000, 0, t0+1))
			if r.Code != lt.CodeLockHeld || r.Holder != "c1" || r.Granted || r.Queued {
				t.Fatalf("result %+v, want lock_held by c1", r)
			}
		}},
		{"release hands off to waiters in FIFO order", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			for i, c := range []string{"c2", "c3", "c4", "c5"} {
				r := h.ok(acq("a", c, 2000, 60000, t0+int64(i)))
				if !r.Queued || r.Position != i || r.Granted {
					t.Fatalf("%s: result %+v, want queued at %d", c, r, i)
				}
				wantEvents(t, c, r.Events, []lt.Event{evQueued("a", c, "", t0+int64(i)+60000)})
			}
			holder, tok := "c1", uint64(1)
			for i, next := range []string{"c2", "c3", "c4", "c5"} {
				now := t0 + 100 + int64(i)
				r := h.ok(rel("a", holder, tok, now))
				wantEvents(t, "release by "+holder, r.Events, []lt.Event{
					evReleased("a", holder, "", tok),
					evGranted("a", next, "", tok+1, 2000, now+2000),
				})
				holder, tok = next, tok+1
				wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: next, Token: tok,
					TTLms: 2000, ExpiresAt: now + 2000, Waiters: 3 - i})
			}
			r := h.ok(rel("a", holder, tok, t0+200))
			wantEvents(t, "last release", r.Events, []lt.Event{evReleased("a", holder, "", tok)})
			if got := h.tb.List("", 0); len(got) != 0 {
				t.Fatalf("free lock still listed: %+v", got)
			}
			wantInfo(t, h.tb, lt.LockInfo{Name: "a"})
		}},
		{"tokens strictly increase across locks and hand-offs", func(t *testing.T, h *harness) {
			var toks []uint64
			grant := func(r lt.Result) {
				for _, e := range r.Events {
					if e.Kind == lt.EvGranted {
						toks = append(toks, e.Token)
					}
				}
			}
			grant(h.ok(acq("a", "c1", 1000, 0, t0)))
			grant(h.ok(acq("b", "c2", 1000, 0, t0)))
			grant(h.ok(acq("a", "c3", 1000, 5000, t0)))
			grant(h.ok(acq("b", "c4", 1000, 5000, t0)))
			grant(h.ok(rel("b", "c2", 2, t0+1)))       // b -> c4
			grant(h.ok(acq("c", "c1", 1000, 0, t0+2))) // new lock
			grant(h.ok(expLock("a", 1, t0+1000)))      // a -> c3 by expiry
			grant(h.ok(rel("c", "c1", 4, t0+1001)))    // free
			grant(h.ok(acq("c", "c1", 1000, 0, t0+1002)))
			want := []uint64{1, 2, 3, 4, 5, 6}
			if !reflect.DeepEqual(toks, want) {
				t.Fatalf("granted tokens %v, want %v", toks, want)
			}
			if h.tb.LastToken() != 6 {
				t.Fatalf("LastToken %d, want 6", h.tb.LastToken())
			}
		}},
		{"hand-off skips a waiter whose deadline has come", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "late", 1000, 100, t0))  // deadline t0+100
			h.ok(acq("a", "next", 1000, 5000, t0)) // deadline t0+5000
			r := h.ok(rel("a", "c1", 1, t0+100))   // exactly at the deadline: too late
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "c1", "", 1),
				evWaitEnded("a", "late", "", lt.ReasonWaitTimeout),
				evGranted("a", "next", "", 2, 1000, t0+1100),
			})
		}},
		{"hand-off one millisecond before the deadline still grants", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "w", 1000, 100, t0))
			r := h.ok(rel("a", "c1", 1, t0+99))
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "c1", "", 1),
				evGranted("a", "w", "", 2, 1000, t0+1099),
			})
		}},
		{"hand-off with every waiter timed out frees the lock", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "w1", 1000, 100, t0))
			h.ok(acq("a", "w2", 1000, 200, t0))
			r := h.ok(rel("a", "c1", 1, t0+500))
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "c1", "", 1),
				evWaitEnded("a", "w1", "", lt.ReasonWaitTimeout),
				evWaitEnded("a", "w2", "", lt.ReasonWaitTimeout),
			})
			wantInfo(t, h.tb, lt.LockInfo{Name: "a"})
			if h.tb.LastToken() != 1 {
				t.Fatalf("LastToken %d: a token was spent on nobody", h.tb.LastToken())
			}
		}},
		{"timeout waiter acts only when Now reaches the deadline", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "w1", 1000, 5000, t0))
			h.ok(acq("a", "w2", 1000, 100, t0)) // deadline t0+100
			h.ok(acq("a", "w3", 1000, 5000, t0))
			h.unchanged(tmo("a", "w2", t0+99))
			r := h.ok(tmo("a", "w2", t0+100))
			wantEvents(t, "timeout", r.Events, []lt.Event{evWaitEnded("a", "w2", "", lt.ReasonWaitTimeout)})
			if got := waiterClients(h.tb, "a"); !reflect.DeepEqual(got, []string{"w1", "w3"}) {
				t.Fatalf("queue %v, want [w1 w3]", got)
			}
			h.unchanged(tmo("a", "w2", t0+200))     // duplicate timer
			h.unchanged(tmo("a", "nobody", t0+200)) // unknown waiter
			h.unchanged(tmo("zzz", "w1", t0+200))   // unknown lock
		}},
		{"timeout of the only waiter leaves the held lock alone", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "w", 1000, 100, t0))
			r := h.ok(tmo("a", "w", t0+150))
			wantEvents(t, "timeout", r.Events, []lt.Event{evWaitEnded("a", "w", "", lt.ReasonWaitTimeout)})
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "c1", Token: 1, TTLms: 10000, ExpiresAt: t0 + 10000})
		}},
		{"a retry that extended the deadline survives a stale timeout", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			h.ok(acq("a", "w0", 1000, 5000, t0))
			h.ok(acq("a", "w", 1000, 100, t0)) // deadline t0+100, position 1
			r := h.ok(acq("a", "w", 1000, 1000, t0+50))
			if !r.Queued || r.Position != 1 {
				t.Fatalf("retry: %+v, want queued at 1", r)
			}
			wantEvents(t, "retry", r.Events, []lt.Event{evQueued("a", "w", "", t0+1050)})
			h.unchanged(tmo("a", "w", t0+100)) // the timer armed for the old deadline
			h.ok(tmo("a", "w0", t0+5000-1))    // too early: w0 stays
			r = h.ok(rel("a", "c1", 1, t0+500))
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "c1", "", 1),
				evGranted("a", "w0", "", 2, 1000, t0+1500),
			})
			r = h.ok(rel("a", "w0", 2, t0+600))
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "w0", "", 2),
				evGranted("a", "w", "", 3, 1000, t0+1600),
			})
		}},
		{"a waiter's retry keeps its queue position", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 10000, 0, t0))
			for _, c := range []string{"w1", "w2", "w3"} {
				h.ok(acq("a", c, 1000, 5000, t0))
			}
			r := h.ok(acq("a", "w2", 1000, 5000, t0+10))
			if !r.Queued || r.Position != 1 || r.Granted {
				t.Fatalf("retry: %+v, want queued at 1", r)
			}
			r = h.ok(acq("a", "w2", 1000, 0, t0+20)) // a try-once retry also just reports the place
			if !r.Queued || r.Position != 1 {
				t.Fatalf("try-once retry: %+v, want queued at 1", r)
			}
			if got := waiterClients(h.tb, "a"); !reflect.DeepEqual(got, []string{"w1", "w2", "w3"}) {
				t.Fatalf("queue %v, want [w1 w2 w3]", got)
			}
			if w := h.tb.Waiters("a")[1]; w.Deadline != t0+10+5000 || w.EnqueuedAt != t0 {
				t.Fatalf("waiter %+v: want deadline from the last waiting retry, enqueue time of the first", w)
			}
		}},
		{"a waiter's retry without a TTL keeps the TTL the grant will carry", func(t *testing.T, h *harness) {
			// A client first queues without a session (so with a TTL), then
			// retries with a session and no TTL of its own. Granting it
			// with neither a session nor a TTL would hold the lock forever.
			h.ok(mkSess("s", "w", 15000, t0))
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(acq("a", "w", 30000, 5000, t0))
			h.ok(acqS("a", "w", "s", 0, 5000, t0+1))
			r := h.ok(rel("a", "c1", 1, t0+2))
			wantEvents(t, "release", r.Events, []lt.Event{
				evReleased("a", "c1", "", 1),
				evGranted("a", "w", "", 2, 30000, t0+2+30000),
			})
		}},
		{"idempotent re-acquire by the holder refreshes the expiry", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(acq("a", "w", 1000, 60000, t0))
			r := h.ok(acq("a", "c1", 1000, 0, t0+400))
			if !r.Granted || r.Token != 1 || r.ExpiresAt != t0+1400 {
				t.Fatalf("re-acquire: %+v, want token 1 expiring at t0+1400", r)
			}
			regrant := evGranted("a", "c1", "", 1, 1000, t0+1400)
			regrant.Reason = lt.ReasonRegrant
			wantEvents(t, "re-acquire", r.Events, []lt.Event{regrant})
			r = h.ok(acq("a", "c1", 3000, 5000, t0+500)) // new TTL, and a wait that does not matter
			if !r.Granted || r.Token != 1 || r.ExpiresAt != t0+3500 {
				t.Fatalf("re-acquire with new TTL: %+v", r)
			}
			if h.tb.LastToken() != 1 {
				t.Fatalf("LastToken %d: a re-grant must not issue a token", h.tb.LastToken())
			}
			h.unchanged(expLock("a", 1, t0+1000)) // timer armed for the first expiry
			h.unchanged(expLock("a", 1, t0+1400)) // and for the second
			r = h.ok(expLock("a", 1, t0+3500))
			wantEvents(t, "expire", r.Events, []lt.Event{
				evLost("a", "c1", "", 1, lt.ReasonExpired),
				evGranted("a", "w", "", 2, 1000, t0+4500),
			})
		}},
		{"TTL expiry releases and hands off in the same command", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(acq("a", "w1", 2000, 60000, t0))
			h.ok(acq("a", "w2", 2000, 60000, t0))
			r := h.ok(expLock("a", 1, t0+1000))
			if r.Token != 1 {
				t.Fatalf("expire result token %d, want 1", r.Token)
			}
			wantEvents(t, "expire", r.Events, []lt.Event{
				evLost("a", "c1", "", 1, lt.ReasonExpired),
				evGranted("a", "w1", "", 2, 2000, t0+3000),
			})
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "w1", Token: 2, TTLms: 2000, ExpiresAt: t0 + 3000, Waiters: 1})
			// The old holder has lost: it can neither renew nor release.
			if r := h.unchanged(renew("a", "c1", 1, 1000, t0+1001)); r.Code != lt.CodeNotHolder {
				t.Fatalf("renew after expiry: %v, want not_holder", r.Code)
			}
			if r := h.unchanged(rel("a", "c1", 1, t0+1001)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release after expiry: %v, want not_holder", r.Code)
			}
		}},
		{"TTL expiry of a lock nobody waits for frees it", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			r := h.ok(expLock("a", 1, t0+5000)) // a late timer is fine
			wantEvents(t, "expire", r.Events, []lt.Event{evLost("a", "c1", "", 1, lt.ReasonExpired)})
			wantInfo(t, h.tb, lt.LockInfo{Name: "a"})
		}},
		{"stale and duplicate expiries are ignored", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "cs", 15000, t0))
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(acq("a", "w", 1000, 60000, t0))
			h.ok(acqS("nottl", "cs", "s", 0, 0, t0))
			h.unchanged(expLock("a", 2, t0+1000))       // wrong token (future)
			h.unchanged(expLock("a", 0, t0+1000))       // no token
			h.unchanged(expLock("a", 1, t0+999))        // before ExpiresAt
			h.unchanged(expLock("missing", 1, t0+9999)) // no such lock
			h.unchanged(expLock("nottl", 2, t0+1e9))    // a lock without TTL never expires
			h.ok(renew("a", "c1", 1, 1000, t0+500))     // moves ExpiresAt to t0+1500
			h.unchanged(expLock("a", 1, t0+1000))       // the timer for the old expiry
			h.ok(expLock("a", 1, t0+1500))              // hands off to w (token 3)
			h.unchanged(expLock("a", 1, t0+1500))       // duplicate
			h.unchanged(expLock("a", 1, t0+99999))      // duplicate, much later
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "w", Token: 3, TTLms: 1000, ExpiresAt: t0 + 2500})
		}},
		{"session expiry releases its locks, drops its waits and hands off in one command", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "cs", 15000, t0))
			h.ok(mkSess("s2", "o2", 15000, t0))
			// s holds b and a (acquired in that order), waits on c and d.
			h.ok(acqS("b", "cs", "s", 0, 0, t0))    // token 1
			h.ok(acqS("a", "cs", "s", 5000, 0, t0)) // token 2, with its own TTL too
			h.ok(acq("c", "x", 60000, 0, t0))       // token 3
			h.ok(acq("d", "y", 60000, 0, t0))       // token 4
			h.ok(acq("a", "wa", 1000, 60000, t0))   // a: next after cs
			h.ok(acqS("b", "wb", "s2", 0, 100, t0)) // b: timed out by the time s expires
			h.ok(acqS("b", "wb2", "s2", 0, 60000, t0))
			h.ok(acqS("c", "cs", "s", 0, 60000, t0)) // c: cs waits first
			h.ok(acq("c", "wc", 1000, 60000, t0))
			h.ok(acq("d", "wd", 1000, 60000, t0))
			h.ok(acqS("d", "cs", "s", 0, 60000, t0)) // d: cs waits second
			now := t0 + 1000
			r := h.ok(expSess("s", now))
			// Locks in name order, so tokens are the same on every member.
			wantEvents(t, "expire session", r.Events, []lt.Event{
				// Every grant of the session ends before any lock is
				// handed on.
				evLost("a", "cs", "s", 2, lt.ReasonSessionExpired),
				evLost("b", "cs", "s", 1, lt.ReasonSessionExpired),
				evGranted("a", "wa", "", 5, 1000, now+1000),
				evWaitEnded("b", "wb", "s2", lt.ReasonWaitTimeout),
				evGranted("b", "wb2", "s2", 6, 0, 0),
				evWaitEnded("c", "cs", "s", lt.ReasonSessionExpired),
				evWaitEnded("d", "cs", "s", lt.ReasonSessionExpired),
				evSessionEnded("s", "cs", lt.ReasonSessionExpired),
			})
			if _, ok := h.tb.Session("s"); ok {
				t.Fatal("session s still exists")
			}
			wantInfo(t, h.tb, lt.LockInfo{Name: "c", Held: true, ClientID: "x", Token: 3, TTLms: 60000, ExpiresAt: t0 + 60000, Waiters: 1})
			wantInfo(t, h.tb, lt.LockInfo{Name: "d", Held: true, ClientID: "y", Token: 4, TTLms: 60000, ExpiresAt: t0 + 60000, Waiters: 1})
			if got := waiterClients(h.tb, "c"); !reflect.DeepEqual(got, []string{"wc"}) {
				t.Fatalf("c queue %v", got)
			}
			if got := waiterClients(h.tb, "d"); !reflect.DeepEqual(got, []string{"wd"}) {
				t.Fatalf("d queue %v", got)
			}
			// The session's client can neither release nor renew what it lost.
			if r := h.unchanged(rel("b", "cs", 1, now+1)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release after session expiry: %v", r.Code)
			}
			// And it cannot acquire through the dead session.
			if r := h.unchanged(acqS("z", "cs", "s", 0, 0, now+1)); r.Code != lt.CodeSessionExpired {
				t.Fatalf("acquire via expired session: %v", r.Code)
			}
		}},
		{"deleting a session is the same with reason deleted", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "cs", 15000, t0))
			h.ok(acqS("a", "cs", "s", 0, 0, t0))
			h.ok(acq("a", "w", 1000, 60000, t0))
			r := h.ok(delSess("s", t0+10))
			wantEvents(t, "delete session", r.Events, []lt.Event{
				evLost("a", "cs", "s", 1, lt.ReasonSessionExpired),
				evGranted("a", "w", "", 2, 1000, t0+1010),
				evSessionEnded("s", "cs", lt.ReasonDeleted),
			})
		}},
		{"a session that holds nothing ends cleanly", func(t *testing.T, h *harness) {
			r := h.ok(mkSess("s", "cs", 15000, t0))
			wantEvents(t, "create", r.Events, []lt.Event{{Kind: lt.EvSessionCreated, SessionID: "s", ClientID: "cs", TTLms: 15000, ExpiresAt: t0 + 15000}})
			if s, ok := h.tb.Session("s"); !ok || s.ClientID != "cs" || s.TTLms != 15000 || s.CreatedAt != t0 {
				t.Fatalf("Session(s) = %+v, %v", s, ok)
			}
			h.unchanged(mkSess("s", "other", 99999, t0+5)) // a retried create finds its session
			r = h.ok(expSess("s", t0+20000))
			wantEvents(t, "expire", r.Events, []lt.Event{evSessionEnded("s", "cs", lt.ReasonSessionExpired)})
		}},
		{"ending a missing session: delete is session_expired, expire is an ok no-op", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "cs", 15000, t0))
			h.ok(acqS("a", "cs", "s", 0, 0, t0))
			if r := h.unchanged(delSess("nope", t0)); r.Code != lt.CodeSessionExpired {
				t.Fatalf("delete missing: %v, want session_expired", r.Code)
			}
			if r := h.unchanged(expSess("nope", t0)); r.Code != lt.OK {
				t.Fatalf("expire missing: %v, want ok", r.Code)
			}
			h.ok(expSess("s", t0+1))
			if r := h.unchanged(expSess("s", t0+2)); r.Code != lt.OK { // duplicate timer
				t.Fatalf("duplicate expire: %v, want ok", r.Code)
			}
			if r := h.unchanged(delSess("s", t0+2)); r.Code != lt.CodeSessionExpired {
				t.Fatalf("delete after expiry: %v, want session_expired", r.Code)
			}
		}},
		{"a waiter whose session is gone is refused at restore", func(t *testing.T, h *harness) {
			// No command log leaves a dead session's waiter queued (ending a
			// session drops its waits); a backup that holds one is refused,
			// so the hand-off re-check stays a last line of defence only.
			w := newSnapWriter(1, 1)
			w.uvarint(0) // sessions
			w.uvarint(1) // locks
			w.str("a")
			w.byte(1)
			w.strs("c1", "")
			w.uvarint(1)
			w.varint(1000)
			w.varint(t0 + 1000)
			w.varint(t0)
			w.uvarint(2) // waiters
			w.strs("ghost", "gone")
			w.varint(0)
			w.varint(t0 + 60000)
			w.varint(t0)
			w.strs("live", "")
			w.varint(1000)
			w.varint(t0 + 60000)
			w.varint(t0)
			w.uvarint(0) // members
			w.uvarint(0) // memo
			if _, err := lt.Restore(w.b); err == nil {
				t.Fatal("a backup with a waiter of a session that does not exist was restored")
			}
		}},
		{"idempotent release", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(acq("a", "c2", 1000, 60000, t0))
			r := h.ok(rel("a", "c1", 1, t0+1))
			if r.Token != 1 || len(r.Events) != 2 {
				t.Fatalf("release: %+v", r)
			}
			// The reply was lost; the client retries after c2 got the lock.
			if r := h.unchanged(rel("a", "c1", 1, t0+2)); r.Code != lt.OK || r.Token != 1 {
				t.Fatalf("retried release: %+v, want ok token 1", r)
			}
			if r := h.unchanged(rel("a", "c3", 1, t0+2)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release of c1's old token by c3: %v, want not_holder", r.Code)
			}
			if r := h.unchanged(rel("a", "c1", 2, t0+2)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release of c2's token by c1: %v, want not_holder", r.Code)
			}
			if r := h.unchanged(rel("a", "c2", 1, t0+2)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release by the holder with an old token: %v, want not_holder", r.Code)
			}
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "c2", Token: 2, TTLms: 1000, ExpiresAt: t0 + 1001})
			h.ok(rel("a", "c2", 2, t0+3))
			if r := h.unchanged(rel("a", "c2", 2, t0+4)); r.Code != lt.OK { // lock gone entirely
				t.Fatalf("retried release of a freed lock: %v", r.Code)
			}
		}},
		{"a release that never happened is not_holder", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			h.ok(expLock("a", 1, t0+1000))
			// Lost to expiry, not released: no memo, so not_holder.
			if r := h.unchanged(rel("a", "c1", 1, t0+1001)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release after expiry: %v, want not_holder", r.Code)
			}
			if r := h.unchanged(rel("never", "c1", 0, t0)); r.Code != lt.CodeNotHolder {
				t.Fatalf("release of an unknown lock: %v", r.Code)
			}
		}},
		{"release memo forgets the oldest after 4096 releases", func(t *testing.T, h *harness) {
			for i := 0; i < 4096+10; i++ {
				r := h.tb.Apply(acq("m", "c", 1000, 0, t0))
				h.tb.Apply(rel("m", "c", r.Token, t0))
			}
			for tok := uint64(1); tok <= 10; tok++ {
				if r := h.unchanged(rel("m", "c", tok, t0)); r.Code != lt.CodeNotHolder {
					t.Fatalf("token %d: %v, want not_holder (evicted)", tok, r.Code)
				}
			}
			for _, tok := range []uint64{11, 2000, 4106} {
				if r := h.unchanged(rel("m", "c", tok, t0)); r.Code != lt.OK {
					t.Fatalf("token %d: %v, want ok (remembered)", tok, r.Code)
				}
			}
		}},
		{"renew", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			r := h.ok(renew("a", "c1", 1, 2000, t0+300))
			if r.Token != 1 || r.ExpiresAt != t0+2300 {
				t.Fatalf("renew: %+v", r)
			}
			wantEvents(t, "renew", r.Events, []lt.Event{{Kind: lt.EvRenewed, Lock: "a", ClientID: "c1", Token: 1, TTLms: 2000, ExpiresAt: t0 + 2300}})
			r = h.ok(renew("a", "c1", 1, 0, t0+400)) // no TTL: keep the current one
			if r.ExpiresAt != t0+2400 {
				t.Fatalf("renew without TTL: %+v, want expiry t0+2400", r)
			}
			for _, c := range []lt.Command{
				renew("a", "c2", 1, 1000, t0+500), // not the holder
				renew("a", "c1", 2, 1000, t0+500), // wrong token
				renew("a", "c1", 0, 1000, t0+500), // no token
				renew("b", "c1", 1, 1000, t0+500), // no such lock
				renew("a", "", 1, 1000, t0+500),   // no client
				renew("", "c1", 1, 1000, t0+500),  // no lock
			} {
				if r := h.unchanged(c); r.Code != lt.CodeNotHolder {
					t.Fatalf("%v: %v, want not_holder", describe(c), r.Code)
				}
			}
		}},
		{"acquire with a missing session is session_expired", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			for _, c := range []lt.Command{
				acqS("b", "c1", "nope", 0, 0, t0),
				acqS("a", "c2", "nope", 1000, 5000, t0), // would queue
				acqS("a", "c1", "nope", 1000, 0, t0),    // even the holder
			} {
				if r := h.unchanged(c); r.Code != lt.CodeSessionExpired || r.Granted || r.Queued {
					t.Fatalf("%v: %+v, want session_expired", describe(c), r)
				}
			}
		}},
		{"a session lock has no TTL of its own unless one is given", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "c1", 15000, t0))
			r := h.ok(acqS("a", "c1", "s", 0, 0, t0))
			if r.ExpiresAt != 0 {
				t.Fatalf("session lock expiry %d, want 0", r.ExpiresAt)
			}
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "c1", SessionID: "s", Token: 1})
			r = h.ok(acqS("b", "c1", "s", 500, 0, t0))
			if r.ExpiresAt != t0+500 {
				t.Fatalf("session lock with TTL: expiry %d", r.ExpiresAt)
			}
			r = h.ok(expLock("b", 2, t0+500)) // its own TTL runs out first
			wantEvents(t, "expire", r.Events, []lt.Event{evLost("b", "c1", "s", 2, lt.ReasonExpired)})
			r = h.ok(expSess("s", t0+600)) // the session no longer holds b
			wantEvents(t, "expire session", r.Events, []lt.Event{
				evLost("a", "c1", "s", 1, lt.ReasonSessionExpired),
				evSessionEnded("s", "c1", lt.ReasonSessionExpired),
			})
		}},
		{"batch applies sub-commands in order with one result each", func(t *testing.T, h *harness) {
			h.ok(mkSess("s", "c9", 15000, t0))
			batch := lt.Command{Op: lt.OpBatch, Now: t0, Batch: []lt.Command{
				acq("a", "c1", 1000, 0, t0),
				acq("a", "c2", 1000, 0, t0),
				acq("a", "c3", 1000, 5000, t0),
				acq("b", "c1", 1000, 0, t0),
				rel("a", "c1", 1, t0+1),
				acq("", "c1", 1000, 0, t0+1),
				{Op: lt.OpBatch, Now: t0 + 1, Batch: []lt.Command{acq("z", "c1", 1000, 0, t0)}},
				delSess("s", t0+2),
				delSess("s", t0+2),
			}}
			// The same commands one by one, on a second table.
			seq := lt.New()
			seq.Apply(mkSess("s", "c9", 15000, t0))
			var want []lt.Result
			for _, c := range batch.Batch {
				if c.Op == lt.OpBatch {
					want = append(want, lt.Result{Code: lt.CodeInvalid})
					continue
				}
				want = append(want, seq.Apply(c))
			}
			r := h.ok(batch)
			if len(r.Batch) != len(batch.Batch) {
				t.Fatalf("%d results for %d commands", len(r.Batch), len(batch.Batch))
			}
			if !reflect.DeepEqual(r.Batch, want) {
				t.Fatalf("batch results\n got  %+v\n want %+v", r.Batch, want)
			}
			codes := []lt.Code{lt.OK, lt.CodeLockHeld, lt.OK, lt.OK, lt.OK, lt.CodeInvalid, lt.CodeInvalid, lt.OK, lt.CodeSessionExpired}
			for i, c := range codes {
				if r.Batch[i].Code != c {
					t.Fatalf("result %d: %v, want %v", i, r.Batch[i].Code, c)
				}
			}
			if r.Batch[0].Token != 1 || r.Batch[3].Token != 2 || !r.Batch[2].Queued {
				t.Fatalf("batch results out of order: %+v", r.Batch)
			}
			if !bytes.Equal(h.tb.Snapshot(), seq.Snapshot()) {
				t.Fatal("batch and one-by-one application disagree")
			}
			wantInfo(t, h.tb, lt.LockInfo{Name: "a", Held: true, ClientID: "c3", Token: 3, TTLms: 1000, ExpiresAt: t0 + 1001})
			wantInfo(t, h.tb, lt.LockInfo{Name: "z"})
		}},
		{"empty batch is a no-op", func(t *testing.T, h *harness) {
			h.ok(acq("a", "c1", 1000, 0, t0))
			r := h.unchanged(lt.Command{Op: lt.OpBatch, Now: t0})
			if r.Code != lt.OK || len(r.Batch) != 0 {
				t.Fatalf("empty batch: %+v", r)
			}
		}},
		{"members set, update and remove", func(t *testing.T, h *harness) {
			h.ok(setMember("n2", "10.0.0.2:7071", "http://10.0.0.2:7070", t0))
			h.ok(setMember("n1", "10.0.0.1:7071", "http://10.0.0.1:7070", t0))
			h.ok(setMember("n3", "10.0.0.3:7071", "", t0))
			want := []lt.Member{
				{ID: "n1", RaftAddr: "10.0.0.1:7071", HTTPAddr: "http://10.0.0.1:7070"},
				{ID: "n2", RaftAddr: "10.0.0.2:7071", HTTPAddr: "http://10.0.0.2:7070"},
				{ID: "n3", RaftAddr: "10.0.0.3:7071"},
			}
			if got := h.tb.Members(); !reflect.DeepEqual(got, want) {
				t.Fatalf("members %+v", got)
			}
			h.ok(setMember("n3", "10.0.0.3:7071", "http://10.0.0.3:7070", t0+1)) // publishes its HTTP address later
			h.ok(rmMember("n2", t0+2))
			h.unchanged(rmMember("n2", t0+3)) // already gone: fine
			want = []lt.Member{want[0], {ID: "n3", RaftAddr: "10.0.0.3:7071", HTTPAddr: "http://10.0.0.3:7070"}}
			if got := h.tb.Members(); !reflect.DeepEqual(got, want) {
				t.Fatalf("members %+v", got)
			}
			if r := h.unchanged(setMember("", "x", "y", t0)); r.Code != lt.CodeInvalid {
				t.Fatalf("member without id: %v", r.Code)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newHarness(t)) })
	}
}

// TestApplyInvalid: a malformed command is refused with CodeInvalid and
// changes nothing, whatever the state.
func TestApplyInvalid(t *testing.T) {
	cases := []struct {
		name string
		cmd  lt.Command
	}{
		{"acquire without lock", acq("", "c1", 1000, 0, t0)},
		{"acquire without client", acq("a", "", 1000, 0, t0)},
		{"acquire with negative TTL", acq("a", "c1", -1, 0, t0)},
		{"acquire with negative wait", acq("a", "c1", 1000, -1, t0)},
		{"acquire without TTL and session", acq("a", "c1", 0, 0, t0)},
		{"holder re-acquire without TTL and session", acq("held", "h", 0, 0, t0)},
		{"waiter retry with negative wait", acq("held", "w", 1000, -5, t0)},
		{"renew with negative TTL", renew("held", "h", 1, -1, t0)},
		{"create session without id", mkSess("", "c1", 15000, t0)},
		{"create session without TTL", mkSess("s2", "c1", 0, t0)},
		{"create session with negative TTL", mkSess("s2", "c1", -1, t0)},
		{"set member without id", setMember("", "a", "b", t0)},
		{"op zero", lt.Command{Op: 0, Now: t0, Lock: "held", ClientID: "h", Token: 1}},
		{"unknown op", lt.Command{Op: 200, Now: t0, Lock: "held", ClientID: "h", Token: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.ok(mkSess("s", "c1", 15000, t0))
			h.ok(acq("held", "h", 1000, 0, t0))
			h.ok(acqS("held", "w", "s", 0, 5000, t0))
			r := h.unchanged(tc.cmd)
			if r.Code != lt.CodeInvalid || r.Granted || r.Queued {
				t.Fatalf("result %+v, want invalid", r)
			}
		})
	}
}

// TestSharedSessionWaits: two clients may queue on one lock through the same
// session (the state machine does not tie a session to its client). When one
// of them leaves the queue, ending the session must still drop the other's
// wait, and a table restored from a snapshot must behave exactly as the
// original: the session's wait index is rebuilt from the locks on Restore.
func TestSharedSessionWaits(t *testing.T) {
	for _, leave := range []struct {
		name string
		cmds []lt.Command
	}{
		{"first waiter times out", []lt.Command{tmo("a", "w1", t0+100)}},
		{"first waiter is granted and releases", []lt.Command{rel("a", "c1", 1, t0+50), rel("a", "w1", 2, t0+60)}},
	} {
		t.Run(leave.name, func(t *testing.T) {
			tb := lt.New()
			log := []lt.Command{
				mkSess("s", "w1", 15000, t0),
				acq("a", "c1", 60000, 0, t0),
				acqS("a", "w1", "s", 1000, 100, t0),
				acq("a", "w3", 1000, 60000, t0),
				acqS("a", "w2", "s", 1000, 60000, t0),
			}
			for _, c := range append(log, leave.cmds...) {
				if r := tb.Apply(c); r.Code != lt.OK {
					t.Fatalf("%v: %v", describe(c), r.Code)
				}
			}
			restored, err := lt.Restore(tb.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			end := delSess("s", t0+200)
			r1, r2 := tb.Apply(end), restored.Apply(end)
			for _, w := range tb.Waiters("a") {
				if w.SessionID == "s" {
					t.Errorf("waiter %q still queued via deleted session s (events %+v)", w.ClientID, r1.Events)
				}
			}
			if !reflect.DeepEqual(r1, r2) {
				t.Errorf("original and restored tables disagree on %v:\n orig     %+v\n restored %+v", describe(end), r1, r2)
			}
			if !bytes.Equal(tb.Snapshot(), restored.Snapshot()) {
				t.Errorf("original and restored tables diverged after %v", describe(end))
			}
		})
	}
}

// TestReadAPI covers the read side the HTTP layer and the leader's timers
// use: Get, List (prefix and limit), Waiters, Session, Stats and ForEach*.
func TestReadAPI(t *testing.T) {
	h := newHarness(t)
	h.ok(mkSess("s1", "c1", 15000, t0))
	h.ok(mkSess("s0", "c0", 15000, t0))
	h.ok(acq("jobs/b", "c1", 1000, 0, t0))
	h.ok(acqS("jobs/a", "c1", "s1", 0, 0, t0))
	h.ok(acq("other", "c2", 1000, 0, t0))
	h.ok(acq("jobs/a", "c3", 1000, 5000, t0))
	h.ok(acqS("jobs/a", "c4", "s0", 0, 6000, t0))

	names := func(lis []lt.LockInfo) (out []string) {
		for _, li := range lis {
			out = append(out, li.Name)
		}
		return out
	}
	if got := names(h.tb.List("", 0)); !reflect.DeepEqual(got, []string{"jobs/a", "jobs/b", "other"}) {
		t.Errorf("List all: %v", got)
	}
	if got := names(h.tb.List("jobs/", 0)); !reflect.DeepEqual(got, []string{"jobs/a", "jobs/b"}) {
		t.Errorf("List jobs/: %v", got)
	}
	if got := names(h.tb.List("jobs/", 1)); !reflect.DeepEqual(got, []string{"jobs/a"}) {
		t.Errorf("List jobs/ limit 1: %v", got)
	}
	if got := h.tb.List("nothing", 0); got == nil || len(got) != 0 {
		t.Errorf("List with no match: %#v, want an empty non-nil slice (JSON [])", got)
	}
	if got := h.tb.Waiters("nope"); got != nil {
		t.Errorf("Waiters of a missing lock: %v", got)
	}
	ws := h.tb.Waiters("jobs/a")
	ws[0].ClientID = "mutated"
	if got := waiterClients(h.tb, "jobs/a"); !reflect.DeepEqual(got, []string{"c3", "c4"}) {
		t.Errorf("Waiters must return a copy: %v", got)
	}
	if _, ok := h.tb.Session("nope"); ok {
		t.Error("Session(nope) exists")
	}
	if got, want := h.tb.Stats(), (lt.Stats{Locks: 3, Held: 3, Holders: 3, Waiters: 2, Sessions: 2, LastToken: 3}); got != want {
		t.Errorf("Stats %+v, want %+v", got, want)
	}
	var held []string
	for _, li := range sortedHeld(h.tb) {
		held = append(held, li.Name+"="+li.ClientID)
	}
	if want := []string{"jobs/a=c1", "jobs/b=c1", "other=c2"}; !reflect.DeepEqual(held, want) {
		t.Errorf("ForEachHeld: %v", held)
	}
	waiting := sortedWaiters(h.tb)
	want := []lt.WaiterInfo{
		{Lock: "jobs/a", Position: 0, Waiter: lt.Waiter{ClientID: "c3", TTLms: 1000, Deadline: t0 + 5000, EnqueuedAt: t0}},
		{Lock: "jobs/a", Position: 1, Waiter: lt.Waiter{ClientID: "c4", SessionID: "s0", Deadline: t0 + 6000, EnqueuedAt: t0}},
	}
	if !reflect.DeepEqual(waiting, want) {
		t.Errorf("ForEachWaiter:\n got  %+v\n want %+v", waiting, want)
	}
	var sessions []string
	for _, s := range sortedSessions(h.tb) {
		sessions = append(sessions, s.ID+"/"+s.ClientID)
	}
	if want := []string{"s0/c0", "s1/c1"}; !reflect.DeepEqual(sessions, want) {
		t.Errorf("ForEachSession: %v", sessions)
	}
}

// TestWaitEndedNamesItsWait: the event of a wait that ended carries that
// wait's deadline, so a server can tell it from a newer wait of the same
// client on the same lock (a retry that re-queued after the first ended).
func TestWaitEndedNamesItsWait(t *testing.T) {
	tb := lt.New()
	tb.Apply(lt.Command{Op: lt.OpAcquire, Lock: "l", ClientID: "h", TTLms: 60000, Now: 1000})
	q := tb.Apply(lt.Command{Op: lt.OpAcquire, Lock: "l", ClientID: "w", TTLms: 1000, WaitMs: 500, Now: 1000})
	if !q.Queued || len(q.Events) != 1 || q.Events[0].Deadline != 1500 {
		t.Fatalf("queued: %+v", q)
	}
	r := tb.Apply(lt.Command{Op: lt.OpTimeoutWaiter, Lock: "l", ClientID: "w", Now: 1600})
	if len(r.Events) != 1 || r.Events[0].Kind != lt.EvWaitEnded || r.Events[0].Deadline != 1500 {
		t.Fatalf("timeout: %+v", r.Events)
	}
	// A new wait of the same client: its own deadline.
	q2 := tb.Apply(lt.Command{Op: lt.OpAcquire, Lock: "l", ClientID: "w", TTLms: 1000, WaitMs: 500, Now: 1700})
	if q2.Events[0].Deadline != 2200 {
		t.Fatalf("second wait: %+v", q2.Events)
	}
	// Dropped at hand-off after its deadline: the event names it too.
	rel := tb.Apply(lt.Command{Op: lt.OpRelease, Lock: "l", ClientID: "h", Token: 1, Now: 2300})
	var ended *lt.Event
	for i := range rel.Events {
		if rel.Events[i].Kind == lt.EvWaitEnded {
			ended = &rel.Events[i]
		}
	}
	if ended == nil || ended.Deadline != 2200 {
		t.Fatalf("hand-off: %+v", rel.Events)
	}
}
