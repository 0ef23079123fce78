package httpapi

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// TestWebSocketServesRequestsConcurrently: 64 acquires of different locks
// pipelined on one connection, each taking 50 ms to commit, are answered
// together, not one after another (3.2 s); every reply carries its own id.
func TestWebSocketServesRequestsConcurrently(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"P"}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	f.commitDelay = 50 * time.Millisecond
	start := time.Now()
	for i := range 64 {
		c.send(fmt.Sprintf(`{"id":%d,"op":"acquire","lock":"p%d","ttl_ms":60000}`, 100+i, i))
	}
	seen := map[uint64]bool{}
	for range 64 {
		m := c.recv()
		if m.Type != api.TypeGranted || m.ID < 100 || m.ID >= 164 || m.Lock != fmt.Sprintf("p%d", m.ID-100) || seen[m.ID] {
			t.Fatalf("reply %+v", m)
		}
		seen[m.ID] = true
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("64 pipelined acquires took %s: served one at a time", d)
	}
}

// TestWebSocketSameLockInOrder: requests of one connection that name the
// same lock take effect in the order they were sent, even pipelined: an
// acquire, a renew and a release of x, sent back to back, all succeed.
func TestWebSocketSameLockInOrder(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"O"}`)
	c.recv()
	f.commitDelay = 20 * time.Millisecond
	c.send(`{"id":2,"op":"acquire","lock":"x","ttl_ms":60000}`)
	// The token of the first grant is the counter's next value: 1.
	c.send(`{"id":3,"op":"renew","lock":"x","fencing_token":1,"ttl_ms":60000}`)
	c.send(`{"id":4,"op":"release","lock":"x","fencing_token":1}`)
	got := map[uint64]api.WSMessage{}
	for range 3 {
		m := c.recv()
		got[m.ID] = m
	}
	if got[2].Type != api.TypeGranted || got[2].FencingToken != 1 {
		t.Fatalf("acquire: %+v", got[2])
	}
	if got[3].Type != api.TypeOK || got[4].Type != api.TypeOK {
		t.Fatalf("renew %+v, release %+v: both must follow the acquire", got[3], got[4])
	}
}

// TestWebSocketTryWhileQueued: a try (wait 0) sent while an earlier acquire
// of the same lock waits is answered lock_held at once, and the earlier
// acquire keeps its place and gets its own answer (the grant) later. Before,
// the try took over the earlier request's pending entry: the try's id got
// the grant and the earlier request was never answered.
func TestWebSocketTryWhileQueued(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	a := dialWS(t, srv)
	a.send(`{"id":1,"op":"hello","client_id":"A"}`)
	a.recv()
	a.send(`{"id":2,"op":"acquire","lock":"q","ttl_ms":60000}`)
	ga := a.recv()
	b := dialWS(t, srv)
	b.send(`{"id":1,"op":"hello","client_id":"B"}`)
	b.recv()
	b.send(`{"id":2,"op":"acquire","lock":"q","ttl_ms":60000,"wait_timeout_ms":60000}`)
	b.send(`{"id":3,"op":"acquire","lock":"q","ttl_ms":60000}`)
	if m := b.recv(); m.ID != 3 || m.Error == nil || m.Error.Code != api.CodeLockHeld {
		t.Fatalf("try while queued: %+v, want id 3 lock_held", m)
	}
	a.send(`{"id":3,"op":"release","lock":"q","fencing_token":` + itoa(ga.FencingToken) + `}`)
	a.recv()
	if m := b.recv(); m.ID != 2 || m.Type != api.TypeGranted {
		t.Fatalf("the queued acquire: %+v, want id 2 granted", m)
	}
}
