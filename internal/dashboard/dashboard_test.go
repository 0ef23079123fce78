package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// fakeSource is a member whose state the test drives. Like the server, it
// applies each command at the next log index and then hands the status of
// every lock the command touched to the watchers.
type fakeSource struct {
	mu       sync.RWMutex
	table    *locktable.Table
	index    uint64
	status   api.NodeStatus
	cluster  api.ClusterStatus
	err      error
	views    int // View calls
	statuses int // Status calls
	clusters int // Cluster calls
	watches  *notify.Watches
}

func newFake() *fakeSource {
	return &fakeSource{
		table:   locktable.New(),
		index:   10,
		watches: notify.NewWatches(nil),
		status:  api.NodeStatus{ID: "n1", State: "Leader", LeaderID: "n1", Term: 3, CommitIndex: 10, AppliedIndex: 10},
		cluster: api.ClusterStatus{LeaderID: "n1", LeaderHTTP: "http://127.0.0.1:7070", Term: 3, Members: []api.Member{
			{ID: "n1", RaftAddr: "127.0.0.1:7071", HTTPAddr: "http://127.0.0.1:7070", Voter: true},
			{ID: "n2", RaftAddr: "127.0.0.1:7171", HTTPAddr: "http://127.0.0.1:7170", Voter: true},
			{ID: "n3", RaftAddr: "127.0.0.1:7271", HTTPAddr: "http://127.0.0.1:7270", Voter: true},
		}},
	}
}

func (f *fakeSource) Cluster(context.Context) (api.ClusterStatus, error) {
	f.mu.Lock()
	f.clusters++
	f.mu.Unlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.cluster, f.err
}

func (f *fakeSource) Status() api.NodeStatus {
	f.mu.Lock()
	f.statuses++
	f.mu.Unlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.status
}

func (f *fakeSource) View(fn func(t *locktable.Table)) {
	f.mu.Lock()
	f.views++
	f.mu.Unlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.table)
}

func (f *fakeSource) WatchPrefix(prefix string, buf int) *notify.Watch {
	return f.watches.WatchPrefix(prefix, buf)
}

// reads returns the number of calls of each reading method.
func (f *fakeSource) reads() (views, statuses, clusters int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.views, f.statuses, f.clusters
}

func (f *fakeSource) apply(t *testing.T, c locktable.Command) locktable.Result {
	t.Helper()
	f.mu.Lock()
	f.index++
	idx := f.index
	r := f.table.ApplyAt(idx, c)
	f.status.CommitIndex, f.status.AppliedIndex = idx, idx
	var changes []notify.Change
	seen := map[string]bool{}
	for _, ev := range r.Events {
		if ev.Lock != "" && !seen[ev.Lock] {
			seen[ev.Lock] = true
			changes = append(changes, notify.Change{Index: idx, Status: f.table.Get(ev.Lock)})
		}
	}
	f.mu.Unlock()
	f.watches.Publish(changes)
	return r
}

const t0 int64 = 1_700_000_000_000

func testConfig() config {
	c := defaultConfig()
	c.coalesce = 20 * time.Millisecond
	c.readEvery = 50 * time.Millisecond
	c.clusterEvery = 200 * time.Millisecond
	c.heartbeat = 150 * time.Millisecond
	c.writeTimeout = 2 * time.Second
	return c
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}

func TestStaticAssets(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := httptest.NewServer(newHandler(newFake(), nil, testConfig()))
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}

	for path, want := range map[string]string{
		"/ui/":            "text/html",
		"/ui/app.js":      "javascript",
		"/ui/net.js":      "javascript",
		"/ui/style.css":   "text/css",
		"/ui/favicon.svg": "image/svg+xml",
	} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) {
			t.Errorf("%s: %d %q, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
		if len(body) == 0 {
			t.Errorf("%s: empty body", path)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
		if path == "/ui/" && (!strings.Contains(string(body), `src="app.js"`) || !strings.Contains(string(body), `src="net.js"`)) {
			t.Errorf("index does not load app.js and net.js:\n%s", body)
		}
	}

	resp, err := client.Get(srv.URL + "/ui/nope")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || decode(t, body)["error"].(map[string]any)["code"] != api.CodeNotFound {
		t.Errorf("unknown asset: %d %s", resp.StatusCode, body)
	}
}

func TestSnapshotContents(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "b/payments", ClientID: "worker-7", TTLms: 30000, Value: "10.0.0.7:8080"})
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "b/payments", ClientID: "worker-8", TTLms: 30000, WaitMs: 60000})
	f.apply(t, locktable.Command{Op: locktable.OpCreateSession, Now: t0, SessionID: "s1", ClientID: "cron", TTLms: 15000})
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "a/nightly", ClientID: "cron", SessionID: "s1"})
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "c/zzz", ClientID: "w", TTLms: 1000})

	cfg := testConfig()
	cfg.maxLocks = 2
	h := newHandler(f, nil, cfg)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/snapshot", nil))
	if rec.Code != 200 {
		t.Fatalf("snapshot: %d %s", rec.Code, rec.Body)
	}
	var s struct {
		Now int64 `json:"now"`
		Snapshot
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	if s.Now == 0 || s.Stale || s.Cluster.LeaderID != "n1" || len(s.Cluster.Members) != 3 || s.Member.ID != "n1" {
		t.Errorf("header fields: %+v", s)
	}
	if s.LocksTotal != 3 || s.LocksLimit != 2 || len(s.Locks) != 2 || s.Held != 3 || s.Waiters != 1 || s.Sessions != 1 || s.LastToken != 3 {
		t.Errorf("counts: total %d limit %d listed %d held %d waiters %d sessions %d last %d",
			s.LocksTotal, s.LocksLimit, len(s.Locks), s.Held, s.Waiters, s.Sessions, s.LastToken)
	}
	want := []Lock{
		{Name: "a/nightly", Held: true, Mode: "exclusive", Limit: 1, HoldersTotal: 1, Index: 14,
			Holders: []Holder{{ClientID: "cron", Session: "s1", Token: 2}}},
		{Name: "b/payments", Held: true, Mode: "exclusive", Limit: 1, HoldersTotal: 1, Waiters: 1, Index: 12,
			Holders: []Holder{{ClientID: "worker-7", Token: 1, TTLms: 30000, ExpiresAt: t0 + 30000, Value: "10.0.0.7:8080"}}},
	}
	if !reflect.DeepEqual(s.Locks, want) {
		t.Errorf("locks = %+v\nwant   %+v", s.Locks, want)
	}

	// A follower's snapshot is marked stale; a cluster error is reported,
	// not fatal.
	f.mu.Lock()
	f.status.State, f.status.LeaderID = "Follower", "n2"
	f.err = errors.New("raft is shutting down")
	f.mu.Unlock()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/snapshot", nil))
	m := decode(t, rec.Body.Bytes())
	if m["stale"] != true || m["cluster_error"] != "raft is shutting down" || m["cluster"].(map[string]any)["leader_id"] != "n2" {
		t.Errorf("follower snapshot: %s", rec.Body)
	}
}

// TestSnapshotLockKinds: a snapshot shows each lock's mode and limit,
// every holder with its token, expiry and value (values cut to
// maxValueBytes at a character boundary), a running lock-delay, and
// bounds the holders it lists.
func TestSnapshotLockKinds(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	acq := func(c locktable.Command) {
		t.Helper()
		c.Op, c.Now = locktable.OpAcquire, t0
		if r := f.apply(t, c); !r.Granted {
			t.Fatalf("acquire %+v: %+v", c, r)
		}
	}
	long := strings.Repeat("x", maxValueBytes-1) + "é and more" // é straddles the cut
	acq(locktable.Command{Lock: "d/shared", ClientID: "r1", TTLms: 5000, Mode: locktable.Shared, Value: "v1"})
	acq(locktable.Command{Lock: "d/shared", ClientID: "r2", TTLms: 6000, Mode: locktable.Shared, Value: long})
	acq(locktable.Command{Lock: "e/sem", ClientID: "p1", TTLms: 5000, Limit: 3})
	acq(locktable.Command{Lock: "e/sem", ClientID: "p2", TTLms: 5000, Limit: 3})
	acq(locktable.Command{Lock: "f/delayed", ClientID: "x", TTLms: 5000, DelayMs: 1500})
	if r := f.apply(t, locktable.Command{Op: locktable.OpRevoke, Now: t0 + 100, Lock: "f/delayed"}); len(r.Tokens) != 1 {
		t.Fatalf("revoke: %+v", r)
	}
	for i := range maxHoldersPerLock + 4 {
		acq(locktable.Command{Lock: "g/big", ClientID: fmt.Sprintf("c%02d", i), TTLms: 5000, Limit: 100})
	}

	h := newHandler(f, nil, testConfig())
	var s Snapshot
	if err := json.Unmarshal(h.hub.build(context.Background()), &s); err != nil {
		t.Fatal(err)
	}
	byName := map[string]Lock{}
	for _, l := range s.Locks {
		byName[l.Name] = l
	}

	sh := byName["d/shared"]
	cutLong := strings.Repeat("x", maxValueBytes-1)
	wantShared := []Holder{
		{ClientID: "r1", Token: 1, TTLms: 5000, ExpiresAt: t0 + 5000, Value: "v1"},
		{ClientID: "r2", Token: 2, TTLms: 6000, ExpiresAt: t0 + 6000, Value: cutLong, ValueTruncated: true},
	}
	if sh.Mode != "shared" || sh.Limit != 1 || sh.HoldersTotal != 2 || !reflect.DeepEqual(sh.Holders, wantShared) {
		t.Errorf("shared lock: %+v", sh)
	}
	sem := byName["e/sem"]
	if sem.Mode != "exclusive" || sem.Limit != 3 || sem.HoldersTotal != 2 || len(sem.Holders) != 2 || sem.Holders[1].ClientID != "p2" {
		t.Errorf("semaphore: %+v", sem)
	}
	d := byName["f/delayed"]
	if d.Held || d.Mode != "none" || d.DelayedUntil != t0+100+1500 || len(d.Holders) != 0 || d.HoldersTotal != 0 {
		t.Errorf("delayed lock: %+v", d)
	}
	big := byName["g/big"]
	if big.Limit != 100 || big.HoldersTotal != maxHoldersPerLock+4 || len(big.Holders) != maxHoldersPerLock {
		t.Errorf("semaphore of %d holders: limit %d, %d listed of %d", maxHoldersPerLock+4, big.Limit, len(big.Holders), big.HoldersTotal)
	}

	// The holders listed per snapshot are bounded too: every lock keeps
	// its first holder.
	budget := 3
	five := locktable.LockInfo{Held: true, Limit: 5, Holders: make([]locktable.Holder, 5)}
	if n1, n2, n3 := listed(five, &budget), listed(five, &budget), listed(locktable.LockInfo{}, &budget); n1 != 3 || n2 != 1 || n3 != 0 {
		t.Errorf("holder budget of 3, two locks of 5 holders and a free one: %d, %d and %d listed, want 3, 1, 0", n1, n2, n3)
	}
}

// sseReader reads Server-Sent Events.
type sseReader struct {
	r *bufio.Reader
}

type sseEvent struct {
	name, id, data string
}

func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.data != "" || ev.name != "" {
				return ev, nil
			}
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			ev.data += strings.TrimPrefix(line, "data: ")
		}
	}
}

// nextWithin reads the next event or fails after d.
func (s *sseReader) nextWithin(t *testing.T, d time.Duration) sseEvent {
	t.Helper()
	type res struct {
		ev  sseEvent
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ev, err := s.next()
		ch <- res{ev, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("reading the stream: %v", r.err)
		}
		return r.ev
	case <-time.After(d):
		t.Fatalf("no event within %s", d)
		return sseEvent{}
	}
}

func openStream(t *testing.T, ctx context.Context, url, origin string) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/ui/events", nil)
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, &sseReader{r: bufio.NewReader(resp.Body)}
}

func TestEventsPushChangesAndHeartbeats(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	h := newHandler(f, nil, testConfig())
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, sse := openStream(t, ctx, srv.URL, "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ev := sse.nextWithin(t, 3*time.Second)
	first := decode(t, []byte(ev.data))
	if ev.name != "" || ev.id == "" || first["now"] == nil || len(first["locks"].([]any)) != 0 {
		t.Fatalf("first event: %+v", ev)
	}
	if !f.watches.Watching() {
		t.Fatal("a stream is open but the hub holds no watch")
	}

	// A change is pushed.
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "payment-processor", ClientID: "worker-7", TTLms: 30000})
	ev = sse.nextWithin(t, 3*time.Second)
	m := decode(t, []byte(ev.data))
	locks := m["locks"].([]any)
	if ev.name != "" || len(locks) != 1 {
		t.Fatalf("after acquire: %+v", ev)
	}
	if h := locks[0].(map[string]any)["holders"].([]any)[0].(map[string]any); h["client_id"] != "worker-7" || h["fencing_token"] != 1.0 {
		t.Fatalf("after acquire: %+v", ev)
	}

	// Nothing changes: only heartbeats, carrying the member's clock, and no
	// read of the lock table (the cluster facts are refreshed meanwhile).
	reads := h.hub.counters().lockReads
	for i := 0; i < 2; i++ {
		ev = sse.nextWithin(t, 3*time.Second)
		if ev.name != "ping" || decode(t, []byte(ev.data))["now"] == nil {
			t.Fatalf("expected a ping, got %+v", ev)
		}
	}
	if c := h.hub.counters(); c.lockReads != reads || c.clusterReads == 0 {
		t.Errorf("with nothing changing: %d more reads of the lock table (want 0), %d refreshes of the cluster facts (want > 0)",
			c.lockReads-reads, c.clusterReads)
	}

	// A second viewer shares the watch and gets the current state at once.
	resp2, sse2 := openStream(t, ctx, srv.URL, "")
	ev = sse2.nextWithin(t, 3*time.Second)
	if len(decode(t, []byte(ev.data))["locks"].([]any)) != 1 {
		t.Fatalf("second viewer: %+v", ev)
	}
	resp2.Body.Close()
	resp.Body.Close()

	// With no viewer left, the hub drops its watch and reads no more.
	waitFor(t, 3*time.Second, func() bool {
		h.hub.mu.Lock()
		defer h.hub.mu.Unlock()
		return !h.hub.running && !f.watches.Watching()
	})
	views, statuses, clusters := f.reads()
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "another", ClientID: "worker-8", TTLms: 30000})
	time.Sleep(300 * time.Millisecond) // longer than the cluster facts' interval
	if v, s, c := f.reads(); v != views || s != statuses || c != clusters {
		t.Errorf("with no viewer the state was read: %d views, %d statuses, %d cluster reads", v-views, s-statuses, c-clusters)
	}
}

// TestNoViewerNoWatchNoReads: a dashboard nobody looks at holds no watch
// and reads nothing, whatever happens to the locks.
func TestNoViewerNoWatchNoReads(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	srv := httptest.NewServer(newHandler(f, nil, testConfig()))
	defer srv.Close()
	for i := range 20 {
		f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: fmt.Sprintf("l%d", i), ClientID: "c", TTLms: 30000})
	}
	time.Sleep(300 * time.Millisecond)
	if v, s, c := f.reads(); v+s+c != 0 || f.watches.Watching() {
		t.Errorf("no viewer: %d views, %d statuses, %d cluster reads, watching %v", v, s, c, f.watches.Watching())
	}
}

// TestChangePushedPromptly: with the default pacing, a change made while a
// page is open reaches it at once (the first change after a quiet spell is
// read immediately), well within the old poll's 400 ms.
func TestChangePushedPromptly(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	cfg := testConfig()
	cfg.coalesce, cfg.readEvery = DefaultCoalesce, DefaultReadInterval
	h := newHandler(f, nil, cfg)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, sse := openStream(t, ctx, srv.URL, "")
	defer resp.Body.Close()
	sse.nextWithin(t, 3*time.Second)

	for i := range 3 {
		time.Sleep(DefaultReadInterval + 50*time.Millisecond) // a quiet spell: a read is available
		name := fmt.Sprintf("lock-%d", i)
		start := time.Now()
		f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: name, ClientID: "w", TTLms: 30000})
		for {
			ev := sse.nextWithin(t, 3*time.Second)
			if ev.name == "" && strings.Contains(ev.data, `"name":"`+name+`"`) {
				break
			}
		}
		took := time.Since(start)
		t.Logf("change %d pushed after %s", i, took)
		if took > 250*time.Millisecond { // generous for a busy 2-core machine; typically well under 10 ms
			t.Errorf("change %d pushed after %s", i, took)
		}
	}
}

// TestBurstCoalesces: a burst of changes spread over a few hundred
// milliseconds costs a few reads and frames, at most one per coalesce
// interval, not one per change, and the last frame shows the state after
// the burst. With a watch buffer too small for an instant burst, the watch
// asks for a resync and the result is the same.
func TestBurstCoalesces(t *testing.T) {
	for _, buf := range []int{DefaultWatchBuffer, 4} {
		t.Run(fmt.Sprintf("buffer %d", buf), func(t *testing.T) {
			defer goleak.VerifyNone(t)
			f := newFake()
			cfg := testConfig()
			cfg.coalesce, cfg.readEvery, cfg.watchBuf = DefaultCoalesce, DefaultReadInterval, buf
			cfg.clusterEvery = time.Hour // only lock reads publish here
			h := newHandler(f, nil, cfg)
			srv := httptest.NewServer(h)
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, sse := openStream(t, ctx, srv.URL, "")
			defer resp.Body.Close()
			sse.nextWithin(t, 3*time.Second)
			time.Sleep(DefaultReadInterval * DefaultReadBurst) // the budget is full
			before := h.hub.counters()

			const n = 300
			start := time.Now()
			for i := range n {
				f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: fmt.Sprintf("burst/%03d", i), ClientID: "w", TTLms: 30000})
				if buf >= n {
					time.Sleep(time.Millisecond) // spread the burst over a few coalesce intervals
				}
			}
			burst := time.Since(start)
			frames := 0
			for {
				ev := sse.nextWithin(t, 3*time.Second)
				if ev.name != "" {
					continue
				}
				frames++
				var s Snapshot
				if err := json.Unmarshal([]byte(ev.data), &s); err != nil {
					t.Fatal(err)
				}
				if s.LocksTotal == n && len(s.Locks) == n {
					break
				}
			}
			after := h.hub.counters()
			reads := after.lockReads - before.lockReads
			t.Logf("%d changes in %s: %d reads, %d frames, %d changes received (%d already read), %d resyncs",
				n, burst, reads, frames, after.changes-before.changes, after.skipped-before.skipped, after.resyncs-before.resyncs)
			// The first change is read at once, the rest at most once per
			// coalesce interval.
			if limit := 2 + int(burst/DefaultCoalesce); reads > limit || frames > reads {
				t.Errorf("%d changes in %s: %d reads and %d frames, want at most %d", n, burst, reads, frames, limit)
			}
			if buf < n && after.resyncs == before.resyncs {
				t.Errorf("buffer %d, %d changes: no resync", buf, n)
			}
		})
	}
}

// TestSustainedLoadReadsNoMoreThanThePoll: under changes that never stop,
// the hub reads the lock table no more often than the poll it replaced
// (one read per readEvery, counted from the moment the stream opened), and
// the page keeps receiving frames.
func TestSustainedLoadReadsNoMoreThanThePoll(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	cfg := testConfig()
	cfg.coalesce, cfg.readEvery = 10*time.Millisecond, 100*time.Millisecond
	cfg.clusterEvery = time.Hour
	h := newHandler(f, nil, cfg)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opened := time.Now()
	resp, sse := openStream(t, ctx, srv.URL, "")
	defer resp.Body.Close()

	frames := make(chan int, 1)
	go func() {
		n := 0
		for {
			ev, err := sse.next()
			if err != nil {
				frames <- n
				return
			}
			if ev.name == "" {
				n++
			}
		}
	}()
	for i := 0; time.Since(opened) < time.Second; i++ {
		f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: fmt.Sprintf("load/%05d", i), ClientID: "w", TTLms: 30000})
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(opened)
	reads := h.hub.counters().lockReads
	resp.Body.Close()
	got := <-frames
	poll := 1 + int(elapsed/cfg.readEvery) // what the poll read in that time, at its first tick and every readEvery
	t.Logf("%s of changes: %d reads of the lock table (the poll: %d), %d frames", elapsed, reads, poll, got)
	if reads > poll || reads < poll/3 || got < 2 {
		t.Errorf("%s of changes: %d reads (want ≤ %d, the poll's, and ≥ %d) and %d frames", elapsed, reads, poll, poll/3, got)
	}
}

// TestReadBudget checks the pacing on a simulated clock: reads never
// closer than coalesce, never more in total than the poll's one per
// readEvery since the start, and a burst after a quiet spell.
func TestReadBudget(t *testing.T) {
	cfg := defaultConfig()
	start := time.Unix(1000, 0)
	b := newReadBudget(cfg, start)
	// Ask for a read every millisecond for 10 s: the reads go where next
	// allows.
	var reads []time.Time
	for now := start; now.Before(start.Add(10 * time.Second)); now = now.Add(time.Millisecond) {
		if !b.next().After(now) {
			reads = append(reads, now)
			b.spend(now, 100*time.Microsecond)
		}
	}
	for i, r := range reads {
		if poll := 1 + int(r.Sub(start)/cfg.readEvery); i+1 > poll {
			t.Fatalf("read %d at +%s: more than the poll's %d", i+1, r.Sub(start), poll)
		}
		if i > 0 && r.Sub(reads[i-1]) < cfg.coalesce {
			t.Fatalf("reads %s apart", r.Sub(reads[i-1]))
		}
	}
	if len(reads) < 24 {
		t.Errorf("%d reads in 10 s of continuous changes, want ~25", len(reads))
	}

	// After a quiet spell, readBurst reads coalesce apart, then readEvery.
	quiet := reads[len(reads)-1].Add(5 * time.Second)
	var burst []time.Duration
	for now := quiet; len(burst) < cfg.readBurst+2; now = now.Add(time.Millisecond) {
		if !b.next().After(now) {
			burst = append(burst, now.Sub(quiet))
			b.spend(now, 100*time.Microsecond)
		}
	}
	want := []time.Duration{0, 100, 200, 300}
	for i, w := range want {
		if burst[i] != w*time.Millisecond {
			t.Errorf("after a quiet spell: reads at %v, want %v first", burst, want)
			break
		}
	}
	if d := burst[cfg.readBurst+1] - burst[cfg.readBurst]; d != cfg.readEvery {
		t.Errorf("after the burst: reads %s apart, want %s", d, cfg.readEvery)
	}

	// A slow read spaces the reads 20 times its cost.
	b.spend(quiet.Add(time.Hour), 50*time.Millisecond)
	if d := b.next().Sub(quiet.Add(time.Hour)); d != time.Second {
		t.Errorf("after a 50 ms read the next one waits %s, want 1s", d)
	}
}

func TestEventsCORSOnlyForMembers(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := httptest.NewServer(newHandler(newFake(), nil, testConfig()))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for origin, allowed := range map[string]bool{
		"http://127.0.0.1:7170": true, // another member's page
		"http://evil.example":   false,
		"http://127.0.0.1:9999": false,
	} {
		resp, _ := openStream(t, ctx, srv.URL, origin)
		got := resp.Header.Get("Access-Control-Allow-Origin")
		resp.Body.Close()
		if allowed && got != origin || !allowed && got != "" {
			t.Errorf("Origin %s: Access-Control-Allow-Origin %q", origin, got)
		}
	}
}

func TestEventsStreamLimit(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.maxStreams = 1
	srv := httptest.NewServer(newHandler(newFake(), nil, cfg))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, sse := openStream(t, ctx, srv.URL, "")
	defer resp.Body.Close()
	sse.nextWithin(t, 3*time.Second)
	resp2, _ := openStream(t, ctx, srv.URL, "")
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable || resp2.Header.Get("Retry-After") == "" {
		t.Errorf("stream over the limit: %d", resp2.StatusCode)
	}
}

func TestEventsEndWithTheRequest(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHandler(newFake(), nil, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/events", nil).WithContext(ctx))
	}()
	time.Sleep(100 * time.Millisecond)
	cancel() // the member shuts down: its base context ends every stream
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("the stream did not end with its request context")
	}
	if !strings.Contains(rec.Body.String(), "data: {\"now\":") {
		t.Errorf("no snapshot written: %q", rec.Body.String())
	}
}

func TestStamp(t *testing.T) {
	got := string(stamp([]byte(`{"a":1}`), time.UnixMilli(42)))
	if got != `{"now":42,"a":1}` {
		t.Errorf("stamp = %s", got)
	}
}

func TestOriginOf(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:7070":      "http://127.0.0.1:7070",
		"https://lockd.internal/x/y": "https://lockd.internal",
		"javascript:alert(1)":        "",
		"127.0.0.1:7070":             "",
		"":                           "",
	} {
		if got := originOf(in); got != want {
			t.Errorf("originOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testStore: ops may read every lock, billing administers billing/ only.
func testStore(t *testing.T) *auth.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(path, []byte(`{"tokens": [
	  {"name": "ops", "token": "ops-token-0123456789", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "billing", "token": "billing-token-0123456789", "permissions": [{"prefix": "billing/", "access": "admin"}]}
	]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

func TestAuth(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.auth = testStore(t)
	srv := httptest.NewServer(newHandler(newFake(), nil, cfg))
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}

	get := func(path, header, origin string) (*http.Response, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		if header != "" {
			req.Header.Set("Authorization", "Bearer "+header)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.Header.Get("Content-Type") == "text/event-stream" {
			ev, err := (&sseReader{r: bufio.NewReader(resp.Body)}).next() // the first event only
			if err != nil {
				t.Fatal(err)
			}
			return resp, ev.data
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	// The page carries no data and needs no token.
	if resp, _ := get("/ui/", "", ""); resp.StatusCode != 200 {
		t.Errorf("/ui/ without a token: %d", resp.StatusCode)
	}
	for _, path := range []string{"/ui/snapshot", "/ui/events"} {
		resp, body := get(path, "", "http://127.0.0.1:7170")
		if resp.StatusCode != 401 || !strings.Contains(body, api.CodeUnauthenticated) || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s without a token: %d %s", path, resp.StatusCode, body)
		}
		// A page on another member can read the refusal and ask for a token.
		if resp.Header.Get("Access-Control-Allow-Origin") != "http://127.0.0.1:7170" {
			t.Errorf("%s: 401 without the CORS header", path)
		}
		if resp, body := get(path, "wrong-token-0123456789", ""); resp.StatusCode != 401 {
			t.Errorf("%s with a wrong token: %d %s", path, resp.StatusCode, body)
		}
		// Admin on a prefix is not read access to every lock.
		if resp, body := get(path, "billing-token-0123456789", ""); resp.StatusCode != 403 || !strings.Contains(body, api.CodePermissionDenied) {
			t.Errorf("%s with a prefix-only token: %d %s", path, resp.StatusCode, body)
		}
		if resp, body := get(path, "ops-token-0123456789", ""); resp.StatusCode != 200 || !strings.Contains(body, `"leader_id":"n1"`) {
			t.Errorf("%s with the header: %d %s", path, resp.StatusCode, body)
		}
		// A token in the URL is refused, valid or not, with or without the
		// header, and names the header to use instead.
		for _, c := range []struct{ query, header string }{
			{"?access_token=ops-token-0123456789", ""},
			{"?access_token=ops-token-0123456789", "ops-token-0123456789"},
			{"?access_token=", "ops-token-0123456789"},
			{"?x=1&access%5Ftoken=ops-token-0123456789", ""},
		} {
			resp, body := get(path+c.query, c.header, "")
			if resp.StatusCode != 400 || !strings.Contains(body, api.CodeInvalidArgument) || !strings.Contains(body, "Authorization: Bearer") {
				t.Errorf("%s%s (header %q): %d %s, want 400 naming the Authorization header", path, c.query, c.header, resp.StatusCode, body)
			}
			if strings.Contains(body, "ops-token") {
				t.Errorf("%s%s: the refusal echoes the token: %s", path, c.query, body)
			}
		}
		// No other query parameter carries a token either: only the header
		// authenticates.
		for _, q := range []string{"?token=", "?access-token=", "?bearer=", "?authorization=Bearer+", "?Access_Token="} {
			if resp, body := get(path+q+"ops-token-0123456789", "", ""); resp.StatusCode != 401 {
				t.Errorf("%s%s<token> without the header: %d %s, want 401", path, q, resp.StatusCode, body)
			}
		}
	}
}

// TestQueryTokenRefusedEverywhere: a token in the URL is refused on every
// dashboard path, the page's included, and with authentication off too, so
// that a script or bookmark still carrying one is noticed before tokens are
// turned on.
func TestQueryTokenRefusedEverywhere(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHandler(newFake(), nil, testConfig())
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/snapshot", "/ui/events", "/ui/nope"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path+"?access_token=secret-0123456789", nil))
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), "Authorization header") ||
			rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s?access_token=: %d %q %s", path, rec.Code, rec.Header().Get("Cache-Control"), rec.Body)
		}
	}
}

// TestNoHandlerReadsTheQuery: the package's code looks at a request's query
// in one function only, refuseQueryToken, so no handler can take a token
// (or anything else) from the URL. It walks the package's non-test
// sources for every way net/http offers to read the query.
func TestNoHandlerReadsTheQuery(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	readers := map[string]bool{"Query": true, "RawQuery": true, "FormValue": true, "Form": true,
		"ParseForm": true, "PostFormValue": true, "ParseMultipartForm": true, "FormFile": true}
	seen := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || !readers[sel.Sel.Name] {
					return true
				}
				if fn.Name.Name == "refuseQueryToken" {
					seen++
					return true
				}
				t.Errorf("%s: %s reads the request's query (.%s); only refuseQueryToken may", fset.Position(sel.Pos()), fn.Name.Name, sel.Sel.Name)
				return true
			})
		}
	}
	if seen == 0 {
		t.Error("refuseQueryToken no longer reads the query: this test checks nothing")
	}
}

// TestPreflight: a page served by another member sends its token in the
// Authorization header, so its browser asks first (CORS preflight). Members'
// origins may; any other origin gets no CORS headers, and its browser sends
// nothing. The preflight itself needs no token.
func TestPreflight(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.auth = testStore(t) // on: the preflight carries no token and must not need one
	h := newHandler(newFake(), nil, cfg)
	for _, path := range []string{"/ui/events", "/ui/snapshot"} {
		for origin, allowed := range map[string]bool{
			"http://127.0.0.1:7170": true,
			"http://evil.example":   false,
		} {
			req := httptest.NewRequest("OPTIONS", path, nil)
			req.Header.Set("Origin", origin)
			req.Header.Set("Access-Control-Request-Method", "GET")
			req.Header.Set("Access-Control-Request-Headers", "authorization")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			hd := rec.Header()
			if rec.Code != http.StatusNoContent {
				t.Errorf("OPTIONS %s from %s: %d %s", path, origin, rec.Code, rec.Body)
			}
			got := hd.Get("Access-Control-Allow-Origin") == origin && hd.Get("Access-Control-Allow-Headers") == "Authorization" &&
				hd.Get("Access-Control-Allow-Methods") == "GET"
			if got != allowed || !allowed && hd.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("OPTIONS %s from %s: allowed %v, want %v (headers %v)", path, origin, got, allowed, hd)
			}
		}
	}
}

// TestStreamEndsWhenTokenRemoved (SPEC 20): an events stream opened with a
// token ends when the token file is reloaded without it (or with less than
// read access to every lock); a stream whose token keeps its access goes
// on. A reconnect is then refused.
func TestStreamEndsWhenTokenRemoved(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	path := filepath.Join(t.TempDir(), "tokens.json")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"tokens": [
	  {"name": "ops", "token": "ops-token-0123456789", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "grafana", "token": "grafana-token-0123456", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "keeps", "token": "keeps-token-01234567", "permissions": [{"prefix": "", "access": "read"}]}
	]}`)
	store, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.auth = store
	f := newFake()
	srv := httptest.NewServer(newHandler(f, nil, cfg))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(token string) (*http.Response, *sseReader) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/ui/events", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, &sseReader{r: bufio.NewReader(resp.Body)}
	}
	respOps, ops := open("ops-token-0123456789")
	defer respOps.Body.Close()
	respGraf, graf := open("grafana-token-0123456")
	defer respGraf.Body.Close()
	respKeep, keep := open("keeps-token-01234567")
	defer respKeep.Body.Close()
	for _, s := range []*sseReader{ops, graf, keep} {
		s.nextWithin(t, 3*time.Second)
	}

	write(`{"tokens": [
	  {"name": "grafana", "token": "grafana-token-0123456", "permissions": [{"prefix": "jobs/", "access": "read"}]},
	  {"name": "keeps", "token": "keeps-token-01234567", "permissions": [{"prefix": "", "access": "read"}]}
	]}`)
	if err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*sseReader{"removed": ops, "narrowed": graf} {
		done := make(chan error, 1)
		go func() {
			var err error
			for err == nil {
				_, err = s.next()
			}
			done <- err
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the stream of the %s token did not end after the reload", name)
		}
	}
	f.apply(t, locktable.Command{Op: locktable.OpAcquire, Now: t0, Lock: "payment-processor", ClientID: "worker-7", TTLms: 30000})
	for ev := keep.nextWithin(t, 3*time.Second); !strings.Contains(ev.data, "payment-processor"); ev = keep.nextWithin(t, 3*time.Second) {
		if ev.name != "ping" {
			t.Fatalf("the stream of a token that kept its access: %+v", ev)
		}
	}
	resp, _ := open("ops-token-0123456789")
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("reconnect of the removed token: %d", resp.StatusCode)
	}
}
