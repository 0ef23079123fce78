package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/testutil"
)

// Fault kinds the nemesis injects.
const (
	FaultKillLeader     = "kill-leader"     // SIGKILL the leader, restart it on its data dir
	FaultKillFollower   = "kill-follower"   // SIGKILL a follower, restart it
	FaultPauseLeader    = "pause-leader"    // SIGSTOP the leader for seconds, SIGCONT
	FaultPauseFollower  = "pause-follower"  // SIGSTOP a follower, SIGCONT
	FaultIsolateLeader  = "isolate-leader"  // cut every link of the leader
	FaultPartition      = "partition"       // random majority/minority split
	FaultOneWayLeader   = "oneway-leader"   // the leader's messages to the others vanish; theirs arrive
	FaultOneWayRandom   = "oneway-random"   // one random directed pair loses its messages
	FaultSlowNet        = "slow-net"        // delay and jitter on every link
	FaultLossyNet       = "lossy-net"       // connections reset at random on every link
	FaultMembership     = "membership"      // add a member with --join, then remove another (sometimes the leader)
	FaultCrashAll       = "crash-all"       // SIGKILL every member at once, restart all; durability probes
	FaultKillLeaderFast = "kill-leader-now" // SIGKILL the leader and restart it at once (crash loop)
	FaultTermLeader     = "term-leader"     // SIGTERM the leader (graceful: hands leadership over), restart it
	FaultBadMember      = "bad-member"      // POST /api/v1/cluster/members with a body no member may accept
	// FaultStall is not injected: it records a stretch in which the test
	// process itself did not run (see watchStalls). Its Raft proxies and
	// clients stood still too, so it disturbs the cluster like a fault.
	FaultStall = "harness-stall"
)

// stallGap is how late the stall watcher's 50 ms tick must come to count
// as a stall of the test process.
const stallGap = 300 * time.Millisecond

// watchStalls records, until ctx ends, every stretch in which the test
// process did not run for stallGap or more (a tick of a 50 ms ticker came
// that late): a FaultStall. On a loaded machine the process that carries
// every client and every Raft link can stop for a second; the liveness
// checkers then excuse what it delayed, as for an injected fault.
func watchStalls(ctx context.Context, rec *Recorder) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	// The Go runtime's own account of the stretch, for the reader: GC
	// cycles, the longest GC pause and the longest wait of a runnable
	// goroutine for a CPU (a starved process) since the last tick.
	samples := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/pauses/total/gc:seconds"},
		{Name: "/sched/latencies:seconds"}}
	metrics.Read(samples)
	prev := snapshotStall(samples)
	last := rec.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := rec.Now()
		metrics.Read(samples)
		cur := snapshotStall(samples)
		if time.Duration(now-last) >= stallGap {
			rec.AddFault(Fault{Kind: FaultStall, Start: last, End: now, Healed: now, Healthy: now,
				Detail: fmt.Sprintf("the test process did not run for %s (Go runtime: %d GC cycles, longest GC pause ≤ %s, longest wait for a CPU ≤ %s)",
					time.Duration(now-last).Round(time.Millisecond), cur.cycles-prev.cycles,
					maxNewBucket(prev.pauses, cur.pauses, samples[1]), maxNewBucket(prev.lat, cur.lat, samples[2]))})
		}
		prev, last = cur, now
	}
}

type stallSnapshot struct {
	cycles      uint64
	pauses, lat []uint64
}

func snapshotStall(s []metrics.Sample) stallSnapshot {
	out := stallSnapshot{}
	if s[0].Value.Kind() == metrics.KindUint64 {
		out.cycles = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindFloat64Histogram {
		out.pauses = append([]uint64(nil), s[1].Value.Float64Histogram().Counts...)
	}
	if s[2].Value.Kind() == metrics.KindFloat64Histogram {
		out.lat = append([]uint64(nil), s[2].Value.Float64Histogram().Counts...)
	}
	return out
}

// maxNewBucket is the upper bound of the highest histogram bucket that
// gained counts between two snapshots ("-" for none).
func maxNewBucket(prev, cur []uint64, s metrics.Sample) string {
	if s.Value.Kind() != metrics.KindFloat64Histogram || len(prev) != len(cur) {
		return "-"
	}
	b := s.Value.Float64Histogram().Buckets
	for i := len(cur) - 1; i >= 0; i-- {
		if cur[i] > prev[i] && i+1 < len(b) {
			if math.IsInf(b[i+1], 1) {
				return fmt.Sprintf("∞ (above %s)", time.Duration(b[i]*float64(time.Second)))
			}
			return time.Duration(b[i+1] * float64(time.Second)).Round(time.Microsecond).String()
		}
	}
	return "-"
}

// AllFaults is every kind, in the order a schedule cycles through them
// before shuffling.
var AllFaults = []string{FaultKillLeader, FaultKillFollower, FaultPauseLeader, FaultPauseFollower,
	FaultIsolateLeader, FaultPartition, FaultOneWayLeader, FaultOneWayRandom, FaultSlowNet, FaultLossyNet,
	FaultMembership, FaultCrashAll, FaultKillLeaderFast, FaultTermLeader, FaultBadMember}

// leaderFaults take the leader away; their failover time is measured.
var leaderFaults = map[string]bool{FaultKillLeader: true, FaultPauseLeader: true, FaultIsolateLeader: true,
	FaultOneWayLeader: true, FaultKillLeaderFast: true, FaultTermLeader: true}

// Nemesis injects faults one at a time, each healed before the next, while
// the workload runs.
type Nemesis struct {
	c       *Cluster
	rec     *Recorder
	rng     *rand.Rand
	kinds   []string
	quiet   time.Duration
	hc      *http.Client
	direct  *http.Client // does not follow redirects
	probe   int
	crashes int
	bad     int
	// Liveness problems: the cluster did not recover after a heal.
	stuck []string
}

// NewNemesis prepares a nemesis over the given fault kinds.
func NewNemesis(c *Cluster, rec *Recorder, seed uint64, kinds []string) *Nemesis {
	return &Nemesis{c: c, rec: rec, rng: rand.New(rand.NewPCG(seed, 7)), kinds: kinds,
		quiet: 700 * time.Millisecond, hc: &http.Client{},
		direct: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Run injects faults until ctx ends. The schedule cycles through the kinds
// in a seeded random order, so a run long enough does every kind.
func (n *Nemesis) Run(ctx context.Context) {
	defer n.hc.CloseIdleConnections()
	defer n.direct.CloseIdleConnections()
	var order []string
	for ctx.Err() == nil {
		if len(order) == 0 {
			order = append([]string(nil), n.kinds...)
			n.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		f := n.inject(ctx, kind)
		n.RecordExits()
		err := n.c.WaitHealthy(45 * time.Second)
		if err != nil {
			msg := fmt.Sprintf("after %s: %v", kind, err)
			n.stuck = append(n.stuck, msg)
			n.rec.Note("liveness: %s", msg)
			n.RecordExits()
			n.reviveAll()
			err = n.c.WaitHealthy(45 * time.Second)
		}
		f.Healthy = n.rec.Now()
		f.Stuck = err != nil
		n.rec.AddFault(f)
		if err != nil {
			n.rec.Note("liveness: still not healthy: %v", err)
			return
		}
		sleep(ctx, n.quiet+jitter(n.rng, 0, time.Second))
	}
}

// Stuck returns the liveness failures seen.
func (n *Nemesis) Stuck() []string { return n.stuck }

// RecordExits records every member process that exited without the
// harness stopping it (a KindMemberExit op each); reviveAll restarts them.
func (n *Nemesis) RecordExits() {
	for _, e := range n.c.Exited() {
		now := n.rec.Now()
		n.rec.Add(Op{Worker: "harness", Via: "nemesis", Kind: KindMemberExit, Node: e.id, Invoke: now, Return: now,
			Outcome: Fail, Err: e.why})
		n.rec.Note("member %s exited by itself: %s", e.id, e.why)
	}
}

// reviveAll undoes every fault: network healed, paused members continued,
// stopped members restarted.
func (n *Nemesis) reviveAll() {
	n.c.HealNet()
	for _, i := range n.c.Members() {
		n.c.Resume(i)
		n.c.mu.Lock()
		running := n.c.slots[i].running()
		n.c.mu.Unlock()
		if !running {
			if err := n.c.Restart(i); err != nil {
				n.rec.Note("restart %s: %v", n.c.ID(i), err)
			}
		}
	}
}

// hold sleeps d unless ctx ends — a fault is always healed, even when the
// run ends in the middle of it.
func (n *Nemesis) hold(ctx context.Context, lo, hi time.Duration) { sleep(ctx, jitter(n.rng, lo, hi)) }

func (n *Nemesis) others(of int) []int {
	var out []int
	for _, i := range n.c.Members() {
		if i != of {
			out = append(out, i)
		}
	}
	return out
}

func (n *Nemesis) pick(from []int) int { return from[n.rng.IntN(len(from))] }

// failover is what a failover probe saw: how long until a write was
// answered, and by which member (the leader then).
type failover struct {
	d  time.Duration
	by string
}

// failoverProbe measures, from now, how long until some member answers a
// write again (200, or 409 from a leader), and which. It reports on the
// returned channel; stop ends it early.
func (n *Nemesis) failoverProbe(ctx context.Context) (<-chan failover, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	out := make(chan failover, 1)
	start := time.Now()
	n.probe++
	base := n.probe * 100000
	go func() {
		defer close(out)
		eps := n.c.Endpoints()
		for i := 0; ctx.Err() == nil; i++ {
			rctx, rcancel := context.WithTimeout(ctx, 250*time.Millisecond)
			body := fmt.Sprintf(`{"client_id":"probe-%d","ttl_ms":100}`, base+i)
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, eps[i%len(eps)]+"/api/v1/locks/chaos-failover-probe/acquire",
				strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := n.hc.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			rcancel()
			if err == nil && (resp.StatusCode == 200 || resp.StatusCode == 409) {
				out <- failover{d: time.Since(start), by: n.c.idAt(resp.Request.URL.Host)}
				return
			}
			sleep(ctx, 10*time.Millisecond)
		}
	}()
	return out, cancel
}

// inject performs one fault and heals it; the caller records it once the
// cluster is healthy again.
func (n *Nemesis) inject(ctx context.Context, kind string) (f Fault) {
	f = Fault{Kind: kind, Start: n.rec.Now()}
	var probe <-chan failover
	var stopProbe context.CancelFunc = func() {}
	startProbe := func() { probe, stopProbe = n.failoverProbe(context.Background()) }
	leader, err := n.c.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		f.Err = err.Error()
		f.End = n.rec.Now()
		return f
	}
	// Heal whatever this fault did, however it ends.
	defer func() {
		if f.Healed == 0 {
			f.Healed = n.rec.Now()
		}
		n.reviveAll()
		if probe != nil {
			select {
			case fo, ok := <-probe:
				if ok {
					f.Failover, f.FailoverBy = int64(fo.d), fo.by
				}
			case <-time.After(30 * time.Second):
			}
			stopProbe()
		}
		f.End = n.rec.Now()
	}()
	name := n.c.ID
	switch kind {
	case FaultKillLeader, FaultKillLeaderFast:
		f.Targets = []string{name(leader)}
		n.c.Kill(leader)
		startProbe()
		if kind == FaultKillLeader {
			n.hold(ctx, 500*time.Millisecond, 3*time.Second)
		}
		if err := n.c.Restart(leader); err != nil {
			f.Err = err.Error()
		}
	case FaultTermLeader:
		f.Targets = []string{name(leader)}
		startProbe()
		if !n.c.Term(leader, 20*time.Second) {
			f.Err = "did not exit within 20s of SIGTERM"
		}
		n.hold(ctx, 200*time.Millisecond, 2*time.Second)
		if err := n.c.Restart(leader); err != nil {
			f.Err = err.Error()
		}
	case FaultKillFollower:
		v := n.pick(n.others(leader))
		f.Targets = []string{name(v)}
		n.c.Kill(v)
		n.hold(ctx, 500*time.Millisecond, 4*time.Second)
		if err := n.c.Restart(v); err != nil {
			f.Err = err.Error()
		}
	case FaultPauseLeader:
		f.Targets = []string{name(leader)}
		sess := n.openSession(leader)
		n.warm(leader, 8)
		d := jitter(n.rng, 1500*time.Millisecond, 4*time.Second)
		n.c.Pause(leader)
		startProbe()
		kas := n.keepalivesWhilePaused(leader, sess, d)
		sleep(ctx, d)
		f.Healed = n.rec.Now()
		n.c.Resume(leader)
		kas.Wait()
	case FaultPauseFollower:
		v := n.pick(n.others(leader))
		f.Targets = []string{name(v)}
		n.c.Pause(v)
		n.hold(ctx, time.Second, 4*time.Second)
		n.c.Resume(v)
	case FaultIsolateLeader:
		f.Targets = []string{name(leader)}
		n.c.Isolate([]int{leader}, n.others(leader))
		startProbe()
		n.hold(ctx, 2*time.Second, 5*time.Second)
	case FaultPartition:
		members := n.c.Members()
		n.rng.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		k := 1 + n.rng.IntN((len(members)-1)/2) // minority size
		minority, majority := members[:k], members[k:]
		for _, i := range minority {
			f.Targets = append(f.Targets, name(i))
		}
		f.Detail = "minority"
		n.c.Isolate(minority, majority)
		n.hold(ctx, 2*time.Second, 5*time.Second)
	case FaultOneWayLeader:
		f.Targets = []string{name(leader)}
		f.Detail = "leader's messages to every other member vanish"
		for _, o := range n.others(leader) {
			n.c.OneWay(leader, o)
		}
		startProbe()
		n.hold(ctx, 2*time.Second, 5*time.Second)
	case FaultOneWayRandom:
		members := n.c.Members()
		a := n.pick(members)
		b := n.pick(n.others(a))
		f.Targets = []string{name(a), name(b)}
		f.Detail = name(a) + "→" + name(b) + " vanishes"
		n.c.OneWay(a, b)
		n.hold(ctx, 2*time.Second, 5*time.Second)
	case FaultSlowNet:
		// Mostly a slow LAN; one time in three a round trip near or above
		// the leader lease, so leaders may step down until it heals.
		d := jitter(n.rng, 10*time.Millisecond, 50*time.Millisecond)
		if n.rng.IntN(3) == 0 {
			d = jitter(n.rng, 100*time.Millisecond, 200*time.Millisecond)
		}
		j := jitter(n.rng, 0, 30*time.Millisecond)
		f.Detail = fmt.Sprintf("delay %s jitter %s", d, j)
		n.c.AllLinks(func(p *testutil.Proxy) { p.SetDelay(d, j) })
		n.hold(ctx, 3*time.Second, 8*time.Second)
	case FaultLossyNet:
		rate := 0.01 + n.rng.Float64()*0.09
		f.Detail = fmt.Sprintf("reset rate %.2f per chunk", rate)
		n.c.AllLinks(func(p *testutil.Proxy) { p.SetDropRate(rate) })
		n.hold(ctx, 3*time.Second, 6*time.Second)
	case FaultMembership:
		n.membership(ctx, leader, &f)
	case FaultCrashAll:
		n.crashAll(ctx, &f, &probe, &stopProbe)
	case FaultBadMember:
		n.badMember(leader, &f)
	default:
		f.Err = "unknown fault kind"
	}
	return f
}

// openSession opens a session on member i directly (no redirect), with
// the shortest TTL, for keepalives sent to it while it is paused. "" when
// i does not take it (it is no longer the leader, say).
func (n *Nemesis) openSession(i int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, b, err := n.send(ctx, http.MethodPost, n.c.slots[i].url()+"/api/v1/sessions",
		strings.NewReader(fmt.Sprintf(`{"client_id":"ka-%d","ttl_ms":%d}`, n.rec.Now(), api.MinSessionTTLms)))
	var sr api.SessionReply
	if err != nil || st != 200 || json.Unmarshal(b, &sr) != nil {
		return ""
	}
	return sr.SessionID
}

// warm opens k idle connections to member i, so requests sent to it while
// it is paused are read as soon as it wakes (not first accepted).
func (n *Nemesis) warm(i, k int) {
	var wg sync.WaitGroup
	for j := 0; j < k; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _, _ = n.send(ctx, http.MethodGet, n.c.slots[i].url()+"/healthz", nil)
		}()
	}
	wg.Wait()
}

// keepalivesWhilePaused sends keepalives of session sess to the paused
// member i, one shortly after the pause and then every 150 ms while it
// lasts (d), redirects not followed: the member must not acknowledge one
// once it wakes up deposed (SPEC semantics 10). Each is recorded when it
// ends; the returned group waits for them.
func (n *Nemesis) keepalivesWhilePaused(i int, sess string, d time.Duration) *sync.WaitGroup {
	var wg sync.WaitGroup
	if sess == "" {
		return &wg
	}
	id, base := n.c.ID(i), n.c.slots[i].url()
	start := time.Now()
	for at := 100 * time.Millisecond; at < d; at += 150 * time.Millisecond {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(at)))
			op := Op{Worker: "nemesis", Via: "nemesis", Kind: KindKeepalive, ClientID: sess, Node: id, Invoke: n.rec.Now()}
			ctx, cancel := context.WithTimeout(context.Background(), d-at+3*time.Second)
			st, b, err := n.send(ctx, http.MethodPost, base+"/api/v1/sessions/"+url.PathEscape(sess)+"/keepalive", nil)
			cancel()
			op.Return, op.Status = n.rec.Now(), st
			var er api.ErrorReply
			_ = json.Unmarshal(b, &er)
			switch {
			case err != nil:
				op.Outcome, op.Err = Unknown, err.Error()
			case st == 200:
				op.Outcome = Ok
			default:
				op.Outcome, op.Code = Fail, er.Error.Code
			}
			n.rec.Add(op)
		}()
	}
	return &wg
}

// send does one request to one member, redirects not followed.
func (n *Nemesis) send(ctx context.Context, method, u string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.direct.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// badMember asks the leader to add a member with a garbage raft_addr and
// a 65,000-byte http_addr of 0xFF bytes (invalid UTF-8; the body stays
// under the 64 KiB limit, so it must be refused by validation, SPEC
// semantics 12): the answer must be 400, the configuration unchanged, and
// every member must keep running (RecordExits, after the fault).
func (n *Nemesis) badMember(leader int, f *Fault) {
	n.bad++
	id := fmt.Sprintf("bad-%d", n.bad)
	const raftAddr = "not an address:::99999"
	body := `{"id":"` + id + `","raft_addr":"` + raftAddr + `","http_addr":"` + strings.Repeat("\xff", 65000) + `"}`
	f.Targets = []string{n.c.ID(leader)}
	f.Detail = fmt.Sprintf("add %s, raft_addr %q, http_addr 65,000 bytes of 0xFF (body %d bytes)", id, raftAddr, len(body))
	op := Op{Worker: "nemesis", Via: "nemesis", Kind: KindMemberAdd, ClientID: id, Node: n.c.ID(leader), Invoke: n.rec.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, b, err := n.send(ctx, http.MethodPost, n.c.slots[leader].url()+"/api/v1/cluster/members", strings.NewReader(body))
	cancel()
	op.Return, op.Status = n.rec.Now(), st
	var er api.ErrorReply
	_ = json.Unmarshal(b, &er)
	op.Code = er.Error.Code
	switch {
	case err != nil:
		op.Outcome, op.Err = Unknown, err.Error()
	case st >= 200 && st < 300:
		op.Outcome = Ok
	default:
		op.Outcome = Fail
	}
	// Give a member that applies something it cannot read the time to fall
	// over, then look at the configuration.
	time.Sleep(1500 * time.Millisecond)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cs api.ClusterStatus
	if u := n.c.leaderURL(ctx); u != "" {
		if code, err := n.c.getJSON(ctx, u+"/api/v1/cluster", &cs); err == nil && code == 200 {
			for _, m := range cs.Members {
				if m.ID == id {
					op.Err = strings.TrimPrefix(op.Err+"; ", "; ") + "the configuration lists it afterwards"
					_, _, _ = n.c.post(ctx, http.MethodDelete, u+"/api/v1/cluster/members/"+id, nil)
				}
			}
		}
	}
	n.rec.Add(op)
}

// membership adds a member in a free slot (it joins with --join), then
// removes another member — the leader one time in three — and wipes it.
func (n *Nemesis) membership(ctx context.Context, leader int, f *Fault) {
	added, err := n.c.AddMember(ctx, 30*time.Second)
	if added >= 0 {
		f.Targets = append(f.Targets, "+"+n.c.ID(added))
	}
	if err != nil {
		f.Err = err.Error()
		if added >= 0 {
			// Take the half-joined member out again so the slot is free.
			if rerr := n.c.RemoveMember(ctx, added, 30*time.Second); rerr != nil {
				f.Err += "; undo: " + rerr.Error()
			}
		}
		return
	}
	victim := leader
	if n.rng.IntN(3) != 0 {
		var cands []int
		for _, i := range n.others(leader) {
			if i != added {
				cands = append(cands, i)
			}
		}
		victim = n.pick(cands)
	}
	f.Targets = append(f.Targets, "-"+n.c.ID(victim))
	if err := n.c.RemoveMember(ctx, victim, 30*time.Second); err != nil {
		f.Err = err.Error()
	}
}

// crashAll takes durability probes, kills every member at once, restarts
// them all, and reads the probes back. Recovery (kill → first write
// answered) is measured like a failover.
func (n *Nemesis) crashAll(ctx context.Context, f *Fault, probe *<-chan failover, stop *context.CancelFunc) {
	n.crashes++
	round := n.crashes
	w := NewWorkload(n.rec, WorkloadOptions{Endpoints: n.c.Endpoints()})
	w.via = "nemesis"
	defer w.hc.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(uint64(round), 11))
	ep := &endpoint{}
	type durable struct {
		lock, cid, tag string
	}
	var probes []durable
	bg := context.WithoutCancel(ctx)
	for i := 0; i < 6; i++ {
		d := durable{lock: fmt.Sprintf("durable-%d-%d", round, i), cid: fmt.Sprintf("d-%d-%d", round, i),
			tag: fmt.Sprintf("durable:%d:%d", round, i)}
		g := w.acquireChain(bg, ep, rng, "nemesis", d.lock, d.cid, 10*time.Minute, 0, d.tag, 10*time.Second)
		if g.Outcome != Ok {
			continue
		}
		if i%2 == 1 {
			w.releaseChain(bg, ep, rng, "nemesis", d.lock, d.cid, g.OutToken, d.tag)
		}
		probes = append(probes, d)
	}
	members := n.c.Members()
	for _, i := range members {
		f.Targets = append(f.Targets, n.c.ID(i))
	}
	f.Start = n.rec.Now()
	for _, i := range members {
		n.c.Kill(i)
	}
	*probe, *stop = n.failoverProbe(context.Background())
	n.hold(ctx, 200*time.Millisecond, 1500*time.Millisecond)
	var errs []error
	for _, i := range members {
		errs = append(errs, n.c.Restart(i))
	}
	errs = append(errs, n.c.WaitHealthy(60*time.Second))
	if err := errors.Join(errs...); err != nil {
		f.Err = err.Error()
	}
	for _, d := range probes {
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := w.read(bg, ep, "nemesis", d.lock, d.tag+":check")
			if r.Outcome == Ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	f.Detail = fmt.Sprintf("%d durability probes", len(probes))
}

// finalState is the lock table every member agreed on at one applied
// index.
type finalState struct {
	Applied uint64
	Locks   []api.LockStatus
}

// compareReplicas waits until every member has applied the same index and
// then compares their local lock tables (stale reads: every field of every
// lock's status, its index and holders' values too) and last tokens:
// replicas of one log must agree. It returns a description of a
// difference that persisted, or "" and the table they agreed on.
func compareReplicas(c *Cluster, d time.Duration) (string, *finalState) {
	deadline := time.Now().Add(d)
	last := "no consistent snapshot of the members could be taken"
	for time.Now().Before(deadline) {
		type view struct {
			id    string
			st    api.NodeStatus
			locks string
			list  []api.LockStatus
		}
		var views []view
		ok := true
		for _, i := range c.Members() {
			st1, err1 := c.Status(i)
			var list api.LockList
			code, err := c.getJSON(context.Background(), c.slots[i].url()+"/api/v1/locks?stale=true&limit=10000", &list)
			st2, err2 := c.Status(i)
			if err1 != nil || err2 != nil || err != nil || code != 200 || st1.AppliedIndex != st2.AppliedIndex || list.Next != "" {
				ok = false
				break
			}
			var sb strings.Builder
			for _, l := range list.Locks {
				fmt.Fprintf(&sb, "%s:%t:%s:%d:%s:%d:%s:%d:%q:%s:%d", l.Lock, l.Held, l.ClientID, l.FencingToken, l.ExpiresAt, l.Waiters,
					l.Mode, l.Limit, l.Value, l.DelayedUntil, l.Index)
				for _, h := range l.Holders {
					fmt.Fprintf(&sb, ":[%s/%d/%s/%s/%q]", h.ClientID, h.FencingToken, h.Mode, h.ExpiresAt, h.Value)
				}
				sb.WriteString(";")
			}
			views = append(views, view{id: c.ID(i), st: st2, locks: sb.String(), list: list.Locks})
		}
		if ok && len(views) > 0 {
			same := true
			for _, v := range views[1:] {
				if v.st.AppliedIndex != views[0].st.AppliedIndex {
					same = false
				}
			}
			if same {
				diff := ""
				for _, v := range views[1:] {
					if v.locks != views[0].locks || v.st.LastToken != views[0].st.LastToken {
						diff = fmt.Sprintf("at applied index %d, %s (last token %d) and %s (last token %d) differ:\n%s\n%s",
							v.st.AppliedIndex, views[0].id, views[0].st.LastToken, v.id, v.st.LastToken, views[0].locks, v.locks)
					}
				}
				if diff == "" {
					return "", &finalState{Applied: views[0].st.AppliedIndex, Locks: views[0].list}
				}
				last = diff
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return last, nil
}
