package chaos

import (
	"testing"
	"time"
)

// Known-good and known-bad histories for the checkers of retried
// WebSocket waits and synced watches (retrywatch_checkers_test.go). Times
// are in milliseconds.

const wrL = "wsretry-1-0-0"

// wsAcquire: client c's acquire of wrL over its WebSocket connection, in
// retry round 0 (which: tagRetryFirst or tagRetryAgain), with a wait of
// waitMs.
func (b *hb) wsAcquire(which string, waitMs, inv, ret int64, out Outcome, code string, token uint64) *Op {
	op := b.add(Op{Kind: KindAcquire, Worker: "wsretry0/" + which, Via: "ws", Lock: wrL, ClientID: "c", Attempt: 100,
		TTLms: 3000, WaitMs: waitMs, Tag: retryTag(0, which), Invoke: inv, Return: ret, Outcome: out, Code: code, OutToken: token})
	if out != Fail {
		op.ExpiryLB = expiryLB(op.Invoke, 3*time.Second)
	}
	return op
}

func (b *hb) wsClosed(client string, at int64) {
	b.add(Op{Kind: KindWSClosed, Via: "ws", ClientID: client, Invoke: at, Return: at, Outcome: Ok})
}

// retryTimeout: h holds wrL past the retry's deadline; c's first acquire
// (20 s) and its retry (800 ms) end together, wait_timeout, at 930 — or,
// with firstOut, the first ends as given.
func retryTimeout(b *hb, firstOut Outcome, firstCode string, firstRet int64, firstToken uint64) *Op {
	b.grant(wrL, "h", 0, 10, 1, 5000)
	first := b.wsAcquire(tagRetryFirst, 20000, 20, firstRet, firstOut, firstCode, firstToken)
	b.wsAcquire(tagRetryAgain, 800, 100, 930, Fail, "wait_timeout", 0)
	b.release(wrL, "h", 1, 1500, 1510, Ok, "")
	return first
}

// TestRetriedWaitKnownHistories: both acquires of one wait answered alike
// pass; the first left unanswered while its connection lived is ws-answer;
// the two answered differently is ws-retry.
func TestRetriedWaitKnownHistories(t *testing.T) {
	t.Run("both time out", func(t *testing.T) {
		var b hb
		retryTimeout(&b, Fail, "wait_timeout", 930, 0)
		b.wsClosed("c", 3000)
		rep := check(t, b.history())
		clean(t, rep)
		if rep.RetryRounds != 1 {
			t.Fatalf("the checker did not look: %+v", rep)
		}
	})
	t.Run("both granted", func(t *testing.T) {
		var b hb
		b.grant(wrL, "h", 0, 10, 1, 5000)
		b.release(wrL, "h", 1, 300, 310, Ok, "")
		b.wsAcquire(tagRetryFirst, 20000, 20, 320, Ok, "", 2)
		b.wsAcquire(tagRetryAgain, 800, 100, 320, Ok, "", 2)
		b.release(wrL, "c", 2, 400, 410, Ok, "")
		b.wsClosed("c", 3000)
		clean(t, check(t, b.history()))
	})
	t.Run("the first never answered", func(t *testing.T) {
		var b hb
		first := retryTimeout(&b, Unknown, "", 2930, 0)
		first.GaveUp = true
		b.wsClosed("c", 3000)
		flagged(t, check(t, b.history()), "ws-answer")
	})
	t.Run("the first unanswered, the connection gone", func(t *testing.T) {
		var b hb
		first := retryTimeout(&b, Unknown, "", 2930, 0)
		first.GaveUp = true
		b.wsClosed("c", 1000) // ended before the client gave up: nothing could come
		clean(t, check(t, b.history()))
	})
	t.Run("the first refused for now (overloaded), the retry timed out", func(t *testing.T) {
		// Admission refused the first before it became a wait: the retry
		// is a wait of its own, and the two answers need not agree.
		var b hb
		first := retryTimeout(&b, Fail, "overloaded", 25, 0)
		first.RetryAfterMs = 200
		b.wsClosed("c", 3000)
		clean(t, check(t, b.history()))
	})
	t.Run("the first granted, the retry timed out", func(t *testing.T) {
		var b hb
		retryTimeout(&b, Ok, "", 930, 2)
		b.wsClosed("c", 3000)
		flagged(t, check(t, b.history()), "ws-retry")
	})
}

// Synced watches: a prefix watch of wchurn-1-* asked at 20; b takes and
// frees wchurn-1-1 (indexes 11 and 12) between the watch's registration
// and its picture, which shows wchurn-1-0 (held by a since index 10) and
// is synced at index 12; c then takes wchurn-1-1 (index 13), which the
// watch and a read show.
const (
	wcA = "wchurn-1-0"
	wcB = "wchurn-1-1"
)

func churnBase(b *hb) {
	b.grant(wcA, "a", 0, 10, 1, 60000)
	b.watchOp("churn-watch0", "cw0", 1, wchurnPrefix, "", 20, 25)
	b.grant(wcB, "b", 21, 24, 2, 60000)
	b.release(wcB, "b", 2, 26, 28, Ok, "")
}

func (b *hb) synced(worker, conn string, id uint64, at int64, index uint64) *Op {
	return b.add(Op{Kind: KindSynced, Worker: worker, Via: "ws", ClientID: conn, WatchID: id, Index: index, Invoke: at, Return: at, Outcome: Ok})
}

func churnEnd(b *hb) {
	b.grant(wcB, "c", 40, 45, 3, 60000)
	b.frame("churn-watch0", "cw0", 1, wcB, 46, 13, "c", 3, "")
	r := b.eread("churn0", wcB, 50, 55, 13, "c", 3, "")
	r.Mode, r.Limit, r.Holders = "", 0, nil // a read of an ordinary lock records the holder fields only
	b.add(Op{Kind: KindUnwatch, Worker: "churn-watch0", Via: "ws", ClientID: "cw0", WatchID: 1, Prefix: wchurnPrefix, Invoke: 60, Return: 61, Outcome: Ok})
	b.wsClosed("cw0", 100)
}

// TestWatchSyncedKnownHistories: the correct picture passes; a frame
// older than the picture after synced (a lock taken and freed while the
// picture was read, shown held after it), a picture that shows a state
// another observation contradicts, and a second synced are watch-synced;
// a lock free in the picture and in another observation at a later index
// below synced's is not.
func TestWatchSyncedKnownHistories(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		var b hb
		churnBase(&b)
		b.frame("churn-watch0", "cw0", 1, wcA, 30, 10, "a", 1, "")
		b.synced("churn-watch0", "cw0", 1, 31, 12)
		churnEnd(&b)
		rep := check(t, b.history())
		clean(t, rep)
		if rep.WatchesSynced != 1 || rep.SyncedFrames != 1 || rep.PicturesCompared == 0 {
			t.Fatalf("the checker did not look: %+v", rep)
		}
	})
	t.Run("a frame older than the picture after it", func(t *testing.T) {
		var b hb
		churnBase(&b)
		b.frame("churn-watch0", "cw0", 1, wcA, 30, 10, "a", 1, "")
		b.synced("churn-watch0", "cw0", 1, 31, 12)
		b.frame("churn-watch0", "cw0", 1, wcB, 32, 11, "b", 2, "") // buffered while the picture was read
		churnEnd(&b)
		flagged(t, check(t, b.history()), "watch-synced")
	})
	t.Run("a picture frame above synced's index", func(t *testing.T) {
		var b hb
		churnBase(&b)
		b.frame("churn-watch0", "cw0", 1, wcA, 30, 10, "a", 1, "")
		b.synced("churn-watch0", "cw0", 1, 31, 9)
		churnEnd(&b)
		flagged(t, check(t, b.history()), "watch-synced")
	})
	t.Run("a stale picture", func(t *testing.T) {
		// The picture shows wchurn-1-1 held at 11 (the change buffered
		// while it was read, sent as part of it), though as of 12 it is
		// free, which another watch shows.
		var b hb
		churnBase(&b)
		b.frame("churn-watch0", "cw0", 1, wcA, 30, 10, "a", 1, "")
		b.frame("churn-watch0", "cw0", 1, wcB, 30, 11, "b", 2, "")
		b.synced("churn-watch0", "cw0", 1, 31, 12)
		b.watchOp("churn-watch1", "cw1", 1, "", wcB, 32, 33)
		b.frame("churn-watch1", "cw1", 1, wcB, 34, 12, "", 0, "")
		b.synced("churn-watch1", "cw1", 1, 35, 12)
		churnEnd(&b)
		flagged(t, check(t, b.history()), "watch-synced")
	})
	t.Run("a lock with state at synced's index missing from the picture", func(t *testing.T) {
		var b hb
		churnBase(&b)
		b.synced("churn-watch0", "cw0", 1, 31, 12) // wchurn-1-0, held, not shown
		r := b.eread("churn0", wcA, 32, 33, 10, "a", 1, "")
		r.Index = 12 // (a status can show a held lock only at its last change: 10)
		churnEnd(&b)
		flagged(t, check(t, b.history()), "watch-synced")
	})
	t.Run("synced twice", func(t *testing.T) {
		var b hb
		churnBase(&b)
		b.frame("churn-watch0", "cw0", 1, wcA, 30, 10, "a", 1, "")
		b.synced("churn-watch0", "cw0", 1, 31, 12)
		b.synced("churn-watch0", "cw0", 1, 33, 12)
		churnEnd(&b)
		flagged(t, check(t, b.history()), "watch-synced")
	})
	t.Run("free in the picture and at a later index", func(t *testing.T) {
		// A watch of wchurn-1-1 alone, after b freed it (index 12): its
		// picture shows it free at 12, synced at 13 (a renewed wchurn-1-0
		// then). A read shows it free at 13: a lock without state may show
		// any index at or above its last change, so that is no change. One
		// showing it held there is.
		for _, bad := range []bool{false, true} {
			var b hb
			b.grant(wcA, "a", 0, 10, 1, 60000)
			b.grant(wcB, "b", 11, 12, 2, 60000)
			b.release(wcB, "b", 2, 13, 14, Ok, "")
			b.add(Op{Kind: KindRenew, Lock: wcA, ClientID: "a", Token: 1, TTLms: 60000, Invoke: 15, Return: 16, Outcome: Ok,
				ExpiryLB: expiryLB(msT(15), time.Minute)})
			b.watchOp("churn-watch1", "cw1", 1, "", wcB, 20, 21)
			b.frame("churn-watch1", "cw1", 1, wcB, 22, 12, "", 0, "")
			b.synced("churn-watch1", "cw1", 1, 23, 13)
			r := b.eread("churn0", wcB, 24, 25, 13, "", 0, "")
			if bad {
				r.Held, r.Holder, r.OutToken = true, "b", 2
			}
			r.Mode, r.Limit, r.Holders = "", 0, nil
			b.add(Op{Kind: KindUnwatch, Worker: "churn-watch1", Via: "ws", ClientID: "cw1", WatchID: 1, Lock: wcB, Invoke: 30, Return: 31, Outcome: Ok})
			b.wsClosed("cw1", 40)
			rep := check(t, b.history())
			if bad {
				flagged(t, rep, "watch-synced")
			} else {
				clean(t, rep)
			}
		}
	})
}
