package httpapi

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
)

// TestSlowWatcherResyncs: a watcher whose client stops reading does not
// grow the connection's queue without bound and does not end the
// connection: its changes are dropped once watchBacklog bytes wait, and
// when the client has read what was queued it is told to resync. Writers
// never wait for it.
func TestSlowWatcherResyncs(t *testing.T) {
	defer func(n int) { watchBacklog = n }(watchBacklog)
	watchBacklog = 64 << 10
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

// SPEC 16: watches are bounded per member, not only per connection: past
// --max-watches a WebSocket watch and a blocking query are 429
// resource_exhausted naming the quota; an unwatch makes room again.
func TestMaxWatchesPerMember(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, MaxWatches: 2}))
	defer srv.Close()
	var conns []*wsClient
	for i := 0; i < 2; i++ {
		c := dialWS(t, srv)
		c.send(fmt.Sprintf(`{"id":1,"op":"hello","client_id":"w%d"}`, i))
		c.recv()
		c.send(`{"id":2,"op":"watch","prefix":"p/"}`)
		if m := c.recv(); m.Type != api.TypeOK {
			t.Fatalf("watch %d: %+v", i, m)
		}
		conns = append(conns, c)
	}
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"w9"}`)
	c.recv()
	c.send(`{"id":2,"op":"watch","lock":"x"}`)
	if m := c.recv(); m.Type != api.TypeError || m.Error.Code != api.CodeResourceExhausted || !strings.Contains(m.Error.Message, "max-watches (2)") {
		t.Fatalf("a third watch on the member: %+v", m)
	}
	resp, err := http.Get(srv.URL + "/api/v1/locks/x?index=1&wait=1s")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a blocking query past the bound: %d", resp.StatusCode)
	}
	conns[0].send(`{"id":3,"op":"unwatch","watch_id":1}`)
	for {
		if m := conns[0].recv(); m.ID == 3 {
			break
		}
	}
	c.send(`{"id":3,"op":"watch","lock":"x"}`)
	for {
		m := c.recv()
		if m.ID != 3 {
			continue
		}
		if m.Type != api.TypeOK {
			t.Fatalf("a watch after another ended: %+v", m)
		}
		break
	}
}

// One change reaching many parked blocking queries is encoded once:
// two hundred queries on a lock whose status is about 256 KiB (64 holders
// with 4 KiB values) cost one encoding, not two hundred.
func TestBlockingQueriesShareOneEncoding(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	h := New(Config{Backend: f})
	value := strings.Repeat("v", api.MaxValueBytes)
	for i := 0; i < 64; i++ {
		if r := do(t, h, "POST", "/api/v1/locks/sem/acquire", fmt.Sprintf(`{"client_id":"h%d","ttl_ms":600000,"limit":100,"value":%q}`, i, value)); r.status != 200 {
			t.Fatalf("acquire: %s", r.raw)
		}
	}
	st := do(t, h, "GET", "/api/v1/locks/sem", "")
	var idx uint64
	fmt.Sscanf(st.raw[strings.Index(st.raw, `"index":`)+len(`"index":`):], "%d", &idx)
	const queries = 200
	type body struct {
		sum [32]byte
		n   int64
	}
	bodies := make(chan body, queries)
	for i := 0; i < queries; i++ {
		go func() {
			resp, err := http.Get(fmt.Sprintf("%s/api/v1/locks/sem?index=%d&wait=30s", srv.URL, idx))
			if err != nil {
				bodies <- body{}
				return
			}
			defer resp.Body.Close()
			// Hashed, not kept: what this test measures is the server's
			// allocations.
			hs := sha256.New()
			n, _ := io.Copy(hs, resp.Body)
			var b body
			copy(b.sum[:], hs.Sum(nil))
			b.n = n
			bodies <- b
		}()
	}
	waitFor(t, "the queries to park", func() bool { return f.watches.Count() >= queries })
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	encodings := statusEncodings.Load()
	if r := do(t, h, "POST", "/api/v1/locks/sem/acquire", `{"client_id":"h64","ttl_ms":600000}`); r.status != 200 {
		t.Fatalf("the change: %s", r.raw)
	}
	first := <-bodies
	for i := 1; i < queries; i++ {
		b := <-bodies
		if b.n < 64*api.MaxValueBytes || b != first {
			t.Fatalf("query %d: %d bytes, differs from the first: %v", i, b.n, b != first)
		}
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d queries answered with %d bytes each; %d MiB allocated in all", queries, first.n, alloc>>20)
	if n := statusEncodings.Load() - encodings; n != 1 {
		t.Fatalf("the change's status was encoded %d times for %d queries, want once", n, queries)
	}
	// One encoding is ~270 KiB; one per query in flight at once would be
	// up to 200 × that, 53 MiB.
	if alloc > 32<<20 {
		t.Fatalf("%d MiB allocated to answer %d queries", alloc>>20, queries)
	}
}

// Watch frames share the change's one encoding too, and every watcher
// gets the same status bytes.
func TestWatchersShareOneEncoding(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	var conns []*wsClient
	for i := 0; i < 20; i++ {
		c := dialWS(t, srv)
		c.send(fmt.Sprintf(`{"id":1,"op":"hello","client_id":"w%d"}`, i))
		c.recv()
		c.send(`{"id":2,"op":"watch","prefix":"s/"}`)
		if m := c.recv(); m.Type != api.TypeOK {
			t.Fatalf("watch: %+v", m)
		}
		conns = append(conns, c)
	}
	before := statusEncodings.Load()
	h := New(Config{Backend: f})
	if r := do(t, h, "POST", "/api/v1/locks/s%2Fx/acquire", `{"client_id":"c","ttl_ms":60000,"value":"v"}`); r.status != 200 {
		t.Fatal(r.raw)
	}
	for i, c := range conns {
		for {
			m := c.recv()
			if m.Type == api.TypeChanged && m.Lock == "s/x" {
				if m.Status == nil || m.Status.Value != "v" || m.Index != m.Status.Index {
					t.Fatalf("watcher %d: %+v", i, m)
				}
				break
			}
		}
	}
	if n := statusEncodings.Load() - before; n != 1 {
		t.Fatalf("one change to 20 watchers was encoded %d times", n)
	}
}
