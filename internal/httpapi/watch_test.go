package httpapi

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
)

// TestSlowWatcherResyncs: a watcher whose client stops reading does not
// grow the connection's queue without bound and does not end the
// connection: its changes are dropped once watchBacklog frames wait, and
// when the client has read what was queued it is told to resync. Writers
// never wait for it.
func TestSlowWatcherResyncs(t *testing.T) {
	defer func(n int) { watchBacklog = n }(watchBacklog)
	watchBacklog = 8
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"slow","session_ttl_ms":60000}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	c.send(`{"id":2,"op":"watch","prefix":"big/"}`)
	if m := c.recv(); m.Type != api.TypeOK || m.WatchID == 0 {
		t.Fatalf("watch: %+v", m)
	}
	// Big values fill the sockets' buffers quickly; the client reads
	// nothing meanwhile.
	value := strings.Repeat("v", api.MaxValueBytes)
	h := New(Config{Backend: f})
	for i := range 1500 {
		name := fmt.Sprintf("big/%d", i%20)
		r := do(t, h, "POST", "/api/v1/locks/"+name+"/acquire", `{"client_id":"w","ttl_ms":60000,"value":"`+value+`"}`)
		if r.status != 200 {
			t.Fatalf("acquire: %d %s", r.status, r.raw)
		}
		var tok uint64
		fmt.Sscanf(r.raw[strings.Index(r.raw, `"fencing_token":`)+len(`"fencing_token":`):], "%d", &tok)
		if r := do(t, h, "POST", "/api/v1/locks/"+name+"/release", fmt.Sprintf(`{"client_id":"w","fencing_token":%d}`, tok)); r.status != 200 {
			t.Fatalf("release: %d %s", r.status, r.raw)
		}
	}
	changed, resyncs := 0, 0
	for resyncs == 0 {
		m := c.recv()
		switch m.Type {
		case api.TypeChanged:
			changed++
		case api.TypeResync:
			resyncs++
		default:
			t.Fatalf("frame %+v", m)
		}
	}
	if changed >= 3000 {
		t.Fatalf("all %d changes were queued for a client that did not read", changed)
	}
	// The connection still serves, and the watch goes on.
	c.send(`{"id":3,"op":"keepalive"}`)
	for {
		m := c.recv()
		if m.ID == 3 {
			if m.Type != api.TypeOK {
				t.Fatalf("keepalive after the resync: %+v", m)
			}
			break
		}
	}
	t.Logf("%d changes delivered before the resync, of 3000 committed", changed)
}
