package chaos

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one broken property (safety, or liveness: see
// livenessCheckers), with the ops that show it.
type Violation struct {
	Checker string `json:"checker"`
	Msg     string `json:"msg"`
	Ops     []int  `json:"ops,omitempty"`
}

// Report is what the checkers found in a history.
type Report struct {
	// Violations lists up to maxViolationsPerChecker per checker;
	// Counts has every one, by checker.
	Violations []Violation
	Counts     map[string]int
	// Counts of what was checked, for the summary: a checker that checked
	// nothing proves nothing.
	Grants         int // distinct grants (tokens) acknowledged to a client
	Intervals      int // grants with a non-empty safe interval (mutual exclusion)
	OrderedPairs   int // fencing-order comparisons that had a real-time order
	FIFORounds     int
	FIFOPairs      int
	ReleasesAcked  int
	DurableChecked int
	FenceAccepted  int
	FenceRefused   int
	// Liveness and the promises beyond one request.
	ExpiryChecked    int // observations of held locks checked against expires_at + grace
	ExpiryPast       int // of them, made after the lock's expires_at
	WaitsChecked     int // waits checked for a grant visible before they were told
	LostChecked      int // Go-client grants whose Lost() time was compared with the next grant
	RestoresChecked  int // forced restores with grants on both sides
	KeepalivesPaused int // keepalives sent to a paused leader
	MemberAdds       int // member additions no member may accept
	// Lock kinds (kinds_checkers_test.go).
	KindIntervals      int // kinds grants with a non-empty safe interval
	KindReads          int // linearizable reads of kinds locks checked (holder sets)
	KindReadGrants     int // grants that held throughout a read of their lock, checked shown
	MultiGrants        int // multi-acquires granted (checked atomic)
	MultiGrantsWS      int // of them, over WebSocket
	MultiSnapshots     int // lists that showed part of a multi-acquire's grant, checked for the rest
	DelaysChecked      int // grants with lock_delay_ms that ended without a release
	DelayGrantsChecked int // later grants of their locks checked against the delay
	DelayRounds        int // delay rounds whose waiter was checked granted in time
	MismatchChecked    int // acquires naming another limit while the lock held, checked refused
	Revokes            int // revokes answered
	RevokedTokens      int // grants they ended
	RevokedRefused     int // releases of revoked grants answered not_holder
	RevokeTold         int // revoked WebSocket grants checked for their lost push
	// Elections and watches (elect_checkers_test.go).
	ElectGrants      int // election grants acknowledged (checked by two-leaders)
	LeadersObserved  int // distinct leaders (election, token) the observers saw
	LeaderPairs      int // successive observations of one observer compared (leader-order)
	ValuesChecked    int // leaders' values shown by a status, traced to the leader's own acquire or proclaim
	ValuesOrdered    int // of them, linearizable reads checked against the leader's acknowledged proclaims
	Watches          int // watches started (raw WebSocket and Go client)
	WatchFrames      int // changed frames and Go-client watch events
	WatchResyncs     int
	WatchStateGroups int // (lock, index) pairs shown by two or more statuses, compared
	WatchGapPairs    int // successive frames of one watch checked for a skipped change
	WatchTokens      int // holder tokens in frames traced to an acquire by their client
	FinalChecked     int // (watch, lock) pairs whose last frame was compared with the final replicated state
	FinalSkipped     int // of them, locks that changed after the final state was read
	BlockingChecked  int // blocking queries checked for an early, late or missing answer
	// Retried WebSocket waits and synced watches (retrywatch_checkers_test.go).
	RetryRounds      int // retry rounds whose retry the wait's end answered
	WatchesSynced    int // watches whose synced frame came
	SyncedFrames     int // frames after a synced frame, checked to be above it
	PicturesCompared int // (synced watch, lock) pairs whose picture was compared with every other observation
	// Withdrawn waits (cancel_checkers_test.go).
	Withdrawn        int // cancels that withdrew a wait
	WithdrawnChecked int // statuses of withdrawn waiters' locks shown after their cancel, checked for the waiter
	WithdrawnRounds  int // cancel rounds whose waiting request's answer was checked
	LinPartitions    int
	LinOps           int
	LinResult        porcupine.CheckResult
	LinTime          time.Duration
	LinInfo          porcupine.LinearizationInfo
	linModel         porcupine.Model
	linVisual        bool
}

// CheckOptions tune the checkers.
type CheckOptions struct {
	// LinTimeout bounds the porcupine check; running out is a failure.
	LinTimeout time.Duration
	// Visualize keeps porcupine's linearization info of an illegal history
	// (it costs a second check).
	Visualize bool
}

// clockMargin absorbs the millisecond truncation of the leader's time
// stamps and clock-rate adjustments between the client's monotonic clock
// and the leader's wall clock (all on one machine).
func clockMargin(ttl time.Duration) time.Duration { return 5*time.Millisecond + ttl/1000 }

// maxViolationsPerChecker bounds what one checker reports in detail.
const maxViolationsPerChecker = 20

type violations struct {
	list  []Violation
	count map[string]int
}

func (v *violations) add(checker string, ops []int, format string, args ...any) {
	if v.count == nil {
		v.count = map[string]int{}
	}
	v.count[checker]++
	if v.count[checker] > maxViolationsPerChecker {
		if v.count[checker] == maxViolationsPerChecker+1 {
			v.list = append(v.list, Violation{Checker: checker, Msg: "further violations of this checker not listed"})
		}
		return
	}
	v.list = append(v.list, Violation{Checker: checker, Msg: fmt.Sprintf(format, args...), Ops: ops})
}

// grant is one grant of a lock as the clients saw it, identified by its
// fencing token.
type grant struct {
	Lock, Client string
	Token        uint64
	// FirstReply is the earliest reply that told a client it holds this
	// grant (acquire ok): the start of its safe interval.
	FirstReply int64
	// FirstSeen is the earliest moment the grant is known to exist: its
	// first acquire reply or a read showing it.
	FirstSeen int64
	// LB is the earliest moment the grant can have been made: the first
	// invoke of the acquire attempts that returned it, or of an earlier
	// acquire of the lock by the same client whose outcome is unknown (it
	// may have made the grant, which a later acquire by the holder returns
	// again). MaxInt64 when only reads saw the grant.
	LB int64
	// ExpiryLB: the server will not end the grant on its own before this.
	ExpiryLB int64
	// ReleaseSent is the first invoke of a release of this grant.
	ReleaseSent int64
	// Mode is the grant's mode as a reply or a read gave it ("" when
	// none said); DelayMs the lock_delay_ms it was asked with; AckExpires
	// the latest expires_at an acquire or renew reply gave it (0: none).
	Mode       string
	DelayMs    int64
	AckExpires int64
	// Via is how the first acquire that reported it was sent.
	Via string
	// AckOp is the first acquire that reported the grant (-1: none).
	AckOp int
	Ops   []int
}

// op names the op that best shows the grant.
func (g *grant) op() int {
	if g.AckOp >= 0 {
		return g.AckOp
	}
	return g.Ops[0]
}

func (g *grant) String() string {
	return fmt.Sprintf("grant %s/%d to %s", g.Lock, g.Token, g.Client)
}

// grants indexes every grant the history shows. It also reports tokens
// seen with two different (lock, client) owners: a reused token.
func grants(h History, v *violations) map[uint64]*grant {
	firstInvoke := map[int64]int64{}
	for _, op := range h.Ops {
		if op.Kind == KindAcquire && op.Attempt != 0 {
			if t, ok := firstInvoke[op.Attempt]; !ok || op.Invoke < t {
				firstInvoke[op.Attempt] = op.Invoke
			}
		}
	}
	out := map[uint64]*grant{}
	get := func(op Op, lock, client string, token uint64) *grant {
		g, ok := out[token]
		if !ok {
			g = &grant{Lock: lock, Client: client, Token: token, FirstReply: math.MaxInt64,
				FirstSeen: math.MaxInt64, LB: math.MaxInt64, ReleaseSent: math.MaxInt64, AckOp: -1}
			out[token] = g
		}
		if g.Lock != lock || g.Client != client {
			v.add("token-unique", append(append([]int(nil), g.Ops[:min(len(g.Ops), 3)]...), op.ID),
				"token %d was given to %s on %s and is seen with %s on %s (%s)", token, g.Client, g.Lock, client, lock, op)
		}
		g.Ops = append(g.Ops, op.ID)
		return g
	}
	for _, op := range h.Ops {
		switch {
		case op.Kind == KindAcquire && op.Outcome == Ok:
			if op.OutToken == 0 {
				v.add("protocol", []int{op.ID}, "grant without a token: %s", op)
				continue
			}
			g := get(op, op.Lock, op.ClientID, op.OutToken)
			if op.Return < g.FirstReply {
				g.AckOp, g.Via = op.ID, op.Via
			}
			g.FirstReply = min(g.FirstReply, op.Return)
			g.FirstSeen = min(g.FirstSeen, op.Return)
			if op.GrantMode != "" {
				g.Mode = op.GrantMode
			}
			g.DelayMs = max(g.DelayMs, op.DelayMs)
			g.AckExpires = max(g.AckExpires, op.ExpiresAt)
			if t, ok := firstInvoke[op.Attempt]; ok && op.Attempt != 0 {
				g.LB = min(g.LB, t)
			} else {
				g.LB = min(g.LB, op.Invoke)
			}
			g.ExpiryLB = max(g.ExpiryLB, op.ExpiryLB)
		case op.Kind == KindRenew && op.Outcome == Ok:
			g := get(op, op.Lock, op.ClientID, op.Token)
			g.ExpiryLB = max(g.ExpiryLB, op.ExpiryLB)
			g.AckExpires = max(g.AckExpires, op.ExpiresAt)
		case op.Kind == KindRead && op.Outcome == Ok:
			for _, sh := range op.shown() {
				g := get(op, op.Lock, sh.Client, sh.Token)
				g.FirstSeen = min(g.FirstSeen, op.Return)
				if g.Mode == "" {
					g.Mode = sh.Mode
				}
			}
		case (op.Kind == KindChanged || op.Kind == KindFinal) && op.Outcome == Ok:
			// A watcher (or the final state) shows a committed status by
			// the time it was read: the grant existed by then.
			for _, sh := range op.holders() {
				g := get(op, op.Lock, sh.Client, sh.Token)
				g.FirstSeen = min(g.FirstSeen, op.Return)
				if g.Mode == "" {
					g.Mode = sh.Mode
				}
			}
		}
	}
	// SPEC: an acquire by the current holder returns the current grant. So
	// a grant returned to an acquire may have been made by an earlier
	// acquire of the same lock by the same client whose outcome is unknown
	// (an unknown op may take effect at any time after it was sent): the
	// holder's next acquire gets it back. A definite refusal (lock_held,
	// wait_timeout) made no grant; a grant that comes of it anyway is a
	// server bug, and does not move LB.
	firstUnknown := map[[2]string]int64{} // (lock, client) → first invoke of an acquire with an unknown outcome
	for _, op := range h.Ops {
		if op.Kind != KindAcquire {
			continue
		}
		if oc, keep := modelOutcome(op); keep && oc == Unknown {
			k := [2]string{op.Lock, op.ClientID}
			if t, ok := firstUnknown[k]; !ok || op.Invoke < t {
				firstUnknown[k] = op.Invoke
			}
		}
	}
	for _, g := range out {
		// Only an acquire sent before the grant was known to exist can have
		// made it.
		if t, ok := firstUnknown[[2]string{g.Lock, g.Client}]; ok && g.LB != math.MaxInt64 && t < g.FirstSeen {
			g.LB = min(g.LB, t)
		}
	}
	// The holder stops relying on the lock when it first tries to release
	// it, whatever came of the request.
	for _, op := range h.Ops {
		if op.Kind == KindRelease {
			if g, ok := out[op.Token]; ok && g.Client == op.ClientID {
				g.ReleaseSent = min(g.ReleaseSent, op.Invoke)
			}
		}
	}
	return out
}

// Total is the number of violations of every checker.
func (r *Report) Total() int {
	n := 0
	for _, c := range r.Counts {
		n += c
	}
	return n
}

// Check runs every checker over h.
func Check(h History, opts CheckOptions) *Report {
	r := &Report{}
	v := &violations{}
	// The checkers of single grants read a multi-acquire as one acquire
	// per lock (expandMulti); the lock-kinds checkers read it whole.
	eh := expandMulti(h)
	gs := grants(eh, v)
	// A forced restore rolls the lock table back by design: the checkers
	// that assume state only moves forward do not read the restore
	// phase's ops. Tokens never go back, restore or not.
	fwd := withoutRollback(eh)
	fgs := grants(fwd, &violations{})
	checkMutualExclusion(fwd, fgs, r, v)
	checkTokenOrder(gs, r, v)
	checkFIFO(fwd, r, v)
	checkReleases(fwd, r, v)
	checkDurability(fwd, fgs, r, v)
	checkFence(h, r, v)
	checkReplies(h, v)
	checkLinearizable(fwd, opts, r, v)
	checkKinds(withoutRollback(h), fgs, r, v)
	checkExpiry(eh, r, v)
	checkWaiterTold(eh, r, v)
	checkLostLate(eh, gs, r, v)
	checkTokenReissue(eh, gs, r, v)
	checkKeepalives(h, r, v)
	checkMembers(h, r, v)
	checkKindsLiveness(h, gs, r, v)
	checkElections(fwd, r, v)
	checkRetriedWaits(eh, r, v)
	checkCancels(h, gs, r, v)
	checkFlood(h, v)
	r.Violations, r.Counts = v.list, v.count
	return r
}

// TagRestore marks the ops of the restore phase (see restorePhase).
const TagRestore = "restore"

// withoutRollback is h without the restore phase's ops. Op ids stay those
// of h.
func withoutRollback(h History) History {
	out := h
	out.Ops = make([]Op, 0, len(h.Ops))
	for _, op := range h.Ops {
		if op.Tag != TagRestore {
			out.Ops = append(out.Ops, op)
		}
	}
	return out
}

// split returns the violation counts of the safety checkers and of the
// liveness checkers apart.
func (r *Report) split() (safety, liveness map[string]int) {
	safety, liveness = map[string]int{}, map[string]int{}
	for k, n := range r.Counts {
		if livenessCheckers[k] {
			liveness[k] = n
		} else {
			safety[k] = n
		}
	}
	return safety, liveness
}

// checkMutualExclusion: no two grants of one lock have overlapping safe
// intervals. A holder's safe interval is [first grant reply, min(first
// release sent, earliest possible server-side end)], the earliest end being
// acquire (or acknowledged renew) sent + TTL, less a clock margin.
func checkMutualExclusion(h History, gs map[uint64]*grant, r *Report, v *violations) {
	type iv struct {
		g          *grant
		start, end int64
	}
	byLock := map[string][]iv{}
	for _, g := range gs {
		if g.FirstReply == math.MaxInt64 {
			continue // only reads saw it: nobody relied on holding it
		}
		if isKind(g.Lock) {
			continue // several holders may be right: checkKinds
		}
		r.Grants++
		if isElect(g.Lock) {
			r.ElectGrants++
		}
		end := min(g.ReleaseSent, g.ExpiryLB)
		if end <= g.FirstReply {
			continue
		}
		r.Intervals++
		byLock[g.Lock] = append(byLock[g.Lock], iv{g, g.FirstReply, end})
	}
	for _, ivs := range byLock {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start < ivs[j].start })
		var widest *iv
		checker := "mutual-exclusion"
		if isElect(ivs[0].g.Lock) {
			checker = "two-leaders" // an election: two leaders acknowledged at once
		}
		for i := range ivs {
			cur := &ivs[i]
			if widest != nil && cur.start < widest.end {
				v.add(checker, []int{widest.g.op(), cur.g.op()},
					"%s safe in [%s, %s] overlaps %s safe in [%s, %s]", widest.g, ms(widest.start), ms(widest.end),
					cur.g, ms(cur.start), ms(cur.end))
			}
			if widest == nil || cur.end > widest.end {
				widest = cur
			}
		}
	}
}

// checkTokenOrder: tokens grow with the real-time order of grants, across
// every lock (SPEC: strictly greater than every token issued before). If
// grant A was known to exist before grant B's first acquire was sent, A's
// token must be below B's.
func checkTokenOrder(gs map[uint64]*grant, r *Report, v *violations) {
	var seen, started []*grant
	for _, g := range gs {
		seen = append(seen, g)
		if g.LB != math.MaxInt64 {
			started = append(started, g)
		}
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i].FirstSeen < seen[j].FirstSeen })
	sort.Slice(started, func(i, j int) bool { return started[i].LB < started[j].LB })
	var top *grant
	i := 0
	for _, b := range started {
		for i < len(seen) && seen[i].FirstSeen < b.LB {
			if top == nil || seen[i].Token > top.Token {
				top = seen[i]
			}
			i++
		}
		if top == nil {
			continue
		}
		r.OrderedPairs += i
		if top.Token >= b.Token {
			v.add("token-order", []int{top.op(), b.op()},
				"%s existed at %s, before %s was asked for at %s, yet its token is not lower",
				top, ms(top.FirstSeen), b, ms(b.LB))
		}
	}
}

// fifoRound gathers the ops of one FIFO probe round.
type fifoRound struct {
	holder   string
	waiters  map[int]string // index → client id
	first    map[string]int64
	waitMs   map[string]int64
	grantAt  map[string]int64
	grantInv map[string]int64 // invoke of the acquire that returned the grant
	unknown  map[string]int64 // first invoke of an acquire of unknown outcome
	token    map[string]uint64
	grantOp  map[string]int
	confirms []Op
}

// checkFIFO: among waiters known to have been queued at the same time,
// grants follow queue order. A round of the prober (see fifoProber) holds a
// fresh lock, sends waiters W1..Wn one after another, and after each sends
// a linearizable read. A read that shows the round's holder still holding
// and exactly a waiters, while W(a+1) had not been sent yet, proves W1..Wa
// were all queued at that moment: each of them was enqueued before any
// later waiter. Such a Wi that was granted before its wait deadline could
// have passed (so it never left the queue in between) must get a lower
// token than every later Wb that was granted.
func checkFIFO(h History, r *Report, v *violations) {
	rounds := map[string]*fifoRound{}
	round := func(id string) *fifoRound {
		fr, ok := rounds[id]
		if !ok {
			fr = &fifoRound{waiters: map[int]string{}, first: map[string]int64{}, waitMs: map[string]int64{},
				grantAt: map[string]int64{}, grantInv: map[string]int64{}, unknown: map[string]int64{},
				token: map[string]uint64{}, grantOp: map[string]int{}}
			rounds[id] = fr
		}
		return fr
	}
	for _, op := range h.Ops {
		parts := strings.Split(op.Tag, ":")
		if len(parts) != 3 || parts[0] != "fifo" {
			continue
		}
		fr := round(parts[1])
		switch {
		case parts[2] == "holder" && op.Kind == KindAcquire:
			fr.holder = op.ClientID
		case parts[2] == "confirm" && op.Kind == KindRead && op.Outcome == Ok:
			fr.confirms = append(fr.confirms, op)
		case strings.HasPrefix(parts[2], "w") && op.Kind == KindAcquire:
			idx, err := strconv.Atoi(parts[2][1:])
			if err != nil {
				continue
			}
			c := op.ClientID
			fr.waiters[idx] = c
			if t, ok := fr.first[c]; !ok || op.Invoke < t {
				fr.first[c] = op.Invoke
				fr.waitMs[c] = op.WaitMs
			}
			if op.Outcome == Ok {
				if t, ok := fr.grantAt[c]; !ok || op.Return < t {
					fr.grantAt[c], fr.grantInv[c], fr.token[c], fr.grantOp[c] = op.Return, op.Invoke, op.OutToken, op.ID
				}
			}
			if oc, keep := modelOutcome(op); keep && oc == Unknown {
				if t, ok := fr.unknown[c]; !ok || op.Invoke < t {
					fr.unknown[c] = op.Invoke
				}
			}
		}
	}
	ids := make([]string, 0, len(rounds))
	for id := range rounds {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fr := rounds[id]
		n := len(fr.waiters)
		if fr.holder == "" || n == 0 {
			continue
		}
		// level[a]: W1..Wa proven queued together.
		level := map[int]bool{}
		for _, rd := range fr.confirms {
			if !rd.Held || rd.Holder != fr.holder {
				continue
			}
			sent := 0
			ordered := true
			for i := 1; i <= n; i++ {
				c, ok := fr.waiters[i]
				if !ok {
					ordered = false
					break
				}
				if fr.first[c] < rd.Return {
					if sent != i-1 {
						ordered = false
					}
					sent = i
				}
			}
			if ordered && sent > 0 && rd.Waiters == sent {
				level[sent] = true
			}
		}
		if len(level) == 0 {
			continue
		}
		r.FIFORounds++
		for i := 1; i <= n; i++ {
			wi := fr.waiters[i]
			ti, granted := fr.token[wi]
			if !granted {
				continue
			}
			deadline := fr.first[wi] + int64(time.Duration(fr.waitMs[wi])*time.Millisecond) - int64(clockMargin(0))
			if fr.grantAt[wi] >= deadline {
				continue // it may have timed out and queued again at the back
			}
			if t, ok := fr.unknown[wi]; ok && t < fr.grantInv[wi] {
				// An earlier acquire whose answer never came may have been
				// granted, the grant lost by its TTL unbeknown to the
				// waiter, and the retry queued again at the back: the grant
				// acknowledged is then not its first.
				continue
			}
			for b := i + 1; b <= n; b++ {
				proven := false
				for a := i; a < b; a++ {
					proven = proven || level[a]
				}
				wb := fr.waiters[b]
				tb, ok := fr.token[wb]
				if !proven || !ok {
					continue
				}
				r.FIFOPairs++
				if tb < ti {
					v.add("fifo", []int{fr.grantOp[wi], fr.grantOp[wb]},
						"round %s: waiter %d (%s) was queued before waiter %d (%s) and never left the queue, but got token %d after %d",
						id, i, wi, b, wb, ti, tb)
				}
			}
		}
	}
}

// checkReleases: an acknowledged release is never undone. Nothing invoked
// after the release's reply may show that grant held.
func checkReleases(h History, r *Report, v *violations) {
	released := map[uint64]Op{} // token → first acknowledged release
	for _, op := range h.Ops {
		if op.Kind == KindRelease && op.Outcome == Ok {
			if prev, ok := released[op.Token]; !ok || op.Return < prev.Return {
				released[op.Token] = op
			}
		}
	}
	r.ReleasesAcked = len(released)
	for _, op := range h.Ops {
		var toks []uint64
		switch {
		case op.Kind == KindRead && op.Outcome == Ok:
			for _, sh := range op.shown() {
				toks = append(toks, sh.Token)
			}
		case op.Kind == KindRenew && op.Outcome == Ok:
			toks = []uint64{op.Token}
		case op.Kind == KindAcquire && op.Outcome == Ok:
			toks = []uint64{op.OutToken}
		}
		for _, tok := range toks {
			if rel, ok := released[tok]; ok && op.Invoke > rel.Return {
				v.add("release-undone", []int{rel.ID, op.ID}, "release of token %d acknowledged at %s, then %s", tok, ms(rel.Return), op)
			}
		}
	}
}

// checkDurability: what was acknowledged before a crash of every member is
// there after the restart. The nemesis acquires (and releases some of) a
// few long-TTL locks before the crash and reads them after; ops carry tags
// "durable:R:I" and "durable:R:I:check".
func checkDurability(h History, gs map[uint64]*grant, r *Report, v *violations) {
	type probe struct {
		acq, rel *Op
		checks   []Op
	}
	probes := map[string]*probe{}
	for i := range h.Ops {
		op := &h.Ops[i]
		if !strings.HasPrefix(op.Tag, "durable:") {
			continue
		}
		key := strings.TrimSuffix(op.Tag, ":check")
		p, ok := probes[key]
		if !ok {
			p = &probe{}
			probes[key] = p
		}
		switch {
		case strings.HasSuffix(op.Tag, ":check") && op.Kind == KindRead && op.Outcome == Ok:
			p.checks = append(p.checks, *op)
		case op.Kind == KindAcquire && op.Outcome == Ok:
			p.acq = op
		case op.Kind == KindRelease && op.Outcome == Ok:
			p.rel = op
		}
	}
	for key, p := range probes {
		if p.acq == nil || len(p.checks) == 0 {
			continue
		}
		r.DurableChecked++
		tok := p.acq.OutToken
		for _, c := range p.checks {
			switch {
			case p.rel != nil && c.Invoke > p.rel.Return:
				if c.Held && c.OutToken == tok {
					v.add("durability", []int{p.rel.ID, c.ID}, "%s: release acknowledged before the crash is undone after the restart: %s", key, c)
				}
			case p.rel == nil && c.Invoke > p.acq.Return:
				g := gs[tok]
				if g != nil && c.Return >= g.ExpiryLB {
					continue // may have expired by now
				}
				if !c.Held || c.OutToken != tok || c.Holder != p.acq.ClientID {
					v.add("durability", []int{p.acq.ID, c.ID}, "%s: grant acknowledged before the crash (token %d to %s) is lost after the restart: %s",
						key, tok, p.acq.ClientID, c)
				}
			}
		}
	}
}

// checkFence: the fencestore's accepted writes per key never go backwards
// in token: a write accepted after another accepted write had returned
// carries a token at least as high. A stale_token refusal names a higher
// token than the one refused.
func checkFence(h History, r *Report, v *violations) {
	byKey := map[string][]Op{}
	for _, op := range h.Ops {
		if op.Kind != KindFence {
			continue
		}
		switch {
		case op.Outcome == Ok:
			r.FenceAccepted++
			byKey[op.Lock] = append(byKey[op.Lock], op)
		case op.Code == "stale_token":
			r.FenceRefused++
			if op.OutToken <= op.Token {
				v.add("fence", []int{op.ID}, "stale_token refusal names highest %d, not above the refused token: %s", op.OutToken, op)
			}
		}
	}
	for _, ops := range byKey {
		byReturn := append([]Op(nil), ops...)
		sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
		sort.Slice(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
		var top *Op
		i := 0
		for _, b := range ops {
			for i < len(byReturn) && byReturn[i].Return < b.Invoke {
				if top == nil || byReturn[i].Token > top.Token {
					top = &byReturn[i]
				}
				i++
			}
			if top != nil && top.Token > b.Token {
				v.add("fence", []int{top.ID, b.ID}, "fencestore accepted token %d for %s after it had accepted %d", b.Token, b.Lock, top.Token)
			}
		}
	}
}

// checkReplies: replies that no valid request should get under any fault
// (400 for a request the harness built by the SPEC, 500, a status outside
// the SPEC).
func checkReplies(h History, v *violations) {
	for _, op := range h.Ops {
		if op.Kind == KindMemberAdd {
			continue // a request built to be refused: checkMembers
		}
		if op.Code == "unexpected" || op.Code == "invalid_argument" || op.Code == "internal" {
			v.add("reply", []int{op.ID}, "unexpected reply: %s", op)
		}
	}
}

// checkLinearizable checks acquires, releases, renews and linearizable
// reads against the lock model with porcupine, one partition per lock.
func checkLinearizable(h History, opts CheckOptions, r *Report, v *violations) {
	ops := porcupineOps(h)
	r.LinOps = len(ops)
	model := lockModel()
	r.linModel = model
	r.LinPartitions = len(model.Partition(ops))
	timeout := opts.LinTimeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	start := time.Now()
	r.LinResult = porcupine.CheckOperationsTimeout(model, ops, timeout)
	r.LinTime = time.Since(start)
	switch r.LinResult {
	case porcupine.Ok:
	case porcupine.Unknown:
		v.add("linearizability", nil, "porcupine did not finish within %s: a checker timeout counts as a failure", timeout)
	default:
		bad := illegalPartitions(model, ops, timeout)
		if len(bad) == 0 {
			// The verdict stands even when no single partition re-checks
			// as illegal (say it timed out on its own).
			v.add("linearizability", nil, "porcupine found the history illegal, but no single lock's partition re-checked as illegal")
		}
		for _, p := range bad {
			ids := make([]int, 0, len(p))
			for _, op := range p {
				ids = append(ids, op.Metadata.(int))
			}
			v.add("linearizability", ids[:min(len(ids), 10)], "lock %s: no linearization of its %d ops fits the lock model", p[0].Input.(Op).Lock, len(p))
		}
		if opts.Visualize && len(bad) > 0 {
			_, r.LinInfo = porcupine.CheckOperationsVerbose(model, bad[0], timeout)
			r.linVisual = true
		}
	}
}

// illegalPartitions re-checks partition by partition to name the bad locks.
func illegalPartitions(model porcupine.Model, ops []porcupine.Operation, timeout time.Duration) [][]porcupine.Operation {
	var bad [][]porcupine.Operation
	for _, p := range model.Partition(ops) {
		if porcupine.CheckOperationsTimeout(model, p, timeout) == porcupine.Illegal {
			bad = append(bad, p)
		}
	}
	return bad
}
