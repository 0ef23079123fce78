// Package testutil holds the test harnesses: a fault-injecting network for
// Raft links, an in-process cluster of real servers (real TCP on loopback,
// real log stores on disk) that can be partitioned, killed and restarted, and
// small HTTP helpers.
package testutil

import (
	"errors"
	"net"
	"sync"
	"time"
)

// ErrCut is returned for a dial or I/O across a cut link.
var ErrCut = errors.New("testutil: link cut")

// Network decides, per ordered pair of members, whether Raft traffic flows.
// Every Raft connection is dialed through it, so a cut closes the live
// connections of the pair (both directions ride on dialed connections) and
// refuses new dials until healed.
type Network struct {
	mu      sync.Mutex
	addrs   map[string]string // raft addr -> member id
	blocked map[[2]string]bool
	delay   map[[2]string]time.Duration
	conns   map[*faultConn]struct{}
}

// NewNetwork returns a network with every link up.
func NewNetwork() *Network {
	return &Network{addrs: map[string]string{}, blocked: map[[2]string]bool{},
		delay: map[[2]string]time.Duration{}, conns: map[*faultConn]struct{}{}}
}

// Register names the member listening on a Raft address.
func (n *Network) Register(id, raftAddr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.addrs[raftAddr] = id
}

// Dialer returns the Raft dialer for member from.
func (n *Network) Dialer(from string) func(addr string, timeout time.Duration) (net.Conn, error) {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		n.mu.Lock()
		to := n.addrs[addr]
		cut := n.blocked[[2]string{from, to}]
		n.mu.Unlock()
		if cut {
			return nil, ErrCut
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil, err
		}
		fc := &faultConn{Conn: c, net: n, from: from, to: to}
		n.mu.Lock()
		n.conns[fc] = struct{}{}
		n.mu.Unlock()
		return fc, nil
	}
}

// Cut blocks traffic between a and b in both directions.
func (n *Network) Cut(a, b string) {
	n.mu.Lock()
	n.blocked[[2]string{a, b}] = true
	n.blocked[[2]string{b, a}] = true
	var doomed []*faultConn
	for c := range n.conns {
		if (c.from == a && c.to == b) || (c.from == b && c.to == a) {
			doomed = append(doomed, c)
		}
	}
	n.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// Partition cuts every link between members of different groups.
func (n *Network) Partition(groups ...[]string) {
	for i := range groups {
		for j := i + 1; j < len(groups); j++ {
			for _, a := range groups[i] {
				for _, b := range groups[j] {
					n.Cut(a, b)
				}
			}
		}
	}
}

// SetDelay delays every write from a to b (a slow link).
func (n *Network) SetDelay(a, b string, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay[[2]string{a, b}] = d
}

// Heal restores every link and removes delays.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blocked = map[[2]string]bool{}
	n.delay = map[[2]string]time.Duration{}
}

func (n *Network) state(from, to string) (cut bool, delay time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.blocked[[2]string{from, to}], n.delay[[2]string{from, to}]
}

type faultConn struct {
	net.Conn
	net      *Network
	from, to string
	once     sync.Once
}

func (c *faultConn) Read(p []byte) (int, error) {
	if cut, _ := c.net.state(c.to, c.from); cut {
		c.Close()
		return 0, ErrCut
	}
	return c.Conn.Read(p)
}

func (c *faultConn) Write(p []byte) (int, error) {
	cut, d := c.net.state(c.from, c.to)
	if cut {
		c.Close()
		return 0, ErrCut
	}
	if d > 0 {
		time.Sleep(d)
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	var err error
	c.once.Do(func() {
		err = c.Conn.Close()
		c.net.mu.Lock()
		delete(c.net.conns, c)
		c.net.mu.Unlock()
	})
	return err
}
