package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/testutil"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parkedQueries is want, or fewer when this process may not open two
// descriptors per query (client and server share the process) with room
// to spare: over the limit, connections fail in ways that test the
// machine, not the member.
func parkedQueries(t *testing.T, want int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return want
	}
	if room := (int(lim.Cur) - 512) / 2; room < want {
		t.Logf("open file limit %d: %d queries instead of %d", lim.Cur, room, want)
		return max(room, 100)
	}
	return want
}

// TestParkedBlockingQueriesCostMemoryNotCPU: thousands of blocking queries
// parked on one lock cost goroutines and memory while nothing changes, no
// CPU (nothing polls); one change answers every one of them with the new
// status, and a query on another lock is not woken by it.
func TestParkedBlockingQueriesCostMemoryNotCPU(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	st := testutil.Get(lockURL(l, "parked", ""))
	index := st.Uint("index")
	n := parkedQueries(t, 2000)
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	replies := make(chan api.LockStatus, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "parked"
			if i == 0 {
				name = "elsewhere"
			}
			// Two thousand queries arriving at once can find the member
			// with 1024 reads in progress: it refuses them for now (503
			// overloaded, SPEC 15), and they retry after the delay it
			// gives, as a client does.
			var resp *http.Response
			for attempt := 0; ; attempt++ {
				var err error
				resp, err = hc.Get(fmt.Sprintf("%s/api/v1/locks/%s?index=%d&wait=60s", l.URL(), name, index))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.StatusCode == http.StatusServiceUnavailable && attempt < 100 {
					delay, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
					resp.Body.Close()
					time.Sleep(time.Duration(max(delay*1000, 100)) * time.Millisecond)
					continue
				}
				break
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Errorf("%s: %s", resp.Status, b)
				return
			}
			var s api.LockStatus
			if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
				t.Error(err)
			}
			replies <- s
		}()
	}
	// Wait until every query is parked: each holds a server goroutine.
	// (a server handler, a connection reader and the client's loops each),
	// and the count has settled.
	prev := 0
	testutil.WaitFor(t, 60*time.Second, "the queries to park", func() bool {
		time.Sleep(500 * time.Millisecond)
		g := runtime.NumGoroutine()
		settled := g >= g0+2*n && g == prev
		prev = g
		return settled
	})
	cpu0, wall0 := cpuTime(), time.Now()
	if f := os.Getenv("PARKED_CPUPROFILE"); f != "" {
		out, _ := os.Create(f)
		pprof.StartCPUProfile(out)
		time.Sleep(2 * time.Second)
		pprof.StopCPUProfile()
		out.Close()
	} else {
		time.Sleep(2 * time.Second)
	}
	idleCPU := cpuTime() - cpu0
	var parked runtime.MemStats
	runtime.ReadMemStats(&parked)
	t.Logf("%d parked blocking queries (server and client goroutines in one process): %d goroutines, heap +%.1f MiB, CPU %.1f%% of one core while idle",
		n, runtime.NumGoroutine()-g0, float64(parked.HeapInuse-before.HeapInuse)/(1<<20),
		100*float64(idleCPU)/float64(time.Since(wall0)))
	if frac := float64(idleCPU) / float64(time.Since(wall0)); frac > 0.25 {
		t.Errorf("parked queries burn %.0f%% of a core while nothing changes", 100*frac)
	}
	select {
	case s := <-replies:
		t.Fatalf("a blocking query answered with no change: %+v", s)
	default:
	}
	a := testutil.Post(lockURL(l, "parked", "acquire"), map[string]any{"client_id": "c", "ttl_ms": 30000})
	if a.Status != 200 {
		t.Fatalf("acquire: %s", a.Raw)
	}
	deadline := time.After(20 * time.Second)
	for got := 0; got < n-1; got++ {
		select {
		case s := <-replies:
			if s.Lock != "parked" || !s.Held || s.ClientID != "c" || s.Index <= index {
				t.Fatalf("answer after the acquire: %+v", s)
			}
		case <-deadline:
			t.Fatalf("only %d of %d parked queries answered the acquire", got, n-1)
		}
	}
	select {
	case s := <-replies:
		t.Fatalf("the query on another lock was woken: %+v", s)
	case <-time.After(300 * time.Millisecond):
	}
	// The last one ends with the member (its wait is a minute).
	c.Stop()
	wg.Wait()
}

// TestBlockingQueryAnswersEarlyOnLeaderChange: a query parked on the leader
// answers when leadership moves (it cannot tell what it missed), and the
// client sees the same index, so it asks again.
func TestBlockingQueryAnswersEarlyOnLeaderChange(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	st := testutil.Get(lockURL(l, "moving", ""))
	done := make(chan testutil.Reply, 1)
	go func() {
		done <- testutil.Get(fmt.Sprintf("%s?index=%d&wait=60s", lockURL(l, "moving", ""), st.Uint("index")))
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if r := testutil.Post(l.URL()+"/api/v1/cluster/transfer-leadership", map[string]any{}); r.Status != 200 {
		t.Fatalf("transfer: %s", r.Raw)
	}
	select {
	case r := <-done:
		if r.Status != 200 || r.Uint("index") != st.Uint("index") {
			t.Fatalf("early answer: %d %s", r.Status, r.Raw)
		}
		t.Logf("answered %v after the transfer began", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("the blocking query did not answer after leadership moved")
	}
}

// TestWatchFollowsEveryChangeInOrder: a prefix watch sees one changed frame
// per committed change of a lock under it, indexes strictly rising per
// lock, and its last frame for each lock matches the replicated state.
// (httpapi's TestSlowWatcherResyncs covers a reader that falls behind.)
func TestWatchFollowsEveryChangeInOrder(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(l.URL(), "http", "ws", 1)+"/api/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	send := func(v any) {
		b, _ := json.Marshal(v)
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	var frames []string
	read := func() api.WSMessage {
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("%v after %d frames, the last %q", err, len(frames), frames[max(0, len(frames)-3):])
		}
		frames = append(frames, string(b))
		var m api.WSMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	prefix := "wt/"
	send(map[string]any{"id": 1, "op": "hello", "client_id": "watcher", "session_ttl_ms": 120000})
	if m := read(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	send(map[string]any{"id": 2, "op": "watch", "prefix": prefix})
	if m := read(); m.Type != api.TypeOK || m.WatchID == 0 {
		t.Fatalf("watch: %+v", m)
	}
	// Changes on three locks from concurrent writers.
	const rounds = 40
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%sl%d", prefix, w)
			for range rounds {
				a := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "w", "ttl_ms": 30000})
				if a.Status != 200 {
					t.Errorf("acquire: %s", a.Raw)
					return
				}
				testutil.Post(lockURL(l, name, "release"), map[string]any{"client_id": "w", "fencing_token": a.Uint("fencing_token")})
			}
		}()
	}
	wg.Wait()
	last := map[string]uint64{}
	held := map[string]bool{}
	changes := 0
	for changes < 3*rounds*2 {
		m := read()
		if m.Type == api.TypeResync {
			t.Fatalf("resync with a reader that keeps up")
		}
		if m.Type != api.TypeChanged {
			continue
		}
		if m.Index <= last[m.Lock] {
			t.Fatalf("%s: index %d after %d", m.Lock, m.Index, last[m.Lock])
		}
		if m.Status == nil || m.Status.Index != m.Index {
			t.Fatalf("changed frame without its status: %+v", m)
		}
		last[m.Lock], held[m.Lock] = m.Index, m.Status.Held
		changes++
	}
	for name, h := range held {
		st := testutil.Get(lockURL(l, name, ""))
		if st.Body["held"] != h || st.Uint("index") != last[name] {
			t.Fatalf("%s: last change seen held=%v index=%d, state %s", name, h, last[name], st.Raw)
		}
	}
}

// TestManyWatchersCost: 500 WebSocket watchers of one prefix (one
// connection each) cost memory while idle and no CPU; every change reaches
// all of them. It reports the figures; the bounds only catch a watcher
// that polls or a change that is lost.
func TestManyWatchersCost(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, changes = 500, 100
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conns := make([]*websocket.Conn, n)
	for i := range conns {
		conn, _, err := websocket.Dial(ctx, strings.Replace(l.URL(), "http", "ws", 1)+"/api/v1/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		conns[i] = conn
		for _, req := range []string{
			fmt.Sprintf(`{"id":1,"op":"hello","client_id":"w%d","session_ttl_ms":120000}`, i),
			`{"id":2,"op":"watch","prefix":"mw/"}`,
		} {
			if err := conn.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 2; {
			_, b, err := conn.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var m api.WSMessage
			_ = json.Unmarshal(b, &m)
			if m.ID == 1 || m.ID == 2 {
				got++
			}
		}
	}
	runtime.GC()
	var idle runtime.MemStats
	runtime.ReadMemStats(&idle)
	cpu0, wall0 := cpuTime(), time.Now()
	time.Sleep(time.Second)
	idleCPU := float64(cpuTime()-cpu0) / float64(time.Since(wall0))
	// Readers count every change on every connection.
	var wg sync.WaitGroup
	counts := make([]int, n)
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for counts[i] < changes {
				_, b, err := conn.Read(ctx)
				if err != nil {
					return
				}
				var m api.WSMessage
				_ = json.Unmarshal(b, &m)
				if m.Type == api.TypeChanged {
					counts[i]++
				}
			}
		}()
	}
	cpu1, wall1 := cpuTime(), time.Now()
	for i := range changes / 2 {
		name := fmt.Sprintf("mw/%d", i)
		a := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "x", "ttl_ms": 60000})
		testutil.Post(lockURL(l, name, "release"), map[string]any{"client_id": "x", "fencing_token": a.Uint("fencing_token")})
	}
	wg.Wait()
	busy := cpuTime() - cpu1
	for i, got := range counts {
		if got != changes {
			t.Fatalf("watcher %d saw %d of %d changes", i, got, changes)
		}
	}
	t.Logf("%d watchers (one WebSocket each, client and server in one process): heap +%.1f MiB (%.1f KiB each), idle CPU %.1f%% of a core; %d changes fanned out to all in %v, %.0f µs CPU per change per watcher",
		n, float64(idle.HeapInuse-before.HeapInuse)/(1<<20), float64(idle.HeapInuse-before.HeapInuse)/1024/n,
		100*idleCPU, changes, time.Since(wall1).Round(time.Millisecond), float64(busy.Microseconds())/float64(changes*n))
	if idleCPU > 0.25 {
		t.Errorf("idle watchers burn %.0f%% of a core", 100*idleCPU)
	}
}

// TestWatchesStartedWhileThePrefixChurns: prefix watches started one after
// another while writers take and free locks under the prefix. Each watch's
// initial frames end with one synced frame at index N; none of them is
// above N, every later frame is above it, a lock's frames rise, and the
// last frame of each lock matches the replicated state. (A change
// committed between a watch's registration and its first read went out
// after the picture, older than it: a lock taken and freed meanwhile was
// shown held.)
func TestWatchesStartedWhileThePrefixChurns(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ws := dialWS(t, ctx, l.URL(), "watcher")
	ws.conn.SetReadLimit(1 << 20)
	send, read := ws.send, ws.read
	prefix := "churn/"
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("%sl%d", prefix, (w*7+i)%6)
				a := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": fmt.Sprintf("w%d", w), "ttl_ms": 30000})
				if a.Status == 200 {
					testutil.Post(lockURL(l, name, "release"), map[string]any{"client_id": fmt.Sprintf("w%d", w), "fencing_token": a.Uint("fencing_token")})
				}
			}
		}()
	}
	type state struct {
		synced  bool
		at      uint64
		last    map[string]uint64
		held    map[string]bool
		changes int
	}
	watches := map[uint64]*state{}
	byReq := map[uint64]uint64{}
	const rounds = 15
	for r := range rounds {
		send(map[string]any{"id": 10 + r, "op": "watch", "prefix": prefix})
		// Read until this watch is synced and has seen a few changes.
		for {
			m := read()
			switch m.Type {
			case api.TypeOK:
				byReq[m.ID] = m.WatchID
				watches[m.WatchID] = &state{last: map[string]uint64{}, held: map[string]bool{}}
				continue
			case api.TypeResync:
				t.Fatalf("resync with a reader that keeps up")
			case api.TypeError:
				t.Fatalf("%+v", m)
			}
			s := watches[m.WatchID]
			if s == nil {
				t.Fatalf("frame of an unknown watch: %+v", m)
			}
			switch m.Type {
			case api.TypeSynced:
				if s.synced {
					t.Fatalf("watch %d synced twice", m.WatchID)
				}
				for name, i := range s.last {
					if i > m.Index {
						t.Fatalf("watch %d: %s's initial frame at %d, above synced %d", m.WatchID, name, i, m.Index)
					}
				}
				s.synced, s.at = true, m.Index
			case api.TypeChanged:
				if m.Index <= s.last[m.Lock] {
					t.Fatalf("watch %d: %s at %d after %d", m.WatchID, m.Lock, m.Index, s.last[m.Lock])
				}
				if s.synced && m.Index <= s.at {
					t.Fatalf("watch %d: %s at %d after synced at %d", m.WatchID, m.Lock, m.Index, s.at)
				}
				if m.Status == nil || m.Status.Index != m.Index {
					t.Fatalf("changed frame without its status: %+v", m)
				}
				s.last[m.Lock], s.held[m.Lock] = m.Index, m.Status.Held
				if s.synced {
					s.changes++
				}
			}
			if cur := watches[byReq[uint64(10+r)]]; cur != nil && cur.synced && cur.changes >= 3 {
				break
			}
		}
	}
	close(stop)
	wg.Wait()
	// Read until every watch has shown each lock as the state has it: what
	// a watch still lacks is on its way.
	for {
		settled := ""
		for id, s := range watches {
			for name := range s.held {
				st := testutil.Get(lockURL(l, name, ""))
				if st.Body["held"] != s.held[name] || (s.held[name] && st.Uint("index") != s.last[name]) {
					settled = fmt.Sprintf("watch %d: %s last seen held=%v at %d, state %s", id, name, s.held[name], s.last[name], st.Raw)
				}
			}
		}
		if settled == "" {
			return
		}
		t.Log(settled)
		m := read()
		if s := watches[m.WatchID]; s != nil && m.Type == api.TypeChanged {
			if m.Index <= s.last[m.Lock] || m.Index <= s.at {
				t.Fatalf("watch %d: %s at %d after %d (synced %d)", m.WatchID, m.Lock, m.Index, s.last[m.Lock], s.at)
			}
			s.last[m.Lock], s.held[m.Lock] = m.Index, m.Status.Held
		}
	}
}
