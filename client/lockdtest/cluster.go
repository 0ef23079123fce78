// Package lockdtest runs an in-memory fake of lockd for tests of code that
// speaks to lockd (package client, lockctl): the WebSocket session protocol
// (hello and resume, acquire with FIFO waits and pushed grants, release,
// renew, keepalive, "lost" pushes, session expiry), the lock kinds (shared
// mode, semaphores, multi-acquire, lock-delay, revocation, values) and the
// plain HTTP API,
// on one or more members of which one is the leader; followers answer as
// the SPEC says (not_leader on WebSocket, 307 on HTTP). There is no Raft and
// nothing on disk: the members share one state, so a leader change keeps
// sessions and queues, as the real cluster does. Faults: SetLeader,
// DropConnections, Partition, DropReplies, ExpireSession, ExpireLock,
// DropGrant, DropWatchChanges, DropHTTPConnections, Overload, ExhaustBudget. Waits are withdrawn by cancel
// (WebSocket and HTTP), and a WebSocket release may hand the lock on to
// another acquire of the same client (handoff), as in lockd. Watches and blocking queries are served
// too (see watch.go), and so is membership as far as clients see it:
// GET /api/v1/status (each member's own view), GET /api/v1/cluster, and
// members added from outside (listed, serving nothing; removing an unknown
// one is 404 not_found, as in lockd).
package lockdtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// Options configure a Cluster.
type Options struct {
	// Members is the number of members; default 1. Member 0 leads first.
	Members int
	// Proofs makes grants carry a fencing_proof ("proof:<lock>:<token>").
	Proofs bool
	// Logf, if set, receives a line per notable event (e.g. t.Logf).
	Logf func(format string, args ...any)
}

// Cluster is a running fake. Close it when done.
type Cluster struct {
	opts    Options
	members []*member
	stop    chan struct{}
	wg      sync.WaitGroup // the sweeper and every handler still running

	mu          sync.Mutex
	closed      bool
	leader      int // index of the leader, -1 for none
	partitioned bool
	dropReplies map[string]bool // WebSocket ops whose replies are lost
	requests    map[string]int  // WebSocket requests handled, by op
	lost        map[string]int  // WebSocket requests lost to a partition, by op
	healed      chan struct{}   // closed when a partition ends
	lastToken   uint64
	nextSession int
	sessions    map[string]*session
	ended       map[string]time.Time // when each ended session ended
	locks       map[string]*lock
	index       uint64                // counts lock changes (the status "index")
	dropped     map[string]uint64     // the index of each dropped lock's last change
	changes     chan struct{}         // closed (and replaced) at every change
	dropWatch   bool                  // see DropWatchChanges
	fresh       int                   // hellos that opened a session
	resumed     int                   // hellos that resumed one
	added       map[string]api.Member // members added by POST /api/v1/cluster/members
	handoffs    int                   // releases with a hand-off
	cancelled   int                   // waits withdrawn by a cancel
	overload    map[string]int        // requests of an op still to refuse as overloaded
	budget      map[string]int        // requests of an op still to refuse as over a client's budget
	overloaded  int                   // requests refused as overloaded
}

// New starts a fake cluster.
func New(opts Options) *Cluster {
	if opts.Members <= 0 {
		opts.Members = 1
	}
	c := &Cluster{
		opts:     opts,
		stop:     make(chan struct{}),
		healed:   make(chan struct{}),
		sessions: make(map[string]*session),
		ended:    make(map[string]time.Time),
		locks:    make(map[string]*lock),
		requests: make(map[string]int),
		lost:     make(map[string]int),
		dropped:  make(map[string]uint64),
		changes:  make(chan struct{}),
		added:    make(map[string]api.Member),
		overload: make(map[string]int),
		budget:   make(map[string]int),

		dropReplies: make(map[string]bool),
	}
	close(c.healed)
	for i := 0; i < opts.Members; i++ {
		m := &member{c: c, idx: i, id: fmt.Sprintf("node%d", i+1), conns: make(map[*conn]struct{})}
		m.srv = httptest.NewUnstartedServer(m.routes())
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.srv.Start()
	}
	c.wg.Add(1)
	go c.sweep()
	return c
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func (c *Cluster) sweep() {
	defer c.wg.Done()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.mu.Lock()
			if c.leader >= 0 {
				c.sweepLocked(now)
			}
			c.mu.Unlock()
		}
	}
}

// URLs returns the members' base URLs.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.srv.URL
	}
	return out
}

// URL returns member i's base URL.
func (c *Cluster) URL(i int) string { return c.members[i].srv.URL }

// Leader returns the index of the leader, -1 for none.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// SetLeader makes member i the leader (-1: no leader). Every WebSocket
// connection is dropped, as when the old leader dies; sessions get a fresh
// full TTL from now, as the SPEC says a new leader gives them.
func (c *Cluster) SetLeader(i int) {
	c.mu.Lock()
	c.leader = i
	now := time.Now()
	for _, s := range c.sessions {
		if d := now.Add(s.ttl); d.After(s.deadline) {
			s.deadline = d
		}
	}
	c.dropLocked()
	close(c.changes) // blocking queries answer early
	c.changes = make(chan struct{})
	c.mu.Unlock()
	c.logf("lockdtest: leader is now %d", i)
}

// DropConnections closes every WebSocket connection abruptly. Sessions stay
// until their TTL runs out.
func (c *Cluster) DropConnections() {
	c.mu.Lock()
	c.dropLocked()
	c.mu.Unlock()
}

// DropHTTPConnections closes every client's HTTP connection to every
// member abruptly, as a member's crash does: a request in flight (a
// waiting acquire, a blocking query) gets a reset, and what it did stays
// done (a waiting acquire keeps its place, as in lockd).
func (c *Cluster) DropHTTPConnections() {
	for _, m := range c.members {
		m.srv.CloseClientConnections()
	}
}

func (c *Cluster) dropLocked() {
	for _, m := range c.members {
		for cn := range m.conns {
			cn.kill()
		}
	}
}

// Partition cuts (true) or heals (false) the clients off from every member:
// frames sent either way are dropped and new requests hang, while the
// leader's timers go on (sessions expire when keepalives stop arriving).
func (c *Cluster) Partition(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if on == c.partitioned {
		return
	}
	c.partitioned = on
	if on {
		c.healed = make(chan struct{})
	} else {
		close(c.healed)
	}
	c.logf("lockdtest: partitioned=%v", on)
}

// DropReplies makes the leader apply every WebSocket request of op (say
// api.OpRelease) but lose its reply on the way (on) or answer again (off),
// as when a connection breaks right after the leader committed the
// request: the client cannot tell what became of it.
func (c *Cluster) DropReplies(op string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropReplies[op] = on
	c.logf("lockdtest: replies to %s dropped=%v", op, on)
}

// Overload makes the leader refuse the next n requests of op (a WebSocket
// op such as api.OpAcquire; HTTP requests of the same action count too:
// acquire, release, renew, cancel) as lockd's admission control does:
// 503 overloaded with Retry-After: 1 over HTTP, an error frame with
// retry_after_ms 100 over WebSocket. Nothing of a refused request is
// applied.
func (c *Cluster) Overload(op string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.overload[op] = n
}

// ExhaustBudget makes the leader refuse the next n requests of op (as
// Overload) as lockd does a client over its share of the member: 429
// resource_exhausted with Retry-After: 1 over HTTP, an error frame
// resource_exhausted with retry_after_ms 100 over WebSocket. Such a refusal
// is for now, like overloaded (a quota's 429 carries no retry delay and is
// final). Overloaded counts these refusals too.
func (c *Cluster) ExhaustBudget(op string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.budget[op] = n
}

// Overloaded returns how many requests were refused for now (Overload and
// ExhaustBudget).
func (c *Cluster) Overloaded() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overloaded
}

// refusalLocked counts a request of op against Overload and ExhaustBudget
// and returns the code to refuse it with ("" to serve it).
func (c *Cluster) refusalLocked(op string) string {
	switch {
	case c.overload[op] > 0:
		c.overload[op]--
		c.overloaded++
		return api.CodeOverloaded
	case c.budget[op] > 0:
		c.budget[op]--
		c.overloaded++
		return api.CodeResourceExhausted
	}
	return ""
}

// Handoffs returns how many releases carried a hand-off (WebSocket release
// with "handoff": release and acquire in one step).
func (c *Cluster) Handoffs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handoffs
}

// Cancelled returns how many waits a cancel withdrew.
func (c *Cluster) Cancelled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelled
}

// ExpireSession ends a session now, as its expiry does: its grants end
// (with their lock-delays) and its waits are dropped. It reports whether
// the session was alive.
func (c *Cluster) ExpireSession(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[id]
	if s == nil {
		return false
	}
	c.endSessionLocked(s)
	return true
}

// SessionDeadline returns when a live session expires unless a keepalive
// arrives: the last one received plus the TTL.
func (c *Cluster) SessionDeadline(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sessions[id]; s != nil {
		return s.deadline, true
	}
	return time.Time{}, false
}

// SessionEnded returns when session id ended, if it did.
func (c *Cluster) SessionEnded(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.ended[id]
	return t, ok
}

// Sessions returns the IDs of the live sessions, sorted.
func (c *Cluster) Sessions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id := range c.sessions {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Hellos returns how many hellos opened a session and how many resumed one.
func (c *Cluster) Hellos() (fresh, resumed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fresh, c.resumed
}

// Holder returns the holder of a lock (the one with the lowest token, when
// several hold it).
func (c *Cluster) Holder(name string) (clientID string, token uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.locks[name]; l != nil && len(l.holders) > 0 {
		return l.holders[0].clientID, l.holders[0].token, true
	}
	return "", 0, false
}

// Status returns a lock's status as GET /api/v1/locks/{name} shows it.
func (c *Cluster) Status(name string) api.LockStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusLocked(name)
}

// LockExpires returns when the lock's TTL runs out (zero: no TTL, or free);
// of the lowest token's grant when several hold it.
func (c *Cluster) LockExpires(name string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.locks[name]; l != nil && len(l.holders) > 0 {
		return l.holders[0].expires
	}
	return time.Time{}
}

// Waiters returns the client IDs waiting for a lock, in queue order.
func (c *Cluster) Waiters(name string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	if l := c.locks[name]; l != nil {
		for _, w := range l.queue {
			out = append(out, w.clientID)
		}
	}
	return out
}

// Requests returns how many WebSocket requests of op (say api.OpAcquire)
// the leader has handled.
func (c *Cluster) Requests(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests[op]
}

// LostRequests returns how many WebSocket requests of op were lost to a
// partition (see Partition).
func (c *Cluster) LostRequests(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost[op]
}

// Conns returns the number of open WebSocket connections.
func (c *Cluster) Conns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.members {
		n += len(m.conns)
	}
	return n
}

// Close stops the fake: connections are closed, hanging requests return,
// and every goroutine of the fake has ended when it returns.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.dropLocked()
	close(c.stop)
	c.mu.Unlock()
	for _, m := range c.members {
		m.srv.CloseClientConnections()
		m.srv.Close()
	}
	c.wg.Wait()
}

// track registers a running handler; false when the fake is closing.
func (c *Cluster) track() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// hold makes a request wait while the cluster is partitioned. It reports
// whether to go on.
func (c *Cluster) hold(r *http.Request) bool {
	c.mu.Lock()
	healed := c.healed
	c.mu.Unlock()
	select {
	case <-healed:
		return true
	case <-r.Context().Done():
	case <-c.stop:
	}
	return false
}

func (c *Cluster) leaderURLLocked() string {
	if c.leader < 0 {
		return ""
	}
	return c.members[c.leader].srv.URL
}

// ExpireLock ends the current grants of a lock as their TTL running out
// does: the holders hear "lost" (reason expired), lock-delays start, and
// the next waiters get it. It reports whether the lock was held.
func (c *Cluster) ExpireLock(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.locks[name]
	if l == nil || len(l.holders) == 0 {
		return false
	}
	now := time.Now()
	for _, h := range append([]*holder(nil), l.holders...) {
		c.endGrantLocked(l, h, api.ReasonExpired, now)
	}
	c.advanceLocked(now, name)
	return true
}

// DropGrant frees a lock without telling the holders, as if the "lost"
// push went missing; a holder learns it at its next renew or release.
func (c *Cluster) DropGrant(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.locks[name]
	if l == nil || len(l.holders) == 0 {
		return false
	}
	l.holders = nil
	c.touchLocked(l)
	c.advanceLocked(time.Now(), name)
	return true
}
