package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Ports handed out by this process, never handed out twice.
var (
	portsMu sync.Mutex
	given   = map[int]bool{}
)

// FreeAddr returns a loopback address whose port was free a moment ago.
//
// It picks from 20000–32767, below Linux's ephemeral range (32768+), on
// purpose: a port the kernel picks for "127.0.0.1:0" in one test process
// is soon handed to another process's dial or listen, so a test that kills
// a member and restarts it on the same port can find it taken — or, worse,
// another test's cluster listening there and accepting its Raft traffic.
// Ports outside the ephemeral range are only ever taken by explicit choice.
func FreeAddr() (string, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for i := 0; i < 1000; i++ {
		p := 20000 + rand.IntN(12768)
		if given[p] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		given[p] = true
		return addr, nil
	}
	return "", fmt.Errorf("testutil: no free port found in 20000-32767")
}

// DeadAddr returns a loopback host:port nobody listens on: a connection to
// it is refused. It comes from FreeAddr's range, so no other process takes
// it by chance (as one may a port of the ephemeral range) and this one
// never hands it out again.
func DeadAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// BlackholeAddr returns the host:port of a listener that never accepts: the
// kernel completes connections to it, and nothing ever answers. It is
// closed when t ends.
func BlackholeAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return addr
}
