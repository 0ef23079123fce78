package chaos

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Checkers of the lock kinds (SPEC "Lock kinds, values, elections and
// watches"): modes, semaphores, multi-locks, lock-delay and revocation.
//
// Why not porcupine. The linearizability model (model_test.go) is one
// exclusive lock: one holder, the token it may not know yet, the earliest
// end of its lease. For the kinds it would have to carry a set of holders
// (each with a token that may be unknown, a mode and a lease bound), the
// queue (FIFO across modes decides who a release hands the lock to, and a
// waiting multi-acquire holds a place in several queues at once, so the
// partitions by lock would no longer be independent), lock-delays and
// revocations; every acquire of unknown outcome doubles the states at each
// step, and with three holders of a semaphore and a few open unknowns the
// search times out — which counts as a failure. So porcupine keeps the
// exclusive locks it checks today, and the kinds locks (named kindPrefix*,
// which no ordinary worker touches) are checked by what follows. Each
// check flags only what no correct execution can produce:
//
//   - every linearizable read of a kinds lock (a GET, or an item of a
//     list) is the whole holder set at one log index: at most limit
//     exclusive holders, never shared beside exclusive, the status
//     consistent with itself, and every grant that a client was told of
//     and that cannot have ended during the read is in it;
//   - the grants clients were told of, each over its safe interval (as
//     for mutual exclusion, ending also at a revoke that may have ended
//     it), never exceed the limit nor mix modes at any moment;
//   - a multi-acquire's grant is atomic: every lock, one token each,
//     consecutive (one step, nothing between), one expiry; a list that
//     shows part of it while the rest cannot have ended yet is a partial
//     grant;
//   - a grant of a lock whose previous grant carried lock_delay_ms and
//     ended without a release comes no earlier than that grant's
//     replicated expires_at (or the revoke that ended it) + the delay;
//   - a semaphore keeps the limit its acquires name (limit_mismatch only
//     for a mismatched limit, and always for one while the lock is held);
//   - a revoke ends the grants it names and every grant that held
//     throughout it; the revoked holder's release gets not_holder, its
//     renew too, and its WebSocket is pushed lost with reason revoked.
//
// Tokens of every kind are checked by token-unique and token-order with
// the ordinary grants (one global counter).

// kindPrefix names the locks of the lock-kinds workload; nothing else
// uses them.
const kindPrefix = "kind-"

func isKind(name string) bool { return strings.HasPrefix(name, kindPrefix) }

// kindLimit is the semaphore size of a kinds lock, by its name: a segment
// "s<N>" (kind-<epoch>-s3-0) makes it a semaphore of N, which every
// acquire of it names; any other lock has limit 1.
func kindLimit(name string) int64 {
	if n := semSize(name); n > 0 {
		return n
	}
	return 1
}

// semSize is the N of a segment "s<N>" of a kinds lock's name, or 0.
func semSize(name string) int64 {
	if !isKind(name) {
		return 0
	}
	for _, seg := range strings.Split(strings.TrimPrefix(name, kindPrefix), "-") {
		if len(seg) > 1 && seg[0] == 's' {
			if n, err := strconv.ParseInt(seg[1:], 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}

// semName reports a semaphore: a kinds lock whose acquires name a limit.
func semName(name string) bool { return semSize(name) > 0 }

// expandMulti returns h with each multi-acquire as one acquire per lock
// (same id), for the checkers of single grants: granted, one acquire per
// grant; refused lock_held, one refused acquire of the blocking lock;
// wait_timeout or unknown, one such acquire per lock (an unknown
// multi-acquire may have granted each). A limit_mismatch refusal changed
// nothing and adds nothing.
func expandMulti(h History) History {
	out := h
	out.Ops = make([]Op, 0, len(h.Ops))
	for _, op := range h.Ops {
		if op.Kind != KindMulti {
			out.Ops = append(out.Ops, op)
			continue
		}
		base := op
		base.Kind, base.Locks, base.Grants = KindAcquire, nil, nil
		switch {
		case op.Outcome == Ok:
			for _, g := range op.Grants {
				c := base
				c.Lock, c.OutToken, c.ExpiresAt, c.GrantMode = g.Lock, g.Token, g.ExpiresAt, g.Mode
				out.Ops = append(out.Ops, c)
			}
		case op.Outcome == Fail && op.Code == "lock_held":
			if op.Lock != "" {
				out.Ops = append(out.Ops, base)
			}
		case op.Outcome == Fail && op.Code != "wait_timeout":
		default:
			for _, l := range op.Locks {
				c := base
				c.Lock, c.Holder = l, ""
				out.Ops = append(out.Ops, c)
			}
		}
	}
	return out
}

// kindsIndex holds what the kinds checkers share.
type kindsIndex struct {
	gs      map[uint64]*grant
	revokes map[string][]Op // lock → revokes
	byLock  map[string][]*grant
}

func newKindsIndex(h History, gs map[uint64]*grant) *kindsIndex {
	k := &kindsIndex{gs: gs, revokes: map[string][]Op{}, byLock: map[string][]*grant{}}
	for _, op := range h.Ops {
		if op.Kind == KindRevoke {
			k.revokes[op.Lock] = append(k.revokes[op.Lock], op)
		}
	}
	for _, g := range gs {
		if isKind(g.Lock) {
			k.byLock[g.Lock] = append(k.byLock[g.Lock], g)
		}
	}
	for _, l := range k.byLock {
		sort.Slice(l, func(i, j int) bool { return l[i].Token < l[j].Token })
	}
	return k
}

// revokeBound is the earliest moment a revoke (other than skip) may have
// ended g: the send time of one that names it in its reply, or of one of
// unknown outcome that would have ended it. MaxInt64: none.
func (k *kindsIndex) revokeBound(g *grant, skip int) int64 {
	b := int64(math.MaxInt64)
	for _, rv := range k.revokes[g.Lock] {
		if rv.ID == skip {
			continue
		}
		oc, keep := modelOutcome(rv)
		switch {
		case !keep:
		case oc == Ok && slices.Contains(rv.Revoked, g.Token):
			b = min(b, rv.Invoke)
		case oc == Unknown && (rv.Token == 0 || rv.Token == g.Token):
			b = min(b, rv.Invoke)
		}
	}
	return b
}

// safeEnd is the end of g's safe interval: its holder first sent a
// release, its lease may have run out, or a revoke (other than skip) may
// have ended it.
func (k *kindsIndex) safeEnd(g *grant, skip int) int64 {
	return min(g.ReleaseSent, g.ExpiryLB, k.revokeBound(g, skip))
}

// heldThroughout reports whether g certainly held from from to to: its
// holder was told before from, and it cannot have ended before to.
func (k *kindsIndex) heldThroughout(g *grant, from, to int64, skip int) bool {
	return g.FirstReply != math.MaxInt64 && g.FirstReply <= from && k.safeEnd(g, skip) >= to
}

func modeOf(m string) string {
	if m == "" {
		return "exclusive"
	}
	return m
}

// checkKinds runs the safety checkers of the lock kinds over h (multi-
// acquires whole; gs from the expanded history).
func checkKinds(h History, gs map[uint64]*grant, r *Report, v *violations) {
	k := newKindsIndex(h, gs)
	for _, op := range h.Ops {
		// A new grant comes in the mode asked for. (A holder that asks
		// again gets its grant back, whatever mode it asks: the workload
		// never asks for a lock its client may still hold.)
		if op.Kind == KindAcquire && op.Outcome == Ok && isKind(op.Lock) && op.GrantMode != "" && modeOf(op.GrantMode) != modeOf(op.Mode) {
			v.add("mode", []int{op.ID}, "asked for %s, granted %s: %s", modeOf(op.Mode), modeOf(op.GrantMode), op)
		}
	}
	checkKindIntervals(k, r, v)
	checkKindReads(h, k, r, v)
	checkMultiAtomic(h, k, r, v)
	checkLockDelay(h, k, r, v)
	checkLimitMismatch(h, k, r, v)
	checkRevokes(h, k, r, v)
}

// checkKindIntervals: at no moment do more than limit exclusive grants
// of a lock overlap, nor a shared grant and an exclusive one, counting
// each grant over its safe interval [first reply, safe end). A grant's
// mode is the one its reply gave, which must be the one asked for.
func checkKindIntervals(k *kindsIndex, r *Report, v *violations) {
	type iv struct {
		g          *grant
		start, end int64
	}
	for lock, gl := range k.byLock {
		limit := kindLimit(lock)
		var ivs []iv
		for _, g := range gl {
			if g.FirstReply == math.MaxInt64 {
				continue
			}
			if modeOf(g.Mode) == "shared" && limit > 1 {
				v.add("mode", []int{g.op()}, "%s is shared on %s, a semaphore of %d (a semaphore's holders are exclusive)", g, lock, limit)
			}
			if end := k.safeEnd(g, -1); end > g.FirstReply {
				ivs = append(ivs, iv{g, g.FirstReply, end})
			}
		}
		r.KindIntervals += len(ivs)
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start < ivs[j].start })
		var active []iv
		reported := map[string]bool{}
		for _, cur := range ivs {
			kept := active[:0]
			for _, a := range active {
				if a.end > cur.start {
					kept = append(kept, a)
				}
			}
			active = append(kept, cur)
			var excl, shared []iv
			for _, a := range active {
				if modeOf(a.g.Mode) == "shared" {
					shared = append(shared, a)
				} else {
					excl = append(excl, a)
				}
			}
			list := func(l []iv) string {
				s := make([]string, len(l))
				for i, a := range l {
					s[i] = fmt.Sprintf("%s (%s) safe in [%s, %s]", a.g, modeOf(a.g.Mode), ms(a.start), ms(a.end))
				}
				return strings.Join(s, ", ")
			}
			ids := func(l []iv) []int {
				out := make([]int, 0, len(l))
				for _, a := range l {
					out = append(out, a.g.op())
				}
				return out
			}
			if int64(len(excl)) > limit && !reported["limit"] {
				reported["limit"] = true
				v.add("limit", ids(excl), "lock %s (limit %d): %d exclusive grants told to their clients overlap at %s: %s",
					lock, limit, len(excl), ms(cur.start), list(excl))
			}
			if len(excl) > 0 && len(shared) > 0 && !reported["mode"] {
				reported["mode"] = true
				v.add("mode", append(ids(excl), ids(shared)...), "lock %s: shared and exclusive grants told to their clients overlap at %s: %s",
					lock, ms(cur.start), list(append(excl, shared...)))
			}
		}
	}
}

// checkKindReads: a linearizable read of a kinds lock is its whole holder
// set at one log index. It must be consistent (held iff holders, holders
// by rising token, one grant per client, the top-level fields naming the
// lowest token, one mode), within the limit, with the lock's limit while
// held, and it must show every grant that held throughout the read.
func checkKindReads(h History, k *kindsIndex, r *Report, v *violations) {
	resized := resizedLocks(h)
	for _, rd := range h.Ops {
		if rd.Kind != KindRead || rd.Outcome != Ok || !isKind(rd.Lock) {
			continue
		}
		r.KindReads++
		lock, limit := rd.Lock, kindLimit(rd.Lock)
		hs := rd.Holders
		bad := func(checker, format string, args ...any) {
			v.add(checker, []int{rd.ID}, "lock %s: "+format+": %s", append(append([]any{lock}, args...), rd)...)
		}
		switch {
		case rd.Held != (len(hs) > 0):
			bad("status", "held is %t with %d holders", rd.Held, len(hs))
		case len(hs) > 0 && (rd.Holder != hs[0].Client || rd.OutToken != hs[0].Token):
			bad("status", "client_id %s, fencing_token %d do not name the holder with the lowest token", rd.Holder, rd.OutToken)
		}
		clients := map[string]bool{}
		for i, x := range hs {
			if i > 0 && hs[i-1].Token >= x.Token {
				bad("status", "holders are not in rising token order")
				break
			}
			if clients[x.Client] {
				bad("status", "client %s holds it twice", x.Client)
				break
			}
			clients[x.Client] = true
		}
		modes := map[string]int{}
		for _, x := range hs {
			modes[modeOf(x.Mode)]++
		}
		switch {
		case modes["shared"] > 0 && modes["exclusive"] > 0:
			bad("mode", "shared and exclusive holders at once")
		case modes["shared"] > 0 && limit > 1:
			bad("mode", "shared holders on a semaphore of %d", limit)
		case len(hs) > 0 && rd.Mode != modeOf(hs[0].Mode):
			bad("status", "mode %q, but the holders are %s", rd.Mode, modeOf(hs[0].Mode))
		case len(hs) == 0 && rd.Mode != "" && rd.Mode != "none":
			bad("status", "mode %q without holders", rd.Mode)
		}
		switch {
		case int64(modes["exclusive"]) > limit:
			bad("limit", "%d exclusive holders of a semaphore of %d", modes["exclusive"], limit)
		case rd.Limit != 0 && int64(modes["exclusive"]) > rd.Limit:
			bad("limit", "%d exclusive holders, over its own limit %d", modes["exclusive"], rd.Limit)
		case len(hs) > 0 && rd.Limit != limit && !resized[lock]:
			bad("limit", "held with limit %d, but every acquire of it names %d", rd.Limit, limit)
		}
		// Every grant that held throughout the read is in it.
		shown := map[uint64]bool{}
		for _, x := range hs {
			shown[x.Token] = true
		}
		for _, g := range k.byLock[lock] {
			if !k.heldThroughout(g, rd.Invoke, rd.Return, -1) {
				continue
			}
			r.KindReadGrants++
			if !shown[g.Token] {
				v.add("kinds-read", []int{g.op(), rd.ID},
					"lock %s: %s was told to its client at %s and cannot have ended before %s (release, lease, revoke), yet a linearizable read in [%s, %s] does not show it: %s",
					lock, g, ms(g.FirstReply), ms(k.safeEnd(g, -1)), ms(rd.Invoke), ms(rd.Return), rd)
			}
		}
	}
	// A list that was one page read the whole table at one index: a kinds
	// lock it does not list was free then.
	type snap struct {
		first  Op
		listed map[string]bool
	}
	snaps := map[int64]*snap{}
	for _, op := range h.Ops {
		if op.Kind == KindRead && op.Outcome == Ok && op.Snap != 0 {
			s := snaps[op.Snap]
			if s == nil {
				s = &snap{first: op, listed: map[string]bool{}}
				snaps[op.Snap] = s
			}
			s.listed[op.Lock] = true
		}
	}
	byInvoke := make([]*snap, 0, len(snaps))
	for _, s := range snaps {
		byInvoke = append(byInvoke, s)
	}
	sort.Slice(byInvoke, func(i, j int) bool { return byInvoke[i].first.Invoke < byInvoke[j].first.Invoke })
	for lock, gl := range k.byLock {
		for _, g := range gl {
			if g.FirstReply == math.MaxInt64 {
				continue
			}
			end := k.safeEnd(g, -1)
			i := sort.Search(len(byInvoke), func(i int) bool { return byInvoke[i].first.Invoke >= g.FirstReply })
			for ; i < len(byInvoke) && byInvoke[i].first.Invoke < end; i++ {
				s := byInvoke[i]
				if s.first.Return > end {
					continue
				}
				r.KindReadGrants++
				if !s.listed[lock] {
					v.add("kinds-read", []int{g.op(), s.first.ID},
						"lock %s: %s was told to its client at %s and cannot have ended before %s, yet a list of the whole table in [%s, %s] does not list the lock",
						lock, g, ms(g.FirstReply), ms(end), ms(s.first.Invoke), ms(s.first.Return))
				}
			}
		}
	}
}

// resizedLocks are the locks a mismatch probe may have created with
// another limit (granted, or of unknown outcome): their status limit
// proves nothing.
func resizedLocks(h History) map[string]bool {
	out := map[string]bool{}
	for _, op := range h.Ops {
		if !strings.HasPrefix(op.Tag, "mismatch:") {
			continue
		}
		if oc, keep := modelOutcome(op); keep && oc != Fail {
			if op.Kind == KindMulti {
				for _, l := range op.Locks {
					out[l] = true
				}
			} else {
				out[op.Lock] = true
			}
		}
	}
	return out
}

// checkMultiAtomic: a multi-acquire is granted in one committed step or
// not at all. Its reply lists one grant per lock asked for, in the mode
// asked for, with consecutive tokens (one step, no other grant between)
// and one expiry; and a list request — one read of the whole table at one
// log index — that shows part of it must show the rest, unless the rest
// may have ended by then.
func checkMultiAtomic(h History, k *kindsIndex, r *Report, v *violations) {
	snaps := map[int64]map[string][]HolderRec{}
	snapOp := map[int64]Op{}
	for _, op := range h.Ops {
		if op.Kind == KindRead && op.Outcome == Ok && op.Snap != 0 {
			m := snaps[op.Snap]
			if m == nil {
				m = map[string][]HolderRec{}
				snaps[op.Snap] = m
				snapOp[op.Snap] = op
			}
			m[op.Lock] = op.shown()
		}
	}
	var snapIDs []int64
	for id := range snaps {
		snapIDs = append(snapIDs, id)
	}
	slices.Sort(snapIDs)
	holds := func(hs []HolderRec, client string, tok uint64) bool {
		for _, x := range hs {
			if x.Client == client && x.Token == tok {
				return true
			}
		}
		return false
	}
	for _, op := range h.Ops {
		if op.Kind != KindMulti || op.Outcome != Ok {
			continue
		}
		r.MultiGrants++
		if op.Via == "ws" {
			r.MultiGrantsWS++
		}
		var names []string
		toks := make([]uint64, 0, len(op.Grants))
		exp := map[int64]bool{}
		for _, g := range op.Grants {
			names = append(names, g.Lock)
			toks = append(toks, g.Token)
			if g.ExpiresAt != 0 {
				exp[g.ExpiresAt/int64(time.Millisecond)] = true
			}
			if modeOf(g.Mode) != modeOf(op.Mode) {
				v.add("mode", []int{op.ID}, "multi-acquire asked for %s, granted %s %s: %s", modeOf(op.Mode), g.Lock, modeOf(g.Mode), op)
			}
		}
		want := append([]string(nil), op.Locks...)
		slices.Sort(want)
		got := append([]string(nil), names...)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			v.add("multi-atomic", []int{op.ID}, "partial grant: the multi-acquire of %v was answered with grants of %v: %s", want, names, op)
			continue
		}
		slices.Sort(toks)
		if toks[len(toks)-1]-toks[0] != uint64(len(toks)-1) {
			between := ""
			for t := toks[0] + 1; t < toks[len(toks)-1]; t++ {
				if g := k.gs[t]; g != nil && !slices.Contains(toks, t) {
					between += fmt.Sprintf(" %s", g)
				}
			}
			if between != "" {
				between = "; between them:" + between
			}
			v.add("multi-atomic", []int{op.ID}, "the grants of one multi-acquire have tokens %v, not consecutive (one step)%s: %s", toks, between, op)
		}
		if len(exp) > 1 {
			v.add("multi-atomic", []int{op.ID}, "the grants of one multi-acquire expire at different times (not one step): %s", op)
		}
		for _, id := range snapIDs {
			s, sop := snaps[id], snapOp[id]
			var seen, missing []GrantRec
			for _, g := range op.Grants {
				if holds(s[g.Lock], op.ClientID, g.Token) {
					seen = append(seen, g)
				} else {
					missing = append(missing, g)
				}
			}
			if len(seen) == 0 {
				continue
			}
			r.MultiSnapshots++
			for _, g := range missing {
				gg := k.gs[g.Token]
				if gg == nil || k.safeEnd(gg, -1) <= sop.Return {
					continue // it may have ended by then
				}
				v.add("multi-atomic", []int{op.ID, sop.ID},
					"partial grant observed: a list in [%s, %s] shows %s holding %s (token %d) of its multi-acquire but not %s (token %d), which cannot have ended before %s",
					ms(sop.Invoke), ms(sop.Return), op.ClientID, seen[0].Lock, seen[0].Token, g.Lock, g.Token, ms(k.safeEnd(gg, -1)))
				break
			}
		}
	}
}

// checkLockDelay: a grant with lock_delay_ms that ends without a release
// (expiry, revocation) leaves the lock to nobody until the delay has
// passed. The delay starts when the grant ends, which is no earlier than
// its replicated expires_at (SPEC semantics 6) or than a revoke that
// ended it was sent; so no later grant of the lock may exist (a reply or
// a read showing it) before min(latest acknowledged expires_at, revoke
// sent) + the delay. A grant whose holder sent a release that may have
// taken effect is left out (a release applies no delay).
func checkLockDelay(h History, k *kindsIndex, r *Report, v *violations) {
	released := map[uint64]bool{}
	for _, op := range h.Ops {
		if op.Kind != KindRelease {
			continue
		}
		if oc, keep := modelOutcome(op); keep && !(oc == Fail && op.Code == "not_holder") {
			released[op.Token] = true
		}
	}
	for lock, gl := range k.byLock {
		if kindLimit(lock) != 1 {
			continue
		}
		for i, g := range gl {
			// An exclusive grant of a limit-1 lock: every grant with a
			// higher token came after it ended. (Shared holders may
			// coexist: a later one is no proof.)
			if g.DelayMs <= 0 || g.AckExpires == 0 || released[g.Token] || modeOf(g.Mode) != "exclusive" {
				continue
			}
			end := min(g.AckExpires, k.revokeBound(g, -1))
			until := end + int64(time.Duration(g.DelayMs)*time.Millisecond)
			r.DelaysChecked++
			for _, next := range gl[i+1:] {
				if next.FirstSeen == math.MaxInt64 {
					continue
				}
				r.DelayGrantsChecked++
				if next.FirstSeen < until-int64(wallMargin) {
					v.add("lock-delay", []int{g.op(), next.op()},
						"lock %s: %s carried lock_delay_ms %d and ended without a release no earlier than %s, so nobody may hold the lock before %s; yet %s existed at %s",
						lock, g, g.DelayMs, ms(end), ms(until), next, ms(next.FirstSeen))
				}
			}
		}
	}
}

// checkLimitMismatch: an acquire naming another limit than the lock has,
// sent while the lock was held (by the sender's own grant, which held
// throughout), is refused limit_mismatch — a multi-acquire naming a
// semaphore too; and an acquire that names the lock's own limit (or none)
// is never refused limit_mismatch. Mismatch probes carry the tag
// "mismatch:<token of the grant that held>".
func checkLimitMismatch(h History, k *kindsIndex, r *Report, v *violations) {
	resized := resizedLocks(h)
	for _, op := range h.Ops {
		if op.Kind != KindAcquire && op.Kind != KindMulti {
			continue
		}
		if tok, ok := strings.CutPrefix(op.Tag, "mismatch:"); ok {
			t, _ := strconv.ParseUint(tok, 10, 64)
			g := k.gs[t]
			if g == nil || !k.heldThroughout(g, op.Invoke, op.Return, -1) {
				continue
			}
			if refusedForNow(op) {
				continue // admission refused it before the table was asked (overload)
			}
			r.MismatchChecked++
			switch {
			case op.Outcome == Ok:
				v.add("limit", []int{g.op(), op.ID}, "an acquire naming another limit was granted while %s held: %s", g, op)
			case op.Outcome == Fail && op.Code != "" && op.Code != "limit_mismatch":
				v.add("limit", []int{g.op(), op.ID}, "an acquire naming another limit was refused %s, not limit_mismatch, while %s held: %s", op.Code, g, op)
			}
			continue
		}
		if op.Code != "limit_mismatch" {
			continue
		}
		names := op.Locks
		if op.Kind == KindAcquire {
			names = []string{op.Lock}
		}
		// Refused rightly when it names another kind than the lock's: a
		// multi-acquire naming a semaphore, another limit, shared on a
		// semaphore; or when a probe may have made the lock another kind.
		right := false
		for _, n := range names {
			lim := kindLimit(n)
			right = right || !isKind(n) || resized[n] ||
				op.Kind == KindMulti && lim != 1 ||
				op.Kind == KindAcquire && op.Limit != 0 && op.Limit != lim ||
				op.Kind == KindAcquire && modeOf(op.Mode) == "shared" && lim > 1
		}
		if !right {
			v.add("limit", []int{op.ID}, "refused limit_mismatch though it names the lock's own kind (nobody asked these locks for another limit): %s", op)
		}
	}
}

// checkRevokes: a revoke's reply names grants of that lock only (the one
// asked for, when it names a token); it ends every grant that held
// throughout it (or the one named, which must then not be refused
// not_holder). A revoked grant is gone: its release is refused not_holder
// (never answered released), and after the revoke's reply no renew,
// acquire or read shows it; a WebSocket holder's lost push for it says
// "revoked".
func checkRevokes(h History, k *kindsIndex, r *Report, v *violations) {
	revokedBy := map[uint64]Op{}
	for _, rv := range h.Ops {
		if rv.Kind != KindRevoke {
			continue
		}
		switch {
		case rv.Outcome == Ok:
			r.Revokes++
			r.RevokedTokens += len(rv.Revoked)
			for _, t := range rv.Revoked {
				if g := k.gs[t]; g != nil && g.Lock != rv.Lock {
					v.add("revoke", []int{rv.ID, g.op()}, "a revoke of %s names token %d, a grant of %s: %s", rv.Lock, t, g.Lock, rv)
				}
				if prev, ok := revokedBy[t]; !ok || rv.Return < prev.Return {
					revokedBy[t] = rv
				}
			}
			if rv.Token != 0 && !slices.Equal(rv.Revoked, []uint64{rv.Token}) {
				v.add("revoke", []int{rv.ID}, "a revoke of token %d answered revoked %v: %s", rv.Token, rv.Revoked, rv)
			}
			for _, g := range k.byLock[rv.Lock] {
				if (rv.Token == 0 || rv.Token == g.Token) && !slices.Contains(rv.Revoked, g.Token) &&
					k.heldThroughout(g, rv.Invoke, rv.Return, rv.ID) {
					v.add("revoke", []int{g.op(), rv.ID}, "%s held throughout a revoke that does not name it: %s", g, rv)
				}
			}
		case rv.Outcome == Fail && rv.Code == "not_holder" && rv.Token != 0:
			if g := k.gs[rv.Token]; g != nil && g.Lock == rv.Lock && k.heldThroughout(g, rv.Invoke, rv.Return, rv.ID) {
				v.add("revoke", []int{g.op(), rv.ID}, "%s held throughout a revoke of it answered not_holder: %s", g, rv)
			}
		}
	}
	for _, op := range h.Ops {
		var toks []uint64
		switch {
		case op.Kind == KindRelease && op.Outcome == Ok:
			// Whenever it was sent: revoked, the grant was never released.
			if rv, ok := revokedBy[op.Token]; ok {
				v.add("revoke", []int{rv.ID, op.ID}, "token %d was revoked, yet its release was answered released: %s", op.Token, op)
			}
			continue
		case op.Kind == KindRelease && op.Code == "not_holder":
			if _, ok := revokedBy[op.Token]; ok {
				r.RevokedRefused++
			}
			continue
		case op.Kind == KindLost && op.Code != "":
			if rv, ok := revokedBy[op.Token]; ok && op.Code != "revoked" {
				v.add("revoke", []int{rv.ID, op.ID}, "token %d was revoked, yet its holder was pushed lost with reason %q: %s", op.Token, op.Code, op)
			}
			continue
		case op.Kind == KindRenew && op.Outcome == Ok:
			toks = []uint64{op.Token}
		case op.Kind == KindAcquire && op.Outcome == Ok:
			toks = []uint64{op.OutToken}
		case op.Kind == KindMulti && op.Outcome == Ok:
			for _, g := range op.Grants {
				toks = append(toks, g.Token)
			}
		case op.Kind == KindRead && op.Outcome == Ok:
			for _, sh := range op.shown() {
				toks = append(toks, sh.Token)
			}
		}
		for _, t := range toks {
			if rv, ok := revokedBy[t]; ok && op.Invoke > rv.Return {
				v.add("revoke", []int{rv.ID, op.ID}, "token %d was revoked (reply at %s), then: %s", t, ms(rv.Return), op)
			}
		}
	}
}

// checkKindsLiveness runs the liveness checkers of the lock kinds.
func checkKindsLiveness(h History, gs map[uint64]*grant, r *Report, v *violations) {
	checkRevokeTold(h, gs, r, v)
	checkDelayWaiter(h, r, v)
}

// checkRevokeTold: a holder over WebSocket whose grant a revoke ended is
// pushed lost (reason revoked) when the revoke commits — by a second after
// the revoke's reply — unless its connection ended first or a fault (but
// quietFaults) came between.
func checkRevokeTold(h History, gs map[uint64]*grant, r *Report, v *violations) {
	ds := disturbances(h, quietFaults)
	lost := map[uint64]Op{}
	closed := map[string]int64{}
	for _, op := range h.Ops {
		switch op.Kind {
		case KindLost:
			if p, ok := lost[op.Token]; !ok || op.Return < p.Return {
				lost[op.Token] = op
			}
		case KindWSClosed:
			if t, ok := closed[op.ClientID]; !ok || op.Invoke < t {
				closed[op.ClientID] = op.Invoke
			}
		}
	}
	for _, rv := range h.Ops {
		if rv.Kind != KindRevoke || rv.Outcome != Ok {
			continue
		}
		for _, t := range rv.Revoked {
			g := gs[t]
			if g == nil || g.Via != "ws" {
				continue
			}
			due := rv.Return + int64(waiterSlack)
			if c, ok := closed[g.Client]; ok && c <= due {
				continue
			}
			if len(overlapping(ds, rv.Invoke-int64(waiterSlack), due)) > 0 || due > h.end() {
				continue
			}
			r.RevokeTold++
			lo, ok := lost[t]
			switch {
			case !ok:
				v.add("revoke-told", []int{g.op(), rv.ID}, "%s (WebSocket) was revoked (reply at %s) and never pushed lost while its connection lived: %s",
					g, ms(rv.Return), rv)
			case lo.Return > due:
				v.add("revoke-told", []int{g.op(), rv.ID, lo.ID}, "%s (WebSocket) was revoked (reply at %s) and pushed lost only at %s", g, ms(rv.Return), ms(lo.Return))
			}
		}
	}
}

// delayDeadline is the moment by which the first waiter of a lock whose
// grant (with lock-delay d) ended by end must hold it: end + d + one
// election timeout + 1 s (SPEC semantics 9 with the delay), moved past
// every disturbance that overlaps the wait to its end + d + the grace.
func delayDeadline(ds []disturbance, end int64, d, grace time.Duration) (int64, []disturbance) {
	bound := end + int64(d+grace)
	var by []disturbance
	for _, x := range ds {
		if x.start > bound {
			break
		}
		if x.end >= end && x.end+int64(d+grace) > bound {
			bound = x.end + int64(d+grace)
			by = append(by, x)
		}
	}
	return bound, by
}

// checkDelayWaiter: in a delay round (tags "delay:R:holder" and
// "delay:R:waiter", on a fresh lock) the holder took the lock with
// lock_delay_ms and walked away (or was revoked), and one waiter queued
// with a wait that outlasts the bound: the waiter must be granted by the
// delay's end + one election timeout + 1 s (delayDeadline), and told then.
// Rounds whose holder sent a release, or whose holder's acquire or
// revoke has an unknown outcome (its end is then unknown), prove nothing.
func checkDelayWaiter(h History, r *Report, v *violations) {
	type round struct {
		holder  []Op
		waiter  []Op
		release bool
		revoke  *Op
		unknown bool
	}
	rounds := map[string]*round{}
	get := func(id string) *round {
		rd := rounds[id]
		if rd == nil {
			rd = &round{}
			rounds[id] = rd
		}
		return rd
	}
	for i, op := range h.Ops {
		parts := strings.Split(op.Tag, ":")
		if len(parts) != 3 || parts[0] != "delay" {
			continue
		}
		rd := get(parts[1])
		switch {
		case parts[2] == "holder" && op.Kind == KindAcquire:
			rd.holder = append(rd.holder, op)
		case parts[2] == "waiter" && op.Kind == KindAcquire:
			rd.waiter = append(rd.waiter, op)
		case op.Kind == KindRelease:
			rd.release = true
		case op.Kind == KindRevoke:
			if op.Outcome == Ok {
				rd.revoke = &h.Ops[i]
			} else if oc, keep := modelOutcome(op); keep && oc == Unknown {
				rd.unknown = true
			}
		}
	}
	ds := disturbances(h, quietFaults)
	grace := expiryGrace(h)
	ids := make([]string, 0, len(rounds))
	for id := range rounds {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		rd := rounds[id]
		if rd.release || rd.unknown || len(rd.holder) == 0 || len(rd.waiter) == 0 {
			continue
		}
		var hg *Op
		definiteAll := true
		for i, op := range rd.holder {
			if !definite(op) {
				definiteAll = false
			}
			if op.Outcome == Ok {
				hg = &rd.holder[i]
			}
		}
		if !definiteAll || hg == nil || hg.ExpiresAt == 0 || hg.DelayMs <= 0 {
			continue
		}
		end := hg.ExpiresAt
		if rd.revoke != nil && slices.Contains(rd.revoke.Revoked, hg.OutToken) {
			end = min(end, rd.revoke.Return)
		}
		delay := time.Duration(hg.DelayMs) * time.Millisecond
		bound, by := delayDeadline(ds, end, delay, grace)
		w := rd.waiter[len(rd.waiter)-1]
		deadline := w.Invoke + int64(time.Duration(w.WaitMs)*time.Millisecond)
		due := max(bound, w.Invoke) + int64(waiterSlack)
		if w.WaitMs <= 0 || deadline <= due {
			continue
		}
		r.DelayRounds++
		moved := ""
		if len(by) > 0 {
			moved = " (moved past " + describe(by) + ")"
		}
		what := ""
		switch {
		case w.Outcome == Ok && w.Return > due:
			what = "was granted only at " + ms(w.Return)
		case w.Outcome == Fail && w.Code == "wait_timeout":
			what = "was answered wait_timeout at " + ms(w.Return)
		case w.Outcome == Unknown && w.GaveUp && w.Return > due:
			what = fmt.Sprintf("got no answer until the client gave up at %s (%s)", ms(w.Return), w.Err)
		default:
			continue
		}
		v.add("delay-waiter", []int{hg.ID, w.ID},
			"lock %s: the grant to %s (token %d, lock_delay %s) ended by %s; its waiter %s (wait until %s) should hold the lock by %s + %s%s, but it %s",
			hg.Lock, hg.ClientID, hg.OutToken, delay, ms(end), w.ClientID, ms(deadline), ms(bound), waiterSlack, moved, what)
	}
}

// kindOf names the lock kind an acquire used, for the summary.
func kindOf(op Op) string {
	switch {
	case strings.HasPrefix(op.Tag, "mismatch:"):
		return "mismatch-probe"
	case op.Kind == KindMulti:
		return "multi/" + op.Via
	case op.DelayMs > 0 || strings.HasPrefix(op.Tag, "delay:"):
		return "delay"
	case semName(op.Lock):
		return "semaphore"
	case modeOf(op.Mode) == "shared":
		return "shared"
	}
	return "exclusive"
}

// kindsSummary renders the lock-kinds part of a run's summary.
func kindsSummary(h History, rep *Report) string {
	type counts struct{ ok, fail, unknown, mismatch int }
	by := map[string]*counts{}
	seen := false
	for _, op := range h.Ops {
		if (op.Kind != KindAcquire && op.Kind != KindMulti) || !(isKind(op.Lock) || len(op.Locks) > 0) {
			continue
		}
		seen = true
		k := kindOf(op)
		c := by[k]
		if c == nil {
			c = &counts{}
			by[k] = c
		}
		switch op.Outcome {
		case Ok:
			c.ok++
		case Fail:
			c.fail++
			if op.Code == "limit_mismatch" {
				c.mismatch++
			}
		default:
			c.unknown++
		}
	}
	if !seen {
		return ""
	}
	var b strings.Builder
	b.WriteString("lock kinds (acquires on kind-* locks):\n")
	for _, k := range []string{"shared", "exclusive", "semaphore", "multi/http", "multi/ws", "delay", "mismatch-probe"} {
		if c := by[k]; c != nil {
			fmt.Fprintf(&b, "  %-14s ok %6d  refused %6d (limit_mismatch %d)  unknown %5d\n", k, c.ok, c.fail, c.mismatch, c.unknown)
		}
	}
	fmt.Fprintf(&b, "kinds checked: %d grants' safe intervals swept (limit, mode); %d status reads (holder sets), %d grants that held throughout a read looked for in it\n",
		rep.KindIntervals, rep.KindReads, rep.KindReadGrants)
	fmt.Fprintf(&b, "  %d multi grants atomic (%d over WebSocket; %d seen in a list of the whole table); %d lock-delays against %d later grants, %d delay waiters timed; %d mismatch probes\n",
		rep.MultiGrants, rep.MultiGrantsWS, rep.MultiSnapshots, rep.DelaysChecked, rep.DelayGrantsChecked, rep.DelayRounds, rep.MismatchChecked)
	fmt.Fprintf(&b, "  %d revokes answered, ending %d grants; %d releases of revoked grants refused not_holder; %d revoked WebSocket holders checked told\n",
		rep.Revokes, rep.RevokedTokens, rep.RevokedRefused, rep.RevokeTold)
	return b.String()
}
