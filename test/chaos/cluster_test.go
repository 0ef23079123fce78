package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/testutil"
)

// builds holds cmd/lockd and cmd/fencestore, built once per test binary
// and removed by TestMain.
var builds testutil.Builds

// binaries builds cmd/lockd and cmd/fencestore once per test binary.
func binaries(t testing.TB) (lockd, fencestore string) {
	t.Helper()
	return builds.Path(t, "lockd"), builds.Path(t, "fencestore")
}

// slot is a place for one member: fixed addresses, a data dir, and the
// proxies its Raft connections go through. A slot is reused when a removed
// member's place is taken by a new member (with a new id and a fresh data
// dir), so every member's --raft-dial-override, fixed at start, covers
// every member that can ever exist in the run.
type slot struct {
	idx      int
	id       string
	inc      int // incarnation: a new member in this slot gets a new id
	dir      string
	httpAddr string
	raftAddr string
	logPath  string

	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
	member bool // part of the cluster configuration (as far as the harness knows)
}

func (s *slot) url() string { return "http://" + s.httpAddr }

func (s *slot) running() bool { return s.cmd != nil }

// Cluster is a set of real lockd processes on loopback, with a
// fault-injecting proxy on every directed Raft link: member A dials member
// B's Raft address through proxy A→B, so A's connections to B — which carry
// A's RPCs to B and B's replies — can be cut, blackholed one way, delayed
// or made lossy.
type Cluster struct {
	t     testing.TB
	bin   string
	base  string
	size  int
	extra []string
	logf  func(format string, args ...any)

	mu      sync.Mutex
	slots   []*slot
	proxies map[[2]int]*testutil.Proxy
	hc      *http.Client
}

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	Members int // initial voters
	Spares  int // extra slots for members added later
	Seed    uint64
	Extra   []string // extra lockd flags
	Logf    func(format string, args ...any)
}

// StartCluster starts opts.Members members bootstrapped together, waits
// until a leader serves, and stops everything at test cleanup.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	bin, _ := binaries(t)
	c := &Cluster{t: t, bin: bin, base: t.TempDir(), size: opts.Members, extra: opts.Extra, logf: opts.Logf,
		proxies: map[[2]int]*testutil.Proxy{},
		hc:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	if c.logf == nil {
		c.logf = t.Logf
	}
	n := opts.Members + opts.Spares
	for i := 0; i < n; i++ {
		h, err := testutil.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		r, err := testutil.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		c.slots = append(c.slots, &slot{idx: i, id: fmt.Sprintf("n%d", i+1), httpAddr: h, raftAddr: r,
			dir: filepath.Join(c.base, fmt.Sprintf("n%d", i+1)), logPath: filepath.Join(c.base, fmt.Sprintf("slot%d.log", i+1))})
	}
	t.Cleanup(c.Stop)
	for a := 0; a < n; a++ {
		for b := 0; b < n; b++ {
			if a == b {
				continue
			}
			p, err := testutil.NewProxy("127.0.0.1:0", c.slots[b].raftAddr, opts.Seed^uint64(a*64+b+1))
			if err != nil {
				t.Fatal(err)
			}
			c.proxies[[2]int{a, b}] = p
		}
	}
	var initial []string
	for i := 0; i < opts.Members; i++ {
		initial = append(initial, c.slots[i].id+"="+c.slots[i].raftAddr)
	}
	for i := 0; i < opts.Members; i++ {
		c.slots[i].member = true
		if err := c.start(i, "--initial-cluster", strings.Join(initial, ",")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// Endpoints are the client URLs of every slot (members come and go; a
// client skips the ones that refuse connections).
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, s := range c.slots {
		out = append(out, s.url())
	}
	return out
}

// start launches the process of slot i with extra flags.
func (c *Cluster) start(i int, args ...string) error {
	c.mu.Lock()
	s := c.slots[i]
	if s.cmd != nil {
		c.mu.Unlock()
		return fmt.Errorf("slot %d already running", i)
	}
	var overrides []string
	for b, peer := range c.slots {
		if b != i {
			overrides = append(overrides, peer.raftAddr+"="+c.proxies[[2]int{i, b}].Addr())
		}
	}
	full := []string{"--id", s.id, "--data-dir", s.dir, "--http-addr", s.httpAddr, "--raft-addr", s.raftAddr,
		"--raft-dial-override", strings.Join(overrides, ",")}
	full = append(full, args...)
	full = append(full, c.extra...)
	c.mu.Unlock()

	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s start %s: lockd %s\n", time.Now().Format(time.RFC3339Nano), s.id, strings.Join(full, " "))
	// A port just released by a killed process is normally reusable at once
	// (SO_REUSEADDR); retry a few times in case it is not.
	for try := 0; ; try++ {
		cmd := exec.Command(c.bin, full...)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			return err
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		select {
		case <-exited:
			if try < 20 {
				time.Sleep(250 * time.Millisecond)
				continue
			}
			return fmt.Errorf("%s exited at start (see %s)", s.id, s.logPath)
		case <-time.After(300 * time.Millisecond):
		}
		c.mu.Lock()
		s.cmd, s.exited, s.paused = cmd, exited, false
		c.mu.Unlock()
		return nil
	}
}

// Restart starts a stopped member on its data dir.
func (c *Cluster) Restart(i int) error { return c.start(i) }

// detach takes slot i's process out of the cluster's hands (it is being
// stopped) and returns it with the channel closed at its exit.
func (c *Cluster) detach(i int) (*exec.Cmd, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[i]
	cmd, exited := s.cmd, s.exited
	s.cmd, s.paused = nil, false
	return cmd, exited
}

// exit is a member process that ended without the harness stopping it.
type exit struct{ id, why string }

// Exited returns the members whose process ended without the harness
// stopping it, and takes them out of the cluster's hands: a member slot
// with no process is restarted by the nemesis's reviveAll.
func (c *Cluster) Exited() []exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []exit
	for _, s := range c.slots {
		if s.cmd == nil {
			continue
		}
		select {
		case <-s.exited:
		default:
			continue
		}
		why := "exited"
		if ps := s.cmd.ProcessState; ps != nil {
			why = ps.String()
		}
		out = append(out, exit{id: s.id, why: fmt.Sprintf("%s (log: %s)", why, filepath.Base(s.logPath))})
		s.cmd, s.paused = nil, false
	}
	return out
}

// Kill sends SIGKILL to slot i and waits until it is gone.
func (c *Cluster) Kill(i int) {
	cmd, exited := c.detach(i)
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	c.note(i, "SIGKILL")
}

// Term sends SIGTERM (graceful stop: leadership is handed over first) and
// waits for the exit; a member that does not exit within d is killed. It
// reports whether the member exited by itself.
func (c *Cluster) Term(i int, d time.Duration) bool {
	cmd, exited := c.detach(i)
	if cmd == nil {
		return true
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	c.note(i, "SIGTERM")
	select {
	case <-exited:
		return true
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		c.note(i, "SIGKILL after SIGTERM timeout")
		return false
	}
}

// Pause sends SIGSTOP; Resume sends SIGCONT.
func (c *Cluster) Pause(i int) {
	c.mu.Lock()
	s := c.slots[i]
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
		s.paused = true
	}
	c.mu.Unlock()
	c.note(i, "SIGSTOP")
}

// Resume continues a paused member.
func (c *Cluster) Resume(i int) {
	c.mu.Lock()
	s := c.slots[i]
	if s.cmd != nil && s.paused {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		s.paused = false
	}
	c.mu.Unlock()
	c.note(i, "SIGCONT")
}

// note writes a harness line into a member's log, so the log reads as a
// timeline of what was done to it.
func (c *Cluster) note(i int, what string) {
	s := c.slots[i]
	if f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "=== %s harness: %s %s\n", time.Now().Format(time.RFC3339Nano), what, s.id)
		f.Close()
	}
}

// Stop kills every process and closes the proxies.
func (c *Cluster) Stop() {
	for i := range c.slots {
		c.Resume(i)
		c.Kill(i)
	}
	for _, p := range c.proxies {
		p.Close()
	}
	c.hc.CloseIdleConnections()
}

// Members returns the slots that are members of the configuration.
func (c *Cluster) Members() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, s := range c.slots {
		if s.member {
			out = append(out, s.idx)
		}
	}
	return out
}

// ID returns the member id of slot i.
func (c *Cluster) ID(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[i].id
}

// idAt returns the id of the member serving HTTP at host:port, or host.
func (c *Cluster) idAt(host string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		if s.httpAddr == host {
			return s.id
		}
	}
	return host
}

func (c *Cluster) slotOf(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		if s.id == id {
			return s.idx
		}
	}
	return -1
}

// getJSON GETs a member's URL with a short timeout.
func (c *Cluster) getJSON(ctx context.Context, url string, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: %w: %s", url, err, b)
		}
	}
	return resp.StatusCode, nil
}

// Leader returns the slot every running, unpaused member names as leader,
// or -1.
func (c *Cluster) Leader(ctx context.Context) int {
	votes := map[string]int{}
	n := 0
	for _, i := range c.Members() {
		c.mu.Lock()
		s := c.slots[i]
		up := s.running() && !s.paused
		u := s.url()
		c.mu.Unlock()
		if !up {
			continue
		}
		n++
		var cs api.ClusterStatus
		if st, err := c.getJSON(ctx, u+"/api/v1/cluster", &cs); err == nil && st == 200 && cs.LeaderID != "" {
			votes[cs.LeaderID]++
		}
	}
	for id, v := range votes {
		if v == n {
			return c.slotOf(id)
		}
	}
	return -1
}

// WaitLeader polls until the members agree on a leader.
func (c *Cluster) WaitLeader(ctx context.Context, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if l := c.Leader(ctx); l >= 0 {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return -1, fmt.Errorf("members do not agree on a leader within %s", d)
}

// WaitHealthy waits until every member is running, answers /readyz, and
// all agree on one leader that is a member.
func (c *Cluster) WaitHealthy(d time.Duration) error {
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		why = c.unhealthy()
		if why == "" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cluster not healthy within %s: %s", d, why)
}

func (c *Cluster) unhealthy() string {
	ctx := context.Background()
	for _, i := range c.Members() {
		c.mu.Lock()
		s := c.slots[i]
		up, paused, u, id := s.running(), s.paused, s.url(), s.id
		c.mu.Unlock()
		if !up || paused {
			return id + " is down or paused"
		}
		st, err := c.getJSON(ctx, u+"/readyz", nil)
		if err != nil || st != 200 {
			return fmt.Sprintf("%s /readyz: %d %v", id, st, err)
		}
	}
	l := c.Leader(ctx)
	if l < 0 {
		return "no agreed leader"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.slots[l].member {
		return "leader " + c.slots[l].id + " is not a member"
	}
	return ""
}

// Status returns a member's own view.
func (c *Cluster) Status(i int) (api.NodeStatus, error) {
	var st api.NodeStatus
	code, err := c.getJSON(context.Background(), c.slots[i].url()+"/api/v1/status", &st)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	return st, err
}

// link returns the proxy member a uses to reach member b.
func (c *Cluster) link(a, b int) *testutil.Proxy { return c.proxies[[2]int{a, b}] }

// CutPair cuts both proxies between a and b.
func (c *Cluster) CutPair(a, b int) {
	c.link(a, b).Cut()
	c.link(b, a).Cut()
}

// Isolate cuts every link between the two groups.
func (c *Cluster) Isolate(group, rest []int) {
	for _, a := range group {
		for _, b := range rest {
			c.CutPair(a, b)
		}
	}
}

// OneWay makes everything a sends to b vanish while b still reaches a:
// a's requests to b (up on a→b) and a's replies to b's requests (down on
// b→a).
func (c *Cluster) OneWay(a, b int) {
	c.link(a, b).Blackhole(testutil.Up)
	c.link(b, a).Blackhole(testutil.Down)
}

// AllLinks applies f to every proxy.
func (c *Cluster) AllLinks(f func(p *testutil.Proxy)) {
	for _, p := range c.proxies {
		f(p)
	}
}

// HealNet removes every network fault.
func (c *Cluster) HealNet() { c.AllLinks((*testutil.Proxy).Heal) }

// NetStats sums the proxies' counters.
func (c *Cluster) NetStats() testutil.ProxyStats {
	var sum testutil.ProxyStats
	for _, p := range c.proxies {
		s := p.Stats()
		sum.Accepted += s.Accepted
		sum.Refused += s.Refused
		sum.Resets += s.Resets
		sum.Forwarded += s.Forwarded
		sum.Discarded += s.Discarded
	}
	return sum
}

// post sends a JSON body to a member path, following redirects to the
// leader, and returns the status and body.
func (c *Cluster) post(ctx context.Context, method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// leaderURL returns the URL of the current leader, or "".
func (c *Cluster) leaderURL(ctx context.Context) string {
	l := c.Leader(ctx)
	if l < 0 {
		return ""
	}
	return c.slots[l].url()
}

// AddMember starts a fresh member in a free slot that joins through the
// leader, and waits until the configuration lists it as a voter. It returns
// the slot.
func (c *Cluster) AddMember(ctx context.Context, d time.Duration) (int, error) {
	c.mu.Lock()
	free := -1
	for _, s := range c.slots {
		if !s.member && !s.running() {
			free = s.idx
			break
		}
	}
	if free < 0 {
		c.mu.Unlock()
		return -1, errors.New("no free slot")
	}
	s := c.slots[free]
	s.inc++
	if s.inc > 1 {
		s.id = fmt.Sprintf("n%d.%d", free+1, s.inc)
	}
	s.dir = filepath.Join(c.base, s.id)
	s.member = true
	c.mu.Unlock()
	join := c.leaderURL(ctx)
	if join == "" {
		join = c.slots[c.Members()[0]].url()
	}
	if err := c.start(free, "--join", join); err != nil {
		return free, err
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var cs api.ClusterStatus
		if u := c.leaderURL(ctx); u != "" {
			if st, err := c.getJSON(ctx, u+"/api/v1/cluster", &cs); err == nil && st == 200 {
				for _, m := range cs.Members {
					if m.ID == s.id && m.Voter {
						return free, nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return free, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return free, fmt.Errorf("new member %s is not a voter within %s", s.id, d)
}

// RemoveMember removes slot i from the configuration (through the leader,
// retrying across the hand-over when i leads), then kills it and wipes its
// data dir so the slot can take a new member.
func (c *Cluster) RemoveMember(ctx context.Context, i int, d time.Duration) error {
	id := c.ID(i)
	deadline := time.Now().Add(d)
	var last string
	removed := false
	for !removed && time.Now().Before(deadline) {
		u := c.leaderURL(ctx)
		if u != "" {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, b, err := c.post(rctx, http.MethodDelete, u+"/api/v1/cluster/members/"+id, nil)
			cancel()
			switch {
			case err == nil && (st == 200 || st == 404):
				removed = true
				continue
			case err != nil:
				last = err.Error()
			default:
				last = fmt.Sprintf("%d %s", st, b)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !removed {
		return fmt.Errorf("remove %s: %s", id, last)
	}
	c.mu.Lock()
	c.slots[i].member = false
	c.mu.Unlock()
	c.Kill(i)
	return os.RemoveAll(c.slots[i].dir)
}

// panicRE finds a panic in a member log: one net/http recovered while
// serving a request (logged as one line, the stack escaped), or one that
// killed the process (Go's own "panic:" / "fatal error:" on stderr).
var (
	panicRE = regexp.MustCompile(`(?:panic serving [^ ]+: |^panic: |^fatal error: )(.*?)(?:\\n|$)`)
	frameRE = regexp.MustCompile(`github\.com/lockd/lockd/[\w/-]+\.(?:\(\*?\w+\)\.)?\w+`)
)

// Panics scans every member log for panics and returns one line per kind
// (the panic's message and the first lockd function on its stack) with
// how often it happened.
func (c *Cluster) Panics() []string {
	var out []string
	for _, s := range c.slots {
		b, err := os.ReadFile(s.logPath)
		if err != nil {
			continue
		}
		count := map[string]int{}
		var order []string
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			m := panicRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			where := ""
			stack := line // recovered: the stack is escaped in the line, from the panic( frame on
			if at := strings.Index(line, "panic("); at >= 0 {
				stack = line[at:]
			}
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				end := i + 1 // fatal: the stack follows, up to the next log line
				for end < len(lines) && end < i+200 && !strings.HasPrefix(lines[end], "time=") && !strings.HasPrefix(lines[end], "=== ") {
					end++
				}
				stack = strings.Join(lines[i:end], "\n")
			}
			if f := frameRE.FindString(stack); f != "" {
				where = " in " + strings.TrimPrefix(f, "github.com/lockd/lockd/")
			}
			key := fmt.Sprintf("%s: %s%s", filepath.Base(s.logPath), m[1], where)
			if count[key] == 0 {
				order = append(order, key)
			}
			count[key]++
		}
		for _, k := range order {
			out = append(out, fmt.Sprintf("%s (%d times)", k, count[k]))
		}
	}
	return out
}

// CopyLogs copies every member log to dir.
func (c *Cluster) CopyLogs(dir string) error {
	var errs []error
	for _, s := range c.slots {
		b, err := os.ReadFile(s.logPath)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.WriteFile(filepath.Join(dir, filepath.Base(s.logPath)), b, 0o644))
	}
	return errors.Join(errs...)
}

// Fencestore is a running cmd/fencestore.
type Fencestore struct {
	URL     string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
}

// StartFencestore starts cmd/fencestore on a free port.
func StartFencestore(t testing.TB) *Fencestore {
	t.Helper()
	_, bin := binaries(t)
	dir := t.TempDir()
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	fs := &Fencestore{URL: "http://" + addr, logPath: filepath.Join(dir, "fencestore.log"), exited: make(chan struct{})}
	f, err := os.Create(fs.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fs.cmd = exec.Command(bin, "--addr", addr, "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	fs.cmd.Stdout, fs.cmd.Stderr = f, f
	if err := fs.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = fs.cmd.Wait(); close(fs.exited) }()
	t.Cleanup(func() {
		_ = fs.cmd.Process.Signal(syscall.SIGKILL)
		<-fs.exited
	})
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := hc.Get(fs.URL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return fs
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("fencestore not healthy; log %s", fs.logPath)
	return nil
}
