package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// hb builds histories by hand. Times are in milliseconds.
type hb struct {
	ops     []*Op // pointers: tests adjust ops after adding later ones
	attempt int64
}

func msT(v int64) int64 { return v * int64(time.Millisecond) }

func (b *hb) add(op Op) *Op {
	op.ID = len(b.ops)
	op.Invoke, op.Return = msT(op.Invoke), msT(op.Return)
	if op.Worker == "" {
		op.Worker = "w-" + op.ClientID
	}
	if op.Via == "" {
		op.Via = "http"
	}
	b.ops = append(b.ops, &op)
	return &op
}

// grant: client acquires lock in [inv, ret] and gets token (TTL ttl ms).
func (b *hb) grant(lock, client string, inv, ret int64, token uint64, ttl int64) *Op {
	b.attempt++
	op := b.add(Op{Kind: KindAcquire, Lock: lock, ClientID: client, Attempt: b.attempt, TTLms: ttl, Invoke: inv, Return: ret,
		Outcome: Ok, OutToken: token})
	op.ExpiryLB = expiryLB(op.Invoke, time.Duration(ttl)*time.Millisecond)
	return op
}

func (b *hb) acquireOutcome(lock, client string, inv, ret int64, ttl int64, out Outcome, code string) *Op {
	b.attempt++
	op := b.add(Op{Kind: KindAcquire, Lock: lock, ClientID: client, Attempt: b.attempt, TTLms: ttl, Invoke: inv, Return: ret,
		Outcome: out, Code: code})
	op.ExpiryLB = expiryLB(op.Invoke, time.Duration(ttl)*time.Millisecond)
	return op
}

func (b *hb) release(lock, client string, token uint64, inv, ret int64, out Outcome, code string) *Op {
	return b.add(Op{Kind: KindRelease, Lock: lock, ClientID: client, Token: token, Invoke: inv, Return: ret, Outcome: out, Code: code})
}

func (b *hb) read(lock string, inv, ret int64, holder string, token uint64) *Op {
	return b.add(Op{Kind: KindRead, Worker: "reader", Lock: lock, Invoke: inv, Return: ret, Outcome: Ok,
		Held: holder != "", Holder: holder, OutToken: token})
}

func (b *hb) fence(key string, token uint64, inv, ret int64, accepted bool, highest uint64) *Op {
	op := Op{Kind: KindFence, Lock: key, ClientID: "f", Token: token, Invoke: inv, Return: ret, Outcome: Ok}
	if !accepted {
		op.Outcome, op.Code, op.OutToken = Fail, "stale_token", highest
	}
	return b.add(op)
}

func (b *hb) history() History {
	h := History{}
	for _, op := range b.ops {
		h.Ops = append(h.Ops, *op)
	}
	return h
}

func check(t *testing.T, h History) *Report {
	t.Helper()
	return Check(h, CheckOptions{LinTimeout: 30 * time.Second})
}

// flagged asserts the report holds a violation of checker.
func flagged(t *testing.T, rep *Report, checker string) {
	t.Helper()
	for _, v := range rep.Violations {
		if v.Checker == checker {
			return
		}
	}
	t.Fatalf("checker %q did not flag the history; violations: %v", checker, rep.Violations)
}

func clean(t *testing.T, rep *Report) {
	t.Helper()
	if len(rep.Violations) > 0 {
		t.Fatalf("a valid history was flagged: %v", rep.Violations)
	}
}

// TestKnownGoodHistory: a history with hand-offs, expiry, retries after
// unknown outcomes, a retried release and a fenced zombie passes every
// checker. A checker that flags this is wrong, not the server.
func TestKnownGoodHistory(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 1000)
	b.read("L", 20, 25, "a", 1)
	b.fence("L", 1, 30, 35, true, 0)
	b.release("L", "a", 1, 40, 45, Unknown, "no_leader") // reply lost...
	b.release("L", "a", 1, 60, 65, Ok, "")               // ...the retry is answered "released"
	b.read("L", 70, 75, "", 0)
	// An acquire whose reply was lost, retried: the retry shows the grant.
	b.acquireOutcome("L", "c", 100, 3100, 1000, Unknown, "")
	b.ops[len(b.ops)-1].Attempt = 99
	g := b.grant("L", "c", 3200, 3210, 2, 1000)
	g.Attempt = 99
	b.acquireOutcome("L", "d", 3300, 3305, 1000, Fail, "lock_held").Holder = "c"
	// c lets it expire (TTL 1 s from 100 ms at the earliest); d gets it.
	b.read("L", 5000, 5005, "", 0)
	b.grant("L", "d", 5100, 5110, 3, 2000)
	b.fence("L", 3, 5120, 5125, true, 0)
	b.fence("L", 1, 5130, 5135, false, 3) // a zombie with the old token is refused
	b.release("L", "d", 3, 5200, 5210, Ok, "")
	// Another lock, later token.
	b.grant("M", "e", 6000, 6010, 4, 1000)
	b.release("M", "e", 4, 6100, 6110, Ok, "")
	clean(t, check(t, b.history()))
}

// TestCheckerCatchesOverlap: two clients told they hold one lock at once.
func TestCheckerCatchesOverlap(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 5000)
	b.grant("L", "b", 100, 110, 2, 5000) // a has neither released nor expired
	b.release("L", "a", 1, 300, 310, Ok, "")
	rep := check(t, b.history())
	flagged(t, rep, "mutual-exclusion")
	flagged(t, rep, "linearizability")
}

// TestCheckerAcceptsHandoffAfterExpiry: the same two grants are fine when
// the second comes after the first's TTL.
func TestCheckerAcceptsHandoffAfterExpiry(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 1000)
	b.grant("L", "b", 1100, 1110, 2, 5000)
	clean(t, check(t, b.history()))
}

// TestCheckerCatchesTokenRegression: a grant asked for after another grant
// was known gets a lower token — on another lock too (one global counter).
func TestCheckerCatchesTokenRegression(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 5, 1000)
	b.release("L", "a", 5, 20, 30, Ok, "")
	b.grant("M", "b", 50, 60, 3, 1000)
	flagged(t, check(t, b.history()), "token-order")
}

// TestCheckerCatchesReusedToken: one token given twice.
func TestCheckerCatchesReusedToken(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 7, 1000)
	b.grant("M", "b", 0, 10, 7, 1000)
	flagged(t, check(t, b.history()), "token-unique")
}

// TestCheckerCatchesLostRelease: a release was acknowledged, then the lock
// shows up held by the same grant again.
func TestCheckerCatchesLostRelease(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 60000)
	b.release("L", "a", 1, 20, 30, Ok, "")
	b.read("L", 40, 50, "a", 1)
	rep := check(t, b.history())
	flagged(t, rep, "release-undone")
	flagged(t, rep, "linearizability")
}

// TestCheckerCatchesStaleRead: a read says free while a grant's TTL cannot
// have run out — a lost grant, or a read served from stale state.
func TestCheckerCatchesStaleRead(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 60000)
	b.read("L", 100, 110, "", 0)
	flagged(t, check(t, b.history()), "linearizability")
}

// TestCheckerCatchesReadOfOldHolder: after a hand-off, a read shows the
// previous holder: time went backwards for that reader.
func TestCheckerCatchesReadOfOldHolder(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 60000)
	b.release("L", "a", 1, 20, 30, Ok, "")
	b.grant("L", "b", 40, 50, 2, 60000)
	b.read("L", 60, 70, "b", 2)
	b.read("L", 80, 90, "a", 1)
	flagged(t, check(t, b.history()), "linearizability")
}

// TestCheckerUnknownMayTakeEffectLate: an acquire whose reply was lost may
// take effect any time after it was sent; a later read showing it is fine.
func TestCheckerUnknownMayTakeEffectLate(t *testing.T) {
	var b hb
	b.read("L", 0, 5, "", 0)
	b.acquireOutcome("L", "c", 10, 2500, 60000, Unknown, "")
	b.read("L", 3000, 3005, "", 0)
	b.read("L", 4000, 4005, "c", 9)
	clean(t, check(t, b.history()))
}

// TestCheckerCatchesFIFOViolation: W1 and W2 proven queued (W1 first), W2
// granted first while W1 was still live.
func TestCheckerCatchesFIFOViolation(t *testing.T) {
	for _, bad := range []bool{false, true} {
		t.Run(fmt.Sprintf("bad=%t", bad), func(t *testing.T) {
			var b hb
			b.grant("F", "h", 0, 10, 1, 8000).Tag = "fifo:1:holder"
			w1 := b.acquireOutcome("F", "w1", 20, 0, 2000, Ok, "")
			w1.WaitMs, w1.Tag = 15000, "fifo:1:w1"
			c1 := b.read("F", 30, 40, "h", 1)
			c1.Waiters, c1.Tag = 1, "fifo:1:confirm"
			w2 := b.acquireOutcome("F", "w2", 50, 0, 2000, Ok, "")
			w2.WaitMs, w2.Tag = 15000, "fifo:1:w2"
			c2 := b.read("F", 60, 70, "h", 1)
			c2.Waiters, c2.Tag = 2, "fifo:1:confirm"
			b.release("F", "h", 1, 100, 110, Ok, "")
			// Grants: in order (w1 gets 2, w2 gets 3), or swapped.
			t1, t2 := uint64(2), uint64(3)
			r1, r2 := int64(120), int64(220)
			if bad {
				t1, t2, r1, r2 = 3, 2, 220, 120
			}
			w1.OutToken, w1.Return, w1.ExpiryLB = t1, msT(r1), msT(2000)
			w2.OutToken, w2.Return, w2.ExpiryLB = t2, msT(r2), msT(2000)
			if bad {
				b.release("F", "w2", 2, 150, 160, Ok, "")
				b.release("F", "w1", 3, 250, 260, Ok, "")
			} else {
				b.release("F", "w1", 2, 150, 160, Ok, "")
				b.release("F", "w2", 3, 250, 260, Ok, "")
			}
			rep := check(t, b.history())
			if rep.FIFOPairs != 1 {
				t.Fatalf("FIFO pairs checked: %d, want 1", rep.FIFOPairs)
			}
			if bad {
				flagged(t, rep, "fifo")
			} else {
				clean(t, rep)
			}
		})
	}
}

// TestCheckerFIFOExcusesAGrantLostUnbeknown: W1 and W2 proven queued (W1
// first); W1's acquire is answered 503 (outcome unknown) when the leader
// that queued it is deposed; W2 holds next, and W1's retry is granted
// after it. W1 may well have been granted first (the holder's release took
// effect), never told, its TTL run out, and its retry queued at the back:
// no FIFO violation. Found by the 10-minute soak (seed 849351, round 765:
// a pause-leader fault between the holder's release and the grant).
func TestCheckerFIFOExcusesAGrantLostUnbeknown(t *testing.T) {
	var b hb
	b.grant("F", "h", 0, 10, 1, 8000).Tag = "fifo:1:holder"
	w1 := b.acquireOutcome("F", "w1", 20, 2700, 2000, Unknown, "no_leader")
	w1.WaitMs, w1.Tag = 15000, "fifo:1:w1"
	c1 := b.read("F", 30, 40, "h", 1)
	c1.Waiters, c1.Tag = 1, "fifo:1:confirm"
	w2 := b.acquireOutcome("F", "w2", 50, 2700, 2000, Unknown, "no_leader")
	w2.WaitMs, w2.Tag = 15000, "fifo:1:w2"
	c2 := b.read("F", 60, 70, "h", 1)
	c2.Waiters, c2.Tag = 2, "fifo:1:confirm"
	b.release("F", "h", 1, 100, 2600, Unknown, "")
	b.read("F", 2800, 2810, "w2", 4)
	b.release("F", "h", 1, 2900, 2910, Ok, "")
	w2r := b.grant("F", "w2", 2920, 2930, 4, 2000)
	w2r.WaitMs, w2r.Tag, w2r.Attempt = 15000, "fifo:1:w2", w2.Attempt
	w1r := b.grant("F", "w1", 2950, 3100, 5, 2000)
	w1r.WaitMs, w1r.Tag, w1r.Attempt = 15000, "fifo:1:w1", w1.Attempt
	b.release("F", "w2", 4, 3000, 3010, Ok, "")
	b.release("F", "w1", 5, 3200, 3210, Ok, "")
	clean(t, check(t, b.history()))
}

// TestCheckerFIFONeedsProof: without a read proving both were queued,
// swapped grants are not a FIFO violation (the second may have been
// enqueued first).
func TestCheckerFIFONeedsProof(t *testing.T) {
	var b hb
	b.grant("F", "h", 0, 10, 1, 8000).Tag = "fifo:1:holder"
	w1 := b.acquireOutcome("F", "w1", 20, 220, 2000, Ok, "")
	w1.WaitMs, w1.Tag, w1.OutToken = 15000, "fifo:1:w1", 3
	w2 := b.acquireOutcome("F", "w2", 50, 120, 2000, Ok, "")
	w2.WaitMs, w2.Tag, w2.OutToken = 15000, "fifo:1:w2", 2
	b.release("F", "h", 1, 100, 110, Ok, "")
	b.release("F", "w2", 2, 150, 160, Ok, "")
	b.release("F", "w1", 3, 250, 260, Ok, "")
	rep := check(t, b.history())
	if rep.FIFOPairs != 0 {
		t.Fatalf("checked %d FIFO pairs without a proof of queue order", rep.FIFOPairs)
	}
	clean(t, rep)
}

// TestCheckerCatchesLostAfterRestart: a durability probe acknowledged
// before a full crash is gone after it.
func TestCheckerCatchesLostAfterRestart(t *testing.T) {
	var b hb
	b.grant("D", "d", 0, 10, 1, 600000).Tag = "durable:1:0"
	b.grant("E", "e", 0, 10, 2, 600000).Tag = "durable:1:1"
	b.release("E", "e", 2, 20, 30, Ok, "").Tag = "durable:1:1"
	b.read("D", 5000, 5010, "", 0).Tag = "durable:1:0:check" // lost
	b.read("E", 5000, 5010, "", 0).Tag = "durable:1:1:check"
	rep := check(t, b.history())
	flagged(t, rep, "durability")
	if rep.DurableChecked != 2 {
		t.Fatalf("durable probes checked: %d, want 2", rep.DurableChecked)
	}
}

// TestCheckerCatchesFenceRegression: the fencestore accepted a lower
// token after a higher one.
func TestCheckerCatchesFenceRegression(t *testing.T) {
	var b hb
	b.fence("k", 5, 0, 10, true, 0)
	b.fence("k", 3, 20, 30, true, 0)
	flagged(t, check(t, b.history()), "fence")

	var c hb
	c.fence("k", 5, 0, 10, true, 0)
	c.fence("k", 3, 5, 30, true, 0) // concurrent: either order is possible
	c.fence("k", 2, 40, 50, false, 5)
	clean(t, check(t, c.history()))
}

// TestCheckerTimeoutIsFailure: a porcupine check that runs out of time is
// reported, never taken as a pass.
func TestCheckerTimeoutIsFailure(t *testing.T) {
	var b hb
	// A valid history, long enough that no check finishes in a nanosecond.
	for i := int64(0); i < 2000; i++ {
		c := fmt.Sprintf("c%d", i)
		b.grant("L", c, i*100, i*100+10, uint64(i+1), 1000)
		b.read("L", i*100+20, i*100+30, c, uint64(i+1))
		b.release("L", c, uint64(i+1), i*100+40, i*100+50, Ok, "")
	}
	if rep := check(t, b.history()); len(rep.Violations) > 0 {
		t.Fatalf("the valid long history is flagged: %v", rep.Violations)
	}
	rep := Check(b.history(), CheckOptions{LinTimeout: time.Nanosecond})
	for _, v := range rep.Violations {
		if v.Checker == "linearizability" && strings.Contains(v.Msg, "did not finish") {
			return
		}
	}
	t.Fatalf("a check that ran out of time passed: %v (result %s)", rep.Violations, rep.LinResult)
}

// TestCheckerAcceptsReGrantAfterUnknownAcquire: an acquire whose reply was
// lost took effect; the client's next acquire of the lock (a new one, not a
// retry) gets that grant back (SPEC: an acquire by the holder returns the
// current grant). The grant is older than the second acquire — a token
// issued on another lock in between is higher — and that is fine: it may
// have been made as early as the first acquire was sent. (The Go client
// workers do this: a wait they gave up on, then a new acquire.)
func TestCheckerAcceptsReGrantAfterUnknownAcquire(t *testing.T) {
	var b hb
	b.grant("K", "z", 0, 10, 3, 1000)
	b.release("K", "z", 3, 20, 30, Ok, "")
	b.acquireOutcome("L", "c", 50, 3000, 5000, Unknown, "") // granted token 4 at some point; the reply was lost
	b.grant("M", "d", 100, 110, 5, 1000)
	b.grant("L", "c", 200, 210, 4, 5000) // the holder asks again: token 4 back
	b.release("M", "d", 5, 300, 310, Ok, "")
	b.release("L", "c", 4, 400, 410, Ok, "")
	rep := check(t, b.history())
	clean(t, rep)
	if rep.OrderedPairs == 0 {
		t.Fatal("no token pair was ordered: the check proved nothing")
	}
}

// TestCheckerCatchesTokenRegressionNotExcusedByOtherAcquires: the same
// history is a token regression when nothing sent before token 5 was known
// can have made token 4: the earlier acquire was refused (a definite
// wait_timeout or lock_held makes no grant), was another client's, was of
// another lock, or was sent after token 5 was known.
func TestCheckerCatchesTokenRegressionNotExcusedByOtherAcquires(t *testing.T) {
	for _, tc := range []struct {
		name         string
		lock, client string
		inv          int64
		outcome      Outcome
		code         string
	}{
		{"refused wait_timeout", "L", "c", 0, Fail, "wait_timeout"},
		{"refused lock_held", "L", "c", 0, Fail, "lock_held"},
		{"another client", "L", "e", 0, Unknown, ""},
		{"another lock", "N", "c", 0, Unknown, ""},
		{"sent after the higher token was known", "L", "c", 150, Unknown, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.acquireOutcome(tc.lock, tc.client, tc.inv, 3000, 5000, tc.outcome, tc.code)
			b.grant("M", "d", 100, 110, 5, 1000)
			b.grant("L", "c", 200, 210, 4, 5000)
			b.release("M", "d", 5, 300, 310, Ok, "")
			b.release("L", "c", 4, 400, 410, Ok, "")
			flagged(t, check(t, b.history()), "token-order")
		})
	}
}

// TestCheckerCatchesStaleReadNextToUnknownOp: an op whose outcome is
// unknown may take effect late, but it does not let a grant end early. A
// read that finds the lock free 100 ms into a 60 s lease is stale even when
// an acquire with a lost reply was in flight: the expiry placed before that
// acquire cannot have happened before the lease's end, and the read
// returned long before.
func TestCheckerCatchesStaleReadNextToUnknownOp(t *testing.T) {
	var b hb
	b.grant("L", "a", 0, 10, 1, 60000)
	b.acquireOutcome("L", "c", 20, 3000, 60000, Unknown, "")
	b.read("L", 100, 110, "", 0)
	flagged(t, check(t, b.history()), "linearizability")

	// After the lease could have run out, the same read is fine, and so is
	// the unknown acquire taking the lock then.
	var c hb
	c.grant("L", "a", 0, 10, 1, 1000)
	c.acquireOutcome("L", "c", 20, 3000, 60000, Unknown, "")
	c.read("L", 1100, 1110, "", 0)
	c.read("L", 1200, 1210, "c", 2)
	clean(t, check(t, c.history()))
}

// TestCheckerCatchesGrantOfATimedOutWait: a client told wait_timeout is
// later seen holding the lock, and no other acquire of its could have made
// that grant. The chaos soak (seed 2027, run 20261129-094759, lock e17-l1)
// found this: a leader frozen past a waiter's deadline answered
// wait_timeout from its stale table while the new leader had granted the
// wait (bugs_test.go, TestPausedLeaderDoesNotDenyAGrantedWait). With the
// same wait's outcome unknown instead, the history is fine.
func TestCheckerCatchesGrantOfATimedOutWait(t *testing.T) {
	for _, refused := range []bool{true, false} {
		t.Run(fmt.Sprintf("refused=%t", refused), func(t *testing.T) {
			var b hb
			b.grant("L", "h", 0, 10, 1, 1500)
			w := b.acquireOutcome("L", "w", 100, 5000, 3000, Unknown, "")
			w.WaitMs = 900
			if refused {
				w.Outcome, w.Code = Fail, "wait_timeout"
			}
			b.read("L", 200, 210, "h", 1)
			b.read("L", 4800, 4810, "w", 2) // the wait was granted (TTL 3 s)
			rep := check(t, b.history())
			if refused {
				flagged(t, rep, "linearizability")
			} else {
				clean(t, rep)
			}
		})
	}
}
