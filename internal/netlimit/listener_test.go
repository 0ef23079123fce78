package netlimit

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve accepts on l and keeps each connection open until the peer closes.
func serve(t *testing.T, l *Listener) {
	t.Helper()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
}

// closedByServer reports whether the server closed c (a read returns EOF or
// a reset) within a short time.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

func TestPerIPCapAndRelease(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(raw, Limits{PerIP: 3})
	defer l.Close()
	serve(t, l)
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if closedByServer(c) {
			t.Fatal("a connection within the cap was closed")
		}
	}
	over, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if !closedByServer(over) {
		t.Fatal("the fourth connection from one IP was kept open")
	}
	over.Close()
	if l.Refused() != 1 {
		t.Fatalf("refused %d, want 1", l.Refused())
	}
	// A slot comes back when a connection closes.
	conns[0].Close()
	deadline := time.Now().Add(2 * time.Second)
	for l.Open() != 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	again, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if closedByServer(again) {
		t.Fatal("a connection after one closed was refused")
	}
	again.Close()
	for _, c := range conns[1:] {
		c.Close()
	}
}

func TestTotalCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(raw, Limits{Total: 2})
	defer l.Close()
	serve(t, l)
	a, _ := net.Dial("tcp", raw.Addr().String())
	b, _ := net.Dial("tcp", raw.Addr().String())
	defer a.Close()
	defer b.Close()
	c, _ := net.Dial("tcp", raw.Addr().String())
	defer c.Close()
	if closedByServer(a) || closedByServer(b) {
		t.Fatal("a connection within the cap was closed")
	}
	if !closedByServer(c) {
		t.Fatal("a connection over the total cap was kept open")
	}
}
