package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// holder is what lockd's and etcd's holders share: the lease as the client
// sees it, the tally it adds to, and the schedule that renews it. Each
// system brings its own acquire and renew.
type holder struct {
	ttl       time.Duration
	book      leaseBook
	t         *holderTally
	acquiring atomic.Bool // an acquire after a loss is under way
}

// granted records a grant of token, answered at at, expiring at expires.
func (h *holder) granted(token uint64, at, expires time.Time) {
	h.book.granted(token, h.ttl, at, expires)
	h.t.add(func(t *holderTally) { t.acquires++ })
}

// acked records a renew of token sent at sent and acknowledged at at with
// the new expiry exp.
func (h *holder) acked(token uint64, sent, at, exp time.Time) {
	late, by := h.book.acked(token, at, exp)
	h.t.add(func(t *holderTally) {
		t.acked++
		t.renewLat.record(at.Sub(sent))
		if late {
			t.late++
			t.lateMax = max(t.lateMax, by)
		}
	})
}

// lost ends the grant token for why; a second report of one loss is not
// counted.
func (h *holder) lost(token uint64, why string) {
	if was, timely := h.book.lost(token); was {
		h.t.add(func(t *holderTally) {
			t.lost++
			if timely {
				t.lostTimely++
			}
			t.lostReasons[why]++
		})
	}
}

// renewals calls renew every period from first until ctx ends, each on its
// own goroutine (renews are pipelined: one is due every period whatever
// became of the previous one), with the grant it renews, the expiry it was
// sent against and when it was sent. While no grant is held it takes the
// lock again instead, one acquire at a time.
func (h *holder) renewals(ctx context.Context, first time.Time, every time.Duration,
	acquire func(context.Context) error, renew func(ctx context.Context, token uint64, against, sent time.Time)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for t := first; ; t = t.Add(every) {
		if !sleepCtx(ctx, time.Until(t)) {
			return
		}
		now := time.Now()
		token, against, timely, ok := h.book.sending(now)
		if !ok {
			if h.acquiring.CompareAndSwap(false, true) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer h.acquiring.Store(false)
					_ = acquire(ctx)
				}()
			}
			continue
		}
		h.t.add(func(t *holderTally) {
			t.renews++
			if !timely {
				t.sentLate++
			}
		})
		wg.Add(1)
		go func() { defer wg.Done(); renew(ctx, token, against, now) }()
	}
}

// leaseBook follows one holder's lease as the client sees it: the latest
// expiry the server acknowledged, and whether every renew so far was sent
// in time. It decides the two things the overload run asks of renewals:
// was a renew acknowledged only after the lease had already run out
// (late), and was a lease lost although it was renewed in time. A renew is
// sent in time when less than the TTL has passed since the grant or the
// previous renew was sent: had the server answered each one at once, the
// lease could not have run out. (Comparing with the acknowledged expiry
// instead would blame the client for the server's slow answers.) Safe for
// concurrent use (renews are pipelined: one is sent every period whatever
// became of the previous one).
type leaseBook struct {
	mu        sync.Mutex
	token     uint64
	ttl       time.Duration
	expires   time.Time // latest acknowledged expiry
	lastSend  time.Time // the grant's answer, then the latest renew sent
	allTimely bool      // every renew of this grant was sent in time
	held      bool
}

// granted starts a new grant of ttl, answered at at, expiring at expires.
func (b *leaseBook) granted(token uint64, ttl time.Duration, at, expires time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.token, b.ttl, b.expires, b.lastSend, b.allTimely, b.held = token, ttl, expires, at, true, true
}

// sending notes a renew sent at t and returns the grant it renews, the
// expiry it was sent against and whether it was sent in time; ok is false
// when no grant is held.
func (b *leaseBook) sending(t time.Time) (token uint64, against time.Time, timely, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held {
		return 0, time.Time{}, false, false
	}
	timely = t.Sub(b.lastSend) < b.ttl
	if !timely {
		b.allTimely = false
	}
	b.lastSend = t
	return b.token, b.expires, timely, true
}

// acked records a renew of token acknowledged at at (the time its answer
// was read) with the new expiry newExp. late is true when the lease had run
// out before the acknowledgement (at is after every expiry acknowledged
// until then), by lateBy. Answers are handled concurrently, so the loss of
// the grant may have been recorded first: its late acknowledgement still
// counts, as long as no newer grant replaced it.
func (b *leaseBook) acked(token uint64, at, newExp time.Time) (late bool, lateBy time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if token != b.token {
		return false, 0
	}
	if at.After(b.expires) {
		late, lateBy = true, at.Sub(b.expires)
	}
	if newExp.After(b.expires) {
		b.expires = newExp
	}
	return late, lateBy
}

// lost ends the grant token (not_holder, or a lost push); it reports
// whether that grant was held (a second report of the same loss is
// ignored) and whether every renew of it had been sent in time.
func (b *leaseBook) lost(token uint64) (wasHeld, timely bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held || token != b.token {
		return false, false
	}
	b.held = false
	return true, b.allTimely
}

// current returns the grant held, if any.
func (b *leaseBook) current() (token uint64, expires time.Time, held bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.token, b.expires, b.held
}

// holderTally adds up every holder's renewals. Safe for concurrent use.
type holderTally struct {
	mu          sync.Mutex
	renews      int64 // renews sent (first sends)
	acked       int64
	late        int64
	lateMax     time.Duration
	sentLate    int64 // renews the bench itself sent a TTL or more after the previous one
	gaveUp      int64 // renews refused until their lease ran out
	failed      map[string]int64
	lost        int64
	lostTimely  int64 // of lost: every renew of that grant was sent in time
	lostReasons map[string]int64
	acquires    int64 // grants (first and after a loss)
	renewLat    *syncHist
}

func newHolderTally() *holderTally {
	return &holderTally{failed: map[string]int64{}, lostReasons: map[string]int64{}, renewLat: newSyncHist()}
}

func (t *holderTally) add(f func(t *holderTally)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(t)
}

// holdersResult is the report of the holders.
type holdersResult struct {
	Holders    int         `json:"holders"`
	TTLms      int64       `json:"ttl_ms"`
	EveryMs    int64       `json:"renew_every_ms"`
	Grants     int64       `json:"grants"`
	Renews     int64       `json:"renews_sent"`
	Acked      int64       `json:"renews_acknowledged"`
	LateAcks   int64       `json:"renews_acknowledged_after_expiry"`
	LateMaxMs  float64     `json:"latest_acknowledgement_after_expiry_ms"`
	SentLate   int64       `json:"renews_sent_after_expiry_by_the_bench"`
	GaveUp     int64       `json:"renews_refused_until_expiry"`
	Failed     []codeCount `json:"renew_errors"`
	Lost       int64       `json:"leases_lost"`
	LostTimely int64       `json:"leases_lost_despite_timely_renews"`
	LostBy     []codeCount `json:"leases_lost_by"`
	RenewLat   latency     `json:"renew_latency"`
}

func (t *holderTally) result(n int, ttl, every time.Duration) holdersResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return holdersResult{Holders: n, TTLms: ttl.Milliseconds(), EveryMs: every.Milliseconds(), Grants: t.acquires,
		Renews: t.renews, Acked: t.acked, LateAcks: t.late, LateMaxMs: float64(t.lateMax.Microseconds()) / 1000,
		SentLate: t.sentLate, GaveUp: t.gaveUp, Failed: sortedCounts(t.failed), Lost: t.lost, LostTimely: t.lostTimely,
		LostBy: sortedCounts(t.lostReasons), RenewLat: t.renewLat.summary()}
}

// sessionTally adds up the keepalive-only sessions. Safe for concurrent use.
type sessionTally struct {
	mu     sync.Mutex
	acked  int64
	failed map[string]int64
	lost   int64
	lat    *syncHist
}

func newSessionTally() *sessionTally {
	return &sessionTally{failed: map[string]int64{}, lat: newSyncHist()}
}

// sessionsResult is the report of the keepalive-only sessions.
type sessionsResult struct {
	Sessions int         `json:"sessions"`
	TTLms    int64       `json:"session_ttl_ms"`
	EveryMs  int64       `json:"keepalive_every_ms"`
	Acked    int64       `json:"keepalives_acknowledged"`
	Failed   []codeCount `json:"keepalive_errors"`
	Lost     int64       `json:"sessions_lost"`
	Latency  latency     `json:"keepalive_latency"`
}

func (t *sessionTally) result(n int, ttl, every time.Duration) sessionsResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return sessionsResult{Sessions: n, TTLms: ttl.Milliseconds(), EveryMs: every.Milliseconds(), Acked: t.acked,
		Failed: sortedCounts(t.failed), Lost: t.lost, Latency: t.lat.summary()}
}
