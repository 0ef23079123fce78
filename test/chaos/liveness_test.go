package chaos

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/lockd/lockd/internal/server"
)

// The checkers in this file look for progress and for the promises that
// outlive one request (SPEC semantics 9, 10, 12 and 13): locks that expire,
// waiters that are told, clients that let go before anyone else holds, and
// tokens that are never handed out twice — also across a forced restore.

// livenessCheckers are the checkers of progress. The summary and the test
// output report them apart from the safety checkers.
var livenessCheckers = map[string]bool{
	"expiry":       true, // a lock nobody renews is free by expires_at + one election timeout + 1 s
	"waiter-told":  true, // a waiter learns of its grant (or of its wait's end) while its connection lives
	"member-exit":  true, // no member process dies unless the harness stops it
	"delay-waiter": true, // after a lock-delay ends, the first waiter is granted (expires_at + delay + election timeout + 1 s)
	"revoke-told":  true, // a revoked WebSocket holder is pushed lost (reason revoked) while its connection lives
	"watch-live":   true, // a watcher that stays connected shows each watched lock's final state within a bound
	"blocking":     true, // a blocking query answers when a change above its index commits, or when its wait ends
	"ws-answer":    true, // a WebSocket acquire that joined a wait is answered when the wait ends, while its connection lives
	"flood-cut":    true, // no connection is cut because the server fell behind while overloaded
}

// electionTimeout is the members' election timeout: the grace a new leader
// may give a lock past its expires_at.
func electionTimeout(h History) time.Duration {
	if h.ElectionTimeoutMs > 0 {
		return time.Duration(h.ElectionTimeoutMs) * time.Millisecond
	}
	return server.DefaultElectionTimeout
}

// expiryGrace is how long past its expires_at a lock whose holder stopped
// renewing may still be held (SPEC semantics 9).
func expiryGrace(h History) time.Duration { return electionTimeout(h) + time.Second }

// wallMargin absorbs the millisecond truncation of expires_at and the
// conversion from the leader's wall clock to history time (one machine).
const wallMargin = 50 * time.Millisecond

// disturbance is a stretch of a run in which a fault may have left the
// cluster without a serving leader: from injection until the cluster was
// seen healthy again.
type disturbance struct {
	kind       string
	start, end int64
}

func (d disturbance) String() string {
	return fmt.Sprintf("%s [%s, %s]", d.kind, ms(d.start), ms(d.end))
}

// disturbances lists the faults of h (those whose kind is not in skip) in
// start order. A fault after which the cluster never became healthy
// disturbs everything up to the end of the history.
func disturbances(h History, skip map[string]bool) []disturbance {
	var end int64
	for _, op := range h.Ops {
		end = max(end, op.Return)
	}
	var out []disturbance
	for _, f := range h.Faults {
		if skip[f.Kind] {
			continue
		}
		e := f.settled()
		if f.Stuck {
			e = max(e, end)
		}
		out = append(out, disturbance{kind: f.Kind, start: f.Start, end: e})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// expiryDeadline is the moment by which a lock with expires_at e must be
// free: e + grace, moved past every disturbance that overlaps the wait (the
// cluster may have had no leader to expire the lock) to that disturbance's
// end + grace. It also returns the disturbances that moved it.
func expiryDeadline(ds []disturbance, e int64, grace time.Duration) (int64, []disturbance) {
	bound := e + int64(grace)
	var by []disturbance
	for _, d := range ds {
		if d.start > bound {
			break // sorted by start: no later one overlaps either
		}
		if d.end >= e && d.end+int64(grace) > bound {
			bound = d.end + int64(grace)
			by = append(by, d)
		}
	}
	return bound, by
}

func overlapping(ds []disturbance, from, to int64) []disturbance {
	var out []disturbance
	for _, d := range ds {
		if d.start <= to && d.end >= from {
			out = append(out, d)
		}
	}
	return out
}

func describe(ds []disturbance) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ", ")
}

// checkExpiry: a lock whose holder stopped renewing is free, or granted to
// the next waiter, by its expires_at + one election timeout + 1 s (SPEC
// semantics 9), the bound moved past faults that may have left the
// cluster without a leader. Evidence of a lock held too long:
//   - a linearizable read (a reader's, the liveness probe's, a scenario's
//     check) that shows the grant held, with its replicated expires_at,
//     sent after that bound: the state itself says nobody renewed it;
//   - a lock_held refusal naming a holder whose last word on the lock was
//     an acknowledged acquire or renew (nothing of unknown outcome since,
//     nor before: that might have extended the grant), sent after the
//     bound of that acknowledged expiry.
func checkExpiry(h History, r *Report, v *violations) {
	grace := expiryGrace(h)
	ds := disturbances(h, nil)
	reported := map[string]bool{}
	flag := func(ev Op, lock, holder string, tok uint64, exp int64, how string) {
		bound, by := expiryDeadline(ds, exp, grace)
		if ev.Invoke <= bound+int64(wallMargin) {
			return
		}
		key := fmt.Sprintf("%s/%d", lock, tok)
		if reported[key] {
			return
		}
		reported[key] = true
		moved := ""
		if len(by) > 0 {
			moved = " (moved past " + describe(by) + ")"
		}
		v.add("expiry", []int{ev.ID},
			"lock %s: token %d of %s with expires_at %s is still held %s sent at %s, %s after the bound expires_at + election timeout %s + 1s = %s%s",
			lock, tok, holder, ms(exp), how, ms(ev.Invoke), time.Duration(ev.Invoke-bound).Round(time.Millisecond),
			electionTimeout(h), ms(bound), moved)
	}
	for _, op := range h.Ops {
		for _, sh := range op.shown() {
			if sh.ExpiresAt == 0 {
				continue
			}
			r.ExpiryChecked++
			if op.Invoke > sh.ExpiresAt {
				r.ExpiryPast++
			}
			flag(op, op.Lock, sh.Client, sh.Token, sh.ExpiresAt, "by a read")
		}
	}
	type key struct{ lock, client string }
	mine := map[key][]Op{}
	for _, op := range h.Ops {
		switch op.Kind {
		case KindAcquire, KindRenew, KindRelease:
			k := key{op.Lock, op.ClientID}
			mine[k] = append(mine[k], op)
		}
	}
	for _, ops := range mine {
		sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	}
	for _, op := range h.Ops {
		if op.Kind != KindAcquire || op.Code != "lock_held" || op.Holder == "" {
			continue
		}
		var last *Op
		maybe := false // an acquire or renew of unknown outcome: it may have moved the expiry
		for i, o := range mine[key{op.Lock, op.Holder}] {
			if o.Invoke >= op.Invoke {
				break
			}
			if oc, keep := modelOutcome(o); keep && oc == Unknown && o.Kind != KindRelease {
				maybe = true
			}
			last = &mine[key{op.Lock, op.Holder}][i]
		}
		if maybe || last == nil || last.Outcome != Ok || last.ExpiresAt == 0 || last.Return > op.Invoke ||
			(last.Kind != KindAcquire && last.Kind != KindRenew) {
			continue
		}
		tok := last.OutToken
		if last.Kind == KindRenew {
			tok = last.Token
		}
		r.ExpiryChecked++
		flag(op, op.Lock, op.Holder, tok, last.ExpiresAt, "by a lock_held refusal naming its holder")
	}
}

// quietFaults leave every member running, reachable by clients and with
// a stable leader: a waiter that gets no answer during one of them is not
// excused by it. (Slow and lossy links are not quiet: a round trip above
// the leader lease, or enough resets, depose leaders again and again.)
var quietFaults = map[string]bool{FaultBadMember: true}

// waiterSlack is how long after its grant is visible a waiter must have
// been told, or after its wait deadline answered at all.
const waiterSlack = time.Second

// checkWaiterTold: a waiter whose grant committed is told while its
// connection lives, when it happens (SPEC semantics 9: pushed, no polling),
// and a wait is answered — granted, or wait_timeout — by its deadline
// (semantics 4). A waiting acquire (wait > 0) fails this when, with no
// fault (but quietFaults) from a second before the grant showed (or the
// wait's deadline) to a second before the answer:
//   - it was answered wait_timeout, or got no answer at all until the
//     client gave up on its own (its timeout, past the wait plus a second;
//     not a reset, a 503 or the end of the run), and a linearizable read
//     that returned a second before that shows the client holding the lock
//     with a token not acknowledged to it before the acquire was sent;
//   - it was answered with its grant, but a read that returned a second
//     before the answer already showed that grant (told late); or
//   - it got no answer at all until the client gave up, a second or more
//     past its wait deadline.
func checkWaiterTold(h History, r *Report, v *violations) {
	ds := disturbances(h, quietFaults)
	type key struct{ lock, client string }
	// A read that shows the client holding: the read, its token there.
	type shownRead struct {
		Op
		tok uint64
	}
	reads := map[key][]shownRead{}
	acked := map[key][]Op{}
	for _, op := range h.Ops {
		switch {
		case op.Kind == KindRead && op.Outcome == Ok:
			for _, sh := range op.shown() {
				k := key{op.Lock, sh.Client}
				reads[k] = append(reads[k], shownRead{op, sh.Token})
			}
		case op.Kind == KindAcquire && op.Outcome == Ok:
			k := key{op.Lock, op.ClientID}
			acked[k] = append(acked[k], op)
		}
	}
	knownBefore := func(k key, tok uint64, t int64) bool {
		for _, a := range acked[k] {
			if a.OutToken == tok && a.Return < t {
				return true
			}
		}
		return false
	}
	for _, a := range h.Ops {
		if a.Kind != KindAcquire || a.WaitMs <= 0 {
			continue
		}
		wait := time.Duration(a.WaitMs) * time.Millisecond
		var ending string
		silent := false
		switch {
		case a.Outcome == Ok:
			ending = fmt.Sprintf("was answered with the grant only at %s", ms(a.Return))
		case a.Outcome == Fail && a.Code == "wait_timeout":
			ending = "was answered wait_timeout at " + ms(a.Return)
		case a.Outcome == Unknown && a.GaveUp && a.Return-a.Invoke >= int64(wait+waiterSlack):
			silent = true
			ending = fmt.Sprintf("got no answer; the client gave up at %s (%s)", ms(a.Return), a.Err)
		default:
			continue
		}
		r.WaitsChecked++
		// A fault between the grant showing and the answer excuses the
		// wait: the member holding it may have been frozen, or deposed
		// without knowing yet, or no leader was stable enough to answer.
		quiet := func(from int64) bool {
			return len(overlapping(ds, from-int64(waiterSlack), a.Return-int64(waiterSlack))) == 0
		}
		k := key{a.Lock, a.ClientID}
		var ev *shownRead
		for i, rd := range reads[k] {
			if rd.Invoke >= a.Invoke && rd.Return+int64(waiterSlack) <= a.Return && !knownBefore(k, rd.tok, a.Invoke) &&
				(a.Outcome != Ok || rd.tok == a.OutToken) && quiet(rd.Invoke) {
				ev = &reads[k][i]
				break
			}
		}
		silent = silent && quiet(a.Invoke+int64(wait))
		switch {
		case ev != nil && a.Outcome == Ok:
			v.add("waiter-told", []int{a.ID, ev.ID},
				"lock %s: waiter %s (acquire sent at %s, wait %s) was told of its grant late: a read returned at %s shows it holding token %d, and the acquire %s, %s later",
				a.Lock, a.ClientID, ms(a.Invoke), wait, ms(ev.Return), ev.tok, ending, time.Duration(a.Return-ev.Return).Round(time.Millisecond))
		case ev != nil:
			v.add("waiter-told", []int{a.ID, ev.ID},
				"lock %s: waiter %s (acquire sent at %s, wait %s) was never told of its grant: a read returned at %s shows it holding token %d, and the acquire %s",
				a.Lock, a.ClientID, ms(a.Invoke), wait, ms(ev.Return), ev.tok, ending)
		case silent:
			v.add("waiter-told", []int{a.ID},
				"lock %s: waiter %s (acquire sent at %s, wait %s, deadline %s) was never answered, neither granted nor wait_timeout: it %s",
				a.Lock, a.ClientID, ms(a.Invoke), wait, ms(a.Invoke+int64(wait)), ending)
		}
	}
}

// lostSlack absorbs the wake-up of the goroutine that records when a
// Go-client lock's Lost() closed, on a loaded machine (the client's own
// lease margin, a twentieth of the TTL, comes on top).
const lostSlack = 50 * time.Millisecond

// checkLostLate: the Go client's Lock.Lost() closes before the server can
// have granted the lock to anyone else. A Go-client grant's holder counts
// on it until Lost() closes, or until it sends a release or begins closing
// the client; a later grant of that lock to another client must not have
// been acknowledged (its acquire answered) before then.
func checkLostLate(h History, gs map[uint64]*grant, r *Report, v *violations) {
	relied := map[uint64]int64{} // token → when its Go-client holder stopped counting on it
	lostOp := map[uint64]Op{}
	anyLost := false
	for _, op := range h.Ops {
		switch {
		case op.Kind == KindLost:
			anyLost = true
			if t, ok := relied[op.Token]; !ok || op.Invoke < t {
				relied[op.Token] = op.Invoke
				lostOp[op.Token] = op
			}
		case op.Kind == KindRelease && op.Via == "client":
			if t, ok := relied[op.Token]; !ok || op.Invoke < t {
				relied[op.Token] = op.Invoke
				delete(lostOp, op.Token)
			}
		}
	}
	if !anyLost {
		return // a history recorded without Lost() times
	}
	byLock := map[string][]*grant{}
	for _, g := range gs {
		if g.FirstReply != math.MaxInt64 {
			byLock[g.Lock] = append(byLock[g.Lock], g)
		}
	}
	checked := map[uint64]bool{}
	for _, op := range h.Ops {
		if op.Kind != KindAcquire || op.Via != "client" || op.Outcome != Ok || checked[op.OutToken] {
			continue
		}
		checked[op.OutToken] = true
		g := gs[op.OutToken]
		if g == nil || g.Client != op.ClientID {
			continue
		}
		r.LostChecked++
		end, ok := relied[g.Token]
		if !ok {
			end = math.MaxInt64
		}
		var next *grant
		for _, o := range byLock[g.Lock] {
			if o.Token > g.Token && o.Client != g.Client && (next == nil || o.FirstReply < next.FirstReply) {
				next = o
			}
		}
		if next == nil || next.FirstReply+int64(lostSlack) >= end {
			continue
		}
		lost := "never closed"
		if lo, ok := lostOp[g.Token]; ok {
			lost = "closed at " + ms(lo.Return)
			if lo.Invoke < lo.Return {
				lost += " (holder closing the client from " + ms(lo.Invoke) + ")"
			}
			if lo.Err != "" {
				lost += ": " + lo.Err
			}
		} else if ok {
			lost = "was still open when the holder sent its release at " + ms(end)
		}
		ids := []int{g.op(), next.op()}
		if lo, ok := lostOp[g.Token]; ok {
			ids = append(ids, lo.ID)
		}
		from := "only reads saw it asked for"
		if next.LB != math.MaxInt64 {
			from = "asked for at " + ms(next.LB)
		}
		v.add("lost-late", ids,
			"lock %s: Go client %s holds token %d and Lost() %s, but token %d was granted to %s (%s) and acknowledged at %s: the client still counted on the lock %s after another client was told it holds it",
			g.Lock, g.Client, g.Token, lost, next.Token, next.Client, from, ms(next.FirstReply),
			time.Duration(min(end, h.end())-next.FirstReply).Round(time.Millisecond))
	}
}

// end is the last moment of the history.
func (h History) end() int64 {
	var e int64
	for _, op := range h.Ops {
		e = max(e, op.Return)
	}
	return e
}

// checkTokenReissue: no fencing token is acknowledged twice (SPEC semantics
// 2), and a restore never reissues one (semantics 13): after a forced
// `snapshot restore`, every grant asked for afterwards has a token above
// every token acknowledged before the restore began — even with traffic
// during the restore. Acknowledged: an acquire answered with the grant.
// The same grant acknowledged again to its holder (an idempotent acquire,
// also of a grant a restore brought back) is one acknowledgement.
func checkTokenReissue(h History, gs map[uint64]*grant, r *Report, v *violations) {
	var acks []Op
	for _, op := range h.Ops {
		if op.Kind == KindAcquire && op.Outcome == Ok && op.OutToken != 0 {
			acks = append(acks, op)
		}
	}
	sort.SliceStable(acks, func(i, j int) bool { return acks[i].Return < acks[j].Return })
	var restores []Fault
	for _, f := range h.Faults {
		if f.Kind == FaultRestore {
			restores = append(restores, f)
		}
	}
	across := func(from, to int64) string {
		var s []string
		for _, f := range restores {
			if f.End >= from && f.Start <= to {
				s = append(s, fmt.Sprintf("[%s, %s]", ms(f.Start), ms(f.End)))
			}
		}
		if len(s) == 0 {
			return ""
		}
		return ", across the forced restore at " + strings.Join(s, ", ")
	}
	type owner struct{ lock, client string }
	first := map[uint64]map[owner]Op{}
	reported := map[uint64]bool{}
	for _, a := range acks {
		o := owner{a.Lock, a.ClientID}
		seen := first[a.OutToken]
		if seen == nil {
			seen = map[owner]Op{}
			first[a.OutToken] = seen
		}
		if _, ok := seen[o]; ok {
			continue
		}
		for prev, p := range seen {
			if !reported[a.OutToken] {
				reported[a.OutToken] = true
				v.add("token-reissued", []int{p.ID, a.ID},
					"token %d was acknowledged to %s on %s at %s and again to %s on %s at %s (asked for at %s)%s",
					a.OutToken, prev.client, prev.lock, ms(p.Return), a.ClientID, a.Lock, ms(a.Return), ms(a.Invoke),
					across(p.Return, a.Invoke))
			}
		}
		seen[o] = a
	}
	for _, f := range restores {
		var top *Op
		before := map[string]bool{}
		for i, a := range acks {
			if a.Return >= f.Start {
				break
			}
			before[fmt.Sprintf("%d/%s/%s", a.OutToken, a.Lock, a.ClientID)] = true
			if top == nil || a.OutToken > top.OutToken {
				top = &acks[i]
			}
		}
		if top == nil {
			continue
		}
		after := 0
		for _, a := range acks {
			g := gs[a.OutToken]
			if g == nil || g.LB <= f.End || before[fmt.Sprintf("%d/%s/%s", a.OutToken, a.Lock, a.ClientID)] {
				continue
			}
			after++
			if a.OutToken <= top.OutToken && !reported[a.OutToken] {
				reported[a.OutToken] = true
				v.add("token-reissued", []int{top.ID, a.ID},
					"the forced restore at [%s, %s] reissued tokens: token %d, granted to %s on %s asked for at %s after the restore, is not above token %d acknowledged to %s on %s at %s before it",
					ms(f.Start), ms(f.End), a.OutToken, a.ClientID, a.Lock, ms(g.LB), top.OutToken, top.ClientID, top.Lock, ms(top.Return))
			}
		}
		if after > 0 {
			r.RestoresChecked++
		}
	}
}

// checkKeepalives: a keepalive is acknowledged only by a member that
// confirmed its leadership with a quorum after receiving it (SPEC semantics
// 10). A keepalive sent to a paused leader and acknowledged (200) once it
// resumed (within an election timeout of waking), when another member had
// answered a write as leader while it was paused, was acknowledged by a
// deposed leader.
func checkKeepalives(h History, r *Report, v *violations) {
	for _, f := range h.Faults {
		if f.Kind != FaultPauseLeader || len(f.Targets) == 0 {
			continue
		}
		newLeader := f.Start + f.Failover
		deposed := f.Failover != 0 && f.FailoverBy != "" && f.FailoverBy != f.Targets[0] && newLeader < f.Healed
		var acked []Op
		for _, op := range h.Ops {
			if op.Kind != KindKeepalive || op.Node != f.Targets[0] || op.Invoke < f.Start || op.Invoke >= f.Healed {
				continue
			}
			r.KeepalivesPaused++
			// Acknowledged within an election timeout of waking: too soon
			// for the member to have been elected again meanwhile.
			if deposed && op.Outcome == Ok && op.Return > f.Healed && op.Return <= f.Healed+int64(electionTimeout(h)) {
				acked = append(acked, op)
			}
		}
		if len(acked) == 0 {
			continue
		}
		first := acked[0]
		ids := []int{first.ID}
		if len(acked) > 1 {
			ids = append(ids, acked[len(acked)-1].ID)
		}
		v.add("keepalive-deposed", ids,
			"session %s: %d keepalives sent to %s while it was paused in [%s, %s] (the first at %s) were acknowledged (200) when it woke, from %s, though %s answered writes as leader from %s: a deposed leader extended a lease",
			first.ClientID, len(acked), f.Targets[0], ms(f.Start), ms(f.Healed), ms(first.Invoke), ms(first.Return), f.FailoverBy, ms(newLeader))
	}
}

// checkMembers: a member addition no member may accept is refused with 400
// and changes nothing, no request makes a member panic (SPEC semantics 12),
// and no member process exits unless the harness stops it.
func checkMembers(h History, r *Report, v *violations) {
	for _, op := range h.Ops {
		switch op.Kind {
		case KindMemberAdd:
			r.MemberAdds++
			if op.Status != 400 || op.Err != "" {
				got := fmt.Sprintf("answered %d %s", op.Status, op.Code)
				if op.Status == 0 {
					got = "not answered"
				}
				if op.Err != "" {
					got += "; " + op.Err
				}
				v.add("bad-member", []int{op.ID},
					"POST /api/v1/cluster/members adding %s with a garbage raft_addr and a 65,000-byte 0xFF http_addr, sent to %s, was %s; want 400 invalid_argument and no change",
					op.ClientID, op.Node, got)
			}
		case KindMemberPanic:
			v.add("member-panic", []int{op.ID}, "a member panicked (logged in %s): %s", op.Node, op.Err)
		case KindMemberExit:
			v.add("member-exit", []int{op.ID}, "member %s exited without being stopped (found at %s): %s", op.Node, ms(op.Invoke), op.Err)
		}
	}
}
