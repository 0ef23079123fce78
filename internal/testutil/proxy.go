package testutil

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction names one half of a proxied TCP connection.
type Direction int

const (
	// Up carries bytes from the side that dialed the proxy to the target.
	Up Direction = iota
	// Down carries the target's bytes back to the dialer.
	Down
)

func (d Direction) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Proxy is a fault-injecting TCP proxy for one directed link between real
// processes, shaped like etcd's robustness-test network failpoints. A member
// dials a peer through it (lockd --raft-dial-override), so every connection
// that member opens to that peer — and both directions of the RPCs on it —
// passes here, where the test can cut it, blackhole one direction, delay it
// or reset connections at random.
//
// Faults act on connections already open, not only on new ones: Raft keeps
// pooled connections, and a cut that spared them would not cut anything.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	cut       bool
	blackhole [2]bool
	delay     time.Duration
	jitter    time.Duration
	dropRate  float64
	rng       *rand.Rand
	conns     map[*proxyConn]struct{}
	closed    bool
	wg        sync.WaitGroup
	accepted  atomic.Int64
	refused   atomic.Int64
	resets    atomic.Int64
	discarded atomic.Int64
	forwarded atomic.Int64
}

// ProxyStats counts what a proxy did.
type ProxyStats struct {
	Accepted, Refused, Resets int64
	// Bytes forwarded and bytes thrown away by a blackhole.
	Forwarded, Discarded int64
}

// NewProxy listens on listen (use "127.0.0.1:0" for any port) and forwards
// every accepted connection to target. seed makes the random drops and
// jitter reproducible for one proxy.
func NewProxy(listen, target string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{},
		rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut drops the link: open connections are reset and new ones are accepted
// and reset at once (a dial "succeeds", then the first read or write fails,
// as with a peer that vanished).
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	doomed := p.connsLocked()
	p.mu.Unlock()
	for _, c := range doomed {
		c.abort()
	}
}

// Blackhole silently discards every byte in one direction while the other
// keeps flowing: a one-way partition. The connections stay open, so the
// sender learns nothing but timeouts. Heal resets connections that lost
// bytes, because their byte stream is no longer a valid protocol stream.
func (p *Proxy) Blackhole(d Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole[d] = true
}

// SetDelay holds every chunk for delay plus a uniform random part of up to
// jitter, in both directions. Order within a connection is kept.
func (p *Proxy) SetDelay(delay, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.jitter = delay, jitter
}

// SetDropRate makes each forwarded chunk reset its connection with
// probability rate: a lossy link on which TCP keeps giving up.
func (p *Proxy) SetDropRate(rate float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropRate = rate
}

// Heal removes every fault. Connections whose stream was broken by a
// blackhole are reset; the others carry on.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.blackhole = [2]bool{}
	p.delay, p.jitter, p.dropRate = 0, 0, 0
	var doomed []*proxyConn
	for c := range p.conns {
		if c.corrupt.Load() {
			doomed = append(doomed, c)
		}
	}
	p.mu.Unlock()
	for _, c := range doomed {
		c.abort()
	}
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() ProxyStats {
	return ProxyStats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Resets: p.resets.Load(),
		Forwarded: p.forwarded.Load(), Discarded: p.discarded.Load()}
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	doomed := p.connsLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range doomed {
		c.abort()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) connsLocked() []*proxyConn {
	out := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			p.refused.Add(1)
			reset(in)
			continue
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(in)
	}
}

// serve dials the target for one accepted connection and pumps both ways.
func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		reset(in)
		return
	}
	c := &proxyConn{p: p, in: in, out: out, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.cut {
		p.mu.Unlock()
		reset(in)
		reset(out)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.pipe(Up, in, out) }()
	go func() { defer wg.Done(); c.pipe(Down, out, in) }()
	wg.Wait()
	c.finish()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// verdict is what happens to one chunk read from one direction.
type verdict struct {
	cut, discard, drop bool
	hold               time.Duration
}

func (p *Proxy) judge(d Direction) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := verdict{cut: p.cut, discard: p.blackhole[d], hold: p.delay}
	if p.jitter > 0 {
		v.hold += time.Duration(p.rng.Int64N(int64(p.jitter)))
	}
	if p.dropRate > 0 && p.rng.Float64() < p.dropRate {
		v.drop = true
	}
	return v
}

type proxyConn struct {
	p       *Proxy
	in, out net.Conn
	corrupt atomic.Bool
	once    sync.Once
	done    chan struct{}
}

// abort resets both sockets (RST, not FIN: the peer sees a failure).
func (c *proxyConn) abort() {
	c.once.Do(func() {
		close(c.done)
		reset(c.in)
		reset(c.out)
	})
}

// finish closes both sockets after both directions ended on their own.
func (c *proxyConn) finish() {
	c.once.Do(func() {
		close(c.done)
		_ = c.in.Close()
		_ = c.out.Close()
	})
}

type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst through the fault rules. A reader goroutine
// stamps each chunk with its release time; this goroutine's writer half
// releases chunks in order, so a delay adds latency without limiting
// throughput.
func (c *proxyConn) pipe(d Direction, src, dst net.Conn) {
	queue := make(chan chunk, 256)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ch := range queue {
			if wait := time.Until(ch.at); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-c.done:
					t.Stop()
					return
				}
			}
			if _, err := dst.Write(ch.data); err != nil {
				c.abort()
				return
			}
			c.p.forwarded.Add(int64(len(ch.data)))
		}
	}()
	graceful := false
	defer func() {
		close(queue)
		wg.Wait()
		if !graceful {
			c.abort()
			return
		}
		// EOF from src: pass the half-close on once everything is written,
		// and let the other direction run to its own end.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	buf := make([]byte, 32<<10)
	var last time.Time
	for {
		n, err := src.Read(buf)
		if n > 0 {
			v := c.p.judge(d)
			switch {
			case v.cut || v.drop:
				c.p.resets.Add(1)
				c.abort()
				return
			case v.discard:
				c.corrupt.Store(true)
				c.p.discarded.Add(int64(n))
				continue
			}
			at := time.Now().Add(v.hold)
			if at.Before(last) {
				at = last
			}
			last = at
			select {
			case queue <- chunk{data: append([]byte(nil), buf[:n]...), at: at}:
			case <-c.done:
				return
			}
		}
		if err != nil {
			graceful = errors.Is(err, io.EOF)
			return
		}
	}
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
