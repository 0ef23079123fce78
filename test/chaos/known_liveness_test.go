package chaos

import (
	"fmt"
	"testing"
)

// Known-good and known-bad histories for the liveness checkers and the
// promises beyond one request (liveness_test.go): each bad history is the
// shape of a bug the chaos runs are meant to catch, and its good twin
// shows the checker does not flag the correct behaviour. Times are in
// milliseconds; the members' election timeout is 300 ms, so a lock whose
// holder walked away must be free by expires_at + 1.3 s.

func (b *hb) historyET() History {
	h := b.history()
	h.ElectionTimeoutMs = 300
	return h
}

// TestCheckerCatchesLockHeldPastExpiry: the holder walked away (its
// acquire's reply said expires_at 1.0 s); a read at 2.4 s — past 1.0 +
// 0.3 + 1 s — still shows it held: the lock never expired (an expiry timer
// lost with the request that made the grant). A read at 2.2 s is within
// the grace and fine, and so is a free lock at 2.4 s.
func TestCheckerCatchesLockHeldPastExpiry(t *testing.T) {
	for _, tc := range []struct {
		readAt int64
		held   bool
		bad    bool
	}{
		{2200, true, false},
		{2400, false, false},
		{2400, true, true},
	} {
		t.Run(fmt.Sprintf("read=%dms,held=%t", tc.readAt, tc.held), func(t *testing.T) {
			var b hb
			b.grant("L", "a", 0, 10, 1, 1000).ExpiresAt = msT(1000)
			rd := b.read("L", tc.readAt, tc.readAt+5, "", 0)
			if tc.held {
				rd.Held, rd.Holder, rd.OutToken, rd.ExpiresAt = true, "a", 1, msT(1000)
			}
			rep := check(t, b.historyET())
			if rep.ExpiryChecked == 0 && tc.held {
				t.Fatal("the read of the held lock was not checked")
			}
			if tc.bad {
				flagged(t, rep, "expiry")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerExpiryBoundMovesPastFaults: with a fault that may have left
// the cluster without a leader from 1.2 s until it was healthy at 3.0 s,
// the lock may be held until 3.0 + 1.3 s: a read at 4.2 s is fine, one at
// 4.4 s is not.
func TestCheckerExpiryBoundMovesPastFaults(t *testing.T) {
	for _, tc := range []struct {
		readAt int64
		bad    bool
	}{{4200, false}, {4400, true}} {
		t.Run(fmt.Sprintf("read=%dms", tc.readAt), func(t *testing.T) {
			var b hb
			b.grant("L", "a", 0, 10, 1, 1000).ExpiresAt = msT(1000)
			rd := b.read("L", tc.readAt, tc.readAt+5, "a", 1)
			rd.ExpiresAt = msT(1000)
			h := b.historyET()
			h.Faults = []Fault{{Kind: FaultKillLeader, Start: msT(1200), End: msT(2500), Healed: msT(2000), Healthy: msT(3000)}}
			rep := check(t, h)
			if tc.bad {
				flagged(t, rep, "expiry")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerCatchesHolderNamedPastExpiry: a try-acquire at 2.5 s is
// refused lock_held naming a holder whose last word was an acquire that
// said expires_at 1.0 s. With an unknown renew sent by the holder in
// between (it may have moved the expiry), the refusal proves nothing.
func TestCheckerCatchesHolderNamedPastExpiry(t *testing.T) {
	for _, renewed := range []bool{false, true} {
		t.Run(fmt.Sprintf("unknown-renew=%t", renewed), func(t *testing.T) {
			var b hb
			b.grant("L", "a", 0, 10, 1, 1000).ExpiresAt = msT(1000)
			if renewed {
				b.add(Op{Kind: KindRenew, Lock: "L", ClientID: "a", Token: 1, TTLms: 5000, Invoke: 900, Return: 3400,
					Outcome: Unknown, ExpiryLB: msT(5895)})
			}
			b.acquireOutcome("L", "b", 2500, 2505, 1000, Fail, "lock_held").Holder = "a"
			rep := check(t, b.historyET())
			if renewed {
				clean(t, rep)
			} else {
				flagged(t, rep, "expiry")
			}
		})
	}
}

// TestCheckerCatchesUntoldWaiter: the holder released at 0.5 s and the
// lock went to the waiter (a read at 0.6 s shows it holding token 2), but
// the waiter's acquire, sent at 0.1 s with a 2 s wait, got no answer until
// the client gave up at 4.6 s: the grant was never pushed. Told at once
// (its acquire answered with token 2 at 0.51 s), it is fine; told only at
// 4.6 s (a fallback poll, not the push) it is not; and a paused leader may
// have held the waiting request.
func TestCheckerCatchesUntoldWaiter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		told  bool
		fault bool
		bad   bool
	}{
		{"told", true, false, false},
		{"told late", true, false, true},
		{"untold", false, false, true},
		{"untold during a pause of the leader", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.grant("L", "h", 0, 10, 1, 5000)
			wt := b.acquireOutcome("L", "w", 100, 4600, 3000, Unknown, "")
			wt.WaitMs, wt.GaveUp, wt.Err = 2000, true, "context deadline exceeded"
			if tc.told {
				wt.Outcome, wt.OutToken, wt.GaveUp, wt.Err = Ok, 2, false, ""
				if !tc.bad {
					wt.Return = msT(510)
				}
			}
			b.release("L", "h", 1, 500, 505, Ok, "")
			b.read("L", 600, 610, "w", 2)
			h := b.historyET()
			if tc.fault {
				h.Faults = []Fault{{Kind: FaultPauseLeader, Targets: []string{"n1"}, Start: msT(300), End: msT(4000),
					Healed: msT(3500), Healthy: msT(4000)}}
			}
			rep := check(t, h)
			if tc.bad {
				flagged(t, rep, "waiter-told")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerCatchesUnansweredWait: a wait of 1 s that got no answer at
// all — neither the grant nor wait_timeout — until the client gave up at
// 3.5 s. A wait whose connection broke (not given up) proves nothing.
func TestCheckerCatchesUnansweredWait(t *testing.T) {
	for _, gaveUp := range []bool{true, false} {
		t.Run(fmt.Sprintf("gave-up=%t", gaveUp), func(t *testing.T) {
			var b hb
			b.grant("L", "h", 0, 10, 1, 60000)
			wt := b.acquireOutcome("L", "w", 100, 3600, 3000, Unknown, "")
			wt.WaitMs, wt.GaveUp, wt.Err = 1000, gaveUp, "connection reset by peer"
			rep := check(t, b.historyET())
			if gaveUp {
				flagged(t, rep, "waiter-told")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerExcusesAHarnessStall: the same unanswered wait, but the test
// process stood still (a harness-stall, recorded by watchStalls) from
// 0.9 s to 2.2 s — its clients and Raft proxies with it: the wait proves
// nothing.
func TestCheckerExcusesAHarnessStall(t *testing.T) {
	var b hb
	b.grant("L", "h", 0, 10, 1, 60000)
	wt := b.acquireOutcome("L", "w", 100, 2105, 3000, Unknown, "")
	wt.WaitMs, wt.GaveUp, wt.Err = 1000, true, "no answer from the leader within the wait"
	h := b.historyET()
	h.Faults = []Fault{{Kind: FaultStall, Start: msT(900), End: msT(2100), Healed: msT(2100), Healthy: msT(2100)}}
	clean(t, check(t, h))
	h.Faults = nil
	flagged(t, check(t, h), "waiter-told")
}

// TestCheckerCatchesLateLost: a Go client holds L (token 1, TTL 1 s) and
// walks away; the server grants L to b, acknowledged at 1.05 s. Lost()
// must have closed by then: closing at 0.99 s is right, at 1.2 s is a
// client that counted on a lock another client was told it holds. A holder
// that sent its release at 0.5 s stopped counting on it then.
func TestCheckerCatchesLateLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lost     int64
		released bool
		bad      bool
	}{
		{"in time", 990, false, false},
		{"late", 1200, false, true},
		{"late after a release", 1200, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			g := b.grant("L", "ws0", 0, 10, 1, 1000)
			g.Via = "client"
			if tc.released {
				b.add(Op{Kind: KindRelease, Via: "client", Lock: "L", ClientID: "ws0", Token: 1, Invoke: 500, Return: 3000, Outcome: Unknown})
			}
			b.add(Op{Kind: KindLost, Via: "client", Lock: "L", ClientID: "ws0", Token: 1, Invoke: tc.lost, Return: tc.lost, Outcome: Ok,
				Err: "lease expired"})
			b.grant("L", "b", 1000, 1050, 2, 1000)
			rep := check(t, b.historyET())
			if rep.LostChecked != 1 {
				t.Fatalf("Go-client grants compared: %d, want 1", rep.LostChecked)
			}
			if tc.bad {
				flagged(t, rep, "lost-late")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerCatchesTokenReissuedByRestore: a forced restore at [1.0 s,
// 1.2 s] while grants are made. Token 5 was acknowledged during it (after
// the backup's counter was read) and, once restored, handed out again to
// another client: acknowledged twice. Another shape of the same bug: a
// grant asked for after the restore gets a token below one acknowledged
// before it. The good twin: tokens keep rising across the restore, and the
// holder of a grant the backup brought back is told the same token again.
func TestCheckerCatchesTokenReissuedByRestore(t *testing.T) {
	restore := []Fault{{Kind: FaultRestore, Start: msT(1000), End: msT(1200), Healed: msT(1200), Healthy: msT(1300)}}
	run := func(t *testing.T, b *hb) *Report {
		for _, op := range b.ops {
			op.Tag = TagRestore
		}
		h := b.historyET()
		h.Faults = restore
		return check(t, h)
	}
	t.Run("duplicate", func(t *testing.T) {
		var b hb
		b.grant("restore-1", "r0-1", 900, 1100, 5, 1000)
		b.grant("restore-2", "r1-1", 1300, 1310, 5, 1000)
		flagged(t, run(t, &b), "token-reissued")
	})
	t.Run("below the floor", func(t *testing.T) {
		var b hb
		b.grant("restore-1", "r0-1", 100, 110, 7, 1000)
		b.grant("restore-2", "r1-1", 1300, 1310, 6, 1000)
		flagged(t, run(t, &b), "token-reissued")
	})
	t.Run("good", func(t *testing.T) {
		var b hb
		b.grant("restore-1", "r0-1", 100, 110, 5, 60000)
		b.grant("restore-2", "r1-1", 900, 1100, 6, 1000)
		b.grant("restore-1", "r0-1", 1300, 1310, 5, 60000) // brought back by the restore: same grant
		b.grant("restore-3", "r2-1", 1300, 1320, 8, 1000)
		rep := run(t, &b)
		clean(t, rep)
		if rep.RestoresChecked != 1 {
			t.Fatalf("restores checked: %d, want 1", rep.RestoresChecked)
		}
	})
}

// TestCheckerCatchesKeepaliveFromDeposedLeader: a keepalive sent at 2.0 s
// to n1, paused from 1.0 s to 4.0 s while n2 answered writes as leader
// from 1.8 s, was acknowledged when n1 woke up. Refused (503), or when no
// other member led during the pause (the first write answered was n1's own,
// after it woke), it is fine.
func TestCheckerCatchesKeepaliveFromDeposedLeader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		failover int64
		by       string
		bad      bool
	}{
		{"acknowledged by the deposed leader", 200, 800, "n2", true},
		{"refused by the deposed leader", 503, 800, "n2", false},
		{"no other leader meanwhile", 200, 3050, "n1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			ka := b.add(Op{Kind: KindKeepalive, Via: "nemesis", ClientID: "s1", Node: "n1", Invoke: 2000, Return: 4020,
				Outcome: Ok, Status: tc.status})
			if tc.status != 200 {
				ka.Outcome, ka.Code = Unknown, "no_leader"
			}
			h := b.historyET()
			h.Faults = []Fault{{Kind: FaultPauseLeader, Targets: []string{"n1"}, Start: msT(1000), End: msT(4500),
				Healed: msT(4000), Healthy: msT(4500), Failover: msT(tc.failover), FailoverBy: tc.by}}
			rep := check(t, h)
			if rep.KeepalivesPaused != 1 {
				t.Fatalf("keepalives to a paused leader: %d, want 1", rep.KeepalivesPaused)
			}
			if tc.bad {
				flagged(t, rep, "keepalive-deposed")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerCatchesBadMemberAccepted: a member addition with a garbage
// raft_addr and a 65,000-byte 0xFF http_addr must be refused with 400; a
// member process that exits on its own is a liveness failure, a panic in a
// member's log (a request that crashed its handler) a safety one.
func TestCheckerCatchesBadMemberAccepted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		exit   bool
		want   string
	}{
		{"refused", 400, false, ""},
		{"accepted", 200, false, "bad-member"},
		{"a member crashed", 400, true, "member-exit"},
		{"a member panicked", 400, false, "member-panic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.add(Op{Kind: KindMemberAdd, Via: "nemesis", ClientID: "bad-1", Node: "n1", Invoke: 0, Return: 10,
				Status: tc.status, Outcome: Fail, Code: "invalid_argument"})
			if tc.want == "member-panic" {
				b.add(Op{Kind: KindMemberPanic, Via: "nemesis", Node: "slot2.log", Invoke: 2000, Return: 2000, Outcome: Fail,
					Err: "runtime error: invalid memory address or nil pointer dereference in internal/notify.(*Sub).Events (3 times)"})
			}
			if tc.exit {
				b.add(Op{Kind: KindMemberExit, Via: "nemesis", Node: "n2", Invoke: 1500, Return: 1500, Outcome: Fail,
					Err: "exit status 2"})
			}
			rep := check(t, b.historyET())
			if tc.want == "" {
				clean(t, rep)
				return
			}
			flagged(t, rep, tc.want)
			if livenessCheckers[tc.want] != (tc.want == "member-exit") {
				t.Fatalf("%s is classed wrongly", tc.want)
			}
		})
	}
}
