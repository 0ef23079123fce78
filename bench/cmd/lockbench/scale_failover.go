package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/api"
)

// The scale run's leadership measurements (SPEC 17): the waiter burst
// watched for elections, a kill -9 of the leader (time from the new leader
// winning its election to serving, and whether the old leader's locks and
// waiters are all there), a SIGTERM of a member (time to exit), and each
// stopped member restarted on its data dir (time to /readyz 200).

// waiterBurstResult is the queueing of the waiters.
type waiterBurstResult struct {
	Seconds      float64     `json:"seconds"` // first send → every wait queued per the leader
	Burst        burstResult `json:"burst"`
	Clients      roleSummary `json:"clients"`
	TermsStarted int64       `json:"terms_started"`
	Elections    []election  `json:"elections"` // "became leader" lines logged during it
}

// failoverResult is a kill -9 of the leader.
type failoverResult struct {
	OldLeader string `json:"old_leader"`
	NewLeader string `json:"new_leader"`
	// From the SIGKILL to the new leader's raft "entering leader state",
	// from there to the first acquire it answered 200, and from the
	// SIGKILL to that acquire; ReadyAfter is lockd's own "became leader
	// ... ready_after=" (barrier and timers).
	KillToElected    float64 `json:"kill_to_elected_seconds"`
	ElectedToServing float64 `json:"elected_to_serving_seconds"`
	KillToServing    float64 `json:"kill_to_serving_seconds"`
	ReadyAfter       string  `json:"ready_after"`
	// The table before (old leader) and after (new leader), per /metrics.
	HeldBefore    int64       `json:"held_before"`
	WaitersBefore int64       `json:"waiters_before"`
	HeldAfter     int64       `json:"held_after"`
	WaitersAfter  int64       `json:"waiters_after"`
	MemoryAfter   []memberMem `json:"memory_after"`
	// The killed member started again on its data dir: start → /readyz 200.
	RestartReady float64  `json:"restart_ready_seconds"`
	Notes        []string `json:"notes,omitempty"`
}

// sigtermResult is a SIGTERM of one member and its restart.
type sigtermResult struct {
	Member       string  `json:"member"`
	WasLeader    bool    `json:"was_leader"`
	ExitSeconds  float64 `json:"exit_seconds"`
	Killed       bool    `json:"killed_after_grace"`
	ExitStatus   string  `json:"exit_status"`
	RestartReady float64 `json:"restart_ready_seconds"`
	// NewLeaderReadyAfter: when the stopped member led, the next leader's
	// "ready_after".
	NewLeaderReadyAfter string `json:"new_leader_ready_after,omitempty"`
	// Handover: what the stopped member logged of handing leadership over
	// ("transferred", "failed: ...", or "" when it logged neither).
	Handover string `json:"handover,omitempty"`
}

// handoverOf reads lockd's shutdown lines: whether leadership was handed
// over before the member stopped.
func handoverOf(lines []string) string {
	for _, l := range lines {
		switch {
		case strings.Contains(l, `msg="leadership transferred before shutdown"`):
			return "transferred"
		case strings.Contains(l, `msg="leadership transfer before shutdown failed"`):
			if _, e, ok := strings.Cut(l, " err="); ok {
				return "failed: " + strings.Trim(e, `"`)
			}
			return "failed"
		}
	}
	return ""
}

// queueWaiters queues n waits, one on each of the first n held locks, over
// conns WebSocket sessions of 1 h TTL (so they stay queued after the
// connections close), and watches the cluster for elections meanwhile.
func queueWaiters(ctx context.Context, lc *lockdCluster, ref *leaderRef, n int64, conns int) (*waiterBurstResult, error) {
	conns = int(min(int64(conns), n))
	per := (n + int64(conns) - 1) / int64(conns)
	hc := &http.Client{Timeout: 5 * time.Second}
	termBefore := maxTerm(ctx, lc, hc)
	t0 := time.Now()
	b, err := openBurst(ctx, burstSpec{ref: ref, conns: conns, prefix: "waiter", waitMs: api.MaxWaitTimeoutMs,
		ttl: time.Duration(api.MaxSessionTTLms) * time.Millisecond, parallel: 32,
		namesOf: func(k int) []string {
			var out []string
			for i := int64(k) * per; i < min(int64(k+1)*per, n); i++ {
				out = append(out, scaleLockName(i))
			}
			return out
		}})
	if err != nil {
		return nil, err
	}
	defer b.close()
	bctx, cancel := context.WithCancel(ctx)
	wait := b.start(bctx)
	defer func() { cancel(); wait() }()
	// Done when every wait was sent (refused ones again after their
	// Retry-After) and the leader counts them all, or its count has not
	// moved for 15 s (waits lost, e.g. to a leader change, are reported).
	var queued, last int64 = -1, -1
	lastMove := time.Now()
	deadline := time.Now().Add(retryFor)
	for {
		if !sleepCtx(ctx, 2*time.Second) {
			return nil, ctx.Err()
		}
		if !b.settled() {
			u, s, r, d := b.counts()
			fmt.Fprintf(os.Stderr, "\rwaits: %d unsent, %d sent, %d refused (retrying), %d answered   ", u, s, r, d)
			lastMove = time.Now()
			continue
		}
		l := ref.refresh(ctx)
		_, queued = tableMetrics(ctx, l.httpURL)
		fmt.Fprintf(os.Stderr, "\rwaiters queued per the leader: %d / %d   ", queued, n)
		if queued != last {
			last, lastMove = queued, time.Now()
		}
		if queued >= n || time.Since(lastMove) > 15*time.Second || time.Now().After(deadline) {
			break
		}
	}
	fmt.Fprintln(os.Stderr)
	t1 := time.Now()
	r := &waiterBurstResult{Seconds: t1.Sub(t0).Seconds(), Burst: b.result(int(n), 0, queued), Clients: b.st.summary("waiters")}
	r.TermsStarted = int64(maxTerm(ctx, lc, hc)) - int64(termBefore)
	for _, e := range electionsOf(lc) {
		if at := parseLogTime(e.At); !at.Before(t0) && !at.After(t1) {
			r.Elections = append(r.Elections, e)
		}
	}
	return r, nil
}

// maxTerm is the highest Raft term the members report (0 when none answers).
func maxTerm(ctx context.Context, lc *lockdCluster, hc *http.Client) uint64 {
	var t uint64
	for _, m := range lc.members {
		if st, err := nodeStatus(ctx, hc, m.httpURL); err == nil {
			t = max(t, st.Term)
		}
	}
	return t
}

// logOffsets remembers how long each member's log is, so later reads see
// only what was written after.
func logOffsets(lc *lockdCluster) map[string]int64 {
	out := map[string]int64{}
	for _, m := range lc.members {
		if st, err := os.Stat(filepath.Join(lc.dir, m.id+".log")); err == nil {
			out[m.id] = st.Size()
		}
	}
	return out
}

// logSince returns the lines member id logged after offset.
func logSince(lc *lockdCluster, id string, offset int64) []string {
	f, err := os.Open(filepath.Join(lc.dir, id+".log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// hashicorp/raft's "entering leader state", in its own format
// (`<time> [INFO]  raft.n2: entering leader state: leader=...`) or through
// slog (`time=<time> level=INFO msg="entering leader state" ...`).
var reEnteringLeader = regexp.MustCompile(`^(?:time=)?(\S+) .*entering leader state`)

// leaderEvents finds, in log lines, when raft entered the leader state and
// lockd's "became leader" with its ready_after.
func leaderEvents(lines []string) (entered, became time.Time, readyAfter string) {
	for _, l := range lines {
		if entered.IsZero() {
			if g := reEnteringLeader.FindStringSubmatch(l); g != nil {
				entered = parseLogTime(g[1])
			}
		}
		if g := reBecame.FindStringSubmatch(l); g != nil && became.IsZero() {
			became, readyAfter = parseLogTime(g[1]), g[4]
		}
	}
	return entered, became, readyAfter
}

// failover kills the leader with SIGKILL, times the new leader from its
// election to its first served acquire, compares the table before and
// after, and starts the killed member again on its data dir.
func failover(ctx context.Context, lc *lockdCluster, ref *leaderRef) (*failoverResult, error) {
	old, err := lc.leader(ctx)
	if err != nil {
		return nil, err
	}
	r := &failoverResult{OldLeader: old.id}
	r.HeldBefore, r.WaitersBefore = tableMetrics(ctx, old.httpURL)
	offsets := logOffsets(lc)
	fmt.Fprintf(os.Stderr, "kill -9 of the leader %s (%d held, %d waiting) ...\n", old.id, r.HeldBefore, r.WaitersBefore)
	killAt := time.Now()
	if err := old.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return r, err
	}
	<-old.p.done

	// The first acquire a surviving member answers 200 (a follower
	// answers 307, a member without a leader 503).
	hc := &http.Client{Timeout: 2 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	body := []byte(`{"client_id":"failover-probe","ttl_ms":30000}`)
	var served time.Time
	var servedBy *lockdMember
	var token uint64
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for served.IsZero() && pctx.Err() == nil {
		for _, m := range lc.members {
			if m == old {
				continue
			}
			tok, ok := tryAcquire(pctx, hc, m.httpURL, "failover-probe", body)
			if ok {
				served, servedBy, token = time.Now(), m, tok
				break
			}
		}
		if served.IsZero() {
			sleepCtx(pctx, 10*time.Millisecond)
		}
	}
	if served.IsZero() {
		return r, errors.New("no surviving member served an acquire within 2 minutes of the kill")
	}
	r.NewLeader = servedBy.id
	r.KillToServing = served.Sub(killAt).Seconds()
	entered, _, ready := leaderEvents(logSince(lc, servedBy.id, offsets[servedBy.id]))
	r.ReadyAfter = ready
	if entered.IsZero() {
		r.Notes = append(r.Notes, "no \"entering leader state\" line in the new leader's log (run lockd with --raft-log-level info)")
	} else {
		r.KillToElected = entered.Sub(killAt).Seconds()
		r.ElectedToServing = served.Sub(entered).Seconds()
	}
	_ = postOK(ctx, hc, servedBy.httpURL+"/api/v1/locks/failover-probe/release",
		[]byte(fmt.Sprintf(`{"client_id":"failover-probe","fencing_token":%d}`, token)))
	r.HeldAfter, r.WaitersAfter = tableMetrics(ctx, servedBy.httpURL)
	ref.refresh(ctx)
	r.MemoryAfter = memberMemory(lc, servedBy)

	fmt.Fprintf(os.Stderr, "new leader %s served %.2f s after the kill; starting %s again ...\n", servedBy.id, r.KillToServing, old.id)
	ready2, err := restartMember(ctx, lc, old)
	r.RestartReady = ready2
	return r, err
}

// tryAcquire posts an acquire to base and reports the token of a 200.
func tryAcquire(ctx context.Context, hc *http.Client, base, lock string, body []byte) (uint64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/locks/"+lock+"/acquire", bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	var ar api.AcquireReply
	if json.Unmarshal(b, &ar) != nil || !ar.Acquired {
		return 0, false
	}
	return ar.FencingToken, true
}

// restartMember starts m again on its data dir and returns the time from
// the start to its /readyz 200.
func restartMember(ctx context.Context, lc *lockdCluster, m *lockdMember) (float64, error) {
	p, err := startProc("lockd-"+m.id, filepath.Join(lc.dir, m.id+".log"), lc.bin, m.args...)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	m.p = p
	if err := waitHTTP200(ctx, m.httpURL+"/readyz", 5*time.Minute); err != nil {
		return 0, fmt.Errorf("lockd %s: %v\n%s", m.id, err, m.p.logTail(2000))
	}
	return time.Since(t0).Seconds(), nil
}

// sigtermMember stops the current leader with SIGTERM (the member with the
// most to do: it hands leadership over first), times its exit, and starts
// it again on its data dir.
func sigtermMember(ctx context.Context, lc *lockdCluster, ref *leaderRef) (*sigtermResult, error) {
	m, err := lc.leader(ctx)
	if err != nil {
		return nil, err
	}
	r := &sigtermResult{Member: m.id, WasLeader: true}
	offsets := logOffsets(lc)
	fmt.Fprintf(os.Stderr, "SIGTERM of the leader %s ...\n", m.id)
	t0 := time.Now()
	if err := m.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return r, err
	}
	const grace = 60 * time.Second
	select {
	case <-m.p.done:
		r.ExitSeconds = time.Since(t0).Seconds()
	case <-time.After(grace):
		r.ExitSeconds, r.Killed = grace.Seconds(), true
		_ = m.p.cmd.Process.Kill()
		<-m.p.done
	}
	r.ExitStatus = "exit 0"
	if m.p.err != nil {
		r.ExitStatus = m.p.err.Error()
	}
	r.Handover = handoverOf(logSince(lc, m.id, offsets[m.id]))
	// The next leader's "became leader" (logged once it serves).
	for deadline := time.Now().Add(time.Minute); r.NewLeaderReadyAfter == "" && time.Now().Before(deadline) && ctx.Err() == nil; {
		for _, o := range lc.members {
			if o != m {
				if _, _, ra := leaderEvents(logSince(lc, o.id, offsets[o.id])); ra != "" {
					r.NewLeaderReadyAfter = o.id + ": " + ra
				}
			}
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	ref.refresh(ctx)
	fmt.Fprintf(os.Stderr, "%s exited %.2f s after SIGTERM (%s); starting it again ...\n", m.id, r.ExitSeconds, r.ExitStatus)
	r.RestartReady, err = restartMember(ctx, lc, m)
	return r, err
}

// writeWaiterBurstMarkdown says how the waiters were queued and whether
// the leader held.
func writeWaiterBurstMarkdown(w io.Writer, rep *scaleReport) {
	if wb := rep.WaiterBurst; wb != nil {
		fmt.Fprintf(w, "Queueing the waiters: %d sent over %d sessions in %.1f s, %d queued per the leader after %.1f s; resent after cuts %d, after refusals %d; refusals %s (Retry-After min/p50/max %.0f/%.0f/%.0f ms, %d without); connections cut %s. **Elections during the waiter burst: %d** (terms started: %d).",
			wb.Burst.Sent, wb.Burst.Conns, wb.Burst.SendSeconds, wb.Burst.Queued, wb.Seconds, wb.Burst.Resent, wb.Burst.Retried,
			fmtCounts(wb.Clients.Codes), wb.Clients.RetryAfter.MinMs, wb.Clients.RetryAfter.P50Ms, wb.Clients.RetryAfter.MaxMs,
			wb.Clients.RetryAfter.Missing, fmtCounts(wb.Clients.Cuts), len(wb.Elections), wb.TermsStarted)
		for _, e := range wb.Elections {
			fmt.Fprintf(w, " %s: %s term %d, ready after %.3f s.", e.At, e.Member, e.Term, e.ReadyAfter)
		}
		fmt.Fprint(w, "\n\n")
	}
}

// writeFailoverMarkdown reports the kill -9 and the SIGTERM.
func writeFailoverMarkdown(w io.Writer, rep *scaleReport) {
	if f := rep.Failover; f != nil {
		fmt.Fprintf(w, "kill -9 of the leader %s: %s won the election %.2f s after the kill and **served its first acquire %.3f s after winning** (%.2f s after the kill; its own ready_after %s). Table before → after: %d → %d held, %d → %d waiting (the probe's own lock released before counting). The killed member, restarted on its data dir, was ready (/readyz 200) after **%.2f s**.  \n",
			f.OldLeader, f.NewLeader, f.KillToElected, f.ElectedToServing, f.KillToServing, f.ReadyAfter, f.HeldBefore, f.HeldAfter, f.WaitersBefore, f.WaitersAfter, f.RestartReady)
		var parts []string
		for _, m := range f.MemoryAfter {
			role := ""
			if m.Leader {
				role = " (leader)"
			}
			if m.ID == f.OldLeader {
				parts = append(parts, m.ID+" down")
				continue
			}
			parts = append(parts, fmt.Sprintf("%s%s %.0f MiB", m.ID, role, m.RSSMiB))
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "RSS after the failover: %s.  \n", strings.Join(parts, ", "))
		}
		for _, n := range f.Notes {
			fmt.Fprintf(w, "Note: %s.  \n", n)
		}
		fmt.Fprintln(w)
	}
	if s := rep.Sigterm; s != nil {
		killed := ""
		if s.Killed {
			killed = " (did not exit within the grace period and was killed)"
		}
		handover := "no handover logged"
		if s.Handover != "" {
			handover = "leadership " + s.Handover
		}
		fmt.Fprintf(w, "SIGTERM of the leader %s: **exited after %.2f s**%s, %s, %s; the next leader ready after %s; restarted on its data dir, **ready after %.2f s**.\n\n",
			s.Member, s.ExitSeconds, killed, s.ExitStatus, handover, s.NewLeaderReadyAfter, s.RestartReady)
	}
}
