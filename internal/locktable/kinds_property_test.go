package locktable_test

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"

	lt "github.com/lockd/lockd/internal/locktable"
)

// The lock-kind property test drives the table with random sequences of
// every command over a few locks, clients and sessions (so they collide):
// acquires of both modes, semaphore sizes 0 to 3, lock-delays, values,
// tries and waits, with and without a session; multi-acquires of 2 or 3
// locks; releases, renewals, expiries, waiter timeouts, delay ends,
// revocations, value changes and session creates, deletes and expiries,
// some in batches, with Now only moving forward.
//
// A reference model, built only from the results and events clients and
// timers are told, predicts each acquire's outcome (granted, queued,
// lock_held and whom it names, limit_mismatch, invalid) and checks each
// event as it comes: a grant goes to a queue's head or to a newcomer on a
// lock free for newcomers, never to a waiter past its deadline or of an
// ended session, never on a delayed lock, only beside holders it may
// share the lock with (and never beside a grant of a session the step
// ends: those end first), with a token above every earlier one; a multi-
// acquire is granted, queued or dropped on all of its locks in one step or
// on none; a lock-delay starts exactly when a grant with one ends without a
// release. After every step the table must read exactly as the model says,
// keep every invariant (those Restore checks too), keep its quota counters,
// round-trip through a snapshot byte for byte, stamp the step's index on
// every lock it changed, and leave no lock free with a waiter it could
// grant (liveness).

// universe is what commands are drawn over.
type universe struct {
	locks, clients, sessions []string
	sharedOneIn              int     // one acquire in this many is shared
	noSession                int     // weight of acquiring without a session, against 1 for each session
	waits                    []int64 // how long acquires wait (0: a try)
	endOneIn                 int     // one session delete or expiry drawn in this many is made (else a create)
}

var (
	// wide: three locks, five clients, two sessions.
	wide = universe{locks: []string{"a", "b", "c"}, clients: []string{"c1", "c2", "c3", "c4", "c5"},
		sessions: []string{"s1", "s2"}, sharedOneIn: 3, noSession: 2, waits: []int64{0, 0, 50, 200, 1000, 5000}, endOneIn: 1}
	// tight: two locks, four clients sharing one session, mostly shared
	// acquires: multi-acquires, readers and session ends meet often.
	tight = universe{locks: []string{"a", "b"}, clients: []string{"c1", "c2", "c3", "c4"},
		sessions: []string{"s1"}, sharedOneIn: 2, noSession: 1, waits: []int64{0, 1000, 60000, 60000}, endOneIn: 3}
	kValues = []string{"", "", "v1", "v2"}
)

// kgen draws commands, peeking at the table under test so that many of
// them name a current holder, token, waiter, expiry or delay end.
type kgen struct {
	tb  *lt.Table
	now int64
	u   universe
}

func (g *kgen) advance(t *rapid.T) {
	g.now += rapid.SampledFrom([]int64{0, 0, 1, 10, 50, 100, 300, 1000}).Draw(t, "dt")
}

// jump moves Now to around at, never back.
func (g *kgen) jump(t *rapid.T, at int64) {
	if at > g.now && rapid.Bool().Draw(t, "jump") {
		g.now = max(g.now, at+rapid.Int64Range(-1, 1).Draw(t, "skew"))
	}
}

func (g *kgen) session(t *rapid.T) string {
	return rapid.SampledFrom(append(make([]string, g.u.noSession), g.u.sessions...)).Draw(t, "session")
}

// grant picks a current grant of lock (most of the time) or a made-up one.
func (g *kgen) grant(t *rapid.T, lock string) (string, uint64, lt.Holder) {
	if hs := g.tb.Get(lock).Holders; len(hs) > 0 && rapid.IntRange(0, 3).Draw(t, "realGrant") > 0 {
		h := rapid.SampledFrom(hs).Draw(t, "holder")
		return h.ClientID, h.Token, h
	}
	return rapid.SampledFrom(g.u.clients).Draw(t, "client"), rapid.Uint64Range(0, g.tb.LastToken()+1).Draw(t, "token"), lt.Holder{}
}

func (g *kgen) acquire(t *rapid.T, lock string) lt.Command {
	c := lt.Command{Op: lt.OpAcquire, Now: g.now, Lock: lock,
		ClientID:  rapid.SampledFrom(g.u.clients).Draw(t, "client"),
		SessionID: g.session(t),
		TTLms:     rapid.SampledFrom([]int64{0, 100, 500, 1000, 5000}).Draw(t, "ttl"),
		WaitMs:    rapid.SampledFrom(g.u.waits).Draw(t, "wait"),
		DelayMs:   rapid.SampledFrom([]int64{0, 0, 100, 500}).Draw(t, "delay"),
		Value:     rapid.SampledFrom(kValues).Draw(t, "value"),
	}
	if rapid.IntRange(1, g.u.sharedOneIn).Draw(t, "shared") == 1 {
		c.Mode = lt.Shared
	}
	return c
}

func (g *kgen) command(t *rapid.T, top bool) lt.Command {
	hi := 99
	if !top {
		hi = 94
	}
	k := rapid.IntRange(0, hi).Draw(t, "kind")
	lock := rapid.SampledFrom(g.u.locks).Draw(t, "lock")
	switch {
	case k < 22:
		c := g.acquire(t, lock)
		c.Limit = rapid.SampledFrom([]int64{0, 0, 0, 1, 2, 3}).Draw(t, "limit")
		if rapid.IntRange(0, 3).Draw(t, "handOff") == 0 {
			// A hand-off: most of the time the client's own grant.
			client, tok, _ := g.grant(t, lock)
			c.ClientID, c.Token = client, tok
		}
		return c
	case k < 36:
		c := g.acquire(t, "")
		c.Limit = rapid.SampledFrom([]int64{0, 0, 0, 0, 0, 0, 1, 2}).Draw(t, "limit")
		c.WaitMs = rapid.SampledFrom(g.u.waits[1:]).Draw(t, "multiWait")
		n := rapid.IntRange(2, len(g.u.locks)).Draw(t, "multiLen")
		c.Locks = slices.Sorted(slices.Values(rapid.Permutation(g.u.locks).Draw(t, "perm")[:n]))
		if rapid.IntRange(0, 19).Draw(t, "unsorted") == 0 {
			slices.Reverse(c.Locks)
		}
		return c
	case k < 48:
		client, tok, _ := g.grant(t, lock)
		return rel(lock, client, tok, g.now)
	case k < 51:
		client, tok, _ := g.grant(t, lock)
		return renew(lock, client, tok, rapid.SampledFrom([]int64{0, 100, 1000}).Draw(t, "ttl"), g.now)
	case k < 59:
		_, tok, h := g.grant(t, lock)
		g.jump(t, h.ExpiresAt)
		return expLock(lock, tok, g.now)
	case k < 65:
		ws := sortedWaiters(g.tb)
		if len(ws) == 0 {
			return tmo(lock, rapid.SampledFrom(g.u.clients).Draw(t, "client"), g.now)
		}
		w := rapid.SampledFrom(ws).Draw(t, "waiter")
		g.jump(t, w.Deadline)
		return tmo(w.Lock, w.ClientID, g.now)
	case k < 71:
		var delayed []lt.LockInfo
		for _, li := range g.tb.List("", 0) {
			if li.DelayedUntil != 0 {
				delayed = append(delayed, li)
			}
		}
		if len(delayed) > 0 && rapid.IntRange(0, 3).Draw(t, "realDelay") > 0 {
			li := rapid.SampledFrom(delayed).Draw(t, "delayed")
			g.jump(t, li.DelayedUntil)
			lock = li.Name
		}
		return endDelay(lock, g.now)
	case k < 74:
		// Withdraw a wait: most of the time a real one (single or multi,
		// by its names), else a client that may hold, wait elsewhere or
		// not wait at all.
		c := lt.Command{Op: lt.OpCancel, Now: g.now, Lock: lock, ClientID: rapid.SampledFrom(g.u.clients).Draw(t, "client")}
		if ws := sortedWaiters(g.tb); len(ws) > 0 && rapid.IntRange(0, 3).Draw(t, "realWait") > 0 {
			w := rapid.SampledFrom(ws).Draw(t, "waiter")
			c.Lock, c.ClientID = w.Lock, w.ClientID
			if w.Locks != nil && rapid.IntRange(0, 3).Draw(t, "byNames") > 0 {
				c.Lock, c.Locks = "", w.Locks
			}
		}
		return c
	case k < 76:
		_, tok, _ := g.grant(t, lock)
		if rapid.Bool().Draw(t, "revokeAll") {
			tok = 0
		}
		return revoke(lock, tok, g.now)
	case k < 82 || (k < 89 && rapid.IntRange(1, g.u.endOneIn).Draw(t, "end") > 1):
		return mkSess(rapid.SampledFrom(g.u.sessions).Draw(t, "sid"), rapid.SampledFrom(g.u.clients).Draw(t, "client"),
			rapid.SampledFrom([]int64{1000, 15000, 15000}).Draw(t, "sttl"), g.now)
	case k < 85:
		return delSess(rapid.SampledFrom(g.u.sessions).Draw(t, "sid"), g.now)
	case k < 89:
		return expSess(rapid.SampledFrom(g.u.sessions).Draw(t, "sid"), g.now)
	case k < 95:
		client, tok, _ := g.grant(t, lock)
		return setValue(lock, client, tok, rapid.SampledFrom(kValues).Draw(t, "value"), g.now)
	default:
		n := rapid.IntRange(1, 4).Draw(t, "batchLen")
		c := lt.Command{Op: lt.OpBatch}
		for i := 0; i < n; i++ {
			c.Batch = append(c.Batch, g.command(t, false))
		}
		c.Now = g.now
		return c
	}
}

// The model.

type kHolder struct {
	client, session string
	token           uint64
	mode            lt.Mode
	ttl, expiresAt  int64
	delay           int64
	value           string
	grantedAt       int64
}

type kWaiter struct {
	client, session string
	mode            lt.Mode
	ttl, deadline   int64
	delay           int64
	value           string
	locks           []string // a multi-acquire's; nil for one lock
}

type kLock struct {
	limit        int64 // 1 for an ordinary lock
	holders      []kHolder
	queue        []kWaiter
	delayedUntil int64
}

func (l *kLock) holder(client string) int {
	if l == nil {
		return -1
	}
	return slices.IndexFunc(l.holders, func(h kHolder) bool { return h.client == client })
}

func (l *kLock) waiter(client string) int {
	if l == nil {
		return -1
	}
	return slices.IndexFunc(l.queue, func(w kWaiter) bool { return w.client == client })
}

func (l *kLock) first() string {
	if l == nil || len(l.holders) == 0 {
		return ""
	}
	return l.holders[0].client
}

// canHold: one more holder of mode m fits beside the holders (SPEC
// "Modes", "Semaphores").
func (l *kLock) canHold(m lt.Mode) bool {
	switch {
	case len(l.holders) == 0:
		return true
	case m == lt.Shared:
		return l.limit == 1 && l.holders[0].mode == lt.Shared
	default:
		return l.holders[0].mode == lt.Exclusive && int64(len(l.holders)) < l.limit
	}
}

// freeFor: a newcomer may be granted at once (SPEC "Tries and queues").
func (l *kLock) freeFor(m lt.Mode) bool {
	return l == nil || (len(l.queue) == 0 && l.delayedUntil == 0 && l.canHold(m))
}

// mismatch: SPEC "Semaphores": another size while the lock has holders or
// waiters, or shared on a semaphore (the size the acquire would give the
// lock when it has neither, else the lock's).
func (l *kLock) mismatch(m lt.Mode, limit int64) bool {
	busy := len(l.holders) > 0 || len(l.queue) > 0
	if limit != 0 && max(1, limit) != l.limit && busy {
		return true
	}
	eff := l.limit
	if limit != 0 && !busy {
		eff = max(1, limit)
	}
	return m == lt.Shared && eff > 1
}

type kModel struct {
	locks    map[string]*kLock
	sessions map[string]bool
	released map[memoKey]string
	maxToken uint64
}

func newKModel() *kModel {
	return &kModel{locks: map[string]*kLock{}, sessions: map[string]bool{}, released: map[memoKey]string{}}
}

func validKinds(c lt.Command) bool {
	return c.ClientID != "" && c.TTLms >= 0 && c.WaitMs >= 0 && (c.TTLms > 0 || c.SessionID != "") &&
		c.Mode <= lt.Shared && c.Limit >= 0 && c.Limit <= lt.MaxLimit && !(c.Mode == lt.Shared && c.Limit > 1) &&
		c.DelayMs >= 0 && c.DelayMs <= lt.MaxLockDelayMs && len(c.Value) <= lt.MaxValueBytes
}

func validSet(names []string) bool {
	if len(names) < lt.MinMultiLocks || len(names) > lt.MaxMultiLocks {
		return false
	}
	for i, n := range names {
		if lt.LockNameProblem(n) != "" || (i > 0 && names[i-1] >= n) {
			return false
		}
	}
	return true
}

// outcome is what the model expects of a result.
type outcome struct {
	code     lt.Code
	granted  bool
	queued   bool
	position int // single acquire queued; -1: not checked
	token    uint64
	mode     lt.Mode
	holder   string
	lock     string
	grants   []uint64 // multi: the tokens, in name order
	events   int      // how many events; -1: some
	// mayGrant: a multi-acquire that queues is granted in the same step
	// when its queueing let dead waiters ahead of it go (the fold checks
	// that every grant went to a queue's head).
	mayGrant bool
}

func (o outcome) check(r lt.Result) error {
	if o.mayGrant && r.Granted {
		o.granted, o.queued, o.mode, o.grants = true, false, r.Mode, nil
		for _, g := range r.Grants {
			o.grants = append(o.grants, g.Token)
		}
	}
	switch {
	case r.Code != o.code:
		return fmt.Errorf("code %v, want %v", r.Code, o.code)
	case r.Granted != o.granted || r.Queued != o.queued:
		return fmt.Errorf("granted %v queued %v, want %v %v", r.Granted, r.Queued, o.granted, o.queued)
	case o.queued && o.position >= 0 && r.Position != o.position:
		return fmt.Errorf("position %d, want %d", r.Position, o.position)
	case o.granted && o.grants == nil && r.Token != o.token:
		return fmt.Errorf("token %d, want %d", r.Token, o.token)
	case o.granted && r.Mode != o.mode:
		return fmt.Errorf("mode %v, want %v", r.Mode, o.mode)
	case o.code == lt.CodeLockHeld && r.Holder != o.holder:
		return fmt.Errorf("lock_held names holder %q, want %q", r.Holder, o.holder)
	case r.Lock != o.lock:
		return fmt.Errorf("lock %q, want %q", r.Lock, o.lock)
	case o.events >= 0 && len(r.Events) != o.events:
		return fmt.Errorf("%d events, want %d", len(r.Events), o.events)
	case o.events < 0 && len(r.Events) == 0:
		return fmt.Errorf("no events")
	}
	var toks []uint64
	for _, g := range r.Grants {
		toks = append(toks, g.Token)
	}
	if !reflect.DeepEqual(toks, o.grants) {
		return fmt.Errorf("grants %v, want %v", toks, o.grants)
	}
	return nil
}

func (m *kModel) predictAcquire(c lt.Command) outcome {
	refused := func(code lt.Code) outcome { return outcome{code: code, position: -1} }
	if len(c.Locks) > 0 {
		return m.predictMulti(c)
	}
	if !validKinds(c) || c.Lock == "" {
		return refused(lt.CodeInvalid)
	}
	if c.SessionID != "" && !m.sessions[c.SessionID] {
		return refused(lt.CodeSessionExpired)
	}
	l := m.locks[c.Lock]
	if l != nil && l.mismatch(c.Mode, c.Limit) {
		o := refused(lt.CodeLimitMismatch)
		o.lock = c.Lock
		return o
	}
	if i := l.holder(c.ClientID); i >= 0 {
		h := l.holders[i]
		return outcome{granted: true, token: h.token, mode: h.mode, events: 1}
	}
	if i := l.waiter(c.ClientID); i >= 0 {
		if l.queue[i].locks != nil {
			o := refused(lt.CodeLockHeld)
			o.holder = l.first()
			return o
		}
		return outcome{queued: true, position: i, events: 1}
	}
	if l.freeFor(c.Mode) {
		return outcome{granted: true, token: m.maxToken + 1, mode: c.Mode, events: 1}
	}
	if c.WaitMs == 0 {
		o := refused(lt.CodeLockHeld)
		o.holder = l.first()
		return o
	}
	return outcome{queued: true, position: len(l.queue), events: 1}
}

func (m *kModel) predictMulti(c lt.Command) outcome {
	refused := func(code lt.Code, lock, holder string) outcome {
		return outcome{code: code, lock: lock, holder: holder, position: -1}
	}
	if !validKinds(c) || c.Lock != "" || c.Limit > 1 || !validSet(c.Locks) {
		return refused(lt.CodeInvalid, "", "")
	}
	if c.SessionID != "" && !m.sessions[c.SessionID] {
		return refused(lt.CodeSessionExpired, "", "")
	}
	for _, n := range c.Locks {
		if l := m.locks[n]; l != nil && l.limit > 1 {
			return refused(lt.CodeLimitMismatch, n, "")
		}
	}
	var held []uint64
	oneStep := true // the grants are one multi-acquire's of this mode
	var prev *kHolder
	for _, n := range c.Locks {
		if l := m.locks[n]; l.holder(c.ClientID) >= 0 {
			h := &l.holders[l.holder(c.ClientID)]
			if h.mode != c.Mode || (prev != nil && (h.token != prev.token+1 || h.grantedAt != prev.grantedAt)) {
				oneStep = false
			}
			prev = h
			held = append(held, h.token)
		}
	}
	if len(held) == len(c.Locks) && !oneStep {
		return refused(lt.CodeLockHeld, c.Locks[0], c.ClientID)
	}
	if len(held) == len(c.Locks) {
		return outcome{granted: true, mode: c.Mode, grants: held, events: len(c.Locks), position: -1}
	}
	for _, n := range c.Locks {
		if len(held) > 0 && m.locks[n].holder(c.ClientID) >= 0 {
			return refused(lt.CodeLockHeld, n, c.ClientID)
		}
	}
	waiting := 0
	for _, n := range c.Locks {
		l := m.locks[n]
		if i := l.waiter(c.ClientID); i >= 0 {
			if !slices.Equal(l.queue[i].locks, c.Locks) {
				return refused(lt.CodeLockHeld, n, l.first())
			}
			waiting++
		}
	}
	if waiting > 0 {
		return outcome{queued: true, position: -1, events: len(c.Locks)}
	}
	for _, n := range c.Locks {
		if l := m.locks[n]; !l.freeFor(c.Mode) {
			if c.WaitMs == 0 {
				return refused(lt.CodeLockHeld, n, l.first())
			}
			return outcome{queued: true, position: -1, events: -1, mayGrant: true}
		}
	}
	var toks []uint64
	for i := range c.Locks {
		toks = append(toks, m.maxToken+1+uint64(i))
	}
	return outcome{granted: true, mode: c.Mode, grants: toks, events: len(c.Locks), position: -1}
}

// predict checks the result of one (non-batch) command.
func (m *kModel) predict(c lt.Command, r lt.Result) error {
	plain := func(code lt.Code, events bool) error {
		if r.Code != code {
			return fmt.Errorf("code %v, want %v", r.Code, code)
		}
		if events != (len(r.Events) > 0) {
			return fmt.Errorf("events %+v, want some: %v", r.Events, events)
		}
		return nil
	}
	now := c.Now
	holderOf := func(lock, client string, tok uint64) *kHolder {
		l := m.locks[lock]
		if i := l.holder(client); i >= 0 && l.holders[i].token == tok {
			return &l.holders[i]
		}
		return nil
	}
	switch c.Op {
	case lt.OpAcquire:
		return m.predictAcquire(c).check(r)
	case lt.OpRelease:
		if h := holderOf(c.Lock, c.ClientID, c.Token); h != nil {
			if err := plain(lt.OK, true); err != nil {
				return err
			}
			if r.Token != c.Token || r.Events[0].Kind != lt.EvReleased {
				return fmt.Errorf("release: want token %d and the release first", c.Token)
			}
			return nil
		}
		if who, ok := m.released[memoKey{c.Lock, c.Token}]; ok && who == c.ClientID {
			return plain(lt.OK, false)
		}
		return plain(lt.CodeNotHolder, false)
	case lt.OpRenew:
		h := holderOf(c.Lock, c.ClientID, c.Token)
		if h == nil {
			return plain(lt.CodeNotHolder, false)
		}
		ttl := h.ttl
		if c.TTLms > 0 {
			ttl = c.TTLms
		}
		if err := plain(lt.OK, true); err != nil {
			return err
		}
		if r.ExpiresAt != expiryOf(now, ttl) || r.Mode != h.mode {
			return fmt.Errorf("renew: expiry %d mode %v, want %d %v", r.ExpiresAt, r.Mode, expiryOf(now, ttl), h.mode)
		}
	case lt.OpSetValue:
		if len(c.Value) > lt.MaxValueBytes {
			return plain(lt.CodeInvalid, false)
		}
		if holderOf(c.Lock, c.ClientID, c.Token) == nil {
			return plain(lt.CodeNotHolder, false)
		}
		return plain(lt.OK, true)
	case lt.OpExpireLock:
		l := m.locks[c.Lock]
		for _, h := range l.holdersOrNil() {
			if h.token == c.Token && h.expiresAt != 0 && h.expiresAt <= now {
				if err := plain(lt.OK, true); err != nil {
					return err
				}
				if r.Token != h.token || r.Events[0].Kind != lt.EvLost {
					return fmt.Errorf("expiry: want the grant lost first")
				}
				return nil
			}
		}
		return plain(lt.OK, false)
	case lt.OpRevoke:
		l := m.locks[c.Lock]
		var want []uint64
		for _, h := range l.holdersOrNil() {
			if c.Token == 0 || h.token == c.Token {
				want = append(want, h.token)
			}
		}
		if c.Token != 0 && len(want) == 0 {
			return plain(lt.CodeNotHolder, false)
		}
		if err := plain(lt.OK, len(want) > 0); err != nil {
			return err
		}
		if r.Tokens == nil || !slices.Equal(r.Tokens, want) {
			return fmt.Errorf("revoked %v, want %v", r.Tokens, want)
		}
	case lt.OpEndDelay:
		l := m.locks[c.Lock]
		return plain(lt.OK, l != nil && l.delayedUntil != 0 && l.delayedUntil <= now)
	case lt.OpTimeoutWaiter:
		l := m.locks[c.Lock]
		i := l.waiter(c.ClientID)
		return plain(lt.OK, i >= 0 && l.queue[i].deadline <= now)
	case lt.OpCancel:
		// Only the client's own wait, named as it was made: one lock's
		// by that lock, a multi-acquire's by its names.
		name := c.Lock
		if len(c.Locks) > 0 {
			name = c.Locks[0]
		}
		l := m.locks[name]
		i := l.waiter(c.ClientID)
		want := i >= 0 && slices.Equal(l.queue[i].locks, c.Locks)
		if err := plain(lt.OK, want); err != nil {
			return err
		}
		if r.Cancelled != want {
			return fmt.Errorf("cancelled %v, want %v", r.Cancelled, want)
		}
	case lt.OpCreateSession:
		switch {
		case c.SessionID == "" || c.TTLms <= 0:
			return plain(lt.CodeInvalid, false)
		case m.sessions[c.SessionID]:
			return plain(lt.OK, false)
		default:
			return plain(lt.OK, true)
		}
	case lt.OpDeleteSession, lt.OpExpireSession:
		if !m.sessions[c.SessionID] {
			if c.Op == lt.OpDeleteSession {
				return plain(lt.CodeSessionExpired, false)
			}
			return plain(lt.OK, false)
		}
		if err := plain(lt.OK, true); err != nil {
			return err
		}
		if last := r.Events[len(r.Events)-1]; last.Kind != lt.EvSessionEnded {
			return fmt.Errorf("session end: last event %+v", last)
		}
	default:
		return plain(lt.CodeInvalid, false)
	}
	return nil
}

func (l *kLock) holdersOrNil() []kHolder {
	if l == nil {
		return nil
	}
	return l.holders
}

// kStep is what folding one command's events keeps track of.
type kStep struct {
	c      lt.Command
	ending string // the session the command ends, if any
	// expectDelay is the lock-delay the last loss must start now (the next
	// event must be its EvDelayed).
	expectDelay *lt.Event
	// Multi-acquire events by request ("kind client locks"): the locks
	// each covered, which must be all of them.
	multi map[string][]string
}

func (m *kModel) step(c lt.Command, r lt.Result) error {
	if c.Op == lt.OpBatch {
		if r.Code != lt.OK || len(r.Events) != 0 || len(r.Batch) != len(c.Batch) {
			return fmt.Errorf("batch result %+v", r)
		}
		for i, sub := range c.Batch {
			if err := m.step(sub, r.Batch[i]); err != nil {
				return fmt.Errorf("batch[%d] %v: %w", i, describe(sub), err)
			}
		}
		return nil
	}
	if c.Op == lt.OpAcquire && c.Token != 0 && len(c.Locks) == 0 {
		return m.handOff(c, r)
	}
	if err := m.predict(c, r); err != nil {
		return fmt.Errorf("%w (result %+v)", err, r)
	}
	s := &kStep{c: c, multi: map[string][]string{}}
	if (c.Op == lt.OpDeleteSession || c.Op == lt.OpExpireSession) && m.sessions[c.SessionID] {
		s.ending = c.SessionID
		delete(m.sessions, s.ending) // gone before anything is handed off
	}
	for i, ev := range r.Events {
		if s.expectDelay != nil {
			if ev.Kind != lt.EvDelayed || ev.Lock != s.expectDelay.Lock || ev.ExpiresAt != s.expectDelay.ExpiresAt {
				return fmt.Errorf("event %d %+v: want the lock-delay %+v first", i, ev, *s.expectDelay)
			}
			s.expectDelay = nil
			m.locks[ev.Lock].delayedUntil = ev.ExpiresAt
			continue
		}
		if err := m.fold(s, ev); err != nil {
			return fmt.Errorf("event %d %+v: %w", i, ev, err)
		}
	}
	if s.expectDelay != nil {
		return fmt.Errorf("a loss did not start its lock-delay %+v", *s.expectDelay)
	}
	for k, got := range s.multi {
		want := strings.Fields(k)[2]
		if sort.Strings(got); strings.Join(got, ",") != want {
			return fmt.Errorf("multi-acquire not all-or-nothing: %s covered only %v", k, got)
		}
	}
	for name, l := range m.locks {
		if len(l.holders) == 0 && len(l.queue) == 0 && l.delayedUntil == 0 {
			delete(m.locks, name)
		}
	}
	return nil
}

// handOff checks an acquire that releases the client's grant c.Token first
// (one step) as that release followed by that acquire: the acquire's one
// event (granted or queued, for the client, when it makes one) comes last;
// everything before it is the release's (the release itself and what the
// queue hands on).
func (m *kModel) handOff(c lt.Command, r lt.Result) error {
	ev := r.Events
	var acqEv []lt.Event
	if n := len(ev); n > 0 && (r.Granted || r.Queued) {
		if last := ev[n-1]; (last.Kind == lt.EvGranted || last.Kind == lt.EvQueued) && last.ClientID == c.ClientID && last.Lock == c.Lock {
			ev, acqEv = ev[:n-1], ev[n-1:]
		}
	}
	rel := lt.Command{Op: lt.OpRelease, Now: c.Now, Lock: c.Lock, ClientID: c.ClientID, Token: c.Token, Owner: c.Owner}
	relRes := lt.Result{Code: lt.CodeNotHolder, Events: ev}
	if r.Released {
		relRes.Code, relRes.Token = lt.OK, c.Token
	}
	if err := m.step(rel, relRes); err != nil {
		return fmt.Errorf("hand-off's release: %w", err)
	}
	acq := c
	acq.Token = 0
	acqRes := r
	acqRes.Released, acqRes.Events = false, acqEv
	if err := m.step(acq, acqRes); err != nil {
		return fmt.Errorf("hand-off's acquire: %w", err)
	}
	return nil
}

// refusedChangedNothing checks a resource_exhausted refusal: nothing
// changed, but for a hand-off whose release stands on its own (only its
// acquire was refused, and nothing of that may show).
func refusedChangedNothing(c lt.Command, r lt.Result, before []byte, tb *lt.Table) error {
	if r.Released {
		for _, ev := range r.Events {
			if (ev.Kind == lt.EvGranted || ev.Kind == lt.EvQueued) && ev.ClientID == c.ClientID {
				return fmt.Errorf("refused, yet the acquire made %+v", ev)
			}
		}
		return nil
	}
	if len(r.Events) != 0 || !bytes.Equal(before, tb.Snapshot()) {
		return fmt.Errorf("refused, yet the table changed")
	}
	return nil
}

// covers reports whether c is an acquire by client naming lock.
func covers(c lt.Command, client, lock string) bool {
	return c.Op == lt.OpAcquire && c.ClientID == client && (c.Lock == lock || slices.Contains(c.Locks, lock))
}

// newcomerLock returns the lock an acquire adds to, made with the size the
// acquire gives, or resized when it has neither holders nor waiters.
func (m *kModel) newcomerLock(c lt.Command, name string) *kLock {
	l := m.locks[name]
	if l == nil {
		l = &kLock{limit: 1}
		m.locks[name] = l
	}
	if len(c.Locks) == 0 && c.Limit != 0 && len(l.holders) == 0 && len(l.queue) == 0 {
		l.limit = max(1, c.Limit)
	}
	return l
}

func (m *kModel) fold(s *kStep, ev lt.Event) error {
	c, now := s.c, s.c.Now
	l := m.locks[ev.Lock]
	multiKey := func(kind string) {
		if ev.Locks != nil {
			k := kind + " " + ev.ClientID + " " + strings.Join(ev.Locks, ",")
			s.multi[k] = append(s.multi[k], ev.Lock)
		}
	}
	switch ev.Kind {
	case lt.EvGranted:
		if ev.Reason == lt.ReasonRegrant {
			i := l.holder(ev.ClientID)
			if i < 0 || l.holders[i].token != ev.Token || !covers(c, ev.ClientID, ev.Lock) {
				return fmt.Errorf("re-grant of a grant the caller does not hold")
			}
			h := &l.holders[i]
			if c.TTLms > 0 {
				h.ttl = c.TTLms
			}
			h.expiresAt = expiryOf(now, h.ttl)
			if ev.TTLms != h.ttl || ev.ExpiresAt != h.expiresAt || ev.Mode != h.mode || !slices.Equal(ev.Locks, c.Locks) {
				return fmt.Errorf("re-grant: want ttl %d expiring at %d, mode %v", h.ttl, h.expiresAt, h.mode)
			}
			multiKey("regrant")
			return nil
		}
		if ev.Token <= m.maxToken {
			return fmt.Errorf("token %d not above every earlier token (%d)", ev.Token, m.maxToken)
		}
		m.maxToken = ev.Token
		var h kHolder
		if i := l.waiter(ev.ClientID); i >= 0 {
			w := l.queue[0]
			switch {
			case i != 0:
				return fmt.Errorf("FIFO: granted to the waiter at position %d", i)
			case now >= w.deadline:
				return fmt.Errorf("waiter granted at %d, its deadline was %d", now, w.deadline)
			case w.session != "" && !m.sessions[w.session]:
				return fmt.Errorf("waiter of ended session %q granted", w.session)
			case w.session != ev.SessionID || w.mode != ev.Mode || !slices.Equal(w.locks, ev.Locks) ||
				w.ttl != ev.TTLms || w.value != ev.Value:
				return fmt.Errorf("grant does not match the waiter %+v", w)
			}
			h = kHolder{client: w.client, session: w.session, mode: w.mode, ttl: w.ttl, delay: w.delay, value: w.value, grantedAt: now}
			l.queue = l.queue[1:]
		} else {
			if !covers(c, ev.ClientID, ev.Lock) {
				return fmt.Errorf("granted to %q, who neither asked now nor waited", ev.ClientID)
			}
			if !l.freeFor(c.Mode) {
				return fmt.Errorf("a newcomer granted a lock not free for newcomers")
			}
			if c.SessionID != ev.SessionID || c.Mode != ev.Mode || !slices.Equal(c.Locks, ev.Locks) ||
				c.TTLms != ev.TTLms || c.Value != ev.Value {
				return fmt.Errorf("grant does not match the acquire")
			}
			l = m.newcomerLock(c, ev.Lock)
			h = kHolder{client: c.ClientID, session: c.SessionID, mode: c.Mode, ttl: c.TTLms, delay: c.DelayMs, value: c.Value, grantedAt: now}
		}
		switch {
		case l.delayedUntil != 0:
			return fmt.Errorf("granted during a lock-delay (until %d)", l.delayedUntil)
		case s.ending != "" && slices.ContainsFunc(l.holders, func(h kHolder) bool { return h.session == s.ending }):
			// The session ended at the start of the step: its grants end
			// (and start their lock-delays) before anything is handed on.
			return fmt.Errorf("handed on beside a grant of the ended session %q", s.ending)
		case !l.canHold(ev.Mode):
			return fmt.Errorf("a %v grant beside holders %+v (limit %d)", ev.Mode, l.holders, l.limit)
		case ev.SessionID != "" && !m.sessions[ev.SessionID]:
			return fmt.Errorf("granted through ended session %q", ev.SessionID)
		case ev.ExpiresAt != expiryOf(now, ev.TTLms):
			return fmt.Errorf("expiry %d, want %d", ev.ExpiresAt, expiryOf(now, ev.TTLms))
		}
		h.token, h.expiresAt = ev.Token, ev.ExpiresAt
		l.holders = append(l.holders, h)
		multiKey("grant")
	case lt.EvQueued:
		if !covers(c, ev.ClientID, ev.Lock) || c.WaitMs < 0 {
			return fmt.Errorf("queued without an acquire")
		}
		if i := l.waiter(ev.ClientID); i >= 0 {
			w := &l.queue[i]
			if c.WaitMs > 0 {
				w.deadline = now + c.WaitMs
				if c.TTLms > 0 {
					w.ttl = c.TTLms
				}
			}
			if ev.Deadline != w.deadline || !slices.Equal(ev.Locks, w.locks) || ev.Mode != w.mode {
				return fmt.Errorf("retry: want deadline %d, locks %v", w.deadline, w.locks)
			}
			multiKey("requeue")
			return nil
		}
		if c.WaitMs == 0 || ev.Deadline != now+c.WaitMs || ev.SessionID != c.SessionID || ev.Mode != c.Mode ||
			!slices.Equal(ev.Locks, c.Locks) {
			return fmt.Errorf("queued event does not match the acquire")
		}
		if len(c.Locks) == 0 && l.freeFor(c.Mode) {
			return fmt.Errorf("queued on a lock free for it")
		}
		l = m.newcomerLock(c, ev.Lock)
		l.queue = append(l.queue, kWaiter{client: c.ClientID, session: c.SessionID, mode: c.Mode, ttl: c.TTLms,
			deadline: ev.Deadline, delay: c.DelayMs, value: c.Value, locks: slices.Clone(c.Locks)})
		multiKey("queue")
	case lt.EvRenewed:
		i := l.holder(ev.ClientID)
		if c.Op != lt.OpRenew || i < 0 || l.holders[i].token != ev.Token || c.Token != ev.Token {
			return fmt.Errorf("renewed a grant that is not the caller's")
		}
		h := &l.holders[i]
		if c.TTLms > 0 {
			h.ttl = c.TTLms
		}
		h.expiresAt = expiryOf(now, h.ttl)
		if ev.ExpiresAt != h.expiresAt || ev.TTLms != h.ttl {
			return fmt.Errorf("renewed to %d, want %d", ev.ExpiresAt, h.expiresAt)
		}
	case lt.EvReleased:
		i := l.holder(ev.ClientID)
		if c.Op != lt.OpRelease || i < 0 || l.holders[i].token != ev.Token || c.Token != ev.Token || c.ClientID != ev.ClientID {
			return fmt.Errorf("released a grant that is not the caller's")
		}
		l.holders = slices.Delete(l.holders, i, i+1)
		m.released[memoKey{ev.Lock, ev.Token}] = ev.ClientID
	case lt.EvLost:
		i := slices.IndexFunc(l.holdersOrNil(), func(h kHolder) bool { return h.token == ev.Token })
		if i < 0 || l.holders[i].client != ev.ClientID || l.holders[i].session != ev.SessionID {
			return fmt.Errorf("lost a grant nobody holds")
		}
		h := l.holders[i]
		delays := true
		switch ev.Reason {
		case lt.ReasonExpired:
			if c.Op != lt.OpExpireLock || c.Token != h.token || h.expiresAt == 0 || now < h.expiresAt {
				return fmt.Errorf("expired early or without its timer (expires at %d)", h.expiresAt)
			}
		case lt.ReasonSessionExpired:
			if s.ending == "" || h.session != s.ending {
				return fmt.Errorf("lost to a session that did not end")
			}
			delays = c.Op == lt.OpExpireSession // a delete is an explicit release
		case lt.ReasonRevoked:
			if c.Op != lt.OpRevoke || c.Lock != ev.Lock || (c.Token != 0 && c.Token != h.token) {
				return fmt.Errorf("revoked without a revoke of it")
			}
		default:
			return fmt.Errorf("reason %q", ev.Reason)
		}
		l.holders = slices.Delete(l.holders, i, i+1)
		if delays && h.delay > 0 && now+h.delay > l.delayedUntil {
			s.expectDelay = &lt.Event{Kind: lt.EvDelayed, Lock: ev.Lock, ExpiresAt: now + h.delay}
		}
	case lt.EvDelayed: // step takes the expected ones
		return fmt.Errorf("a lock-delay without a loss that starts it")
	case lt.EvDelayEnded:
		if c.Op != lt.OpEndDelay || c.Lock != ev.Lock || l == nil || l.delayedUntil == 0 || l.delayedUntil > now {
			return fmt.Errorf("delay ended early or without its timer")
		}
		l.delayedUntil = 0
	case lt.EvValueSet:
		i := l.holder(ev.ClientID)
		if c.Op != lt.OpSetValue || i < 0 || l.holders[i].token != ev.Token || c.Token != ev.Token || ev.Value != c.Value {
			return fmt.Errorf("value set on a grant that is not the caller's")
		}
		l.holders[i].value = c.Value
	case lt.EvWaitEnded:
		i := l.waiter(ev.ClientID)
		if i < 0 {
			return fmt.Errorf("wait ended for a client not waiting")
		}
		w := l.queue[i]
		switch ev.Reason {
		case lt.ReasonWaitTimeout:
			if now < w.deadline {
				return fmt.Errorf("wait ended at %d before its deadline %d", now, w.deadline)
			}
		case lt.ReasonSessionExpired:
			if w.session == "" || m.sessions[w.session] {
				return fmt.Errorf("wait ended for a live session")
			}
		case lt.ReasonCancelled:
			if c.Op != lt.OpCancel || c.ClientID != ev.ClientID || !slices.Equal(c.Locks, w.locks) {
				return fmt.Errorf("wait ended as cancelled without its client's cancel")
			}
		default:
			return fmt.Errorf("reason %q", ev.Reason)
		}
		if ev.Deadline != w.deadline || !slices.Equal(ev.Locks, w.locks) || ev.Mode != w.mode {
			return fmt.Errorf("wait ended does not name the wait %+v", w)
		}
		l.queue = slices.Delete(l.queue, i, i+1)
		multiKey("wait_ended")
	case lt.EvSessionCreated:
		if c.Op != lt.OpCreateSession || ev.SessionID != c.SessionID || m.sessions[ev.SessionID] {
			return fmt.Errorf("session created twice or without a command")
		}
		m.sessions[ev.SessionID] = true
	case lt.EvSessionEnded:
		if s.ending == "" || ev.SessionID != s.ending {
			return fmt.Errorf("session ended without its command")
		}
	default:
		return fmt.Errorf("unknown event kind")
	}
	return nil
}

// agree checks that the table reads exactly as the model says.
func (m *kModel) agree(tb *lt.Table, u universe) error {
	names := map[string]bool{}
	for _, li := range tb.List("", 0) {
		names[li.Name] = true
	}
	for n := range m.locks {
		names[n] = true
	}
	for n := range names {
		li, l := tb.Get(n), m.locks[n]
		if l == nil {
			return fmt.Errorf("lock %q: table %+v, the model has none", n, li)
		}
		var hs []kHolder
		for _, h := range li.Holders {
			hs = append(hs, kHolder{client: h.ClientID, session: h.SessionID, token: h.Token, mode: h.Mode,
				ttl: h.TTLms, expiresAt: h.ExpiresAt, delay: h.DelayMs, value: h.Value, grantedAt: h.GrantedAt})
		}
		var ws []kWaiter
		for _, w := range tb.Waiters(n) {
			ws = append(ws, kWaiter{client: w.ClientID, session: w.SessionID, mode: w.Mode, ttl: w.TTLms,
				deadline: w.Deadline, delay: w.DelayMs, value: w.Value, locks: w.Locks})
		}
		if !reflect.DeepEqual(hs, nilIfEmpty(l.holders)) {
			return fmt.Errorf("lock %q: holders %+v, model %+v", n, hs, l.holders)
		}
		if !reflect.DeepEqual(ws, nilIfEmpty(l.queue)) {
			return fmt.Errorf("lock %q: queue %+v, model %+v", n, ws, l.queue)
		}
		if li.Limit != l.limit || li.DelayedUntil != l.delayedUntil {
			return fmt.Errorf("lock %q: limit %d delayed until %d, model %d %d", n, li.Limit, li.DelayedUntil, l.limit, l.delayedUntil)
		}
	}
	if tb.LastToken() != m.maxToken {
		return fmt.Errorf("LastToken %d, highest token issued %d", tb.LastToken(), m.maxToken)
	}
	for _, id := range u.sessions {
		if _, ok := tb.Session(id); ok != m.sessions[id] {
			return fmt.Errorf("session %q: exists %v, model %v", id, ok, m.sessions[id])
		}
	}
	return nil
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// live checks that no lock is left with a waiter it could grant now: for
// every lock not delayed, a live head that fits beside the holders is a
// multi-acquire still waiting for another of its locks.
func (m *kModel) live(now int64) error {
	for name, l := range m.locks {
		if l.delayedUntil != 0 || len(l.queue) == 0 {
			continue
		}
		w := l.queue[0]
		if now >= w.deadline || (w.session != "" && !m.sessions[w.session]) || !l.canHold(w.mode) {
			continue // dead heads wait for their own timers
		}
		if w.locks == nil {
			return fmt.Errorf("lock %q: head waiter %q could be granted (holders %+v)", name, w.client, l.holders)
		}
		ready := true
		for _, n := range w.locks {
			o := m.locks[n]
			if o == nil || o.delayedUntil != 0 || len(o.queue) == 0 || o.queue[0].client != w.client || !o.canHold(w.mode) {
				ready = false
			}
		}
		if ready {
			return fmt.Errorf("multi-acquire %q of %v heads every queue and fits every lock, yet waits", w.client, w.locks)
		}
	}
	return nil
}

// lockViews is what the read API shows of every lock, index aside.
func lockViews(tb *lt.Table, names map[string]bool) map[string]any {
	out := map[string]any{}
	for n := range names {
		li := tb.Get(n)
		li.Index = 0
		out[n] = []any{li, tb.Waiters(n)}
	}
	return out
}

// checkIndexes: every lock whose status changed in the step applied at idx
// reads idx as its index; the others keep theirs (or read idx).
func checkIndexes(tb *lt.Table, idx uint64, before map[string]any, beforeIdx map[string]uint64) error {
	names := map[string]bool{}
	for n := range before {
		names[n] = true
	}
	for _, li := range tb.List("", 0) {
		names[li.Name] = true
	}
	after := lockViews(tb, names)
	for n := range names {
		got := tb.Get(n).Index
		if got > idx {
			return fmt.Errorf("lock %q: index %d beyond the applied %d", n, got, idx)
		}
		if !reflect.DeepEqual(before[n], after[n]) {
			if got != idx {
				return fmt.Errorf("lock %q changed at index %d but reads index %d", n, idx, got)
			}
		} else if old, ok := beforeIdx[n]; ok && got != old && got != idx {
			return fmt.Errorf("lock %q unchanged, index %d -> %d", n, old, got)
		}
	}
	return nil
}

func allNames(tb *lt.Table, u universe) map[string]bool {
	names := map[string]bool{}
	for _, n := range u.locks {
		names[n] = true
	}
	for _, li := range tb.List("", 0) {
		names[li.Name] = true
	}
	return names
}

func TestPropertyKinds(t *testing.T) {
	stats := map[string]int{}
	t.Run("wide", func(t *testing.T) { rapid.Check(t, func(t *rapid.T) { propertyKinds(t, wide, stats) }) })
	t.Run("tight", func(t *testing.T) { rapid.Check(t, func(t *rapid.T) { propertyKinds(t, tight, stats) }) })
	// The generator must reach what the properties are about.
	for _, k := range []string{"shared grant", "semaphore grant", "multi grant", "multi queued", "multi lock_held",
		"limit_mismatch", "delayed", "delay ended with a grant", "revoked", "value set", "multi wait ended",
		"multi hand-off", "lock_held by nobody"} {
		if stats[k] == 0 {
			t.Errorf("no %s in any run: the generator misses it (%v)", k, stats)
		}
	}
}

func propertyKinds(t *rapid.T, u universe, stats map[string]int) {
	tb := lt.New()
	m := newKModel()
	g := &kgen{tb: tb, now: t0, u: u}
	n := rapid.IntRange(30, 200).Draw(t, "steps")
	restoreAt := rapid.IntRange(0, n).Draw(t, "restoreAt")
	var clone *lt.Table
	for i := 0; i < n; i++ {
		idx := uint64(i + 1)
		if i == restoreAt {
			var err error
			if clone, err = lt.Restore(tb.Snapshot()); err != nil {
				t.Fatalf("restore at step %d: %v", i, err)
			}
		}
		g.advance(t)
		c := g.command(t, true)
		before := lockViews(tb, allNames(tb, u))
		beforeIdx := map[string]uint64{}
		for _, li := range tb.List("", 0) {
			beforeIdx[li.Name] = li.Index
		}
		prev := tb.LastToken()
		r := tb.ApplyAt(idx, c)
		if err := m.step(c, r); err != nil {
			t.Fatalf("step %d %v: %v", i, describe(c), err)
		}
		if err := m.agree(tb, u); err != nil {
			t.Fatalf("step %d %v: %v", i, describe(c), err)
		}
		if err := m.live(g.now); err != nil {
			t.Fatalf("step %d %v: liveness: %v", i, describe(c), err)
		}
		if err := checkTable(tb, prev); err != nil {
			t.Fatalf("step %d %v: %v", i, describe(c), err)
		}
		if err := checkIndexes(tb, idx, before, beforeIdx); err != nil {
			t.Fatalf("step %d %v: %v", i, describe(c), err)
		}
		if clone != nil {
			if r2 := clone.ApplyAt(idx, c); !reflect.DeepEqual(r, r2) {
				t.Fatalf("step %d %v: restored table answers differently\n orig     %+v\n restored %+v", i, describe(c), r, r2)
			}
			if !bytes.Equal(tb.Snapshot(), clone.Snapshot()) {
				t.Fatalf("step %d %v: restored table diverged", i, describe(c))
			}
		}
		countKinds(stats, c, r)
	}
}

// countKinds tallies what a step exercised.
func countKinds(stats map[string]int, c lt.Command, r lt.Result) {
	if c.Op == lt.OpBatch {
		for i, sub := range c.Batch {
			countKinds(stats, sub, r.Batch[i])
		}
		return
	}
	if c.Op == lt.OpAcquire && len(c.Locks) > 0 {
		stats["multi "+r.Code.String()]++
		switch {
		case r.Granted:
			stats["multi grant"]++
		case r.Queued:
			stats["multi queued"]++
		case r.Code == lt.CodeLockHeld:
			stats["multi lock_held"]++
		}
	}
	if r.Code == lt.CodeLockHeld && r.Holder == "" {
		stats["lock_held by nobody"]++
	}
	if r.Code == lt.CodeLimitMismatch {
		stats["limit_mismatch"]++
	}
	for i, e := range r.Events {
		switch {
		case e.Kind == lt.EvGranted && e.Mode == lt.Shared:
			stats["shared grant"]++
		case e.Kind == lt.EvGranted && c.Limit > 1:
			stats["semaphore grant"]++
		case e.Kind == lt.EvDelayed:
			stats["delayed"]++
		case e.Kind == lt.EvDelayEnded && i+1 < len(r.Events) && r.Events[i+1].Kind == lt.EvGranted:
			stats["delay ended with a grant"]++
		case e.Kind == lt.EvLost && e.Reason == lt.ReasonRevoked:
			stats["revoked"]++
		case e.Kind == lt.EvValueSet:
			stats["value set"]++
		case e.Kind == lt.EvWaitEnded && e.Locks != nil:
			stats["multi wait ended"]++
		}
		if e.Kind == lt.EvGranted && e.Locks != nil && e.Reason == "" && !covers(c, e.ClientID, e.Lock) {
			stats["multi hand-off"]++
		}
	}
}

// TestPropertyKindsDeterministic: one random log of every kind of command,
// applied to two fresh tables, gives the same results and byte-identical
// snapshots (and the same as the table that guided the generator).
func TestPropertyKindsDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		guide := lt.New()
		g := &kgen{tb: guide, now: t0, u: wide}
		if rapid.Bool().Draw(t, "tight") {
			g.u = tight
		}
		var log []lt.Command
		for i, n := 0, rapid.IntRange(30, 300).Draw(t, "steps"); i < n; i++ {
			g.advance(t)
			c := g.command(t, true)
			guide.ApplyAt(uint64(i+1), c)
			log = append(log, c)
		}
		a, b := lt.New(), lt.New()
		for i, c := range log {
			if ra, rb := a.ApplyAt(uint64(i+1), c), b.ApplyAt(uint64(i+1), c); !reflect.DeepEqual(ra, rb) {
				t.Fatalf("step %d %v: %+v vs %+v", i, describe(c), ra, rb)
			}
		}
		if sa, sb := a.Snapshot(), b.Snapshot(); !bytes.Equal(sa, sb) || !bytes.Equal(sa, guide.Snapshot()) {
			t.Fatal("the same log gave different snapshots")
		}
	})
}

// TestPropertyKindsQuotaCounters: the lock kinds' commands with owners and
// small quotas: after every command the quota counters equal a recount
// of the table, a refusal changes nothing, and no acquire grows a count
// past the quota it carries (a multi-acquire none of its locks' queues).
func TestPropertyKindsQuotaCounters(t *testing.T) {
	refusals := 0
	rapid.Check(t, func(t *rapid.T) {
		tb := lt.New()
		g := &kgen{tb: tb, now: t0, u: wide}
		og := &gen{}
		for i, n := 0, rapid.IntRange(30, 200).Draw(t, "steps"); i < n; i++ {
			g.advance(t)
			c := og.owned(t, g.command(t, true))
			before, snap := countsFor(tb, c), tb.Snapshot()
			waiters := map[string]int{}
			for _, l := range c.Locks {
				waiters[l] = len(tb.Waiters(l))
			}
			r := tb.ApplyAt(uint64(i+1), c)
			if err := lt.CheckCounters(tb); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			if c.Op == lt.OpBatch {
				continue
			}
			if err := grewPast(c, before, countsFor(tb, c)); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			for l, n := range waiters {
				if lim := c.Quotas.WaitersPerLock; lim > 0 && len(tb.Waiters(l)) > n && int64(len(tb.Waiters(l))) > lim {
					t.Fatalf("step %d %v: %d waiters on %s, past the quota %d", i, describe(c), len(tb.Waiters(l)), l, lim)
				}
			}
			if r.Code == lt.CodeResourceExhausted {
				refusals++
				if err := refusedChangedNothing(c, r, snap, tb); err != nil {
					t.Fatalf("step %d %v: %v", i, describe(c), err)
				}
			}
		}
		back, err := lt.Restore(tb.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := lt.CheckCounters(back); err != nil {
			t.Fatalf("restored: %v", err)
		}
	})
	if refusals == 0 {
		t.Fatal("no command was refused: the quotas never bit")
	}
}
