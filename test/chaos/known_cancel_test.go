package chaos

import (
	"testing"
)

// Known-good and known-bad histories for the cancel checkers
// (cancel_checkers_test.go): the shapes of a cancel round of the workload,
// with the server doing right, and granting a waiter it withdrew.

// cancelOp: a cancel of client's wait on locks in [inv, ret], answered
// cancelled: withdrawn.
func (b *hb) cancelOp(client string, locks []string, inv, ret int64, withdrawn bool, tag string) *Op {
	op := Op{Kind: KindCancel, ClientID: client, Invoke: inv, Return: ret, Outcome: Ok, Withdrawn: withdrawn, Tag: tag}
	if len(locks) == 1 {
		op.Lock = locks[0]
	} else {
		op.Locks = locks
	}
	return b.add(op)
}

// TestCheckerCatchesWithdrawnWaiterGranted: a holder holds L; W waits;
// W's wait is withdrawn (cancelled: true) and its request answered
// cancelled; the holder releases. Right: the lock comes free (or goes to
// the next waiter). Wrong: a read after the cancel shows W holding L — the
// withdrawn waiter was granted all the same — or W's waiting request is
// answered granted, or wait_timeout. Also for a multi-acquire's wait, and
// a W that asked again after the cancel (then a grant is its own).
func TestCheckerCatchesWithdrawnWaiterGranted(t *testing.T) {
	const lock, lock2 = "kind-wd1-a", "kind-wd1-b"
	for _, tc := range []struct {
		name    string
		multi   bool
		answer  string // the waiting request's: "cancelled", "granted", "wait_timeout"
		shown   bool   // a read after the cancel shows W holding the lock
		again   bool   // W sends a new acquire after the cancel
		checker string // "" for a valid history
	}{
		{name: "withdrawn and free", answer: "cancelled"},
		{name: "withdrawn, then granted", answer: "cancelled", shown: true, checker: "cancel-granted"},
		{name: "withdrawn, answered granted", answer: "granted", checker: "cancel-answer"},
		{name: "withdrawn, answered wait_timeout", answer: "wait_timeout", checker: "cancel-answer"},
		{name: "withdrawn, asked again, granted", answer: "cancelled", shown: true, again: true},
		{name: "multi withdrawn and free", multi: true, answer: "cancelled"},
		{name: "multi withdrawn, then granted", multi: true, answer: "cancelled", shown: true, checker: "cancel-granted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b hb
			b.kgrant(lock, "h", 0, 10, 1, 5000, "", 0)
			locks := []string{lock}
			var w *Op
			if tc.multi {
				locks = []string{lock, lock2}
				w = b.multi("w", 20, 200, 5000, "")
				w.Locks, w.Grants = locks, nil
			} else {
				w = b.acquireOutcome(lock, "w", 20, 200, 5000, Fail, "")
			}
			w.WaitMs, w.Tag = 5000, "wd:1:wait"
			switch tc.answer {
			case "granted":
				w.Outcome, w.OutToken = Ok, 2
			default:
				w.Outcome, w.Code = Fail, tc.answer
			}
			b.cancelOp("w", locks, 100, 110, true, "wd:1:cancel")
			b.release(lock, "h", 1, 300, 310, Ok, "")
			if tc.again {
				b.kgrant(lock, "w", 400, 410, 2, 5000, "", 0)
			}
			if tc.shown {
				b.kread(lock, 500, 510, 1, excl("w", 2))
				b.release(lock, "w", 2, 600, 610, Ok, "")
			} else if tc.answer != "granted" {
				b.kread(lock, 500, 510, 1)
			} else {
				b.release(lock, "w", 2, 600, 610, Ok, "")
			}
			rep := check(t, b.history())
			if rep.Withdrawn != 1 || rep.WithdrawnRounds != 1 {
				t.Fatalf("withdrawn %d, rounds %d: want the cancel and its round checked", rep.Withdrawn, rep.WithdrawnRounds)
			}
			if tc.checker == "" {
				clean(t, rep)
				return
			}
			flagged(t, rep, tc.checker)
		})
	}
}

// TestCheckerCancelThatFoundNothing: a cancel that found no wait
// (cancelled: false) — the waiter was granted first — says nothing about
// the grant; but its waiting request answered cancelled is a lie.
func TestCheckerCancelThatFoundNothing(t *testing.T) {
	const lock = "kind-wd2-a"
	for _, bad := range []bool{false, true} {
		var b hb
		b.kgrant(lock, "h", 0, 10, 1, 300, "", 0)
		b.release(lock, "h", 1, 50, 60, Ok, "")
		w := b.acquireOutcome(lock, "w", 20, 70, 5000, Ok, "")
		w.WaitMs, w.Tag, w.OutToken = 5000, "wd:2:wait", 2
		if bad {
			w.Outcome, w.OutToken, w.Code = Fail, 0, "cancelled"
		}
		b.cancelOp("w", []string{lock}, 100, 110, false, "wd:2:cancel")
		if !bad {
			b.kread(lock, 200, 210, 1, excl("w", 2))
			b.release(lock, "w", 2, 300, 310, Ok, "")
		}
		rep := check(t, b.history())
		if !bad {
			clean(t, rep)
			continue
		}
		flagged(t, rep, "cancel-answer")
	}
}
