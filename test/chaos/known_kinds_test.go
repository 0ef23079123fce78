package chaos

import (
	"fmt"
	"testing"
	"time"
)

// Known-good and known-bad histories for the lock-kinds checkers
// (kinds_checkers_test.go). Each bad history is the shape of a bug the
// kinds workload is meant to catch; its good twin shows the checker does
// not flag the correct behaviour. Times are in milliseconds.

// kgrant: client acquires a kinds lock in [inv, ret] with mode and limit
// (0: none given) and gets token for ttl ms.
func (b *hb) kgrant(lock, client string, inv, ret int64, token uint64, ttl int64, mode string, limit int64) *Op {
	op := b.grant(lock, client, inv, ret, token, ttl)
	op.Mode, op.Limit, op.GrantMode = mode, limit, modeOf(mode)
	return op
}

// multi: client's multi-acquire in [inv, ret], granted grants (ttl ms).
func (b *hb) multi(client string, inv, ret int64, ttl int64, mode string, grants ...GrantRec) *Op {
	b.attempt++
	op := b.add(Op{Kind: KindMulti, ClientID: client, Attempt: b.attempt, TTLms: ttl, Invoke: inv, Return: ret, Outcome: Ok, Mode: mode})
	op.ExpiryLB = expiryLB(op.Invoke, time.Duration(ttl)*time.Millisecond)
	for _, g := range grants {
		op.Locks = append(op.Locks, g.Lock)
		if g.Mode == "" {
			g.Mode = modeOf(mode)
		}
		if g.ExpiresAt == 0 {
			g.ExpiresAt = msT(ret + ttl)
		}
		op.Grants = append(op.Grants, g)
	}
	return op
}

// kread: a linearizable read of a kinds lock showing holders (client,
// token, mode), with the status's mode and limit.
func (b *hb) kread(lock string, inv, ret int64, limit int64, holders ...HolderRec) *Op {
	op := b.add(Op{Kind: KindRead, Worker: "reader", Lock: lock, Invoke: inv, Return: ret, Outcome: Ok, Limit: limit,
		Mode: "none", Holders: holders})
	if len(holders) > 0 {
		op.Held, op.Holder, op.OutToken, op.Mode = true, holders[0].Client, holders[0].Token, modeOf(holders[0].Mode)
	}
	return op
}

func (b *hb) krevoke(lock string, token uint64, inv, ret int64, out Outcome, code string, revoked ...uint64) *Op {
	op := b.add(Op{Kind: KindRevoke, Worker: "revoker", Lock: lock, Token: token, Invoke: inv, Return: ret, Outcome: out, Code: code,
		Revoked: revoked})
	if out == Ok && op.Revoked == nil {
		op.Revoked = []uint64{}
	}
	return op
}

func excl(client string, tok uint64) HolderRec {
	return HolderRec{Client: client, Token: tok, Mode: "exclusive"}
}

func shared(client string, tok uint64) HolderRec {
	return HolderRec{Client: client, Token: tok, Mode: "shared"}
}

// TestCheckerCatchesTwoHoldersOfSemaphoreOfOne: a lock asked for as a
// semaphore with limit 1 has two exclusive holders at once — told to their
// clients, or in one read. In turn they are fine.
func TestCheckerCatchesTwoHoldersOfSemaphoreOfOne(t *testing.T) {
	const lock = "kind-1-s1-0"
	for _, tc := range []struct {
		name string
		bad  bool
		read bool
	}{{"in turn", false, false}, {"overlapping grants", true, false}, {"one read shows two", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.kgrant(lock, "a", 0, 10, 1, 5000, "", 1)
			switch {
			case tc.read:
				b.kread(lock, 100, 110, 1, excl("a", 1), excl("b", 2))
				b.release(lock, "a", 1, 300, 310, Ok, "")
			case tc.bad:
				b.kgrant(lock, "b", 100, 110, 2, 5000, "", 1)
				b.release(lock, "a", 1, 300, 310, Ok, "")
				b.release(lock, "b", 2, 400, 410, Ok, "")
			default:
				b.release(lock, "a", 1, 300, 310, Ok, "")
				b.kgrant(lock, "b", 400, 410, 2, 5000, "", 1)
				b.release(lock, "b", 2, 500, 510, Ok, "")
			}
			rep := check(t, b.history())
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "limit")
		})
	}
}

// TestCheckerCatchesFourHoldersOfSemaphoreOfThree: three permits of a
// semaphore of 3 at once are right; a fourth is not — told to four
// clients at once, or shown by one read.
func TestCheckerCatchesFourHoldersOfSemaphoreOfThree(t *testing.T) {
	const lock = "kind-1-s3-0"
	for _, n := range []int{3, 4} {
		for _, read := range []bool{false, true} {
			t.Run(fmt.Sprintf("holders=%d,read=%t", n, read), func(t *testing.T) {
				var b hb
				var hs []HolderRec
				for i := range n {
					c, tok := fmt.Sprintf("c%d", i), uint64(i+1)
					if read {
						hs = append(hs, excl(c, tok))
					} else {
						b.kgrant(lock, c, int64(i*10), int64(i*10+5), tok, 5000, "", 3)
					}
				}
				if read {
					b.kread(lock, 100, 110, 3, hs...)
				}
				rep := check(t, b.history())
				if read && rep.KindReads != 1 {
					t.Fatalf("kinds reads checked: %d, want 1", rep.KindReads)
				}
				if n <= 3 {
					clean(t, rep)
					return
				}
				flagged(t, rep, "limit")
			})
		}
	}
}

// TestCheckerCatchesSharedWithExclusive: shared holders of a read-write
// lock coexist; an exclusive grant beside one does not — told to the
// clients, or in one read.
func TestCheckerCatchesSharedWithExclusive(t *testing.T) {
	const lock = "kind-1-rw0"
	for _, tc := range []struct {
		name  string
		mode2 string
		read  bool
		bad   bool
	}{
		{"two shared", "shared", false, false},
		{"shared and exclusive", "exclusive", false, true},
		{"a read shows both", "exclusive", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.kgrant(lock, "r", 0, 10, 1, 5000, "shared", 0)
			if tc.read {
				b.kread(lock, 100, 110, 1, shared("r", 1), excl("w", 2))
			} else {
				b.kgrant(lock, "w", 100, 110, 2, 5000, tc.mode2, 0)
				b.kread(lock, 200, 210, 1, shared("r", 1), HolderRec{Client: "w", Token: 2, Mode: tc.mode2})
				b.release(lock, "w", 2, 400, 410, Ok, "")
			}
			b.release(lock, "r", 1, 300, 310, Ok, "")
			rep := check(t, b.history())
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "mode")
		})
	}
}

// TestCheckerCatchesPartialMultiGrant: a multi-acquire is granted whole in
// one step. Flagged: a reply without one of the locks; tokens that are not
// consecutive (another grant between them); a list of the whole table that
// shows one lock held by the client and not the other while the other
// cannot have ended. Fine: a list showing both, or one after the other
// was released.
func TestCheckerCatchesPartialMultiGrant(t *testing.T) {
	const a, c = "kind-1-rw0", "kind-1-rw2"
	for _, tc := range []struct {
		name string
		want string
	}{
		{"whole", ""},
		{"a list after a release of one", ""},
		{"a reply without one lock", "multi-atomic"},
		{"tokens not consecutive", "multi-atomic"},
		{"a list shows part", "multi-atomic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			t2 := uint64(2)
			if tc.name == "tokens not consecutive" {
				t2 = 3
				b.kgrant("kind-1-s3-0", "z", 100, 110, 2, 5000, "", 3)
				b.release("kind-1-s3-0", "z", 2, 120, 130, Ok, "")
			}
			m := b.multi("m", 100, 110, 5000, "", GrantRec{Lock: a, Token: 1}, GrantRec{Lock: c, Token: t2})
			if tc.name == "a reply without one lock" {
				m.Locks = []string{a, "kind-1-rw1", c}
			}
			var snap []*Op
			switch tc.name {
			case "whole":
				snap = append(snap, b.kread(a, 200, 210, 1, excl("m", 1)), b.kread(c, 200, 210, 1, excl("m", t2)))
			case "a list after a release of one":
				b.release(c, "m", t2, 150, 160, Ok, "")
				snap = append(snap, b.kread(a, 200, 210, 1, excl("m", 1)))
			case "a list shows part":
				snap = append(snap, b.kread(a, 200, 210, 1, excl("m", 1)))
			}
			for _, s := range snap {
				s.Snap = 7
			}
			b.release(a, "m", 1, 300, 310, Ok, "")
			if tc.name != "a list after a release of one" {
				b.release(c, "m", t2, 320, 330, Ok, "")
			}
			rep := check(t, b.history())
			if rep.MultiGrants != 1 {
				t.Fatalf("multi grants checked: %d, want 1", rep.MultiGrants)
			}
			if tc.want == "" {
				clean(t, rep)
				return
			}
			flagged(t, rep, tc.want)
		})
	}
}

// TestCheckerCatchesGrantDuringDelay: a grant with lock_delay_ms 500 and
// expires_at 1.0 s walks away; nobody may hold the lock before 1.5 s — or,
// when a revoke sent at 0.3 s ended it, before 0.8 s. A release applies no
// delay.
func TestCheckerCatchesGrantDuringDelay(t *testing.T) {
	const lock = "kind-d1"
	for _, tc := range []struct {
		name    string
		end     string // "expire", "revoke", "release"
		grantAt int64
		bad     bool
	}{
		{"after the delay", "expire", 1600, false},
		{"during the delay", "expire", 1200, true},
		{"after a revoke's delay", "revoke", 900, false},
		{"during a revoke's delay", "revoke", 700, true},
		{"after a release", "release", 400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			h := b.kgrant(lock, "h", 0, 10, 1, 1000, "", 0)
			h.DelayMs, h.ExpiresAt, h.Tag = 500, msT(1000), "delay:1:holder"
			switch tc.end {
			case "revoke":
				b.krevoke(lock, 1, 300, 310, Ok, "", 1).Tag = "delay:1:revoke"
			case "release":
				b.release(lock, "h", 1, 300, 310, Ok, "").Tag = "delay:1:release"
			}
			w := b.kgrant(lock, "w", 50, tc.grantAt, 2, 1000, "", 0)
			w.WaitMs, w.Tag = 6000, "delay:1:waiter"
			b.release(lock, "w", 2, tc.grantAt+20, tc.grantAt+30, Ok, "")
			rep := check(t, b.historyET())
			if tc.end != "release" && rep.DelaysChecked != 1 {
				t.Fatalf("lock-delays checked: %d, want 1", rep.DelaysChecked)
			}
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "lock-delay")
		})
	}
}

// TestCheckerCatchesLateDelayWaiter: the holder's grant (expires_at 1.0 s,
// lock_delay 500 ms) walked away; its waiter (wait 6 s) must hold the lock
// by 1.0 + 0.5 + 0.3 + 1 s = 2.8 s (plus a second to be told). Granted at
// 1.6 s is right; at 3.9 s, or a wait_timeout, is not; a fault in between
// moves the bound.
func TestCheckerCatchesLateDelayWaiter(t *testing.T) {
	const lock = "kind-d1"
	for _, tc := range []struct {
		name  string
		out   Outcome
		ret   int64
		fault bool
		bad   bool
	}{
		{"in time", Ok, 1600, false, false},
		{"late", Ok, 3900, false, true},
		{"timed out", Fail, 6060, false, true},
		{"late after a fault", Ok, 3900, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			h := b.kgrant(lock, "h", 0, 10, 1, 1000, "", 0)
			h.DelayMs, h.ExpiresAt, h.Tag = 500, msT(1000), "delay:1:holder"
			w := b.acquireOutcome(lock, "w", 50, tc.ret, 1000, tc.out, "")
			w.WaitMs, w.Tag = 6000, "delay:1:waiter"
			if tc.out == Ok {
				w.OutToken = 2
				b.release(lock, "w", 2, tc.ret+20, tc.ret+30, Ok, "")
			} else {
				w.Code = "wait_timeout"
			}
			h2 := b.historyET()
			if tc.fault {
				h2.Faults = []Fault{{Kind: FaultKillLeader, Start: msT(1200), End: msT(2000), Healed: msT(1800), Healthy: msT(2000)}}
			}
			rep := check(t, h2)
			if rep.DelayRounds != 1 {
				t.Fatalf("delay rounds checked: %d, want 1", rep.DelayRounds)
			}
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "delay-waiter")
		})
	}
}

// TestCheckerCatchesReusedTokenAcrossKinds: one global counter for every
// kind: a semaphore permit and a grant of a multi-acquire with one token
// is a reused token; a multi-acquire asked for after a shared grant was
// known, with lower tokens, is a token regression.
func TestCheckerCatchesReusedTokenAcrossKinds(t *testing.T) {
	t.Run("reused", func(t *testing.T) {
		var b hb
		b.kgrant("kind-1-s3-0", "a", 0, 10, 5, 1000, "", 3)
		b.multi("m", 0, 10, 1000, "", GrantRec{Lock: "kind-1-rw0", Token: 5}, GrantRec{Lock: "kind-1-rw1", Token: 6})
		flagged(t, check(t, b.history()), "token-unique")
	})
	t.Run("regression", func(t *testing.T) {
		var b hb
		b.kgrant("kind-1-rw3", "r", 0, 10, 7, 1000, "shared", 0)
		b.multi("m", 50, 60, 1000, "", GrantRec{Lock: "kind-1-rw0", Token: 3}, GrantRec{Lock: "kind-1-rw1", Token: 4})
		flagged(t, check(t, b.history()), "token-order")
	})
	t.Run("good", func(t *testing.T) {
		var b hb
		b.kgrant("kind-1-rw3", "r", 0, 10, 7, 1000, "shared", 0)
		b.multi("m", 50, 60, 1000, "", GrantRec{Lock: "kind-1-rw0", Token: 8}, GrantRec{Lock: "kind-1-rw1", Token: 9})
		b.kgrant("kind-1-s3-0", "a", 70, 80, 10, 1000, "", 3)
		clean(t, check(t, b.history()))
	})
}

// TestCheckerCatchesRevokeBugs: a revoked grant is gone — its release is
// refused not_holder, nothing shows it after the revoke's reply, its
// WebSocket holder is pushed lost with reason revoked (in time) — and a
// revoke finds every grant that held throughout it.
func TestCheckerCatchesRevokeBugs(t *testing.T) {
	const lock = "kind-1-rw0"
	for _, tc := range []struct {
		name string
		want string
	}{
		{"good", ""},
		{"release answered released", "revoke"},
		{"read after the revoke", "revoke"},
		{"lost with another reason", "revoke"},
		{"never pushed lost", "revoke-told"},
		{"not_holder while held", "revoke"},
		{"a held grant not named", "revoke"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			g := b.kgrant(lock, "ws1", 0, 10, 1, 5000, "shared", 0)
			g.Via = "ws"
			b.kgrant(lock, "h2", 20, 30, 2, 5000, "shared", 0)
			switch tc.name {
			case "not_holder while held":
				b.krevoke(lock, 1, 100, 110, Fail, "not_holder")
				b.release(lock, "ws1", 1, 300, 310, Ok, "").Via = "ws"
				b.release(lock, "h2", 2, 300, 310, Ok, "")
				flagged(t, check(t, b.historyET()), tc.want)
				return
			case "a held grant not named":
				b.krevoke(lock, 0, 100, 110, Ok, "", 1)
			default:
				b.krevoke(lock, 0, 100, 110, Ok, "", 1, 2)
			}
			reason := "revoked"
			if tc.name == "lost with another reason" {
				reason = "expired"
			}
			if tc.name != "never pushed lost" {
				b.add(Op{Kind: KindLost, Via: "ws", Lock: lock, ClientID: "ws1", Token: 1, Invoke: 112, Return: 112, Outcome: Ok, Code: reason})
			}
			rel := b.release(lock, "ws1", 1, 200, 210, Fail, "not_holder")
			rel.Via = "ws"
			if tc.name == "release answered released" {
				rel.Outcome, rel.Code = Ok, ""
			}
			if tc.name == "read after the revoke" {
				b.kread(lock, 150, 160, 1, shared("ws1", 1))
			}
			if tc.name != "a held grant not named" {
				b.release(lock, "h2", 2, 220, 230, Fail, "not_holder")
			} else {
				b.release(lock, "h2", 2, 220, 230, Ok, "")
			}
			b.add(Op{Kind: KindRead, Worker: "reader", Lock: "kind-1-rw1", Invoke: 2000, Return: 2010, Outcome: Ok}) // the run goes on
			rep := check(t, b.historyET())
			if tc.want == "" {
				clean(t, rep)
				if rep.RevokeTold != 1 || rep.RevokedRefused != 2 {
					t.Fatalf("revoked holders told checked %d (want 1), releases refused %d (want 2)", rep.RevokeTold, rep.RevokedRefused)
				}
				return
			}
			flagged(t, rep, tc.want)
		})
	}
}

// TestCheckerCatchesLimitMismatchBugs: while a semaphore of 3 is held, an
// acquire naming limit 2 must be refused limit_mismatch, and a multi-
// acquire naming it too; an acquire naming the lock's own limit never is,
// and a held semaphore keeps its limit.
func TestCheckerCatchesLimitMismatchBugs(t *testing.T) {
	const lock = "kind-1-s3-0"
	for _, tc := range []struct {
		name string
		want string
	}{
		{"probes refused", ""},
		{"probe refused for now (overloaded)", ""},
		{"probe granted", "limit"},
		{"probe refused lock_held", "limit"},
		{"own limit refused", "limit"},
		{"read shows another limit", "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.kgrant(lock, "a", 0, 10, 1, 5000, "", 3)
			p := b.acquireOutcome(lock, "a-mm", 20, 30, 1000, Fail, "limit_mismatch")
			p.Limit, p.Tag = 2, "mismatch:1"
			m := b.add(Op{Kind: KindMulti, ClientID: "a-mmm", Locks: []string{"kind-1-rw0", lock}, TTLms: 1000, Invoke: 40, Return: 50,
				Outcome: Fail, Code: "limit_mismatch", Tag: "mismatch:1"})
			switch tc.name {
			case "probe granted":
				p.Outcome, p.Code, p.OutToken, p.GrantMode = Ok, "", 2, "exclusive"
				b.release(lock, "a-mm", 2, 60, 70, Ok, "")
			case "probe refused lock_held":
				m.Code = "lock_held"
			case "probe refused for now (overloaded)":
				// Admission refused it before the table was asked: no
				// answer about the limit, not a wrong one.
				m.Code, m.RetryAfterMs = "overloaded", 200
			case "own limit refused":
				b.acquireOutcome(lock, "b", 80, 90, 1000, Fail, "limit_mismatch").Limit = 3
			case "read shows another limit":
				b.kread(lock, 80, 90, 2, excl("a", 1))
			}
			b.release(lock, "a", 1, 200, 210, Ok, "")
			rep := check(t, b.history())
			if want := 2 - boolInt(tc.name == "probe refused for now (overloaded)"); rep.MismatchChecked != want {
				t.Fatalf("mismatch probes checked: %d, want %d", rep.MismatchChecked, want)
			}
			if tc.want == "" {
				clean(t, rep)
				return
			}
			flagged(t, rep, tc.want)
		})
	}
}

// TestCheckerCatchesKindsStaleRead: a linearizable read of a kinds lock
// (or a list of the whole table) that misses a grant that held throughout
// it.
func TestCheckerCatchesKindsStaleRead(t *testing.T) {
	const lock = "kind-1-s3-1"
	for _, tc := range []struct {
		name string
		bad  bool
	}{{"shown", false}, {"read misses it", true}, {"list misses the lock", true}, {"after its lease", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.kgrant(lock, "a", 0, 10, 1, 1000, "", 3)
			b.kgrant(lock, "b", 20, 30, 2, 5000, "", 3)
			switch tc.name {
			case "shown":
				b.kread(lock, 100, 110, 3, excl("a", 1), excl("b", 2))
			case "read misses it":
				b.kread(lock, 100, 110, 3, excl("b", 2))
			case "list misses the lock":
				b.kread("kind-1-rw0", 100, 110, 1).Snap = 3
			case "after its lease":
				b.kread(lock, 1500, 1510, 3, excl("b", 2))
			}
			b.release(lock, "b", 2, 2000, 2010, Ok, "")
			rep := check(t, b.history())
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "kinds-read")
		})
	}
}

// TestCheckerAcceptsKindsHistory: a history with every kind — shared
// holders together, a semaphore at its limit, a shared multi-acquire
// beside a shared grant, a hand-off to an exclusive waiter, a revocation
// of one permit with the holder told and refused, a lock-delay respected —
// passes every checker.
func TestCheckerAcceptsKindsHistory(t *testing.T) {
	var b hb
	rw0, rw1, s3 := "kind-1-rw0", "kind-1-rw1", "kind-1-s3-0"
	b.kgrant(rw0, "r1", 0, 10, 1, 3000, "shared", 0)
	b.multi("m", 20, 30, 3000, "shared", GrantRec{Lock: rw0, Token: 2}, GrantRec{Lock: rw1, Token: 3})
	for i := range 3 {
		g := b.kgrant(s3, fmt.Sprintf("s%d", i), int64(40+i*10), int64(45+i*10), uint64(4+i), 3000, "", 3)
		if i == 0 {
			g.Via = "ws"
		}
	}
	all := b.kread(s3, 100, 110, 3, excl("s0", 4), excl("s1", 5), excl("s2", 6))
	all.Snap = 1
	for _, r := range []*Op{b.kread(rw0, 100, 110, 1, shared("r1", 1), shared("m", 2)), b.kread(rw1, 100, 110, 1, shared("m", 3))} {
		r.Snap = 1
	}
	b.krevoke(s3, 4, 200, 210, Ok, "", 4)
	b.add(Op{Kind: KindLost, Via: "ws", Lock: s3, ClientID: "s0", Token: 4, Invoke: 212, Return: 212, Outcome: Ok, Code: "revoked"})
	b.release(s3, "s0", 4, 250, 260, Fail, "not_holder").Via = "ws"
	b.kgrant(s3, "s3", 270, 280, 7, 3000, "", 3)
	b.release(rw0, "r1", 1, 300, 310, Ok, "")
	b.release(rw0, "m", 2, 320, 330, Ok, "")
	b.release(rw1, "m", 3, 320, 330, Ok, "")
	b.kgrant(rw0, "w", 100, 335, 8, 3000, "exclusive", 0).WaitMs = 2000
	b.kread(rw0, 400, 410, 1, excl("w", 8))
	b.release(rw0, "w", 8, 500, 510, Ok, "")
	for i, c := range []string{"s1", "s2", "s3"} {
		b.release(s3, c, uint64(5+i), 600, 610, Ok, "")
	}
	h := b.kgrant("kind-d1", "h", 700, 710, 9, 500, "", 0)
	h.DelayMs, h.ExpiresAt = 300, msT(1200)
	b.kread("kind-d1", 1300, 1310, 1).DelayedUntil = msT(1500)
	b.kgrant("kind-d1", "w2", 800, 1520, 10, 1000, "", 0).WaitMs = 3000
	b.release("kind-d1", "w2", 10, 1600, 1610, Ok, "")
	b.add(Op{Kind: KindRead, Worker: "reader", Lock: "kind-1-rw1", Invoke: 2000, Return: 2010, Outcome: Ok})
	rep := check(t, b.historyET())
	clean(t, rep)
	if rep.MultiGrants != 1 || rep.MultiSnapshots != 1 || rep.Revokes != 1 || rep.DelaysChecked != 1 || rep.KindReadGrants == 0 {
		t.Fatalf("checked too little: multi %d (seen %d), revokes %d, delays %d, read grants %d",
			rep.MultiGrants, rep.MultiSnapshots, rep.Revokes, rep.DelaysChecked, rep.KindReadGrants)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
