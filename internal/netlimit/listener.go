// Package netlimit caps the connections a listener lets in: in total and
// per remote address, so no client can hoard a member's descriptors.
// A connection over a cap is closed as soon as it is accepted; the client
// sees a reset and retries (or, for a real overload, backs off).
package netlimit

import (
	"net"
	"sync"
	"sync/atomic"
)

// Limits are the caps; 0 means no cap.
type Limits struct {
	Total int // open connections at once
	PerIP int // open connections at once from one remote IP
}

// Listener wraps a net.Listener with Limits.
type Listener struct {
	net.Listener
	lim Limits

	mu    sync.Mutex
	total int
	perIP map[string]int

	refused atomic.Uint64
}

// Wrap returns ln with the caps applied.
func Wrap(ln net.Listener, lim Limits) *Listener {
	return &Listener{Listener: ln, lim: lim, perIP: map[string]int{}}
}

// Refused counts connections closed because a cap was reached.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Open returns the connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Accept returns the next connection within the caps; connections over a
// cap are closed here and never reach the caller.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if l.admit(ip) {
			return &conn{Conn: c, l: l, ip: ip}, nil
		}
		l.refused.Add(1)
		_ = c.Close()
	}
}

func (l *Listener) admit(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.Total > 0 && l.total >= l.lim.Total {
		return false
	}
	if l.lim.PerIP > 0 && l.perIP[ip] >= l.lim.PerIP {
		return false
	}
	l.total++
	l.perIP[ip]++
	return true
}

func (l *Listener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if n := l.perIP[ip] - 1; n > 0 {
		l.perIP[ip] = n
	} else {
		delete(l.perIP, ip)
	}
}

func remoteIP(c net.Conn) string {
	a := c.RemoteAddr()
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// conn gives its slot back once, on the first Close.
type conn struct {
	net.Conn
	l    *Listener
	ip   string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}
