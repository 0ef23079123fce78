package httpapi

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
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
		case api.TypeSynced:
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
	obs := &recordingObserver{}
	srv := httptest.NewServer(New(Config{Backend: f, MaxWatches: 2, Observer: obs}))
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
	if got := obs.takeRefusals(); !slices.Equal(got, []string{"resource_exhausted/watch", "resource_exhausted/watch"}) {
		t.Fatalf("refusals counted: %v", got)
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

// watchFrames reads watch frames until stop says so, failing on any
// error frame.
func (w *wsClient) watchFrames(stop func(api.WSMessage) bool) []api.WSMessage {
	w.t.Helper()
	var out []api.WSMessage
	for {
		m := w.recv()
		if m.Type == api.TypeError {
			w.t.Fatalf("error frame %+v after %+v", m, out)
		}
		out = append(out, m)
		if stop(m) {
			return out
		}
	}
}

// TestPrefixWatchSendsNothingOlderThanItsPicture: a lock taken and freed
// between a prefix watch's registration and the read of its first picture
// is free in the picture (not listed); its older changes, buffered
// meanwhile, must not follow the picture (they showed a holder that the
// picture's index no longer has). After the picture only changes above its
// index come.
func TestPrefixWatchSendsNothingOlderThanItsPicture(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	srv := httptest.NewServer(h)
	defer srv.Close()
	acquire := func(name string) uint64 {
		r := do(t, h, "POST", "/api/v1/locks/"+name+"/acquire", `{"client_id":"w","ttl_ms":60000}`)
		if r.status != 200 {
			t.Fatalf("acquire %s: %s", name, r.raw)
		}
		return uint64(r.body["fencing_token"].(float64))
	}
	acquire("p/held")
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"watcher"}`)
	c.recv()
	f.mu.Lock()
	f.afterReadIndex = func() {
		f.mu.Lock()
		f.afterReadIndex = nil
		f.mu.Unlock()
		tok := acquire("p/gap")
		if r := do(t, h, "POST", "/api/v1/locks/p%2Fgap/release", fmt.Sprintf(`{"client_id":"w","fencing_token":%d}`, tok)); r.status != 200 {
			t.Errorf("release: %s", r.raw)
		}
	}
	f.mu.Unlock()
	c.send(`{"id":2,"op":"watch","prefix":"p/"}`)
	if m := c.recv(); m.Type != api.TypeOK {
		t.Fatalf("watch: %+v", m)
	}
	var picture uint64 // the highest index the picture showed
	frames := c.watchFrames(func(m api.WSMessage) bool { return m.Type == api.TypeChanged })
	if m := frames[0]; m.Lock != "p/held" || !m.Status.Held {
		t.Fatalf("picture: %+v", m)
	}
	picture = frames[0].Index
	f.View(func(tb *locktable.Table) { picture = max(picture, tb.LastChange()) })
	acquire("p/after")
	for _, m := range c.watchFrames(func(m api.WSMessage) bool { return m.Lock == "p/after" }) {
		switch {
		case m.Type == api.TypeSynced:
		case m.Lock == "p/gap":
			t.Fatalf("a change older than the picture (read at %d) came after it: %+v held=%v", picture, m, m.Status.Held)
		case m.Index <= picture:
			t.Fatalf("frame at %d after a picture read at %d: %+v", m.Index, picture, m)
		}
	}
}

// TestWatchSynced: after a watch's initial frames comes one synced frame
// naming the index they are as of; every later frame is above it. A prefix
// read in several pages at different indexes sends the changes of its
// earlier pages up to the last page's index before synced (and none at or
// below the index each lock's page was read at).
func TestWatchSynced(t *testing.T) {
	defer func(n int) { watchPage = n }(watchPage)
	watchPage = 2
	f := newFake()
	h := New(Config{Backend: f})
	srv := httptest.NewServer(h)
	defer srv.Close()
	tokens := map[string]uint64{}
	acquire := func(name string) {
		r := do(t, h, "POST", "/api/v1/locks/"+strings.ReplaceAll(name, "/", "%2F")+"/acquire", `{"client_id":"w","ttl_ms":60000}`)
		if r.status != 200 {
			t.Fatalf("acquire %s: %s", name, r.raw)
		}
		tokens[name] = uint64(r.body["fencing_token"].(float64))
	}
	release := func(name string) {
		if r := do(t, h, "POST", "/api/v1/locks/"+strings.ReplaceAll(name, "/", "%2F")+"/release", fmt.Sprintf(`{"client_id":"w","fencing_token":%d}`, tokens[name])); r.status != 200 {
			t.Fatalf("release %s: %s", name, r.raw)
		}
	}
	lastChange := func() (n uint64) {
		f.View(func(tb *locktable.Table) { n = tb.LastChange() })
		return n
	}
	for _, n := range []string{"p/a", "p/b", "p/c", "p/d", "p/e", "q"} {
		acquire(n)
	}
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"watcher"}`)
	c.recv()

	t.Run("one lock", func(t *testing.T) {
		c.send(`{"id":2,"op":"watch","lock":"q"}`)
		ok := c.recv()
		want := lastChange()
		fs := c.watchFrames(func(m api.WSMessage) bool { return m.Type == api.TypeSynced })
		if len(fs) != 2 || fs[0].Lock != "q" || fs[1].WatchID != ok.WatchID || fs[1].Index != want {
			t.Fatalf("frames %+v, want q's status then synced at %d", fs, want)
		}
		release("q")
		if m := c.recv(); m.Lock != "q" || m.Index <= want || m.Status.Held {
			t.Fatalf("the release: %+v (synced at %d)", m, want)
		}
	})
	t.Run("a prefix in pages", func(t *testing.T) {
		// After the first page (p/a, p/b) is read, p/a changes (it must
		// come before synced), and p/cc is taken and freed before its page
		// is read (it must not come at all).
		f.mu.Lock()
		f.afterView = func() {
			f.mu.Lock()
			f.afterView = nil
			f.mu.Unlock()
			release("p/a")
			acquire("p/cc")
			release("p/cc")
		}
		f.mu.Unlock()
		c.send(`{"id":3,"op":"watch","prefix":"p/"}`)
		if m := c.recv(); m.Type != api.TypeOK {
			t.Fatalf("watch: %+v", m)
		}
		fs := c.watchFrames(func(m api.WSMessage) bool { return m.Type == api.TypeSynced })
		var got []string
		for _, m := range fs[:len(fs)-1] {
			got = append(got, fmt.Sprintf("%s@%d:%v", m.Lock, m.Index, m.Status.Held))
		}
		synced := fs[len(fs)-1]
		if synced.Index != lastChange() {
			t.Fatalf("synced at %d, the last change is at %d", synced.Index, lastChange())
		}
		var aFreed uint64
		f.View(func(tb *locktable.Table) { aFreed = tb.Get("p/a").Index })
		first := fs[0].Index
		want := []string{
			fmt.Sprintf("p/a@%d:true", first), fmt.Sprintf("p/b@%d:true", fs[1].Index),
			fmt.Sprintf("p/c@%d:true", fs[2].Index), fmt.Sprintf("p/d@%d:true", fs[3].Index),
			fmt.Sprintf("p/e@%d:true", fs[4].Index), fmt.Sprintf("p/a@%d:false", aFreed),
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("initial frames\n got %v\nwant %v", got, want)
		}
		acquire("p/z")
		if m := c.recv(); m.Lock != "p/z" || m.Index <= synced.Index {
			t.Fatalf("after synced at %d: %+v", synced.Index, m)
		}
	})
	t.Run("an empty prefix", func(t *testing.T) {
		c.send(`{"id":4,"op":"watch","prefix":"none/"}`)
		ok := c.recv()
		if m := c.recv(); m.Type != api.TypeSynced || m.WatchID != ok.WatchID || m.Index != lastChange() {
			t.Fatalf("want synced at %d at once: %+v", lastChange(), m)
		}
	})
}
