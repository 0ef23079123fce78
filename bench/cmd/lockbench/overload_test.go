package main

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

func TestParseRetryAfterHeader(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1", time.Second, true},
		{" 3 ", 3 * time.Second, true},
		{"0.25", 250 * time.Millisecond, true},
		{"0", 0, true},
		{"Tue, 01 Dec 2026 10:00:05 GMT", 5 * time.Second, true},
		{"Tue, 01 Dec 2026 09:59:00 GMT", 0, true}, // a date in the past: retry now
		{"", 0, false},
		{"-1", 0, false},
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfterHeader(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfterHeader(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestRetryAfterOfFrame(t *testing.T) {
	for _, c := range []struct {
		frame string
		want  time.Duration
		ok    bool
	}{
		{`{"id":3,"type":"error","error":{"code":"overloaded","message":"x"},"retry_after_ms":250}`, 250 * time.Millisecond, true},
		{`{"id":3,"type":"error","error":{"code":"overloaded","message":"x","retry_after_ms":1500}}`, 1500 * time.Millisecond, true},
		{`{"type":"error","error":{"code":"overloaded"},"retry_after":2}`, 2 * time.Second, true},
		{`{"type":"error","error":{"code":"overloaded"},"retry_after":"1"}`, time.Second, true},
		{`{"type":"error","error":{"code":"overloaded","retry_after":"300ms"}}`, 300 * time.Millisecond, true},
		{`{"type":"error","error":{"code":"overloaded"},"retry_after_seconds":0.5}`, 500 * time.Millisecond, true},
		{`{"type":"error","error":{"code":"overloaded","message":"x"}}`, 0, false},
		{`{"type":"error","error":{"code":"overloaded"},"retry_after_ms":-5}`, 0, false},
		{`{"type":"error","error":{"code":"overloaded"},"retry_after":"later"}`, 0, false},
		{`not json`, 0, false},
		{``, 0, false},
	} {
		got, ok := retryAfterOfFrame([]byte(c.frame))
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfterOfFrame(%s) = %v, %v; want %v, %v", c.frame, got, ok, c.want, c.ok)
		}
	}
}

func TestBackoffHonoursRetryAfter(t *testing.T) {
	e := &apiErr{Code: api.CodeOverloaded, RetryAfter: time.Second, HasRetryAfter: true}
	for i := 0; i < 200; i++ {
		d := backoffFor(e, i%5)
		if d < time.Second || d > 1100*time.Millisecond {
			t.Fatalf("backoff with Retry-After 1s = %v, want 1s–1.1s", d)
		}
	}
	// Without one: exponential from 50 ms, capped at 2 s, drawn from [d/2, d].
	for attempt, want := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 2 * time.Second, 2 * time.Second} {
		for i := 0; i < 50; i++ {
			if d := backoffFor(nil, attempt); d < want/2 || d > want {
				t.Fatalf("backoff attempt %d = %v, want within [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	for _, c := range []string{api.CodeOverloaded, api.CodeResourceExhausted, api.CodeNoLeader, api.CodeNotLeader, "http_503", "http_429"} {
		if !retryable(c) {
			t.Errorf("%s should be retried", c)
		}
	}
	for _, c := range []string{api.CodeNotHolder, api.CodeSessionExpired, api.CodeInternal, api.CodeInvalidArgument, api.CodeWaitTimeout} {
		if retryable(c) {
			t.Errorf("%s should not be retried", c)
		}
	}
}

func TestOpenLoopStartsEveryCycleOnTime(t *testing.T) {
	start := time.Now().Add(20 * time.Millisecond)
	end := start.Add(300 * time.Millisecond)
	const rate = 200.0
	var mu sync.Mutex
	var seqs []int64
	var lateness []time.Duration
	t0 := time.Now()
	started, skipped := openLoop(context.Background(), rate, start, end, 1000, func(seq int64, due time.Time) {
		mu.Lock()
		seqs = append(seqs, seq)
		lateness = append(lateness, time.Since(due))
		mu.Unlock()
		if want := dueAt(start, rate, seq); !due.Equal(want) {
			t.Errorf("cycle %d due %v, want %v", seq, due, want)
		}
		time.Sleep(100 * time.Millisecond) // slow cycles must not hold back the next ones
	})
	took := time.Since(t0)
	if want := scheduled(rate, end.Sub(start)); started != want || skipped != 0 || int64(len(seqs)) != want {
		t.Fatalf("started %d, skipped %d, fired %d; want %d, 0", started, skipped, len(seqs), want)
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != int64(i) {
			t.Fatalf("sequence numbers %v...: missing %d", seqs[:i+1], i)
		}
	}
	// A closed loop would take 60 × 100 ms; open loop takes the window
	// plus one cycle.
	if took > 1500*time.Millisecond {
		t.Fatalf("the schedule waited for slow cycles: %v", took)
	}
	slices.Sort(lateness)
	if p50 := lateness[len(lateness)/2]; p50 > 50*time.Millisecond {
		t.Fatalf("cycles started late: median %v after their due time", p50)
	}
}

func TestOpenLoopSkipsAtTheClientBound(t *testing.T) {
	release := make(chan struct{})
	var fired atomic.Int64
	start := time.Now()
	done := make(chan struct{})
	var started, skipped int64
	go func() {
		defer close(done)
		started, skipped = openLoop(context.Background(), 1000, start, start.Add(100*time.Millisecond), 5, func(int64, time.Time) {
			fired.Add(1)
			<-release
		})
	}()
	time.Sleep(300 * time.Millisecond)
	close(release)
	<-done
	if started != 5 || fired.Load() != 5 || started+skipped != scheduled(1000, 100*time.Millisecond) {
		t.Fatalf("started %d (fired %d), skipped %d of %d", started, fired.Load(), skipped, scheduled(1000, 100*time.Millisecond))
	}
}

func TestScheduled(t *testing.T) {
	for _, c := range []struct {
		rate float64
		d    time.Duration
		want int64
	}{{2, time.Second, 2}, {1000, 100 * time.Millisecond, 100}, {3, time.Second, 3}, {0.5, 3 * time.Second, 2}, {0, time.Second, 0}, {10, 0, 0}} {
		if got := scheduled(c.rate, c.d); got != c.want {
			t.Errorf("scheduled(%v, %v) = %d, want %d", c.rate, c.d, got, c.want)
		}
	}
}

func TestFloodOutcomeMath(t *testing.T) {
	start := time.Unix(1000, 0)
	l := newCycleLog(start, start.Add(4*time.Second))
	// 100 completions in each of seconds 0, 1 and 3, 20 in second 2 (the
	// burst), and 7 after the window.
	for s, n := range []int{100, 100, 20, 100} {
		for i := 0; i < n; i++ {
			at := start.Add(time.Duration(s)*time.Second + time.Duration(i)*time.Millisecond)
			l.done(at.Add(-5*time.Millisecond), at)
		}
	}
	for i := 0; i < 7; i++ {
		l.done(start.Add(4*time.Second), start.Add(4*time.Second+time.Duration(i)*time.Millisecond))
	}
	l.fail(api.CodeOverloaded)
	l.fail(api.CodeOverloaded)
	l.fail("timeout")
	r := floodOutcome(l, 200, 800, 0, 100, 4*time.Second, 2*time.Second, true)
	if r.Completed != 320 || r.Late != 7 || r.Goodput != 80 || math.Abs(r.Ratio-0.8) > 1e-9 {
		t.Fatalf("completed %d late %d goodput %v ratio %v", r.Completed, r.Late, r.Goodput, r.Ratio)
	}
	if r.GoodputAfterBurst != 60 || math.Abs(r.RatioAfterBurst-0.6) > 1e-9 {
		t.Fatalf("after the burst: %v (%v)", r.GoodputAfterBurst, r.RatioAfterBurst)
	}
	if r.WorstSecond != 20 || r.WorstSecondAt != 2 || math.Abs(r.WorstSecondRatio-0.2) > 1e-9 {
		t.Fatalf("worst second %d at %d (%v)", r.WorstSecond, r.WorstSecondAt, r.WorstSecondRatio)
	}
	if r.Scheduled != 800 || codeOf(r.Failed, api.CodeOverloaded) != 2 || codeOf(r.Failed, "timeout") != 1 {
		t.Fatalf("scheduled %d, failed %v", r.Scheduled, r.Failed)
	}
	if r.Latency.Count != 327 || r.Latency.P50 < 4.9 || r.Latency.P50 > 5.1 {
		t.Fatalf("latency %+v", r.Latency)
	}
}

func TestLeaseBookLateAcksAndLosses(t *testing.T) {
	t0 := time.Unix(5000, 0)
	var b leaseBook
	b.granted(7, 5*time.Second, t0, t0.Add(5*time.Second))
	// Renews sent every second; their acknowledgements arrive late and
	// out of order.
	if tok, against, timely, ok := b.sending(t0.Add(time.Second)); !ok || !timely || tok != 7 || !against.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("sending: %d %v %v %v", tok, against, timely, ok)
	}
	// The renew sent at +1 s is acknowledged at +4 s: in time.
	if late, _ := b.acked(7, t0.Add(4*time.Second), t0.Add(9*time.Second)); late {
		t.Fatal("an acknowledgement before expiry counted late")
	}
	// Renews keep going out every second although the server is slow: in
	// time, even past the acknowledged expiry (+9 s).
	for s := 2; s <= 9; s++ {
		if _, _, timely, _ := b.sending(t0.Add(time.Duration(s) * time.Second)); !timely {
			t.Fatalf("a renew one second after the previous one counted late (at +%d s)", s)
		}
	}
	// One acknowledged at +9.5 s extends a lease that ran out at +9 s.
	late, by := b.acked(7, t0.Add(9500*time.Millisecond), t0.Add(13*time.Second))
	if !late || by != 500*time.Millisecond {
		t.Fatalf("late %v by %v; want late by 500ms", late, by)
	}
	// An older renew answered afterwards does not move the expiry back.
	b.acked(7, t0.Add(9600*time.Millisecond), t0.Add(12*time.Second))
	if _, exp, _ := b.current(); !exp.Equal(t0.Add(13 * time.Second)) {
		t.Fatalf("expiry moved back to %v", exp)
	}
	// A renew of another grant is ignored.
	if late, _ := b.acked(8, t0.Add(time.Hour), t0.Add(2*time.Hour)); late {
		t.Fatal("another grant's acknowledgement counted")
	}
	if _, exp, _ := b.current(); !exp.Equal(t0.Add(13 * time.Second)) {
		t.Fatalf("another grant's acknowledgement moved the expiry to %v", exp)
	}
	// Lost with every renew sent in time: reported once.
	if was, timely := b.lost(7); !was || !timely {
		t.Fatalf("lost: %v %v", was, timely)
	}
	if was, _ := b.lost(7); was {
		t.Fatal("the same loss reported twice")
	}
	if _, _, _, ok := b.sending(t0.Add(14 * time.Second)); ok {
		t.Fatal("a renew sent for a lost grant")
	}
	// A late acknowledgement handled after the loss still counts.
	if late, by := b.acked(7, t0.Add(14*time.Second), t0.Add(18*time.Second)); !late || by != time.Second {
		t.Fatalf("late acknowledgement after the loss: %v %v", late, by)
	}
	// A grant the bench itself renewed a whole TTL after the previous send:
	// its loss is not the server's.
	b.granted(9, 5*time.Second, t0.Add(20*time.Second), t0.Add(25*time.Second))
	if _, _, timely, _ := b.sending(t0.Add(25 * time.Second)); timely {
		t.Fatal("a renew a TTL after the grant counted as in time")
	}
	if was, timely := b.lost(9); !was || timely {
		t.Fatalf("lost after a late send: %v %v", was, timely)
	}
}

func TestSummarizeMonitor(t *testing.T) {
	mk := func(t float64, leader string, term, commit uint64, rss float64) monitorSample {
		var ms []memberSample
		for _, id := range []string{"n1", "n2", "n3"} {
			m := memberSample{Member: id, Term: term, Commit: commit, RSSMiB: 30, OK: true}
			if id == leader {
				m.Leader, m.RSSMiB, m.HWMMiB = true, rss, rss+10
			}
			ms = append(ms, m)
		}
		return monitorSample{T: t, Members: ms}
	}
	ss := []monitorSample{
		mk(-2, "n1", 2, 0, 40),
		mk(-1, "n1", 2, 500, 40), // 500/s before the window
		mk(0, "n1", 2, 1000, 45),
		mk(1, "n1", 2, 1600, 300),  // 600/s
		mk(2, "n1", 2, 1700, 900),  // 100/s: the worst
		mk(3, "n2", 3, 1800, 200),  // a new leader: not a commit rate
		mk(4, "n2", 3, 2600, 250),  // 800/s
		mk(9, "n2", 4, 9000, 1000), // after the window: ignored
	}
	s := summarizeMonitor(ss, 4)
	if s.TermsStarted != 1 || s.LeaderChanges != 1 {
		t.Fatalf("terms %d, changes %d", s.TermsStarted, s.LeaderChanges)
	}
	if s.LeaderRSSStart != 45 || s.LeaderRSSMax != 900 || s.LeaderRSSMaxAt != 2 || s.LeaderRSSEnd != 250 || s.LeaderHWM != 910 {
		t.Fatalf("leader RSS %+v", s)
	}
	if s.CommitsBefore != 500 || s.CommitsMin != 100 || s.CommitsMinAt != 2 || math.Abs(s.CommitsWindow-1500.0/3) > 1e-9 {
		t.Fatalf("commits %+v", s)
	}
	if s.MaxRSS["n1"] != 900 || s.MaxRSS["n2"] != 1000 || s.MaxRSS["n3"] != 30 {
		t.Fatalf("max RSS %v", s.MaxRSS)
	}
}

func TestBurstNames(t *testing.T) {
	const conns, waits, locks = 7, 100, 15
	seen := map[string]int{}
	total := 0
	for k := 0; k < conns; k++ {
		ns := burstNames(k, conns, waits, locks, burstLock)
		total += len(ns)
		own := map[string]bool{}
		for _, n := range ns {
			if own[n] {
				t.Fatalf("session %d waits twice on %s", k, n)
			}
			own[n] = true
			seen[n]++
		}
	}
	if total != waits || len(seen) != locks {
		t.Fatalf("%d waits on %d locks; want %d on %d", total, len(seen), waits, locks)
	}
	for n, c := range seen {
		if c < waits/locks || c > waits/locks+1 {
			t.Fatalf("%s has %d waiters, want an even spread", n, c)
		}
	}
	o := overloadOpts{systems: []string{"lockd"}, members: 3, workers: 1, baseline: time.Second, duration: time.Minute, offered: 2,
		burst: 100_000, burstConns: 100, burstLocks: 999, burstAt: time.Second, sessionTTL: 15 * time.Second, holderTTL: 5 * time.Second,
		renewEvery: time.Second, opTimeout: time.Second, maxInFlight: 1, sample: time.Second}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--burst-locks") {
		t.Fatalf("999 locks for 1000 waits per session: %v", err)
	}
	o.burstLocks = 1000
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(o *overloadOpts){
		func(o *overloadOpts) { o.systems = []string{"zookeeper"} },
		func(o *overloadOpts) { o.burstAt = time.Minute },
		func(o *overloadOpts) { o.renewEvery = 5 * time.Second },
		func(o *overloadOpts) { o.sessionTTL = 500 * time.Millisecond },
		func(o *overloadOpts) { o.burstWait = 11 * time.Minute },
		func(o *overloadOpts) { o.offered, o.rate = 0, 0 },
	} {
		oo := o
		bad(&oo)
		if oo.validate() == nil {
			t.Errorf("accepted %+v", oo)
		}
	}
}

func TestRejectionsAndCuts(t *testing.T) {
	st := newRoleStats()
	for i := 0; i < 3; i++ {
		st.refused(&apiErr{Code: api.CodeOverloaded, RetryAfter: time.Duration(100*(i+1)) * time.Millisecond, HasRetryAfter: true})
	}
	st.refused(&apiErr{Code: api.CodeOverloaded}) // no Retry-After
	st.refused(&apiErr{Code: api.CodeResourceExhausted, RetryAfter: time.Second, HasRetryAfter: true})
	st.refused(&apiErr{Code: api.CodeNoLeader})
	st.refused(&apiErr{Code: api.CodeNotLeader})
	st.refused(&apiErr{Code: api.CodeWaitTimeout}) // an outcome, not a refusal
	st.refused(&apiErr{Code: api.CodeInternal})
	st.connEnded("internal: event stream overflowed")
	st.connEnded("close 1000 leadership lost")
	st.connEnded("")
	other := newRoleStats()
	other.refused(&apiErr{Code: api.CodeOverloaded, RetryAfter: 5 * time.Second, HasRetryAfter: true})
	other.retried()
	all := mergeRoles("all", st, other)
	o, e, n, x := rejections(all)
	if o != 5 || e != 1 || n != 2 || x != 1 {
		t.Fatalf("rejections %d %d %d %d", o, e, n, x)
	}
	if ra := all.RetryAfter; ra.Count != 5 || ra.Missing != 2 || ra.MinMs != 100 || ra.P50Ms != 300 || ra.MaxMs != 5000 {
		t.Fatalf("Retry-After %+v", ra)
	}
	if i, a := internalCuts(all); i != 1 || a != 2 {
		t.Fatalf("cuts %d of %d", i, a)
	}
	if all.Retries != 1 {
		t.Fatalf("retries %d", all.Retries)
	}
}

// ---- the clients against a scripted server ----

func TestSessionWaitsOutRetryAfter(t *testing.T) {
	var n atomic.Int32
	f := newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		if req.Op != api.OpKeepalive {
			t.Errorf("unexpected op %s", req.Op)
			return
		}
		if n.Add(1) <= 2 {
			fc.refuse(req.ID, api.CodeOverloaded, 150*time.Millisecond)
			return
		}
		fc.reply(req.ID, api.WSMessage{Type: api.TypeOK})
	})
	st := newRoleStats()
	s := &wsSession{ref: f.ref(), clientID: "c", ttlMs: 15000, st: st}
	defer s.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := s.do(ctx, api.WSRequest{Op: api.OpKeepalive}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took < 300*time.Millisecond {
		t.Fatalf("answered after %v: the two Retry-Afters of 150 ms were not waited out", took)
	}
	sum := st.summary("x")
	if codeOf(sum.Codes, api.CodeOverloaded) != 2 || sum.Retries != 2 || sum.RetryAfter.Count != 2 || sum.RetryAfter.P50Ms != 150 || sum.RetryAfter.Missing != 0 {
		t.Fatalf("stats %+v", sum)
	}
}

func TestSessionResumesAfterACut(t *testing.T) {
	f := newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		if fc.n == 1 {
			fc.cut()
			return
		}
		fc.reply(req.ID, api.WSMessage{Type: api.TypeOK, SessionID: fc.session})
	})
	st := newRoleStats()
	s := &wsSession{ref: f.ref(), clientID: "c", ttlMs: 15000, st: st}
	defer s.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.do(ctx, api.WSRequest{Op: api.OpKeepalive})
	if err != nil {
		t.Fatal(err)
	}
	if m.SessionID != "s1" || f.connCount() != 2 {
		t.Fatalf("answered in session %q after %d connections", m.SessionID, f.connCount())
	}
	f.mu.Lock()
	hellos := f.hellos
	f.mu.Unlock()
	if len(hellos) != 2 || hellos[1].SessionID != "s1" {
		t.Fatalf("hellos %+v: the second must resume s1", hellos)
	}
	// The cut is recorded by a watcher of the old connection.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sum := st.summary("x")
		if i, a := internalCuts(sum); i == 1 && a == 1 && sum.Reconnects == 1 && sum.Retries == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", sum)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSessionExpiryIsReportedOnce(t *testing.T) {
	var f *fakeLockd
	f = newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		if fc.session == "s1" {
			// The server decided the session is gone: the keepalive says
			// so, and the connection drops.
			f.expire("s1")
			fc.refuse(req.ID, api.CodeSessionExpired, -1)
			_ = fc.c.CloseNow()
			return
		}
		fc.reply(req.ID, api.WSMessage{Type: api.TypeOK, SessionID: fc.session})
	})
	var lost atomic.Int32
	s := &wsSession{ref: f.ref(), clientID: "c", ttlMs: 15000, st: newRoleStats(), onExpired: func() { lost.Add(1) }}
	defer s.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.do(ctx, api.WSRequest{Op: api.OpKeepalive})
	var e *apiErr
	if !errors.As(err, &e) || e.Code != api.CodeSessionExpired {
		t.Fatalf("keepalive of an expired session: %v", err)
	}
	// The next request runs in a new session; the loss counted once.
	m, err := s.do(ctx, api.WSRequest{Op: api.OpKeepalive})
	if err != nil || m.SessionID != "s2" {
		t.Fatalf("after expiry: %v in %q", err, m.SessionID)
	}
	if lost.Load() != 1 {
		t.Fatalf("expiry reported %d times", lost.Load())
	}
}

func TestBurstRetriesRefusalsAndResendsAfterACut(t *testing.T) {
	const waits = 40
	var mu sync.Mutex
	got := map[int]map[string]int{} // connection → lock → acquires received
	refused := map[string]bool{}
	f := newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		if req.Op != api.OpAcquire {
			fc.reply(req.ID, api.WSMessage{Type: api.TypeOK})
			return
		}
		mu.Lock()
		if got[fc.n] == nil {
			got[fc.n] = map[string]int{}
		}
		got[fc.n][req.Lock]++
		first := !refused[req.Lock]
		n := len(got[1])
		mu.Unlock()
		var i int
		_, _ = fmtSscanf(req.Lock, &i)
		switch {
		case fc.n == 1 && i%4 == 0 && first:
			// Every fourth wait is refused once, with a Retry-After.
			mu.Lock()
			refused[req.Lock] = true
			mu.Unlock()
			fc.refuse(req.ID, api.CodeOverloaded, 100*time.Millisecond)
		case fc.n == 1 && n == waits:
			// Once every wait arrived: cut the connection, queued waits
			// unanswered.
			fc.cut()
		case i == 3:
			fc.reply(req.ID, api.WSMessage{Type: api.TypeGranted, Lock: req.Lock, FencingToken: 9})
		}
		// Otherwise: queued, no answer.
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := make([]string, waits)
	for i := range names {
		names[i] = burstLock(i)
	}
	b, err := openBurst(ctx, burstSpec{ref: f.ref(), conns: 1, prefix: "b", waitMs: 600000, ttl: time.Hour, parallel: 1,
		namesOf: func(int) []string { return names }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	bctx, bcancel := context.WithCancel(ctx)
	wait := b.start(bctx)
	// Settled: every wait sent, the refused ones sent again, the cut
	// connection replaced and its unanswered waits sent again.
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		resentAll := len(got[2]) >= waits-1 // all but the granted one
		mu.Unlock()
		if b.settled() && resentAll {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("not settled: conn 1 got %d locks, conn 2 %d; pending %d", len(got[1]), len(got[2]), b.conns[0].pending.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	bcancel()
	wait()
	r := b.result(waits, 0, -1)
	if r.Sent != waits || r.Granted != 1 || r.Retried != waits/4 || r.Unanswered != waits-1 || r.Refused != 0 || r.Unsent != 0 {
		t.Fatalf("burst result %+v", r)
	}
	if r.Resent < waits-1-waits/4 {
		t.Fatalf("resent %d after the cut; want at least the %d queued on it", r.Resent, waits-1-waits/4)
	}
	sum := b.st.summary("burst")
	if codeOf(sum.Codes, api.CodeOverloaded) != waits/4 || sum.RetryAfter.P50Ms != 100 || sum.Reconnects != 1 {
		t.Fatalf("stats %+v", sum)
	}
	if i, _ := internalCuts(sum); i != 1 {
		t.Fatalf("cuts %+v", sum.Cuts)
	}
	// The granted wait is not sent again.
	mu.Lock()
	defer mu.Unlock()
	if got[2][burstLock(3)] != 0 {
		t.Fatal("a granted wait was sent again after the cut")
	}
}

// fmtSscanf reads the index of a burst lock name.
func fmtSscanf(name string, i *int) (int, error) {
	n := 0
	s := strings.TrimPrefix(name, "ov-q-")
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, errors.New("not a burst lock")
		}
		n = n*10 + int(r-'0')
	}
	*i = n
	return 1, nil
}

func TestHolderCountsLateAcksAndLosses(t *testing.T) {
	// The first grant (token 5) has a 300 ms lease: its first renew is
	// acknowledged 500 ms late, then every renew of it is answered
	// not_holder. The holder takes the lock again (token 6, a long lease,
	// renewed promptly).
	var grants atomic.Uint64
	ackSent := make(chan struct{})
	var once sync.Once
	f := newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		switch req.Op {
		case api.OpAcquire:
			tok := 5 + grants.Add(1) - 1
			ttl := 10 * time.Second
			if tok == 5 {
				ttl = 300 * time.Millisecond
			}
			fc.reply(req.ID, api.WSMessage{Type: api.TypeGranted, Lock: req.Lock, FencingToken: tok,
				ExpiresAt: api.FormatTime(time.Now().Add(ttl).UnixMilli())})
		case api.OpRenew:
			if req.FencingToken != 5 {
				fc.reply(req.ID, api.WSMessage{Type: api.TypeOK, Lock: req.Lock, FencingToken: req.FencingToken,
					ExpiresAt: api.FormatTime(time.Now().Add(10 * time.Second).UnixMilli())})
				return
			}
			first := false
			once.Do(func() { first = true })
			go func() {
				if first {
					time.Sleep(500 * time.Millisecond)
					fc.reply(req.ID, api.WSMessage{Type: api.TypeOK, Lock: req.Lock, FencingToken: 5,
						ExpiresAt: api.FormatTime(time.Now().Add(300 * time.Millisecond).UnixMilli())})
					close(ackSent)
					return
				}
				<-ackSent
				fc.refuse(req.ID, api.CodeNotHolder, -1)
			}()
		}
	})
	st, tally := newRoleStats(), newHolderTally()
	// The server's expiries decide lateness; the holder's own TTL (2 s)
	// only decides whether the bench sent a renew late, which a renew
	// every 100 ms is not, even on a loaded machine.
	h := &lockdHolder{holder: holder{ttl: 2 * time.Second, t: tally}, lock: "h"}
	h.s = &wsSession{ref: f.ref(), clientID: "h", ttlMs: 15000, st: st, onPush: h.push}
	defer h.s.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.renewals(rctx, time.Now().Add(50*time.Millisecond), 100*time.Millisecond) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := tally.result(1, h.ttl, 100*time.Millisecond)
		if r.LateAcks == 1 && r.Lost == 1 && r.Grants == 2 && r.Acked >= 3 {
			if r.LostTimely != 1 || r.SentLate != 0 || r.LateMaxMs < 100 || codeOf(r.LostBy, "renew answered not_holder") != 1 {
				t.Fatalf("holders %+v", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holders %+v", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rcancel()
	<-done
}

func TestPostOKCarriesTheRefusal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":"overloaded","message":"the cluster commits less than it is asked"}}`))
	}))
	defer srv.Close()
	err := postOK(context.Background(), srv.Client(), srv.URL+"/api/v1/locks/x/acquire", []byte(`{}`))
	var e *apiErr
	if !errors.As(err, &e) || e.Code != api.CodeOverloaded || !e.HasRetryAfter || e.RetryAfter != 2*time.Second || !strings.Contains(e.Msg, "commits less") {
		t.Fatalf("postOK: %v (%+v)", err, e)
	}
	// The loaders wait it out: a retry after this refusal comes 2 s later
	// at the earliest.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if retrying(ctx, t0, 0, err) {
		t.Fatal("retried before the Retry-After had passed")
	}
}
