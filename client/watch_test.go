package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// watchRecorder collects a watch's events as they come.
type watchRecorder struct {
	mu     sync.Mutex
	evs    []client.WatchEvent
	closed chan struct{}
}

func record(t *testing.T, ch <-chan client.WatchEvent) *watchRecorder {
	r := &watchRecorder{closed: make(chan struct{})}
	go func() {
		defer close(r.closed)
		for ev := range ch {
			t.Logf("event %s index=%d held=%v client=%s token=%d value=%q waiters=%d resync=%v",
				ev.Lock, ev.Index, ev.Status.Held, ev.Status.ClientID, ev.Status.FencingToken, ev.Status.Value, ev.Status.Waiters, ev.Resync)
			r.mu.Lock()
			r.evs = append(r.evs, ev)
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *watchRecorder) events() []client.WatchEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]client.WatchEvent(nil), r.evs...)
}

// of returns the events of one lock.
func (r *watchRecorder) of(name string) []client.WatchEvent {
	var out []client.WatchEvent
	for _, ev := range r.events() {
		if ev.Lock == name {
			out = append(out, ev)
		}
	}
	return out
}

// lastOf returns the last event of a lock.
func (r *watchRecorder) lastOf(name string) (client.WatchEvent, bool) {
	evs := r.of(name)
	if len(evs) == 0 {
		return client.WatchEvent{}, false
	}
	return evs[len(evs)-1], true
}

// waitFor waits until cond holds for the events so far.
func (r *watchRecorder) waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, within, what, cond)
}

// waitLast waits until the last event of name satisfies cond.
func (r *watchRecorder) waitLast(t *testing.T, name, what string, cond func(client.WatchEvent) bool) client.WatchEvent {
	t.Helper()
	var ev client.WatchEvent
	r.waitFor(t, 10*time.Second, name+": "+what, func() bool {
		var ok bool
		ev, ok = r.lastOf(name)
		return ok && cond(ev)
	})
	return ev
}

// checkOrder fails the test unless every lock's events have strictly
// rising indexes that match their status: no change twice, none out of
// order.
func checkOrder(t *testing.T, evs []client.WatchEvent) {
	t.Helper()
	last := map[string]uint64{}
	for _, ev := range evs {
		if ev.Index != ev.Status.Index || ev.Lock != ev.Status.Lock {
			t.Fatalf("event %s index %d carries status of %s index %d", ev.Lock, ev.Index, ev.Status.Lock, ev.Status.Index)
		}
		if l, ok := last[ev.Lock]; ok && ev.Index <= l {
			t.Fatalf("lock %s: index %d after %d (a change twice or out of order)", ev.Lock, ev.Index, l)
		}
		last[ev.Lock] = ev.Index
	}
}

func held(ev client.WatchEvent) bool { return ev.Status.Held }

func heldBy(id string) func(client.WatchEvent) bool {
	return func(ev client.WatchEvent) bool { return ev.Status.Held && ev.Status.ClientID == id }
}

func free(ev client.WatchEvent) bool { return !ev.Status.Held }

func valueIs(v string) func(client.WatchEvent) bool {
	return func(ev client.WatchEvent) bool { return ev.Status.Held && ev.Status.Value == v }
}

// A watch of one lock gets its current state, then every change in order,
// and ends (unwatching on the server) when its ctx does.
func TestWatchLock(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	h := newClient(t, f, client.Config{ClientID: "holder"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	if _, err := w.Watch(ctx, ""); err == nil {
		t.Fatal("Watch of an empty name: no error")
	}
	if _, err := w.Watch(ctx, "bad name"); !errors.As(err, new(*client.ServerError)) || !strings.Contains(err.Error(), api.CodeInvalidArgument) {
		t.Fatalf("Watch of a bad name: %v, want invalid_argument", err)
	}
	ch, err := w.Watch(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	first := r.waitLast(t, "a", "the current state", free)
	if first.Resync || first.Status.Mode != api.ModeNone {
		t.Fatalf("first event %+v", first)
	}

	l, err := h.Acquire(ctx, "a", client.WithValue("v1"))
	if err != nil {
		t.Fatal(err)
	}
	ev := r.waitLast(t, "a", "held by holder", heldBy("holder"))
	if ev.Status.FencingToken != l.Token() || ev.Status.Value != "v1" || ev.Index <= first.Index {
		t.Fatalf("event after the acquire %+v (token %d)", ev, l.Token())
	}
	if err := l.SetValue(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	r.waitLast(t, "a", "value v2", valueIs("v2"))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitLast(t, "a", "free again", free)
	evs := r.events()
	checkOrder(t, evs)
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4 (state, acquire, value, release)", len(evs))
	}
	if f.Watches() != 1 {
		t.Fatalf("%d watches on the server, want 1", f.Watches())
	}

	cancel()
	waitClosed(t, r.closed, 5*time.Second, "the channel to close after ctx ended")
	testutil.WaitFor(t, 5*time.Second, "the server watch to end", func() bool { return f.Watches() == 0 })
}

// A prefix watch gets the locks with state under it, then their changes in
// log order, and nothing of other locks.
func TestWatchPrefix(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	a := newAPI(t, f.URL(0))
	ctx := t.Context()
	for _, n := range []string{"w/a", "x/b"} {
		if _, err := a.Acquire(ctx, n, "h1", time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := w.WatchPrefix(ctx, "w/")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	r.waitLast(t, "w/a", "the current state", heldBy("h1"))
	rep, err := a.Acquire(ctx, "w/c", "h2", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := a.Status(ctx, "w/a", false)
	if err := a.Release(ctx, "w/a", "h1", st.FencingToken); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "x/d", "h3", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	r.waitLast(t, "w/a", "free", free)
	evs := r.events()
	checkOrder(t, evs)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%s:%v", ev.Lock, ev.Status.Held))
	}
	if strings.Join(got, " ") != "w/a:true w/c:true w/a:false" {
		t.Fatalf("events %v, want w/a held, w/c held, w/a free", got)
	}
	if c := r.of("w/c")[0]; c.Status.FencingToken != rep.FencingToken {
		t.Fatalf("w/c event %+v", c)
	}
}

// After a leader change the watches are back on the new leader: a lock
// freed while the client could not connect (gone from the prefix) comes as
// free, a lock that did not change does not come again, and later changes
// follow.
func TestWatchSurvivesLeaderChange(t *testing.T) {
	f := newFake(t, lockdtest.Options{Members: 2})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	a := newAPI(t, f.URLs()...)
	ctx := t.Context()
	for _, n := range []string{"j/a", "j/b"} {
		if _, err := a.Acquire(ctx, n, "h", time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	pch, err := w.WatchPrefix(ctx, "j/")
	if err != nil {
		t.Fatal(err)
	}
	lch, err := w.Watch(ctx, "j/a")
	if err != nil {
		t.Fatal(err)
	}
	pr, lr := record(t, pch), record(t, lch)
	pr.waitLast(t, "j/a", "held", held)
	pr.waitLast(t, "j/b", "held", held)
	lr.waitLast(t, "j/a", "held", held)

	// No leader: the watcher cannot reconnect while j/a is freed.
	f.SetLeader(-1)
	if !f.ExpireLock("j/a") {
		t.Fatal("j/a was not held")
	}
	f.SetLeader(1)
	for _, r := range []*watchRecorder{pr, lr} {
		ev := r.waitLast(t, "j/a", "free after the leader change", free)
		if !ev.Resync {
			t.Fatalf("j/a's free state after a reconnect is not marked Resync: %+v", ev)
		}
	}
	if _, err := a.Acquire(ctx, "j/c", "h", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	pr.waitLast(t, "j/c", "held", held)
	checkOrder(t, pr.events())
	checkOrder(t, lr.events())
	if n := len(pr.of("j/b")); n != 1 {
		t.Fatalf("j/b came %d times, want once: it did not change", n)
	}
	if n := len(lr.events()); n != 2 {
		t.Fatalf("the watch of j/a got %d events, want 2 (held, free)", n)
	}
}

// A resync from the server (changes dropped for a slow watcher) makes the
// client read again: every lock's latest state comes, in order, a freed
// lock as free.
func TestWatchResyncFromServer(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	a := newAPI(t, f.URL(0))
	ctx := t.Context()
	rep, err := a.Acquire(ctx, "r/a", "h", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := w.WatchPrefix(ctx, "r/")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	r.waitLast(t, "r/a", "held", held)

	f.DropWatchChanges(true)
	if err := a.Release(ctx, "r/a", "h", rep.FencingToken); err != nil {
		t.Fatal(err)
	}
	rb, err := a.Acquire(ctx, "r/b", "h", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetValue(ctx, "r/b", "h", rb.FencingToken, "late"); err != nil {
		t.Fatal(err)
	}
	f.DropWatchChanges(false)
	r.waitLast(t, "r/a", "free", free)
	ev := r.waitLast(t, "r/b", "value late", valueIs("late"))
	if !ev.Resync {
		t.Fatalf("r/b's state read again is not marked Resync: %+v", ev)
	}
	checkOrder(t, r.events())
	// The watch goes on.
	if err := a.Release(ctx, "r/b", "h", rb.FencingToken); err != nil {
		t.Fatal(err)
	}
	ev = r.waitLast(t, "r/b", "free", free)
	if ev.Resync {
		t.Fatalf("a change after the resync marked Resync: %+v", ev)
	}
	checkOrder(t, r.events())
}

// A consumer that does not take its events never holds up the client:
// with the buffer full, changes are dropped, and once the consumer catches
// up the client reads again, so the latest state of every lock it has seen
// comes (a lock whose every change was dropped and that has no state now
// need not come at all).
func TestWatchSlowConsumer(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	h := newClient(t, f, client.Config{ClientID: "holder"})
	ctx := t.Context()
	ch, err := w.WatchPrefix(ctx, "s/", client.WithWatchBuffer(2))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"s/a", "s/b", "s/c"}
	for round := range 5 {
		for _, n := range names {
			l, err := h.Acquire(ctx, n, client.WithValue(fmt.Sprint(round)))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.SetValue(ctx, fmt.Sprint(round, "'")); err != nil {
				t.Fatal(err)
			}
			if round < 4 || n != "s/b" {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The watcher's own requests go through while its consumer sleeps.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.TryAcquire(tctx, "other"); err != nil {
		t.Fatalf("the watcher's client is held up by its slow consumer: %v", err)
	}

	last := map[string]client.WatchEvent{}
	var evs []client.WatchEvent
	deadline := time.After(10 * time.Second)
	// s/a and s/b came before the overflow at least; s/c may not have come
	// at all (its first changes were dropped, and it has no state now).
	done := func() bool {
		c, seenC := last["s/c"]
		a, seenA := last["s/a"]
		return seenA && !a.Status.Held && last["s/b"].Status.Value == "4'" && (!seenC || !c.Status.Held)
	}
	for !done() {
		select {
		case ev := <-ch:
			t.Logf("event %s index=%d held=%v value=%q resync=%v", ev.Lock, ev.Index, ev.Status.Held, ev.Status.Value, ev.Resync)
			evs = append(evs, ev)
			last[ev.Lock] = ev
		case <-deadline:
			t.Fatalf("the latest states did not come; last events %+v", last)
		}
	}
	checkOrder(t, evs)
	resynced := false
	for _, ev := range evs {
		resynced = resynced || ev.Resync
	}
	if !resynced {
		t.Fatalf("no event came from a re-read, though the buffer of 2 overflowed: %d events", len(evs))
	}
}

// Close ends every watch: their channels close.
func TestWatchEndsOnClose(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	w := newClient(t, f, client.Config{ClientID: "watcher"})
	ch, err := w.Watch(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	r.waitLast(t, "x", "the current state", free)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, r.closed, 5*time.Second, "the channel to close after Close")
	if _, err := w.Watch(t.Context(), "x"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}

// A blocking query answers once the lock changes past the index given, or
// at the end of its wait with the same index.
func TestWaitStatus(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newAPI(t, f.URL(0))
	ctx := t.Context()
	st, err := a.Status(ctx, "q", false)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *api.LockStatus, 1)
	go func() {
		st, err := a.WaitStatus(ctx, "q", st.Index, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- st
	}()
	select {
	case s := <-got:
		t.Fatalf("answered before any change: %+v", s)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := a.Acquire(ctx, "q", "h", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	var s *api.LockStatus
	select {
	case s = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer after the acquire")
	}
	if s == nil || !s.Held || s.Index <= st.Index {
		t.Fatalf("answer %+v after index %d", s, st.Index)
	}
	s2, err := a.WaitStatus(ctx, "q", s.Index, 200*time.Millisecond)
	if err != nil || s2.Index != s.Index || !s2.Held {
		t.Fatalf("a wait that ends: %+v, %v", s2, err)
	}
	if _, err := a.WaitStatus(ctx, "q", 0, 11*time.Minute); err == nil {
		t.Fatal("a wait above 10m: no error")
	}
}

// A prefix watch re-established after a reconnect learns the prefix's
// state from the server's first frames and their synced frame, with no
// other read: a lock freed while the client was away is delivered free at
// the synced index, the others with their latest state, nothing twice.
// (The client used to list the prefix over HTTP at every reconnect; here
// the lists fail, so it could not.)
func TestWatchPrefixRewatchReadsNothingElse(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	var down atomic.Bool
	var lists atomic.Int64
	target, _ := url.Parse(f.URL(0))
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/locks" {
			lists.Add(1)
			http.Error(w, "no lists here", http.StatusServiceUnavailable)
			return
		}
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	w := newClient(t, f, client.Config{ClientID: "watcher", Endpoints: []string{srv.URL}, SessionTTL: 5 * time.Second,
		MaxBackoff: 100 * time.Millisecond})
	a := newAPI(t, f.URL(0))
	ctx := t.Context()
	toks := map[string]uint64{}
	for _, n := range []string{"s/a", "s/b", "s/c"} {
		rep, err := a.Acquire(ctx, n, "h", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		toks[n] = rep.FencingToken
	}
	ch, err := w.WatchPrefix(ctx, "s/")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	for _, n := range []string{"s/a", "s/b", "s/c"} {
		r.waitLast(t, n, "held", held)
	}
	// Away: s/a is freed, s/b gets a value, s/d is taken.
	down.Store(true)
	f.DropConnections()
	if err := a.Release(ctx, "s/a", "h", toks["s/a"]); err != nil {
		t.Fatal(err)
	}
	if err := a.SetValue(ctx, "s/b", "h", toks["s/b"], "while away"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "s/d", "h", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // a reconnect attempt or two fails meanwhile
	down.Store(false)
	for _, c := range []struct {
		name, what string
		ok         func(client.WatchEvent) bool
	}{{"s/a", "free", free}, {"s/b", "its value", valueIs("while away")}, {"s/d", "held", held}} {
		if ev := r.waitLast(t, c.name, c.what, c.ok); !ev.Resync {
			t.Fatalf("%s read again after the reconnect is not marked Resync: %+v", c.name, ev)
		}
	}
	// The watch goes on, and its changes are no longer marked Resync.
	if err := a.Release(ctx, "s/c", "h", toks["s/c"]); err != nil {
		t.Fatal(err)
	}
	if ev := r.waitLast(t, "s/c", "free", free); ev.Resync {
		t.Fatalf("a change after the re-established watch synced is marked Resync: %+v", ev)
	}
	checkOrder(t, r.events())
	if n := len(r.of("s/c")); n != 2 {
		t.Fatalf("s/c came %d times, want twice (held, then free): %+v", n, r.of("s/c"))
	}
	if n := lists.Load(); n != 0 {
		t.Fatalf("the client listed the prefix %d times", n)
	}
}
