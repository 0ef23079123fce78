package locktable_test

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"

	lt "github.com/lockd/lockd/internal/locktable"
)

// The property tests drive the table with random command sequences over a
// small universe (so commands collide), with Now never going back, and check
// every result and event against a tiny reference model built only from
// what clients are told: a client believes it holds a lock from its grant
// until its release or loss. The model must agree with the table's read API
// after every command.

var (
	pLocks    = []string{"a", "b", "c"}
	pClients  = []string{"c1", "c2", "c3", "c4"}
	pSessions = []string{"s1", "s2"}
)

// gen draws commands, peeking at the table under test so that a good share
// of them hit the current holder, token, waiter or expiry.
type gen struct {
	tb  *lt.Table
	now int64
}

func (g *gen) advance(t *rapid.T) {
	g.now += rapid.SampledFrom([]int64{0, 0, 1, 10, 50, 100, 300, 1000, 3000}).Draw(t, "dt")
}

func (g *gen) token(t *rapid.T, lock string) uint64 {
	if rapid.IntRange(0, 2).Draw(t, "tokenKind") < 2 {
		return g.tb.Get(lock).Token // the current grant (0 when free)
	}
	return rapid.Uint64Range(0, g.tb.LastToken()+1).Draw(t, "token")
}

func (g *gen) client(t *rapid.T, lock string) string {
	if li := g.tb.Get(lock); li.Held && rapid.IntRange(0, 3).Draw(t, "holderClient") > 0 {
		return li.ClientID
	}
	return rapid.SampledFrom(pClients).Draw(t, "client")
}

func (g *gen) session(t *rapid.T, label string) string {
	return rapid.SampledFrom(append([]string{"", "", ""}, pSessions...)).Draw(t, label)
}

func (g *gen) command(t *rapid.T, allowBatch bool) lt.Command {
	top := 99
	if !allowBatch {
		top = 94
	}
	k := rapid.IntRange(0, top).Draw(t, "kind")
	lock := rapid.SampledFrom(pLocks).Draw(t, "lock")
	switch {
	case k < 30:
		return lt.Command{Op: lt.OpAcquire, Now: g.now, Lock: lock,
			ClientID:  rapid.SampledFrom(pClients).Draw(t, "client"),
			SessionID: g.session(t, "session"),
			TTLms:     rapid.SampledFrom([]int64{0, 100, 500, 1000, 5000}).Draw(t, "ttl"),
			WaitMs:    rapid.SampledFrom([]int64{0, 0, 50, 200, 1000, 5000}).Draw(t, "wait")}
	case k < 45:
		return rel(lock, g.client(t, lock), g.token(t, lock), g.now)
	case k < 53:
		return renew(lock, g.client(t, lock), g.token(t, lock),
			rapid.SampledFrom([]int64{0, 100, 1000}).Draw(t, "ttl"), g.now)
	case k < 65:
		if li := g.tb.Get(lock); li.ExpiresAt > g.now && rapid.Bool().Draw(t, "jumpToExpiry") {
			g.now = li.ExpiresAt + rapid.Int64Range(-1, 1).Draw(t, "skew")
		}
		return expLock(lock, g.token(t, lock), g.now)
	case k < 75:
		ws := sortedWaiters(g.tb)
		if len(ws) == 0 {
			return tmo(lock, rapid.SampledFrom(pClients).Draw(t, "client"), g.now)
		}
		w := rapid.SampledFrom(ws).Draw(t, "waiter")
		if w.Deadline > g.now && rapid.Bool().Draw(t, "jumpToDeadline") {
			g.now = w.Deadline + rapid.Int64Range(-1, 1).Draw(t, "skew")
		}
		return tmo(w.Lock, w.ClientID, g.now)
	case k < 82:
		return mkSess(rapid.SampledFrom(pSessions).Draw(t, "sid"), rapid.SampledFrom(pClients).Draw(t, "client"),
			rapid.SampledFrom([]int64{0, 1000, 15000, 15000}).Draw(t, "sttl"), g.now)
	case k < 86:
		return delSess(rapid.SampledFrom(slices.Concat(pSessions, []string{"s9"})).Draw(t, "sid"), g.now)
	case k < 91:
		return expSess(rapid.SampledFrom(slices.Concat(pSessions, []string{"s9"})).Draw(t, "sid"), g.now)
	case k < 93:
		return setMember(rapid.SampledFrom([]string{"", "m1", "m2"}).Draw(t, "member"),
			rapid.SampledFrom([]string{"r1", "r2"}).Draw(t, "raft"), "h", g.now)
	case k < 95:
		return rmMember(rapid.SampledFrom([]string{"m1", "m2", "m3"}).Draw(t, "member"), g.now)
	default:
		n := rapid.IntRange(1, 4).Draw(t, "batchLen")
		c := lt.Command{Op: lt.OpBatch}
		for i := 0; i < n; i++ {
			if rapid.IntRange(0, 20).Draw(t, "nested") == 0 {
				c.Batch = append(c.Batch, lt.Command{Op: lt.OpBatch, Now: g.now})
				continue
			}
			c.Batch = append(c.Batch, g.command(t, false))
		}
		c.Now = g.now
		return c
	}
}

type mHolder struct {
	client, session string
	token           uint64
	ttl, expiresAt  int64
}

type mWaiter struct {
	client, session string
	deadline        int64
}

type memoKey struct {
	lock  string
	token uint64
}

// model is what the clients, told only the results and events, know.
type model struct {
	holders  map[string]mHolder
	queues   map[string][]mWaiter
	sessions map[string]bool
	released map[memoKey]string // explicit releases: (lock, token) -> client
	members  map[string]lt.Member
	maxToken uint64
}

func newModel() *model {
	return &model{holders: map[string]mHolder{}, queues: map[string][]mWaiter{},
		sessions: map[string]bool{}, released: map[memoKey]string{}, members: map[string]lt.Member{}}
}

func expiryOf(now, ttl int64) int64 {
	if ttl <= 0 {
		return 0
	}
	return now + ttl
}

func (m *model) queuePos(lock, client string) int {
	return slices.IndexFunc(m.queues[lock], func(w mWaiter) bool { return w.client == client })
}

// step checks one command's result against the model, then folds its events
// into the model, checking each.
func (m *model) step(c lt.Command, r lt.Result) error {
	if c.Op == lt.OpBatch {
		if r.Code != lt.OK || len(r.Events) != 0 || len(r.Batch) != len(c.Batch) {
			return fmt.Errorf("batch result %+v", r)
		}
		for i, sub := range c.Batch {
			if sub.Op == lt.OpBatch {
				if r.Batch[i].Code != lt.CodeInvalid {
					return fmt.Errorf("batch[%d]: nested batch gave %v", i, r.Batch[i].Code)
				}
				continue
			}
			if err := m.step(sub, r.Batch[i]); err != nil {
				return fmt.Errorf("batch[%d] %v: %w", i, describe(sub), err)
			}
		}
		return nil
	}
	if err := m.predict(c, r); err != nil {
		return fmt.Errorf("%w (result %+v)", err, r)
	}
	return m.fold(c, r.Events)
}

// predict checks the result's code and values against what the model says
// the command must do.
func (m *model) predict(c lt.Command, r lt.Result) error {
	want := func(code lt.Code, events bool) error {
		if r.Code != code {
			return fmt.Errorf("code %v, want %v", r.Code, code)
		}
		if !events && len(r.Events) != 0 {
			return fmt.Errorf("unexpected events %+v", r.Events)
		}
		if events && len(r.Events) == 0 {
			return fmt.Errorf("no events")
		}
		return nil
	}
	now := c.Now
	switch c.Op {
	case lt.OpAcquire:
		if c.TTLms == 0 && c.SessionID == "" {
			return want(lt.CodeInvalid, false)
		}
		if c.SessionID != "" && !m.sessions[c.SessionID] {
			return want(lt.CodeSessionExpired, false)
		}
		h, held := m.holders[c.Lock]
		switch pos := m.queuePos(c.Lock, c.ClientID); {
		case held && h.client == c.ClientID:
			ttl := h.ttl
			if c.TTLms > 0 {
				ttl = c.TTLms
			}
			if err := want(lt.OK, true); err != nil {
				return err
			}
			if !r.Granted || r.Queued || r.Token != h.token || r.ExpiresAt != expiryOf(now, ttl) || len(r.Events) != 1 {
				return fmt.Errorf("holder re-acquire: want token %d expiring at %d", h.token, expiryOf(now, ttl))
			}
		case pos >= 0:
			if err := want(lt.OK, true); err != nil {
				return err
			}
			if !r.Queued || r.Granted || r.Position != pos || len(r.Events) != 1 {
				return fmt.Errorf("waiter retry: want queued at %d", pos)
			}
		case !held:
			if err := want(lt.OK, true); err != nil {
				return err
			}
			if !r.Granted || r.Queued || r.Token <= m.maxToken || r.ExpiresAt != expiryOf(now, c.TTLms) || len(r.Events) != 1 {
				return fmt.Errorf("acquire of a free lock: want a fresh grant")
			}
		case c.WaitMs == 0:
			if err := want(lt.CodeLockHeld, false); err != nil {
				return err
			}
			if r.Holder != h.client {
				return fmt.Errorf("lock_held names %q, holder is %q", r.Holder, h.client)
			}
		default:
			if err := want(lt.OK, true); err != nil {
				return err
			}
			if !r.Queued || r.Granted || r.Position != len(m.queues[c.Lock]) {
				return fmt.Errorf("want queued at the end (%d)", len(m.queues[c.Lock]))
			}
		}
	case lt.OpRelease:
		if h, held := m.holders[c.Lock]; held && h.client == c.ClientID && h.token == c.Token {
			if err := want(lt.OK, true); err != nil {
				return err
			}
			if r.Token != c.Token || r.Events[0].Kind != lt.EvReleased {
				return fmt.Errorf("release: want token %d and a release event first", c.Token)
			}
		} else if who, ok := m.released[memoKey{c.Lock, c.Token}]; ok && who == c.ClientID {
			if err := want(lt.OK, false); err != nil {
				return fmt.Errorf("retried release: %w", err)
			}
			if r.Token != c.Token {
				return fmt.Errorf("retried release: token %d", r.Token)
			}
		} else {
			return want(lt.CodeNotHolder, false)
		}
	case lt.OpRenew:
		h, held := m.holders[c.Lock]
		if !held || h.client != c.ClientID || h.token != c.Token {
			return want(lt.CodeNotHolder, false)
		}
		ttl := h.ttl
		if c.TTLms > 0 {
			ttl = c.TTLms
		}
		if err := want(lt.OK, true); err != nil {
			return err
		}
		if r.Token != h.token || r.ExpiresAt != expiryOf(now, ttl) || len(r.Events) != 1 {
			return fmt.Errorf("renew: want expiry %d", expiryOf(now, ttl))
		}
	case lt.OpExpireLock:
		h, held := m.holders[c.Lock]
		if !held || h.token != c.Token || h.expiresAt == 0 || h.expiresAt > now {
			return want(lt.OK, false) // stale, early or duplicate: ignored
		}
		if err := want(lt.OK, true); err != nil {
			return err
		}
		if r.Token != h.token || r.Events[0].Kind != lt.EvLost {
			return fmt.Errorf("expiry: want the grant lost first")
		}
	case lt.OpTimeoutWaiter:
		pos := m.queuePos(c.Lock, c.ClientID)
		if pos < 0 || m.queues[c.Lock][pos].deadline > now {
			return want(lt.OK, false)
		}
		if err := want(lt.OK, true); err != nil {
			return err
		}
		if len(r.Events) != 1 || r.Events[0].Kind != lt.EvWaitEnded {
			return fmt.Errorf("timeout: want exactly the wait ended")
		}
	case lt.OpCreateSession:
		switch {
		case c.SessionID == "" || c.TTLms <= 0:
			return want(lt.CodeInvalid, false)
		case m.sessions[c.SessionID]:
			return want(lt.OK, false)
		default:
			return want(lt.OK, true)
		}
	case lt.OpDeleteSession, lt.OpExpireSession:
		if !m.sessions[c.SessionID] {
			if c.Op == lt.OpDeleteSession {
				return want(lt.CodeSessionExpired, false)
			}
			return want(lt.OK, false)
		}
		if err := want(lt.OK, true); err != nil {
			return err
		}
		if last := r.Events[len(r.Events)-1]; last.Kind != lt.EvSessionEnded {
			return fmt.Errorf("session end: last event %+v", last)
		}
	case lt.OpSetMember:
		if c.MemberID == "" {
			return want(lt.CodeInvalid, false)
		}
		m.members[c.MemberID] = lt.Member{ID: c.MemberID, RaftAddr: c.RaftAddr, HTTPAddr: c.HTTPAddr}
		return want(lt.OK, false)
	case lt.OpRemoveMember:
		delete(m.members, c.MemberID)
		return want(lt.OK, false)
	default:
		return want(lt.CodeInvalid, false)
	}
	return nil
}

// fold applies one command's events to the model, checking that each is
// something that may happen now.
func (m *model) fold(c lt.Command, evs []lt.Event) error {
	now := c.Now
	ending := ""
	if (c.Op == lt.OpDeleteSession || c.Op == lt.OpExpireSession) && m.sessions[c.SessionID] {
		ending = c.SessionID
		delete(m.sessions, ending) // gone before anything is handed off
	}
	for i, ev := range evs {
		if err := m.foldOne(c, now, ending, ev); err != nil {
			return fmt.Errorf("event %d %+v: %w", i, ev, err)
		}
	}
	return nil
}

func (m *model) foldOne(c lt.Command, now int64, ending string, ev lt.Event) error {
	h, held := m.holders[ev.Lock]
	switch ev.Kind {
	case lt.EvGranted:
		if ev.ExpiresAt != expiryOf(now, ev.TTLms) {
			return fmt.Errorf("expiry %d, want %d", ev.ExpiresAt, expiryOf(now, ev.TTLms))
		}
		if held {
			// Only an idempotent re-grant to the holder itself.
			if h.client != ev.ClientID || h.token != ev.Token {
				return fmt.Errorf("mutual exclusion: granted to %q (token %d) while %q holds token %d",
					ev.ClientID, ev.Token, h.client, h.token)
			}
			if c.Op != lt.OpAcquire || c.ClientID != ev.ClientID {
				return fmt.Errorf("re-grant without an acquire by the holder")
			}
			h.ttl, h.expiresAt = ev.TTLms, ev.ExpiresAt
			m.holders[ev.Lock] = h
			return nil
		}
		if ev.Token <= m.maxToken {
			return fmt.Errorf("token %d not above every earlier token (%d)", ev.Token, m.maxToken)
		}
		m.maxToken = ev.Token
		if pos := m.queuePos(ev.Lock, ev.ClientID); pos >= 0 {
			w := m.queues[ev.Lock][0]
			switch {
			case pos != 0:
				return fmt.Errorf("FIFO: granted to the waiter at position %d", pos)
			case now >= w.deadline:
				return fmt.Errorf("waiter granted at %d, its deadline was %d", now, w.deadline)
			case w.session != ev.SessionID:
				return fmt.Errorf("waiter queued via %q granted via %q", w.session, ev.SessionID)
			}
			m.queues[ev.Lock] = m.queues[ev.Lock][1:]
		} else if c.Op != lt.OpAcquire || c.Lock != ev.Lock || c.ClientID != ev.ClientID {
			return fmt.Errorf("granted to %q, who neither asked now nor waited", ev.ClientID)
		}
		if ev.SessionID != "" && !m.sessions[ev.SessionID] {
			return fmt.Errorf("granted via dead session %q", ev.SessionID)
		}
		m.holders[ev.Lock] = mHolder{client: ev.ClientID, session: ev.SessionID, token: ev.Token,
			ttl: ev.TTLms, expiresAt: ev.ExpiresAt}
	case lt.EvQueued:
		if c.Op != lt.OpAcquire || c.Lock != ev.Lock || c.ClientID != ev.ClientID {
			return fmt.Errorf("queued without an acquire")
		}
		if !held || h.client == ev.ClientID {
			return fmt.Errorf("queued on a lock that is free or its own")
		}
		if pos := m.queuePos(ev.Lock, ev.ClientID); pos >= 0 {
			m.queues[ev.Lock][pos].deadline = ev.Deadline
		} else {
			if ev.Deadline != now+c.WaitMs {
				return fmt.Errorf("deadline %d, want %d", ev.Deadline, now+c.WaitMs)
			}
			m.queues[ev.Lock] = append(m.queues[ev.Lock], mWaiter{ev.ClientID, ev.SessionID, ev.Deadline})
		}
	case lt.EvRenewed:
		if c.Op != lt.OpRenew || !held || h.client != ev.ClientID || h.token != ev.Token {
			return fmt.Errorf("renewed a grant that is not the holder's")
		}
		h.ttl, h.expiresAt = ev.TTLms, ev.ExpiresAt
		m.holders[ev.Lock] = h
	case lt.EvReleased:
		if c.Op != lt.OpRelease || !held || h.client != ev.ClientID || h.token != ev.Token || c.Token != h.token {
			return fmt.Errorf("released a grant that is not the caller's")
		}
		delete(m.holders, ev.Lock)
		m.released[memoKey{ev.Lock, ev.Token}] = ev.ClientID
	case lt.EvLost:
		if !held || h.client != ev.ClientID || h.token != ev.Token || h.session != ev.SessionID {
			return fmt.Errorf("lost a grant that is not the holder's (%+v)", h)
		}
		switch ev.Reason {
		case lt.ReasonExpired:
			if c.Op != lt.OpExpireLock || c.Token != h.token || h.expiresAt == 0 || now < h.expiresAt {
				return fmt.Errorf("expired early or without its timer (expires at %d)", h.expiresAt)
			}
		case lt.ReasonSessionExpired:
			if ending == "" || h.session != ending {
				return fmt.Errorf("lost to a session that did not end")
			}
		default:
			return fmt.Errorf("reason %q", ev.Reason)
		}
		delete(m.holders, ev.Lock)
	case lt.EvWaitEnded:
		pos := m.queuePos(ev.Lock, ev.ClientID)
		if pos < 0 {
			return fmt.Errorf("wait ended for a client not waiting")
		}
		w := m.queues[ev.Lock][pos]
		switch ev.Reason {
		case lt.ReasonWaitTimeout:
			if now < w.deadline {
				return fmt.Errorf("wait ended at %d before its deadline %d", now, w.deadline)
			}
		case lt.ReasonSessionExpired:
			if w.session == "" || m.sessions[w.session] {
				return fmt.Errorf("wait ended for a live session")
			}
		default:
			return fmt.Errorf("reason %q", ev.Reason)
		}
		m.queues[ev.Lock] = slices.Delete(m.queues[ev.Lock], pos, pos+1)
	case lt.EvSessionCreated:
		if c.Op != lt.OpCreateSession || ev.SessionID != c.SessionID || m.sessions[ev.SessionID] {
			return fmt.Errorf("session created twice or without a command")
		}
		m.sessions[ev.SessionID] = true
	case lt.EvSessionEnded:
		wantReason := map[lt.Op]string{lt.OpDeleteSession: lt.ReasonDeleted, lt.OpExpireSession: lt.ReasonSessionExpired}[c.Op]
		if ending == "" || ev.SessionID != ending || ev.Reason != wantReason {
			return fmt.Errorf("session ended without its command")
		}
	default:
		return fmt.Errorf("unknown event kind")
	}
	return nil
}

// agree checks that the table reads exactly as the model says.
func (m *model) agree(tb *lt.Table) error {
	names := map[string]bool{}
	for _, li := range tb.List("", 0) {
		names[li.Name] = true
	}
	for l := range m.holders {
		names[l] = true
	}
	for l, q := range m.queues {
		if len(q) > 0 {
			names[l] = true
		}
	}
	for l := range names {
		li := tb.Get(l)
		h, held := m.holders[l]
		if li.Held != held || li.ClientID != h.client || li.SessionID != h.session || li.Token != h.token ||
			li.TTLms != h.ttl || li.ExpiresAt != h.expiresAt {
			return fmt.Errorf("lock %q: table %+v, clients believe %+v (held %v)", l, li, h, held)
		}
		var got []mWaiter
		for _, w := range tb.Waiters(l) {
			got = append(got, mWaiter{w.ClientID, w.SessionID, w.Deadline})
		}
		if q := m.queues[l]; len(got)+len(q) > 0 && !reflect.DeepEqual(got, q) {
			return fmt.Errorf("lock %q: queue %+v, clients believe %+v", l, got, q)
		}
	}
	if tb.LastToken() != m.maxToken {
		return fmt.Errorf("LastToken %d, highest token issued %d", tb.LastToken(), m.maxToken)
	}
	for _, id := range slices.Concat(pSessions, []string{"s9"}) {
		if _, ok := tb.Session(id); ok != m.sessions[id] {
			return fmt.Errorf("session %q: exists %v, model %v", id, ok, m.sessions[id])
		}
	}
	want := []lt.Member{}
	for _, mm := range m.members {
		want = append(want, mm)
	}
	sort.Slice(want, func(i, j int) bool { return want[i].ID < want[j].ID })
	if got := tb.Members(); !reflect.DeepEqual(got, want) {
		return fmt.Errorf("members %+v, want %+v", got, want)
	}
	return nil
}

func TestPropertyModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tb := lt.New()
		m := newModel()
		g := &gen{tb: tb, now: t0}
		n := rapid.IntRange(50, 500).Draw(t, "steps")
		restoreAt := rapid.IntRange(0, n).Draw(t, "restoreAt")
		var (
			clone   *lt.Table
			log     []lt.Command
			results []lt.Result
		)
		for i := 0; i < n; i++ {
			if i == restoreAt {
				var err error
				if clone, err = lt.Restore(tb.Snapshot()); err != nil {
					t.Fatalf("restore at step %d: %v", i, err)
				}
			}
			g.advance(t)
			c := g.command(t, true)
			prev := tb.LastToken()
			r := tb.Apply(c)
			log, results = append(log, c), append(results, r)
			if err := m.step(c, r); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			if err := checkInvariants(tb, prev); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			if err := m.agree(tb); err != nil {
				t.Fatalf("step %d %v: %v", i, describe(c), err)
			}
			if clone != nil {
				if r2 := clone.Apply(c); !reflect.DeepEqual(r, r2) {
					t.Fatalf("step %d %v: restored table answers differently\n orig     %+v\n restored %+v", i, describe(c), r, r2)
				}
				if !bytes.Equal(tb.Snapshot(), clone.Snapshot()) {
					t.Fatalf("step %d %v: restored table diverged", i, describe(c))
				}
			}
		}
		snap := tb.Snapshot()
		back, err := lt.Restore(snap)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if !bytes.Equal(back.Snapshot(), snap) {
			t.Fatal("snapshot -> restore -> snapshot changed the bytes")
		}
		replay := lt.New()
		for i, c := range log {
			if r := replay.Apply(c); !reflect.DeepEqual(r, results[i]) {
				t.Fatalf("replay step %d %v: %+v, first run %+v", i, describe(c), r, results[i])
			}
		}
		if !bytes.Equal(replay.Snapshot(), snap) {
			t.Fatal("replaying the log gave a different snapshot")
		}
	})
}

// TestPropertyReplayDeterministic: one random log applied to two fresh
// tables gives the same results and byte-identical snapshots.
func TestPropertyReplayDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		guide := lt.New()
		g := &gen{tb: guide, now: t0}
		var log []lt.Command
		for i, n := 0, rapid.IntRange(50, 500).Draw(t, "steps"); i < n; i++ {
			g.advance(t)
			c := g.command(t, true)
			guide.Apply(c)
			log = append(log, c)
		}
		a, b := lt.New(), lt.New()
		for i, c := range log {
			if ra, rb := a.Apply(c), b.Apply(c); !reflect.DeepEqual(ra, rb) {
				t.Fatalf("step %d %v: %+v vs %+v", i, describe(c), ra, rb)
			}
		}
		if sa, sb := a.Snapshot(), b.Snapshot(); !bytes.Equal(sa, sb) || !bytes.Equal(sa, guide.Snapshot()) {
			t.Fatal("the same log gave different snapshots")
		}
	})
}
