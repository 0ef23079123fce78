package chaos

import (
	"fmt"
	"slices"
	"strings"
)

// checkCancels (SPEC 18): a wait that a cancel withdrew is never granted.
//
//   - cancel-granted: a cancel answered cancelled: true withdrew client C's
//     queued wait on its lock(s) in the step it committed; at that step C
//     held none of them (a client that holds a lock does not wait for it).
//     So a grant of one of them to C that anything shows after the cancel
//     returned was made after the cancel, and must come from an acquire by
//     C that may have taken effect after it: one sent after the cancel was,
//     or not answered before it was sent, or of unknown outcome — not the
//     withdrawn request, which was refused. A grant with no such acquire is
//     the withdrawn waiter granted all the same.
//   - cancel-answer: in the workload's cancel rounds (tags wd:R:*), where
//     the waiter sends its one waiting request before the cancel and never
//     another, that request is answered cancelled when the cancel withdrew
//     a wait — not granted, not wait_timeout — and is not answered
//     cancelled when the cancel found none.
func checkCancels(h History, gs map[uint64]*grant, r *Report, v *violations) {
	byID := make(map[int]Op, len(h.Ops))
	acquires := map[[2]string][]Op{} // (lock, client) → acquires, a multi's once per lock
	waits := map[string]Op{}         // round tag prefix → its waiting request
	shows := map[string][]Op{}       // lock → ops that show its status
	var cancels []Op
	for _, op := range h.Ops {
		byID[op.ID] = op
		if op.observed() {
			shows[op.Lock] = append(shows[op.Lock], op)
		}
		switch op.Kind {
		case KindAcquire:
			acquires[[2]string{op.Lock, op.ClientID}] = append(acquires[[2]string{op.Lock, op.ClientID}], op)
		case KindMulti:
			for _, l := range op.Locks {
				acquires[[2]string{l, op.ClientID}] = append(acquires[[2]string{l, op.ClientID}], op)
			}
		case KindCancel:
			if op.Outcome == Ok {
				cancels = append(cancels, op)
			}
		}
		if round, ok := strings.CutSuffix(op.Tag, ":wait"); ok && strings.HasPrefix(op.Tag, "wd:") && (op.Kind == KindAcquire || op.Kind == KindMulti) {
			waits[round] = op
		}
	}
	for _, x := range cancels {
		if x.Withdrawn {
			r.Withdrawn++
		}
		locks := x.Locks
		if len(locks) == 0 {
			locks = []string{x.Lock}
		}
		if round, ok := strings.CutSuffix(x.Tag, ":cancel"); ok {
			if w, ok := waits[round]; ok && w.Invoke < x.Invoke {
				r.WithdrawnRounds++
				switch {
				case x.Withdrawn && w.Outcome == Ok:
					v.add("cancel-answer", []int{x.ID, w.ID}, "the cancel withdrew %s's wait on %s, and the waiting request was answered granted: %s; %s",
						x.ClientID, strings.Join(locks, ","), x, w)
				case x.Withdrawn && w.Outcome == Fail && w.Code != "" && w.Code != "cancelled":
					v.add("cancel-answer", []int{x.ID, w.ID}, "the cancel withdrew %s's wait on %s, and the waiting request was answered %s, not cancelled: %s; %s",
						x.ClientID, strings.Join(locks, ","), w.Code, x, w)
				case !x.Withdrawn && w.Code == "cancelled":
					v.add("cancel-answer", []int{x.ID, w.ID}, "the only cancel of %s's wait found none to withdraw, and the waiting request was answered cancelled: %s; %s",
						x.ClientID, x, w)
				}
			}
		}
		if !x.Withdrawn {
			continue
		}
		for _, l := range locks {
			for _, op := range shows[l] {
				if op.Invoke > x.Return {
					r.WithdrawnChecked++ // would show the waiter's grant
				}
			}
		}
		for _, g := range gs {
			if g.Client != x.ClientID || !slices.Contains(locks, g.Lock) {
				continue
			}
			// The first thing that shows the grant after the cancel returned.
			var seen *Op
			for _, id := range g.Ops {
				op, ok := byID[id]
				if ok && op.Invoke > x.Return && (seen == nil || op.Return < seen.Return) {
					seen = &op
				}
			}
			if seen == nil {
				continue // shown only before the cancel: it ended before
			}
			explained := false
			for _, a := range acquires[[2]string{g.Lock, g.Client}] {
				oc, keep := modelOutcome(a)
				if !keep || oc == Fail || a.Invoke >= seen.Return {
					continue
				}
				if a.Invoke > x.Invoke || a.Return > x.Invoke || oc == Unknown {
					explained = true
					break
				}
			}
			if !explained {
				v.add("cancel-granted", []int{x.ID, seen.ID}, "%s's wait on %s was withdrawn (%s), and %s shows it holding token %d, which no acquire of it sent or answered after the cancel can have made",
					x.ClientID, g.Lock, x, seen, g.Token)
			}
		}
	}
}

// cancelSummary is the summary's line on withdrawn waits.
func cancelSummary(rep *Report) string {
	return fmt.Sprintf("cancels: %d waits withdrawn; %d later statuses of their locks checked for the withdrawn waiter; %d cancel rounds' waiting requests checked for their answer\n",
		rep.Withdrawn, rep.WithdrawnChecked, rep.WithdrawnRounds)
}
