package server_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestConnectionsCannotBeHoarded: idle keep-alive connections are closed
// after the idle timeout, connections over the per-IP cap are closed at
// once, and a body that never arrives is cut off — while a request that
// waits longer than the body timeout after sending its body still gets its
// answer.
func TestConnectionsCannotBeHoarded(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Conns = server.ConnLimits{MaxConnsPerIP: 20, IdleTimeout: 300 * time.Millisecond, BodyTimeout: 300 * time.Millisecond}
	}})
	l := c.WaitLeader(10 * time.Second)
	addr := strings.TrimPrefix(l.URL(), "http://")

	// Idle keep-alives: one request each, then silence.
	var idle []net.Conn
	for range 10 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		idle = append(idle, conn)
	}
	time.Sleep(800 * time.Millisecond)
	for i, conn := range idle {
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatalf("idle connection %d still open after the idle timeout", i)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("idle connection %d still open after the idle timeout", i)
		}
		conn.Close()
	}

	// The per-IP cap.
	var held []net.Conn
	defer func() {
		for _, conn := range held {
			conn.Close()
		}
	}()
	refused := 0
	for range 30 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			refused++
			continue
		}
		held = append(held, conn)
	}
	time.Sleep(100 * time.Millisecond)
	for _, conn := range held {
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				refused++
			}
		}
	}
	if refused != 10 {
		t.Fatalf("%d of 30 connections from one IP refused, want 10 (cap 20)", refused)
	}
	for _, conn := range held {
		conn.Close()
	}
	held = nil
	time.Sleep(100 * time.Millisecond)

	// A body announced and never sent.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /api/v1/locks/x/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	start := time.Now()
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("a request whose body never came was still open after 3 s")
			}
			break
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("slow body cut after %s", d)
	}

	// A long wait after its body arrived is answered, not cut.
	if r := testutil.Post(lockURL(l, "busy", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("acquire: %s", r.Raw)
	}
	r := testutil.Post(lockURL(l, "busy", "acquire"), map[string]any{"client_id": "b", "ttl_ms": 60000, "wait_timeout_ms": 1200})
	if r.Status != 409 || r.Code() != "wait_timeout" {
		t.Fatalf("a 1.2 s wait with a 300 ms body timeout: %d %s, want 409 wait_timeout", r.Status, r.Raw)
	}
}
