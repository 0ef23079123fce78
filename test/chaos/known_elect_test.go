package chaos

import (
	"strings"
	"testing"
	"time"
)

// Known-good and known-bad histories for the checkers of values,
// elections and watches (elect_checkers_test.go). Each bad history is the
// shape of a bug the elections workload is meant to catch; its good twin
// shows the checker does not flag the correct behaviour. Times are in
// milliseconds.

const eL = "elect-1-0"

// campaign: client wins the election lock in [inv, ret] with value, token,
// a TTL of ttl ms.
func (b *hb) campaign(lock, client string, inv, ret int64, token uint64, ttl int64, value string) *Op {
	op := b.grant(lock, client, inv, ret, token, ttl)
	op.Value, op.WaitMs = value, 1000
	return op
}

func (b *hb) proclaim(lock, client string, token uint64, inv, ret int64, value string, out Outcome) *Op {
	return b.add(Op{Kind: KindValue, Lock: lock, ClientID: client, Token: token, Value: value, Invoke: inv, Return: ret, Outcome: out})
}

// status fills op with a status of lock at index: held by holder (token,
// value) or free ("").
func status(op *Op, index uint64, holder string, token uint64, value string) {
	op.Index, op.StatusIndex, op.Mode, op.Limit = index, index, "none", 1
	if holder != "" {
		op.Held, op.Holder, op.OutToken, op.Value, op.Mode = true, holder, token, value, "exclusive"
		op.Holders = []HolderRec{{Client: holder, Token: token, Mode: "exclusive", Value: value}}
	}
}

// watchOp: conn's watch id of prefix (or lock, when prefix is "") asked
// for in [inv, ret].
func (b *hb) watchOp(worker, conn string, id uint64, prefix, lock string, inv, ret int64) *Op {
	return b.add(Op{Kind: KindWatch, Worker: worker, Via: "ws", ClientID: conn, WatchID: id, Prefix: prefix, Lock: lock,
		Invoke: inv, Return: ret, Outcome: Ok})
}

// frame: a changed frame of conn's watch id read at at.
func (b *hb) frame(worker, conn string, id uint64, lock string, at int64, index uint64, holder string, token uint64, value string) *Op {
	op := b.add(Op{Kind: KindChanged, Worker: worker, Via: "ws", ClientID: conn, WatchID: id, Lock: lock, Invoke: at, Return: at, Outcome: Ok})
	status(op, index, holder, token, value)
	return op
}

func (b *hb) resync(worker, conn string, id uint64, at int64) *Op {
	return b.add(Op{Kind: KindResync, Worker: worker, Via: "ws", ClientID: conn, WatchID: id, Invoke: at, Return: at, Outcome: Ok})
}

func (b *hb) stopWatch(w *Op, at int64) *Op {
	return b.add(Op{Kind: KindUnwatch, Worker: w.Worker, Via: w.Via, ClientID: w.ClientID, WatchID: w.WatchID, Prefix: w.Prefix, Lock: w.Lock,
		Tag: tagStop, Invoke: at, Return: at, Outcome: Ok})
}

// eread: a linearizable read of an election (tag "blocking" with a
// blocking index when block is not nil).
func (b *hb) eread(worker, lock string, inv, ret int64, index uint64, holder string, token uint64, value string) *Op {
	op := b.add(Op{Kind: KindRead, Worker: worker, Lock: lock, Invoke: inv, Return: ret, Outcome: Ok})
	status(op, index, holder, token, value)
	op.StatusIndex = 0
	return op
}

func (b *hb) blocking(worker, lock string, inv, ret int64, after uint64, waitMs int64, index uint64, holder string, token uint64, value string) *Op {
	op := b.eread(worker, lock, inv, ret, index, holder, token, value)
	op.Tag, op.BlockIndex, op.WaitMs = tagBlocking, after, waitMs
	return op
}

// final records the final state: lock (held, or "" for none listed) at
// index, the marker at applied.
func (b *hb) final(at int64, applied uint64, lock string, index uint64, holder string, token uint64, value string) {
	if lock != "" {
		op := b.add(Op{Kind: KindFinal, Worker: "replicas", Via: "nemesis", Lock: lock, Invoke: at, Return: at, Outcome: Ok, Node: "every member"})
		status(op, index, holder, token, value)
		op.StatusIndex = 0
	}
	b.add(Op{Kind: KindFinal, Worker: "replicas", Via: "nemesis", Invoke: at, Return: at, Outcome: Ok, Index: applied, Node: "every member"})
}

// electionBase: a wins the election (token 1, value a#0, index 10),
// proclaims a#1 (index 11) and resigns (index 12); b, waiting since 50,
// wins (token 2, value b#0, index 12) and holds through the end. A prefix
// watcher sees every change; after a reconnect at 1500 it watches again
// and sees b's leadership (index 12) as its first frame. A blocking query
// waits from index 11 and answers with index 12.
func electionBase(b *hb) (w1, w2 *Op) {
	b.campaign(eL, "a", 0, 10, 1, 60000, "a#0")
	w1 = b.watchOp("watch-prefix0", "wp0", 1, electPrefix, "", 5, 8)
	b.frame("watch-prefix0", "wp0", 1, eL, 11, 10, "a", 1, "a#0")
	b.acquireOutcome(eL, "b", 50, 60, 60000, Fail, "lock_held")
	b.proclaim(eL, "a", 1, 100, 110, "a#1", Ok)
	b.frame("watch-prefix0", "wp0", 1, eL, 111, 11, "a", 1, "a#1")
	b.eread("reader", eL, 120, 125, 11, "a", 1, "a#1")
	b.release(eL, "a", 1, 300, 310, Ok, "")
	b.blocking("blocking0", eL, 200, 312, 11, 3000, 12, "", 0, "")
	b.frame("watch-prefix0", "wp0", 1, eL, 311, 12, "", 0, "")
	b.campaign(eL, "b", 400, 410, 2, 60000, "b#0")
	b.frame("watch-prefix0", "wp0", 1, eL, 411, 13, "b", 2, "b#0")
	b.add(Op{Kind: KindWSClosed, Worker: "watch-prefix0", Via: "ws", ClientID: "wp0", Invoke: 1500, Return: 1500, Outcome: Ok})
	w2 = b.watchOp("watch-prefix0", "wp1", 1, electPrefix, "", 1600, 1610)
	b.frame("watch-prefix0", "wp1", 1, eL, 1611, 13, "b", 2, "b#0")
	return w1, w2
}

// electionEnd: the final state has b leading at index 13 (applied 20),
// and the second watch runs past the bound.
func electionEnd(b *hb, w2 *Op) {
	b.final(2000, 20, eL, 13, "b", 2, "b#0")
	b.stopWatch(w2, 2000+watchFinalBound.Milliseconds()+10)
}

// TestElectionKnownGoodHistory: leaders in turn, values set by their
// leaders, watchers across a reconnect, a blocking query, the final state
// shown: every checker passes it.
func TestElectionKnownGoodHistory(t *testing.T) {
	var b hb
	_, w2 := electionBase(&b)
	electionEnd(&b, w2)
	rep := check(t, b.history())
	clean(t, rep)
	if rep.ElectGrants != 2 || rep.LeadersObserved != 2 || rep.FinalChecked != 1 || rep.WatchGapPairs == 0 || rep.ValuesChecked == 0 {
		t.Fatalf("the checkers did not look: %+v", rep)
	}
}

// TestCheckerCatchesLeadersOutOfOrder: after a reconnect a watcher is
// shown the old leader again (a stale member answered its new watch).
func TestCheckerCatchesLeadersOutOfOrder(t *testing.T) {
	for _, bad := range []bool{false, true} {
		var b hb
		_, w2 := electionBase(&b)
		w3 := b.watchOp("watch-prefix0", "wp2", 1, electPrefix, "", 1700, 1710)
		if bad {
			b.frame("watch-prefix0", "wp2", 1, eL, 1711, 11, "a", 1, "a#1")
		} else {
			b.frame("watch-prefix0", "wp2", 1, eL, 1711, 13, "b", 2, "b#0")
		}
		_ = w3
		electionEnd(&b, w2)
		rep := check(t, b.history())
		if !bad {
			clean(t, rep)
			continue
		}
		flagged(t, rep, "leader-order")
	}
}

// TestCheckerCatchesIndexGoingDown: within one watch an index comes twice
// or goes down; across a reconnect a status with state goes back to an
// older index.
func TestCheckerCatchesIndexGoingDown(t *testing.T) {
	t.Run("within a watch", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.frame("watch-prefix0", "wp1", 1, eL, 1620, 13, "b", 2, "b#0")
		electionEnd(&b, w2)
		flagged(t, check(t, b.history()), "watch-order")
	})
	t.Run("frame index is not its status's", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.ops[len(b.ops)-1].StatusIndex = 12
		electionEnd(&b, w2)
		flagged(t, check(t, b.history()), "watch-order")
	})
	t.Run("across a reconnect", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.watchOp("watch-prefix0", "wp2", 1, electPrefix, "", 1700, 1710)
		// Same leader, older index: a renewal the view lost.
		b.frame("watch-prefix0", "wp2", 1, eL, 1711, 12, "b", 2, "b#0")
		electionEnd(&b, w2)
		rep := check(t, b.history())
		flagged(t, rep, "leader-order")
	})
	t.Run("a lock without state may show any index", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.watchOp("watch-lock0", "wl0", 1, "", "elect-1-1", 1700, 1710)
		b.frame("watch-lock0", "wl0", 1, "elect-1-1", 1711, 30, "", 0, "")
		b.add(Op{Kind: KindWSClosed, Worker: "watch-lock0", Via: "ws", ClientID: "wl0", Invoke: 1750, Return: 1750, Outcome: Ok})
		b.watchOp("watch-lock0", "wl1", 1, "", "elect-1-1", 1800, 1810)
		b.frame("watch-lock0", "wl1", 1, "elect-1-1", 1811, 5, "", 0, "")
		electionEnd(&b, w2)
		clean(t, check(t, b.history()))
	})
}

// TestCheckerCatchesTwoLeadersAtOnce: two candidates are told they lead
// at once, or one status shows two leaders.
func TestCheckerCatchesTwoLeadersAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bad    bool
		status bool
	}{{"in turn", false, false}, {"overlapping leaderships", true, false}, {"one status shows two", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.campaign(eL, "a", 0, 10, 1, 5000, "a#0")
			switch {
			case tc.status:
				f := b.frame("watch-prefix0", "wp0", 1, eL, 100, 10, "a", 1, "a#0")
				f.Holders = append(f.Holders, HolderRec{Client: "b", Token: 2, Mode: "exclusive", Value: "b#0"})
				b.acquireOutcome(eL, "b", 50, 60, 5000, Unknown, "")
				b.release(eL, "a", 1, 300, 310, Ok, "")
			case tc.bad:
				b.campaign(eL, "b", 100, 110, 2, 5000, "b#0")
				b.release(eL, "a", 1, 300, 310, Ok, "")
				b.release(eL, "b", 2, 400, 410, Ok, "")
			default:
				b.release(eL, "a", 1, 300, 310, Ok, "")
				b.campaign(eL, "b", 400, 410, 2, 5000, "b#0")
				b.release(eL, "b", 2, 500, 510, Ok, "")
			}
			rep := check(t, b.history())
			if !tc.bad {
				clean(t, rep)
				return
			}
			flagged(t, rep, "two-leaders")
		})
	}
}

// TestCheckerCatchesForeignValue: a status shows a leader with another
// leader's value, or with a value nobody sent, or a linearizable read
// shows a value older than one the leader proclaimed and saw acknowledged.
func TestCheckerCatchesForeignValue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		read  bool // shown by a read after a's proclaim of a#1 was acknowledged
	}{{"own value", "a#1", true}, {"another leader's value", "b#0", false}, {"nobody's value", "zz", false},
		{"an older value after a proclaim", "a#0", true}, {"a proclaim in flight", "a#2", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			_, w2 := electionBase(&b)
			b.campaign("elect-1-1", "c", 500, 510, 3, 60000, "c#0")
			b.proclaim("elect-1-1", "c", 3, 520, 530, "c#1", Ok)
			b.proclaim("elect-1-1", "c", 3, 540, 4000, "c#2", Unknown)
			value := strings.Replace(tc.value, "a#", "c#", 1)
			if tc.read {
				b.eread("reader", "elect-1-1", 600, 610, 31, "c", 3, value)
			} else {
				b.frame("watch-prefix0", "wp0", 1, "elect-1-1", 600, 31, "c", 3, value)
			}
			electionEnd(&b, w2)
			rep := check(t, b.history())
			if tc.value == "a#1" || tc.value == "a#2" {
				clean(t, rep)
				return
			}
			flagged(t, rep, "value")
		})
	}
	t.Run("a status value that is not its leader's", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.ops[len(b.ops)-1].Value = "a#1"
		electionEnd(&b, w2)
		flagged(t, check(t, b.history()), "value")
	})
}

// TestCheckerCatchesFinalStateMismatch: the final frame a watcher shows
// for a lock is not the final replicated state at that index (safety), or
// the watcher never showed the last change (liveness). A change after the
// final state was read is not judged.
func TestCheckerCatchesFinalStateMismatch(t *testing.T) {
	t.Run("same index, another value", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.ops[len(b.ops)-1].Value = "b#9"
		b.ops[len(b.ops)-1].Holders[0].Value = "b#9"
		b.proclaim(eL, "b", 2, 1000, 1010, "b#9", Unknown) // so that the value checker does not complain first
		electionEnd(&b, w2)
		flagged(t, check(t, b.history()), "watch-state")
	})
	t.Run("the last change not shown", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.proclaim(eL, "b", 2, 1000, 1010, "b#1", Ok)
		b.final(2000, 20, eL, 14, "b", 2, "b#1")
		b.stopWatch(w2, 2000+watchFinalBound.Milliseconds()+10)
		flagged(t, check(t, b.history()), "watch-live")
	})
	t.Run("the last change shown", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.proclaim(eL, "b", 2, 1000, 1010, "b#1", Ok)
		b.frame("watch-prefix0", "wp1", 1, eL, 1900, 14, "b", 2, "b#1")
		b.final(2000, 20, eL, 14, "b", 2, "b#1")
		b.stopWatch(w2, 2000+watchFinalBound.Milliseconds()+10)
		clean(t, check(t, b.history()))
	})
	t.Run("a freed lock shown held", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.release(eL, "b", 2, 1000, 1010, Ok, "")
		b.final(2000, 20, "", 0, "", 0, "")
		b.stopWatch(w2, 2000+watchFinalBound.Milliseconds()+10)
		flagged(t, check(t, b.history()), "watch-live")
	})
	t.Run("a change after the final state", func(t *testing.T) {
		var b hb
		_, w2 := electionBase(&b)
		b.release(eL, "b", 2, 1000, 1010, Ok, "")
		b.final(2000, 20, "", 0, "", 0, "")
		b.campaign(eL, "c", 2100, 2110, 3, 60000, "c#0")
		b.frame("watch-prefix0", "wp1", 1, eL, 2111, 21, "c", 3, "c#0")
		b.stopWatch(w2, 2000+watchFinalBound.Milliseconds()+10)
		rep := check(t, b.history())
		if rep.Counts["watch-live"] != 0 || rep.FinalSkipped != 1 {
			t.Fatalf("a change after the final state was judged: %v (skipped %d)", rep.Violations, rep.FinalSkipped)
		}
	})
}

// TestCheckerCatchesSkippedChange: a watch's frames skip a change others
// saw, with no resync between; with one, it is fine.
func TestCheckerCatchesSkippedChange(t *testing.T) {
	for _, resync := range []bool{false, true} {
		var b hb
		b.campaign(eL, "a", 0, 10, 1, 60000, "a#0")
		b.watchOp("watch-prefix0", "wp0", 1, electPrefix, "", 5, 8)
		b.frame("watch-prefix0", "wp0", 1, eL, 11, 10, "a", 1, "a#0")
		b.proclaim(eL, "a", 1, 100, 110, "a#1", Ok)
		b.eread("reader", eL, 120, 125, 11, "a", 1, "a#1")
		b.proclaim(eL, "a", 1, 200, 210, "a#2", Ok)
		if resync {
			b.resync("watch-prefix0", "wp0", 1, 205)
		}
		b.frame("watch-prefix0", "wp0", 1, eL, 211, 12, "a", 1, "a#2")
		rep := check(t, b.history())
		if resync {
			clean(t, rep)
			continue
		}
		flagged(t, rep, "watch-gap")
	}
}

// TestCheckerCatchesNeverGrantedToken: a watcher is shown a holder that
// never asked for the lock, or a token another grant has.
func TestCheckerCatchesNeverGrantedToken(t *testing.T) {
	t.Run("a holder that never asked", func(t *testing.T) {
		var b hb
		b.campaign(eL, "a", 0, 10, 1, 60000, "a#0")
		b.frame("watch-prefix0", "wp0", 1, eL, 11, 10, "z", 7, "z#0")
		flagged(t, check(t, b.history()), "watch-token")
	})
	t.Run("another grant's token", func(t *testing.T) {
		var b hb
		b.campaign(eL, "a", 0, 10, 1, 60000, "a#0")
		b.acquireOutcome(eL, "b", 5, 4000, 60000, Unknown, "")
		b.frame("watch-prefix0", "wp0", 1, eL, 11, 10, "b", 1, "")
		flagged(t, check(t, b.history()), "token-unique")
	})
}

// TestCheckerCatchesBlockingQueryBugs: a blocking query answers early
// without news and without a fault; or late, a second after a change
// above its index was seen; or not at all.
func TestCheckerCatchesBlockingQueryBugs(t *testing.T) {
	base := func(b *hb) {
		b.campaign(eL, "a", 0, 10, 1, 60000, "a#0")
		b.watchOp("watch-prefix0", "wp0", 1, electPrefix, "", 5, 8)
		b.frame("watch-prefix0", "wp0", 1, eL, 11, 10, "a", 1, "a#0")
		b.proclaim(eL, "a", 1, 2000, 2010, "a#1", Ok)
		b.frame("watch-prefix0", "wp0", 1, eL, 2011, 11, "a", 1, "a#1")
		b.eread("reader", eL, 9000, 9010, 11, "a", 1, "a#1")
	}
	for _, tc := range []struct {
		name    string
		checker string
		add     func(b *hb)
	}{
		{"answered at the change", "", func(b *hb) { b.blocking("blocking0", eL, 1000, 2012, 10, 3000, 11, "a", 1, "a#1") }},
		{"answered at the end of its wait", "", func(b *hb) { b.blocking("blocking0", eL, 100, 1100, 10, 1000, 10, "a", 1, "a#0") }},
		{"early", "blocking", func(b *hb) { b.blocking("blocking0", eL, 100, 300, 10, 1500, 10, "a", 1, "a#0") }},
		{"late", "blocking", func(b *hb) { b.blocking("blocking0", eL, 1000, 3500, 10, 5000, 11, "a", 1, "a#1") }},
		{"never", "blocking", func(b *hb) {
			op := b.add(Op{Kind: KindRead, Worker: "blocking0", Lock: eL, Tag: tagBlocking, BlockIndex: 11, WaitMs: 1000,
				Invoke: 3000, Return: 6500, Outcome: Unknown, GaveUp: true, Err: "context deadline exceeded"})
			_ = op
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			base(&b)
			tc.add(&b)
			rep := check(t, b.history())
			if tc.checker == "" {
				clean(t, rep)
				if rep.BlockingChecked != 1 {
					t.Fatalf("the blocking query was not checked: %+v", rep)
				}
				return
			}
			flagged(t, rep, tc.checker)
		})
	}
	t.Run("a fault excuses an early answer", func(t *testing.T) {
		var b hb
		base(&b)
		b.blocking("blocking0", eL, 100, 300, 10, 1500, 10, "a", 1, "a#0")
		h := b.history()
		h.Faults = []Fault{{Kind: FaultKillLeader, Start: msT(150), End: msT(400), Healthy: msT(900)}}
		clean(t, check(t, h))
	})
	_ = time.Second
}
