package testutil

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/server"
)

// Member is one in-process member of a test cluster.
type Member struct {
	ID       string
	Dir      string
	RaftAddr string
	HTTPAddr string
	Srv      *server.Server // nil while down
}

// URL is the member's client API URL.
func (m *Member) URL() string {
	if m.Srv != nil {
		return m.Srv.URL()
	}
	return "http://" + m.HTTPAddr
}

// Cluster is an in-process cluster of real servers over loopback TCP with a
// Network in every Raft link.
type Cluster struct {
	t       testing.TB
	Net     *Network
	mu      sync.Mutex
	Members map[string]*Member
	order   []string
	opts    Options
}

// Options tune a test cluster.
type Options struct {
	Heartbeat time.Duration // default 200ms
	LogStore  string        // default "": lockd's default, wal for these new data dirs
	Modify    func(*server.Config)
}

// NewCluster starts n members bootstrapped together and waits for a ready
// leader. Everything is stopped by t.Cleanup.
func NewCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.Heartbeat == 0 {
		opts.Heartbeat = 200 * time.Millisecond
	}
	c := &Cluster{t: t, Net: NewNetwork(), Members: map[string]*Member{}, opts: opts}
	base := t.TempDir()
	var initial []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		m := &Member{ID: id, Dir: filepath.Join(base, id), RaftAddr: freeAddr(t), HTTPAddr: freeAddr(t)}
		c.Members[id] = m
		c.order = append(c.order, id)
		c.Net.Register(id, m.RaftAddr)
		initial = append(initial, id+"="+m.RaftAddr)
	}
	for _, id := range c.order {
		c.start(c.Members[id], strings.Join(initial, ","), "")
	}
	t.Cleanup(c.Stop)
	c.WaitLeader(15 * time.Second)
	return c
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func (c *Cluster) start(m *Member, initial, join string, modify ...func(*server.Config)) {
	c.t.Helper()
	cfg := server.Config{
		ID: m.ID, DataDir: m.Dir, HTTPAddr: m.HTTPAddr, RaftAddr: m.RaftAddr,
		InitialCluster: initial, Join: join,
		HeartbeatTimeout: c.opts.Heartbeat, ElectionTimeout: c.opts.Heartbeat,
		LeaderLeaseTimeout: c.opts.Heartbeat, LogStore: c.opts.LogStore,
		Logger:   slog.New(slog.NewTextHandler(testWriter{c.t, m.ID}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		RaftDial: c.Net.Dialer(m.ID), RaftLogLevel: "error",
	}
	if c.opts.Modify != nil {
		c.opts.Modify(&cfg)
	}
	for _, f := range modify {
		f(&cfg)
	}
	var srv *server.Server
	var err error
	// A just-closed port can take a moment to be reusable.
	for i := 0; i < 50; i++ {
		srv, err = server.New(cfg)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("start %s: %v", m.ID, err)
	}
	c.mu.Lock()
	m.Srv = srv
	c.mu.Unlock()
}

// Stop stops every running member.
func (c *Cluster) Stop() {
	for _, id := range c.order {
		c.Kill(id)
	}
}

// Kill stops a member abruptly (no leadership transfer).
func (c *Cluster) Kill(id string) {
	c.mu.Lock()
	m := c.Members[id]
	srv := m.Srv
	m.Srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Kill()
	}
}

// Restart starts a stopped member on its data dir.
func (c *Cluster) Restart(id string) {
	c.t.Helper()
	c.start(c.Members[id], "", "")
}

// AddMember starts a new member that joins through the given member's URL;
// modify changes its configuration after the cluster-wide Options.Modify.
func (c *Cluster) AddMember(id, via string, modify ...func(*server.Config)) *Member {
	c.t.Helper()
	m := &Member{ID: id, Dir: filepath.Join(c.t.TempDir(), id), RaftAddr: freeAddr(c.t), HTTPAddr: freeAddr(c.t)}
	c.mu.Lock()
	c.Members[id] = m
	c.order = append(c.order, id)
	c.mu.Unlock()
	c.Net.Register(id, m.RaftAddr)
	c.start(m, "", via, modify...)
	return m
}

// Up returns the running members.
func (c *Cluster) Up() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Member
	for _, id := range c.order {
		if m := c.Members[id]; m.Srv != nil {
			out = append(out, m)
		}
	}
	return out
}

// URLsFollowersFirst lists the running members' URLs with the leader last,
// so that a client's first call is answered with a redirect.
func (c *Cluster) URLsFollowersFirst() []string {
	l := c.WaitLeader(15 * time.Second)
	var out []string
	for _, m := range c.Up() {
		if m.ID != l.ID {
			out = append(out, m.URL())
		}
	}
	return append(out, l.URL())
}

// WaitLeader waits until exactly one running member is a ready leader and
// returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) *Member {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var ready []*Member
		for _, m := range c.Up() {
			if m.Srv.Ready() {
				ready = append(ready, m)
			}
		}
		if len(ready) == 1 {
			return ready[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no single ready leader within %s", timeout)
	return nil
}

// WaitLeaderAmong waits for a ready leader among the given members.
func (c *Cluster) WaitLeaderAmong(ids []string, timeout time.Duration) *Member {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, id := range ids {
			c.mu.Lock()
			m := c.Members[id]
			srv := m.Srv
			c.mu.Unlock()
			if srv != nil && srv.Ready() {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no ready leader among %v within %s", ids, timeout)
	return nil
}

// testWriter sends log lines to t.Log, prefixed with the member id.
type testWriter struct {
	t  testing.TB
	id string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(w.id + ": " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
