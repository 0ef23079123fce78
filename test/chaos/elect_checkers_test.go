package chaos

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Checkers of values, elections and watches (SPEC "Values and elections",
// "Status", "Watches"). An election is an exclusive lock, so two leaders
// acknowledged at once is mutual exclusion (checkMutualExclusion reports
// it as two-leaders on an election lock), and porcupine checks the
// elections' acquires, releases, renewals and reads like any lock's.
// What follows reads the statuses the observers saw:
//
//   - leader-order: one observer (a watcher across its reconnects, a
//     chain of blocking queries, the Go client's Observe) sees an
//     election's leaders in rising token order and its statuses at
//     non-decreasing indexes: a view never goes back;
//   - value: a value shown with a leader's token is one that leader set
//     (its campaign's value, or a proclaim acknowledged or of unknown
//     outcome), never another's, sent before the status was read; a
//     linearizable read never shows a value older than one the leader had
//     proclaimed and seen acknowledged before the read; a status's value
//     is its leader's, and a free election has none;
//   - watch-order: within one watch the frames of a lock come at strictly
//     rising indexes, each frame's index is its status's, and a frame
//     names a lock the watch follows;
//   - watch-state: every status shown at one (lock, index) — a frame, a
//     read, a blocking query, the final replicated state — is the same
//     status (the lock's state right after that log index);
//   - watch-gap: a watch skips no committed change of a lock between two
//     of its frames, unless a resync came between;
//   - watch-token: a frame never shows a holder that never asked for the
//     lock (nor a token another grant has: token-unique);
//   - two-leaders: a status never shows two leaders of an election;
//   - watch-live (liveness): a watch that stayed connected shows each
//     lock's final replicated state within watchFinalBound of it being
//     read from every member;
//   - blocking (liveness): a blocking query answers when a change above
//     its index commits (within a second of any observer seeing it), not
//     early without one unless a fault came between, and within its wait.

// watchFinalBound is how long after the final state was read from every
// member the watchers are given to show it.
const watchFinalBound = 2 * time.Second

// wkey names one watch: a raw WebSocket watch by its connection's client
// id and watch_id; a Go-client watch by its client id and 1.
type wkey struct {
	client string
	id     uint64
}

func (k wkey) String() string { return fmt.Sprintf("watch %d of %s", k.id, k.client) }

// watchRec is what the history shows of one watch.
type watchRec struct {
	key    wkey
	start  *Op // the watch request (nil: not recorded)
	stop   *Op // the stop marker: running when the observers stopped
	frames []Op
	resync []int64 // when resyncs were read (and Go-client events read again)
	goc    bool    // a Go-client watch (survives reconnects; marks events read again)
}

// inScope reports whether a lock is one the watch follows.
func (wr *watchRec) inScope(lock string) bool {
	if wr.start == nil {
		return true
	}
	if wr.start.Prefix != "" {
		return strings.HasPrefix(lock, wr.start.Prefix)
	}
	return lock == wr.start.Lock
}

// resyncIn reports a resync read in (from, to].
func (wr *watchRec) resyncIn(from, to int64) bool {
	for _, t := range wr.resync {
		if t > from && t <= to {
			return true
		}
	}
	return false
}

// statusLevel is how much of a status an op recorded: 0 the leader only
// (Election.Observe), 1 the holder fields of an ordinary lock's read, 2
// everything (kinds and election reads, frames, the final state).
func statusLevel(op Op) int {
	switch {
	case op.Tag == tagObserve:
		return 0
	case op.Kind == KindChanged || op.Kind == KindFinal || isKind(op.Lock) || isElect(op.Lock):
		return 2
	}
	return 1
}

// canonical renders a status at a level, for comparison.
func canonical(op Op, level int) string {
	s := fmt.Sprintf("held=%t holder=%s token=%d value=%q", op.Held, op.Holder, op.OutToken, op.Value)
	if level >= 1 {
		s += fmt.Sprintf(" waiters=%d expires=%d", op.Waiters, op.ExpiresAt)
	}
	if level >= 2 {
		s += fmt.Sprintf(" mode=%s limit=%d delayed=%d holders=[", op.Mode, op.Limit, op.DelayedUntil)
		for _, h := range op.Holders {
			s += fmt.Sprintf("%s/%d/%s/%q/%d ", h.Client, h.Token, h.Mode, h.Value, h.ExpiresAt)
		}
		s += "]"
	}
	return s
}

// describeObs names where a status came from.
func describeObs(op Op) string {
	switch {
	case op.Kind == KindFinal:
		return "the final replicated state (" + op.Node + ")"
	case op.Kind == KindChanged && op.Tag == tagObserve:
		return fmt.Sprintf("%s's Election.Observe at %s", op.Worker, ms(op.Return))
	case op.Kind == KindChanged:
		return fmt.Sprintf("a frame of %s read at %s", wkey{op.ClientID, op.WatchID}, ms(op.Return))
	case op.Tag == tagBlocking:
		return fmt.Sprintf("%s's blocking query in [%s, %s]", op.Worker, ms(op.Invoke), ms(op.Return))
	}
	return fmt.Sprintf("%s's read in [%s, %s]", op.Worker, ms(op.Invoke), ms(op.Return))
}

// checkElections runs the checkers of values, elections and watches.
func checkElections(h History, r *Report, v *violations) {
	watches := collectWatches(h)
	checkLeaderOrder(h, r, v)
	checkValues(h, r, v)
	checkWatchOrder(watches, r, v)
	checkWatchState(h, r, v)
	checkWatchGaps(h, watches, r, v)
	checkWatchTokens(h, r, v)
	checkWatchFinal(h, watches, r, v)
	checkWatchSynced(h, watches, r, v)
	checkBlocking(h, r, v)
}

// collectWatches gathers each watch's request, frames, resyncs and stop.
func collectWatches(h History) map[wkey]*watchRec {
	out := map[wkey]*watchRec{}
	get := func(k wkey) *watchRec {
		wr := out[k]
		if wr == nil {
			wr = &watchRec{key: k}
			out[k] = wr
		}
		return wr
	}
	for i, op := range h.Ops {
		if op.WatchID == 0 {
			continue
		}
		wr := get(wkey{op.ClientID, op.WatchID})
		wr.goc = wr.goc || op.Via == "client"
		switch {
		case op.Kind == KindWatch && op.Outcome == Ok:
			wr.start = &h.Ops[i]
		case op.Kind == KindUnwatch && op.Tag == tagStop:
			wr.stop = &h.Ops[i]
		case op.Kind == KindChanged && op.Outcome == Ok:
			wr.frames = append(wr.frames, op)
			if op.Resync {
				wr.resync = append(wr.resync, op.Return)
			}
		case op.Kind == KindResync:
			wr.resync = append(wr.resync, op.Return)
		}
	}
	return out
}

// checkLeaderOrder: per observer and election, the leaders it sees come
// in rising token order and its statuses at non-decreasing indexes (a lock
// without state may show any index at or above its last change, so only
// statuses with state count for the index).
func checkLeaderOrder(h History, r *Report, v *violations) {
	type last struct {
		held  *Op // the last status that showed a leader
		state *Op // the last status with state
	}
	seen := map[[2]string]*last{}
	leaders := map[string]bool{}
	for i, op := range h.Ops {
		observer := op.Kind == KindChanged && op.Outcome == Ok || op.Kind == KindRead && op.Outcome == Ok && op.Tag == tagBlocking
		if !observer || !isElect(op.Lock) {
			continue
		}
		k := [2]string{op.Worker, op.Lock}
		l := seen[k]
		if l == nil {
			l = &last{}
			seen[k] = l
		}
		cur := &h.Ops[i]
		if op.Held && op.OutToken != 0 {
			leaders[fmt.Sprintf("%s/%d", op.Lock, op.OutToken)] = true
			if p := l.held; p != nil {
				r.LeaderPairs++
				if op.OutToken < p.OutToken {
					v.add("leader-order", []int{p.ID, op.ID},
						"observer %s saw %s led by %s with token %d (value %q) at index %d in %s, then an older leader %s with token %d (value %q) at index %d in %s",
						op.Worker, op.Lock, p.Holder, p.OutToken, p.Value, p.Index, describeObs(*p), op.Holder, op.OutToken, op.Value, op.Index, describeObs(op))
				}
			}
			l.held = cur
		}
		if hasState(op) {
			if p := l.state; p != nil && op.Index < p.Index && !(p.OutToken > op.OutToken && op.Held) {
				v.add("leader-order", []int{p.ID, op.ID},
					"observer %s saw %s at index %d in %s, then at the lower index %d in %s: its view went back",
					op.Worker, op.Lock, p.Index, describeObs(*p), op.Index, describeObs(op))
			}
			l.state = cur
		}
	}
	r.LeadersObserved = len(leaders)
}

// checkValues: the values statuses of elections show (see the file's
// comment).
func checkValues(h History, r *Report, v *violations) {
	byValue := map[string][]Op{}     // value → the ops that sent it
	acquires := map[[2]string][]Op{} // (lock, client) → acquires that may have made a grant
	proclaims := map[uint64][]Op{}   // token → value ops that may have taken effect
	for _, op := range h.Ops {
		if !isElect(op.Lock) {
			continue
		}
		switch op.Kind {
		case KindAcquire:
			if oc, keep := modelOutcome(op); keep && oc != Fail {
				acquires[[2]string{op.Lock, op.ClientID}] = append(acquires[[2]string{op.Lock, op.ClientID}], op)
				byValue[op.Value] = append(byValue[op.Value], op)
			}
		case KindValue:
			if oc, keep := modelOutcome(op); keep && oc != Fail {
				proclaims[op.Token] = append(proclaims[op.Token], op)
				byValue[op.Value] = append(byValue[op.Value], op)
			}
		}
	}
	for _, ob := range h.Ops {
		if !ob.observed() || !isElect(ob.Lock) || ob.Outcome != Ok || ob.Lock == "" {
			continue
		}
		hs := ob.holders()
		if statusLevel(ob) == 2 {
			switch {
			case len(hs) > 1:
				v.add("two-leaders", []int{ob.ID}, "election %s: %s shows %d leaders: %s", ob.Lock, describeObs(ob), len(hs), ob)
			case len(hs) == 0 && ob.Value != "":
				v.add("value", []int{ob.ID}, "election %s: %s shows no leader but the value %q: %s", ob.Lock, describeObs(ob), ob.Value, ob)
			case len(hs) > 0 && ob.Value != hs[0].Value:
				v.add("value", []int{ob.ID}, "election %s: %s shows the value %q, its leader's is %q: %s", ob.Lock, describeObs(ob), ob.Value, hs[0].Value, ob)
			}
		}
		for _, x := range hs {
			r.ValuesChecked++
			// The ops of this grant's holder that set value x.Value, sent
			// before the status was read.
			var from *Op
			for _, a := range acquires[[2]string{ob.Lock, x.Client}] {
				if a.Value == x.Value && a.Invoke < ob.Return {
					from = &a
					break
				}
			}
			for _, p := range proclaims[x.Token] {
				if from == nil && p.Value == x.Value && p.ClientID == x.Client && p.Lock == ob.Lock && p.Invoke < ob.Return {
					from = &p
				}
			}
			if from == nil {
				who := "nobody sent it before"
				ids := []int{ob.ID}
				for _, o := range byValue[x.Value] {
					who = fmt.Sprintf("it is %s's (%s)", o.ClientID, o)
					ids = append(ids, o.ID)
					break
				}
				v.add("value", ids, "election %s: %s shows leader %s (token %d) with the value %q, which that leader never set: %s",
					ob.Lock, describeObs(ob), x.Client, x.Token, x.Value, who)
				continue
			}
			// A linearizable read shows the last value the leader had
			// set: nothing older than a proclaim acknowledged before the
			// read was sent.
			if ob.Kind != KindRead || from.Outcome != Ok {
				continue
			}
			r.ValuesOrdered++
			for _, p := range proclaims[x.Token] {
				if p.Outcome == Ok && p.Return < ob.Invoke && from.Return < p.Invoke && p.Value != x.Value {
					v.add("value", []int{from.ID, p.ID, ob.ID},
						"election %s: %s shows leader %s (token %d) with the value %q set by %s, though its later proclaim of %q was acknowledged at %s, before the read",
						ob.Lock, describeObs(ob), x.Client, x.Token, x.Value, from, p.Value, ms(p.Return))
					break
				}
			}
		}
	}
}

// checkWatchOrder: within one watch, per lock, strictly rising indexes;
// each frame's index is its status's; frames name locks the watch follows;
// a status is consistent with itself.
func checkWatchOrder(watches map[wkey]*watchRec, r *Report, v *violations) {
	keys := make([]wkey, 0, len(watches))
	for k := range watches {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].client < keys[j].client || keys[i].client == keys[j].client && keys[i].id < keys[j].id
	})
	for _, k := range keys {
		wr := watches[k]
		if wr.start != nil {
			r.Watches++
		}
		r.WatchResyncs += len(wr.resync)
		last := map[string]Op{}
		for _, f := range wr.frames {
			r.WatchFrames++
			if f.Index != f.StatusIndex {
				v.add("watch-order", []int{f.ID}, "%s: a frame of %s at index %d carries a status at index %d: %s", k, f.Lock, f.Index, f.StatusIndex, f)
			}
			if !wr.inScope(f.Lock) {
				v.add("watch-order", []int{f.ID}, "%s follows %s, yet sent a frame of %s: %s", k, scopeOf(wr), f.Lock, f)
			}
			if p, ok := last[f.Lock]; ok && f.Index <= p.Index {
				v.add("watch-order", []int{p.ID, f.ID}, "%s: frames of %s at index %d, then %d (read at %s and %s): indexes must rise strictly within a watch",
					k, f.Lock, p.Index, f.Index, ms(p.Return), ms(f.Return))
			}
			last[f.Lock] = f
			hs := f.Holders
			switch {
			case f.Held != (len(hs) > 0):
				v.add("status", []int{f.ID}, "%s: a frame of %s says held %t with %d holders: %s", k, f.Lock, f.Held, len(hs), f)
			case len(hs) > 0 && (f.Holder != hs[0].Client || f.OutToken != hs[0].Token):
				v.add("status", []int{f.ID}, "%s: a frame of %s names %s/%d, not its holder with the lowest token: %s", k, f.Lock, f.Holder, f.OutToken, f)
			}
		}
	}
}

func scopeOf(wr *watchRec) string {
	switch {
	case wr.start == nil:
		return "(unknown)"
	case wr.start.Prefix != "":
		return fmt.Sprintf("prefix %q", wr.start.Prefix)
	}
	return "lock " + wr.start.Lock
}

// checkWatchState: the statuses shown at one (lock, index) are one status.
func checkWatchState(h History, r *Report, v *violations) {
	type group struct {
		rep      [3]*Op // the first status seen at each level
		n        int
		reported bool
	}
	groups := map[string]*group{}
	for i, op := range h.Ops {
		// Index 0: a status without an index (a server before watches, or
		// the in-test fake).
		if !op.observed() || op.Outcome != Ok || op.Lock == "" || op.Index == 0 || op.Resync && !hasState(op) {
			continue
		}
		k := fmt.Sprintf("%s@%d", op.Lock, op.Index)
		g := groups[k]
		if g == nil {
			g = &group{}
			groups[k] = g
		}
		g.n++
		if g.n == 2 {
			r.WatchStateGroups++
		}
		lv := statusLevel(op)
		for l, p := range g.rep {
			if p == nil || g.reported {
				continue
			}
			at := min(l, lv)
			if canonical(*p, at) != canonical(op, at) {
				g.reported = true
				v.add("watch-state", []int{p.ID, op.ID},
					"lock %s at index %d: %s shows %s, but %s shows %s — one index, one state",
					op.Lock, op.Index, describeObs(*p), canonical(*p, at), describeObs(op), canonical(op, at))
			}
		}
		if g.rep[lv] == nil {
			g.rep[lv] = &h.Ops[i]
		}
	}
}

// changeIndexes returns, per lock, the indexes known to be changes of it,
// with the earliest moment each was seen: statuses with state (their index
// is the last change's), and frames after a watch's first of the lock (a
// change frame; a lock without state in a first frame or in a status read
// again may show any index at or above its last change).
func changeIndexes(h History) map[string]map[uint64]int64 {
	out := map[string]map[uint64]int64{}
	firstSeen := map[string]bool{} // watch + lock: a frame came already
	for _, op := range h.Ops {
		if !op.observed() || op.Outcome != Ok || op.Lock == "" || op.Index == 0 {
			continue
		}
		change := hasState(op)
		if op.Kind == KindChanged && op.Tag != tagObserve {
			k := fmt.Sprintf("%s/%d/%s", op.ClientID, op.WatchID, op.Lock)
			change = change || firstSeen[k] && !op.Resync
			firstSeen[k] = true
		}
		if !change {
			continue
		}
		m := out[op.Lock]
		if m == nil {
			m = map[uint64]int64{}
			out[op.Lock] = m
		}
		if t, ok := m[op.Index]; !ok || op.Return < t {
			m[op.Index] = op.Return
		}
	}
	return out
}

// checkWatchGaps: between two frames of a lock in one watch, no change of
// the lock that anything else shows was skipped, unless a resync came
// between (or the later one was read again after a reconnect).
func checkWatchGaps(h History, watches map[wkey]*watchRec, r *Report, v *violations) {
	changes := changeIndexes(h)
	sorted := map[string][]uint64{}
	for lock, m := range changes {
		s := make([]uint64, 0, len(m))
		for i := range m {
			s = append(s, i)
		}
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		sorted[lock] = s
	}
	for k, wr := range watches {
		last := map[string]Op{}
		for _, f := range wr.frames {
			p, ok := last[f.Lock]
			last[f.Lock] = f
			if !ok || f.Index <= p.Index || f.Resync || wr.resyncIn(p.Return, f.Return) {
				continue
			}
			r.WatchGapPairs++
			s := sorted[f.Lock]
			i := sort.Search(len(s), func(i int) bool { return s[i] > p.Index })
			if i < len(s) && s[i] < f.Index {
				v.add("watch-gap", []int{p.ID, f.ID},
					"%s: frames of %s at index %d (read at %s) and %d (read at %s), with no resync between, skip the change at index %d (seen at %s)",
					k, f.Lock, p.Index, ms(p.Return), f.Index, ms(f.Return), s[i], ms(changes[f.Lock][s[i]]))
			}
		}
	}
}

// checkWatchTokens: every holder a frame shows had asked for the lock
// before the frame was read (an acquire not refused for certain).
func checkWatchTokens(h History, r *Report, v *violations) {
	asked := map[[2]string]int64{} // (lock, client) → first invoke of an acquire that may have made a grant
	for _, op := range h.Ops {
		if op.Kind != KindAcquire {
			continue
		}
		if oc, keep := modelOutcome(op); keep && oc != Fail {
			k := [2]string{op.Lock, op.ClientID}
			if t, ok := asked[k]; !ok || op.Invoke < t {
				asked[k] = op.Invoke
			}
		}
	}
	for _, f := range h.Ops {
		if f.Kind != KindChanged || f.Outcome != Ok {
			continue
		}
		for _, x := range f.holders() {
			r.WatchTokens++
			if t, ok := asked[[2]string{f.Lock, x.Client}]; !ok || t >= f.Return {
				v.add("watch-token", []int{f.ID}, "%s shows %s held by %s with token %d, but %s never asked for it before: %s",
					describeObs(f), f.Lock, x.Client, x.Token, x.Client, f)
			}
		}
	}
}

// checkWatchFinal: a watch that was still running when the observers
// stopped — watchFinalBound after the final state was read from every
// member — shows each lock it follows as the final state has it: its
// last frame of a lock with state in the final state is at that lock's
// index (then watch-state compares the statuses), and a lock without
// state is last shown free. A last frame above the final index (or, for
// a lock without state, above the final applied index) is a change after
// the final state was read: not checked. Missing the final state is
// watch-live; a watch that resynced after its last frame of the lock is
// excused (it re-reads).
func checkWatchFinal(h History, watches map[wkey]*watchRec, r *Report, v *violations) {
	var marker *Op
	final := map[string]Op{}
	for i, op := range h.Ops {
		if op.Kind != KindFinal {
			continue
		}
		if op.Lock == "" {
			marker = &h.Ops[i]
		} else {
			final[op.Lock] = op
		}
	}
	if marker == nil {
		return
	}
	ds := disturbances(h, quietFaults)
	keys := make([]wkey, 0, len(watches))
	for k := range watches {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].client < keys[j].client || keys[i].client == keys[j].client && keys[i].id < keys[j].id
	})
	for _, k := range keys {
		wr := watches[k]
		if wr.stop == nil || wr.start == nil || wr.stop.Return < marker.Return+int64(watchFinalBound)-int64(100*time.Millisecond) ||
			len(overlapping(ds, marker.Return, wr.stop.Return)) > 0 {
			continue // not running to the end, or the harness stood still meanwhile
		}
		lastOf := map[string]Op{}
		for _, f := range wr.frames {
			if f.Return <= wr.stop.Return {
				lastOf[f.Lock] = f
			}
		}
		locks := map[string]bool{}
		for l := range lastOf {
			locks[l] = true
		}
		for l := range final {
			if wr.inScope(l) {
				locks[l] = true
			}
		}
		if wr.start.Prefix == "" {
			locks[wr.start.Lock] = true
		}
		names := make([]string, 0, len(locks))
		for l := range locks {
			names = append(names, l)
		}
		sort.Strings(names)
		for _, l := range names {
			lf, seen := lastOf[l]
			fs, held := final[l]
			from := wr.start.Return
			if seen {
				from = lf.Return
			}
			if wr.resyncIn(from, wr.stop.Return) {
				continue
			}
			r.FinalChecked++
			switch {
			case held && seen && lf.Index > fs.Index, !held && seen && lf.Index > marker.Index:
				r.FinalSkipped++
			case held && !seen:
				v.add("watch-live", []int{wr.start.ID, fs.ID},
					"%s (%s, from %s until %s) never showed %s, which the final state (read at %s) has at index %d: %s",
					k, scopeOf(wr), ms(wr.start.Invoke), ms(wr.stop.Return), l, ms(marker.Return), fs.Index, fs)
			case held && lf.Index < fs.Index:
				v.add("watch-live", []int{lf.ID, fs.ID},
					"%s (%s, until %s) last showed %s at index %d (read at %s); the final state, read from every member at %s, has it at index %d: not shown within %s",
					k, scopeOf(wr), ms(wr.stop.Return), l, lf.Index, ms(lf.Return), ms(marker.Return), fs.Index, watchFinalBound)
			case !held && seen && hasState(lf):
				v.add("watch-live", []int{lf.ID, marker.ID},
					"%s (%s, until %s) last showed %s with state at index %d (read at %s): %s; the final state (read at %s, %s) has it free: not shown within %s",
					k, scopeOf(wr), ms(wr.stop.Return), l, lf.Index, ms(lf.Return), lf, ms(marker.Return), marker.Node, watchFinalBound)
			}
		}
	}
}

// checkBlocking: a blocking query (?index=N&wait=D) answers when a change
// of the lock above N commits — within waiterSlack of the first moment any
// observation shows one, or of its sending if one was shown before — and
// otherwise when its wait ends; it answers early, at an index not above
// N, only when the member cannot tell (a leader change: a fault between).
// A query that got no answer by its wait plus the client's 2.5 s fails too.
// Any fault but quietFaults from a second before it was sent to a second
// after its answer was due excuses it.
func checkBlocking(h History, r *Report, v *violations) {
	changes := changeIndexes(h)
	ds := disturbances(h, quietFaults)
	end := h.end()
	for _, b := range h.Ops {
		if b.Kind != KindRead || b.Tag != tagBlocking {
			continue
		}
		wait := time.Duration(b.WaitMs) * time.Millisecond
		// The first moment a change above N was shown anywhere.
		seen := int64(math.MaxInt64)
		var at uint64
		for idx, t := range changes[b.Lock] {
			if idx > b.BlockIndex && t < seen {
				seen, at = t, idx
			}
		}
		due := b.Invoke + int64(wait)
		if seen != math.MaxInt64 {
			due = min(due, max(seen, b.Invoke)+int64(waiterSlack))
		}
		if due+int64(waiterSlack) > end || len(overlapping(ds, b.Invoke-int64(waiterSlack), max(due, b.Return)+int64(waiterSlack))) > 0 {
			continue
		}
		r.BlockingChecked++
		switch {
		case b.Outcome == Ok && b.Index <= b.BlockIndex && b.Return-b.Invoke < int64(wait)-int64(100*time.Millisecond):
			v.add("blocking", []int{b.ID}, "lock %s: a blocking query for a change above index %d answered after %s of its %s wait, at index %d, with no fault between: %s",
				b.Lock, b.BlockIndex, time.Duration(b.Return-b.Invoke).Round(time.Millisecond), wait, b.Index, b)
		case b.Outcome == Ok && seen != math.MaxInt64 && b.Return > max(seen, b.Invoke)+int64(waiterSlack) && b.Return-b.Invoke < int64(wait):
			v.add("blocking", []int{b.ID}, "lock %s: a blocking query for a change above index %d answered only at %s, though the change at index %d was seen at %s: %s",
				b.Lock, b.BlockIndex, ms(b.Return), at, ms(seen), b)
		case b.Outcome == Unknown && b.GaveUp:
			v.add("blocking", []int{b.ID}, "lock %s: a blocking query with a %s wait got no answer until the client gave up at %s: %s",
				b.Lock, wait, ms(b.Return), b)
		}
	}
}

// electSummary renders the elections and watches part of a run's summary.
func electSummary(h History, rep *Report) string {
	type counts struct{ ok, fail, unknown int }
	by := map[string]*counts{}
	seen := false
	for _, op := range h.Ops {
		var k string
		switch {
		case op.Kind == KindAcquire && isElect(op.Lock):
			k = "campaign/" + op.Via
		case op.Kind == KindValue:
			k = "proclaim/" + op.Via
		case op.Kind == KindRelease && isElect(op.Lock):
			k = "resign/" + op.Via
		case op.Kind == KindRead && op.Tag == tagBlocking:
			k = "blocking"
		case op.Kind == KindWatch:
			k = "watch/" + op.Via
		default:
			continue
		}
		seen = true
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
		default:
			c.unknown++
		}
	}
	if !seen {
		return ""
	}
	var b strings.Builder
	b.WriteString("elections and watches (elect-* locks):\n")
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c := by[k]
		fmt.Fprintf(&b, "  %-16s ok %6d  refused %6d  unknown %5d\n", k, c.ok, c.fail, c.unknown)
	}
	fmt.Fprintf(&b, "  %d elections won (acknowledged), checked for two leaders at once; %d distinct leaders seen by observers, %d successive observations ordered\n",
		rep.ElectGrants, rep.LeadersObserved, rep.LeaderPairs)
	fmt.Fprintf(&b, "  %d leaders' values traced to their own campaign or proclaim (%d reads against acknowledged proclaims)\n",
		rep.ValuesChecked, rep.ValuesOrdered)
	fmt.Fprintf(&b, "  %d watches, %d frames, %d resyncs; %d (lock, index) shown twice or more compared; %d frame pairs checked for a skipped change; %d holder tokens traced\n",
		rep.Watches, rep.WatchFrames, rep.WatchResyncs, rep.WatchStateGroups, rep.WatchGapPairs, rep.WatchTokens)
	fmt.Fprintf(&b, "  final state: %d (watch, lock) pairs compared with it (%d changed after it was read); %d blocking queries timed\n",
		rep.FinalChecked, rep.FinalSkipped, rep.BlockingChecked)
	return b.String()
}
