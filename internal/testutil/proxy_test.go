package testutil

import (
	"bufio"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line with "echo: <line>" and can push lines to
// the most recent connection.
func echoServer(t *testing.T) (addr string, push func(string)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() {
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						c.Close()
						return
					}
					if _, err := io.WriteString(c, "echo: "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	var last net.Conn
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(conns)
		for c := range conns {
			c.Close()
		}
		if last != nil {
			last.Close()
		}
	})
	return ln.Addr().String(), func(s string) {
		for {
			select {
			case c := <-conns:
				last = c
				continue
			default:
			}
			break
		}
		if last != nil {
			_, _ = io.WriteString(last, s+"\n")
		}
	}
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy("127.0.0.1:0", target, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// isReset reports whether a roundTrip result is a closed or reset
// connection (not a reply, and not a timeout).
func isReset(got string) bool {
	return strings.HasPrefix(got, "error") && !strings.Contains(got, "timeout")
}

// roundTrip sends one line and returns the reply line or the error text.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) string {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "error: " + err.Error()
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestProxyForwardsBothWays(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	c, r := dial(t, p.Addr())
	for _, msg := range []string{"a", "bb", strings.Repeat("x", 100000)} {
		if got := roundTrip(c, r, msg, 5*time.Second); got != "echo: "+msg {
			t.Fatalf("round trip of %d bytes: got %.40q", len(msg), got)
		}
	}
}

// TestProxyCutResetsOpenConnections is the property the chaos harness
// depends on: Raft's pooled connections must die with the cut, not only new
// dials.
func TestProxyCutResetsOpenConnections(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	c, r := dial(t, p.Addr())
	if got := roundTrip(c, r, "before", 5*time.Second); got != "echo: before" {
		t.Fatalf("before the cut: %q", got)
	}
	p.Cut()
	// Reset, not merely silent: a hang would show as a timeout.
	if got := roundTrip(c, r, "during", 2*time.Second); !isReset(got) {
		t.Fatalf("an open connection was not reset by the cut: %q", got)
	}
	// The listener stays, so the dial normally succeeds and the connection
	// is reset at once; on a loaded machine the reset can reach the client
	// before its connect returns, which refuses the connection just as well.
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		defer c2.Close()
		if got := roundTrip(c2, bufio.NewReader(c2), "new", 2*time.Second); !isReset(got) {
			t.Fatalf("a new connection was not refused during the cut: %q", got)
		}
	} else if !isReset("error: " + err.Error()) {
		t.Fatalf("a dial during the cut: %v, want a reset", err)
	}
	p.Heal()
	c3, r3 := dial(t, p.Addr())
	if got := roundTrip(c3, r3, "after", 5*time.Second); got != "echo: after" {
		t.Fatalf("after heal: %q", got)
	}
	if s := p.Stats(); s.Refused == 0 {
		t.Fatalf("stats do not show the cut: %+v", s)
	}
}

// TestProxyBlackholeIsOneWay: with Up blackholed the target hears nothing,
// while bytes the target pushes still arrive; Heal resets the connection
// whose stream lost bytes.
func TestProxyBlackholeIsOneWay(t *testing.T) {
	target, push := echoServer(t)
	p := newProxy(t, target)
	c, r := dial(t, p.Addr())
	if got := roundTrip(c, r, "hello", 5*time.Second); got != "echo: hello" {
		t.Fatalf("before: %q", got)
	}
	p.Blackhole(Up)
	if got := roundTrip(c, r, "lost", 300*time.Millisecond); !strings.Contains(got, "timeout") {
		t.Fatalf("a blackholed request got through: %q", got)
	}
	push("pushed")
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "pushed" {
		t.Fatalf("down direction blocked by an up blackhole: %q %v", line, err)
	}
	if p.Stats().Discarded == 0 {
		t.Fatal("no bytes counted as discarded")
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil || os.IsTimeout(err) {
		t.Fatalf("a connection that lost bytes survived Heal: %v", err)
	}
}

func TestProxyDelayAddsLatency(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	c, r := dial(t, p.Addr())
	roundTrip(c, r, "warm", 5*time.Second)
	p.SetDelay(100*time.Millisecond, 0)
	start := time.Now()
	if got := roundTrip(c, r, "slow", 5*time.Second); got != "echo: slow" {
		t.Fatalf("delayed round trip: %q", got)
	}
	// One delay each way.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("round trip took %s with 100ms each way", d)
	}
}

func TestProxyDropRateResets(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	c, r := dial(t, p.Addr())
	p.SetDropRate(1)
	if got := roundTrip(c, r, "x", 2*time.Second); !strings.HasPrefix(got, "error") {
		t.Fatalf("drop rate 1 let a chunk through: %q", got)
	}
	if p.Stats().Resets == 0 {
		t.Fatal("no reset counted")
	}
}
