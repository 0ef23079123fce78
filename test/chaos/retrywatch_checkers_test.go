package chaos

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Checkers of one WebSocket request among others (workloads in
// retrywatch_workload_test.go):
//
//   - ws-retry / ws-answer: the two acquires of a retry round — a long
//     wait, then while it is pending the same acquire with a short one —
//     are one wait in the state machine, so the end of that wait answers
//     both, the same way: both granted with one token, or both
//     wait_timeout (ws-retry, safety); once the retry has been answered,
//     the first is answered too while the connection lives (ws-answer,
//     liveness: a request left without a reply);
//   - watch-synced: a watch's synced frame at index N closes its first
//     picture: no frame before it is above N, none after it at or below N
//     (nothing older than the picture follows it: a lock taken and freed
//     while the picture was read must not come back held), and one synced
//     a watch. The picture is the state at N of everything the watch
//     follows: a lock it shows at index j did not change in (j, N] — no
//     other observation (a frame, a read, a blocking query, the final
//     state) shows it at an index there, unless both show it without state
//     (a free lock may report any index at or above its last change) — and
//     a lock of a prefix it does not show had no state at N.

// checkRetriedWaits checks the retry rounds' pairs of acquires.
func checkRetriedWaits(h History, r *Report, v *violations) {
	type pair struct{ first, retry *Op }
	pairs := map[string]*pair{}
	var keys []string
	closed := map[string]int64{} // client id → when its connection ended
	for i, op := range h.Ops {
		if op.Kind == KindWSClosed {
			if t, ok := closed[op.ClientID]; !ok || op.Invoke < t {
				closed[op.ClientID] = op.Invoke
			}
			continue
		}
		if op.Kind != KindAcquire || !strings.HasPrefix(op.Tag, "wsretry:") {
			continue
		}
		round, which, ok := strings.Cut(strings.TrimPrefix(op.Tag, "wsretry:"), ":")
		if !ok {
			continue
		}
		k := op.ClientID + "/" + round
		p := pairs[k]
		if p == nil {
			p = &pair{}
			pairs[k] = p
			keys = append(keys, k)
		}
		switch which {
		case tagRetryFirst:
			p.first = &h.Ops[i]
		case tagRetryAgain:
			p.retry = &h.Ops[i]
		}
	}
	ds := disturbances(h, quietFaults)
	answer := func(op *Op) string {
		switch {
		case op.Outcome == Ok:
			return "granted token " + strconv.FormatUint(op.OutToken, 10)
		case op.Outcome == Fail && op.Code != "":
			return op.Code
		case op.GaveUp:
			return "no answer"
		}
		return "unknown (" + op.Err + ")"
	}
	for _, k := range keys {
		p := pairs[k]
		if p.first == nil || p.retry == nil {
			continue
		}
		f, rt := p.first, p.retry
		if refusedForNow(*f) {
			continue // refused before it became a wait (overload): the retry is a wait of its own
		}
		ended := rt.Outcome == Ok || rt.Outcome == Fail && rt.Code == "wait_timeout"
		if !ended {
			continue // the retry was not answered by the wait's end (a refusal, a lost connection)
		}
		r.RetryRounds++
		fAnswered := f.Outcome == Ok || f.Outcome == Fail && f.Code != ""
		switch {
		case fAnswered && (f.Outcome != rt.Outcome || f.Code != rt.Code || f.OutToken != rt.OutToken):
			v.add("ws-retry", []int{f.ID, rt.ID},
				"lock %s: client %s's acquire (wait %s) and its retry on the same connection (wait %s, sent while the first waited) are one wait, yet the first was answered %s at %s and the retry %s at %s",
				f.Lock, f.ClientID, time.Duration(f.WaitMs)*time.Millisecond, time.Duration(rt.WaitMs)*time.Millisecond,
				answer(f), ms(f.Return), answer(rt), ms(rt.Return))
		case f.Outcome == Unknown && f.GaveUp:
			if t, ok := closed[f.ClientID]; ok && t < f.Return {
				continue // the connection ended first
			}
			if len(overlapping(ds, rt.Return-int64(waiterSlack), f.Return)) > 0 {
				continue
			}
			v.add("ws-answer", []int{f.ID, rt.ID},
				"lock %s: client %s's acquire (wait %s, sent at %s) was never answered while its connection lived (the client gave up at %s), though the retry that joined its wait (wait %s) was answered %s at %s",
				f.Lock, f.ClientID, time.Duration(f.WaitMs)*time.Millisecond, ms(f.Invoke), ms(f.Return),
				time.Duration(rt.WaitMs)*time.Millisecond, answer(rt), ms(rt.Return))
		}
	}
}

// checkWatchSynced checks every watch's synced frame against the watch's
// own frames and the picture it closes against every other observation.
func checkWatchSynced(h History, watches map[wkey]*watchRec, r *Report, v *violations) {
	synced := map[wkey]*Op{}
	for i, op := range h.Ops {
		if op.Kind != KindSynced {
			continue
		}
		k := wkey{op.ClientID, op.WatchID}
		if p := synced[k]; p != nil {
			v.add("watch-synced", []int{p.ID, op.ID}, "%s was synced twice, at index %d (read at %s) and %d (read at %s)",
				k, p.Index, ms(p.Return), op.Index, ms(op.Return))
			continue
		}
		synced[k] = &h.Ops[i]
	}
	// Every status with an index, by lock and index.
	type obs struct {
		index uint64
		op    Op
	}
	byLock := map[string][]obs{}
	for _, op := range h.Ops {
		if !op.observed() || op.Outcome != Ok || op.Lock == "" || op.Index == 0 || op.Tag == tagObserve {
			continue
		}
		byLock[op.Lock] = append(byLock[op.Lock], obs{op.Index, op})
	}
	for _, l := range byLock {
		sort.Slice(l, func(i, j int) bool { return l[i].index < l[j].index })
	}
	keys := make([]wkey, 0, len(synced))
	for k := range synced {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].client < keys[j].client || keys[i].client == keys[j].client && keys[i].id < keys[j].id
	})
	for _, k := range keys {
		s := synced[k]
		wr := watches[k]
		if wr == nil {
			continue
		}
		r.WatchesSynced++
		n := s.Index
		picture := map[string]Op{} // each lock's last frame before synced
		for _, f := range wr.frames {
			if f.ID < s.ID {
				if f.Index > n {
					v.add("watch-synced", []int{f.ID, s.ID}, "%s: a first frame of %s at index %d, above the index %d its synced frame says the first frames are as of: %s",
						k, f.Lock, f.Index, n, f)
				}
				picture[f.Lock] = f
				continue
			}
			r.SyncedFrames++
			if f.Index <= n {
				v.add("watch-synced", []int{s.ID, f.ID},
					"%s was synced at index %d (read at %s), then sent a frame of %s at index %d (read at %s): older than its first picture, %s",
					k, n, ms(s.Return), f.Lock, f.Index, ms(f.Return), describeStatus(f))
			}
		}
		// The picture is the state at n: compare it with what everything
		// else shows of the locks the watch follows, at indexes up to n.
		for lock, l := range byLock {
			if !wr.inScope(lock) {
				continue
			}
			p, shown := picture[lock]
			from := uint64(0)
			if shown {
				from = p.Index
			}
			r.PicturesCompared++
			i := sort.Search(len(l), func(i int) bool { return l[i].index > from })
			for ; i < len(l) && l[i].index <= n; i++ {
				o := l[i].op
				if o.WatchID == k.id && o.ClientID == k.client {
					continue // the watch's own frames: checked above
				}
				switch {
				case shown && !hasState(p) && !hasState(o):
					continue // free either way: a free lock may show any index at or above its last change
				case shown:
					v.add("watch-synced", []int{p.ID, s.ID, o.ID},
						"%s's first picture, as of index %d, shows %s at index %d (%s); %s shows it at index %d (%s): a change the picture does not have",
						k, n, lock, p.Index, describeStatus(p), describeObs(o), o.Index, describeStatus(o))
				case o.Index == n && hasState(o):
					v.add("watch-synced", []int{s.ID, o.ID},
						"%s's first picture, as of index %d, does not show %s (no state then); %s shows it with state at index %d (%s)",
						k, n, lock, describeObs(o), o.Index, describeStatus(o))
				}
			}
		}
	}
}

// describeStatus renders a status shortly.
func describeStatus(op Op) string {
	if !hasState(op) {
		return "free"
	}
	if op.Held {
		return fmt.Sprintf("held by %s with token %d", op.Holder, op.OutToken)
	}
	return fmt.Sprintf("not held, %d waiters", op.Waiters)
}
