package httpapi

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
)

// waitDeadline polls until client waits on lock with a deadline for which
// ok holds, and returns it.
func (f *fakeBackend) waitDeadline(t *testing.T, lock, client string, ok func(d int64) bool) int64 {
	t.Helper()
	stop := time.Now().Add(5 * time.Second)
	for time.Now().Before(stop) {
		var d int64
		f.View(func(tb *locktable.Table) {
			for _, w := range tb.Waiters(lock) {
				if w.ClientID == client {
					d = w.Deadline
				}
			}
		})
		if d != 0 && ok(d) {
			return d
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s never waited on %s as expected", client, lock)
	return 0
}

// timeoutWaiter moves the fake's clock past deadline and commits the
// leader timer's timeout of client's wait on lock.
func (f *fakeBackend) timeoutWaiter(t *testing.T, lock, client string, deadline int64) {
	t.Helper()
	f.mu.Lock()
	f.now = max(f.now, deadline)
	f.mu.Unlock()
	if _, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpTimeoutWaiter, Lock: lock, ClientID: client}); err != nil {
		t.Fatal(err)
	}
}

// answers reads frames until every id of want has its answer, then until
// a keepalive sent after that is answered (so a second answer to one of
// them would have shown up), and returns them by id.
func (w *wsClient) answers(want ...uint64) map[uint64]api.WSMessage {
	w.t.Helper()
	got := map[uint64]api.WSMessage{}
	const marker = 1_000_000
	sent := false
	for {
		if !sent && len(got) == len(want) {
			w.send(fmt.Sprintf(`{"id":%d,"op":"keepalive"}`, marker))
			sent = true
		}
		m := w.recv()
		switch {
		case m.ID == marker:
			return got
		case m.ID == 0:
			continue // pushes (session ended, lost)
		}
		if _, dup := got[m.ID]; dup {
			w.t.Fatalf("request %d answered twice: %+v and %+v", m.ID, got[m.ID], m)
		}
		got[m.ID] = m
	}
}

// TestWebSocketRetriedWaitAnswersEveryRequest: a connection that sends an
// acquire with a wait, then (before its answer) the same acquire with
// another wait, has one wait in the state machine, whose deadline is the
// retry's. Both requests are its requests: whatever ends the wait answers
// both, once each — a timeout at the retry's deadline, the session's end,
// a cancel, a grant. (Before, only the request whose own deadline matched the end
// of the wait was answered: the first waited for a reply forever.)
func TestWebSocketRetriedWaitAnswersEveryRequest(t *testing.T) {
	setup := func(t *testing.T, first, retry int64) (*fakeBackend, *wsClient, *wsClient, uint64, int64) {
		f := newFake()
		srv := httptest.NewServer(New(Config{Backend: f}))
		t.Cleanup(srv.Close)
		a := dialWS(t, srv)
		a.send(`{"id":1,"op":"hello","client_id":"A"}`)
		a.recv()
		a.send(`{"id":2,"op":"acquire","lock":"l"}`)
		ga := a.recv()
		if ga.Type != api.TypeGranted {
			t.Fatalf("A: %+v", ga)
		}
		b := dialWS(t, srv)
		b.send(`{"id":1,"op":"hello","client_id":"B"}`)
		b.recv()
		b.send(fmt.Sprintf(`{"id":2,"op":"acquire","lock":"l","wait_timeout_ms":%d}`, first))
		d1 := f.waitDeadline(t, "l", "B", func(int64) bool { return true })
		b.send(fmt.Sprintf(`{"id":3,"op":"acquire","lock":"l","wait_timeout_ms":%d}`, retry))
		d2 := f.waitDeadline(t, "l", "B", func(d int64) bool { return d != d1 })
		return f, a, b, ga.FencingToken, d2
	}
	t.Run("a shorter retry times out both", func(t *testing.T) {
		f, _, b, _, d := setup(t, 600_000, 1000)
		f.timeoutWaiter(t, "l", "B", d)
		for id, m := range b.answers(2, 3) {
			if m.Type != api.TypeError || m.Error == nil || m.Error.Code != api.CodeWaitTimeout || m.Lock != "l" {
				t.Fatalf("request %d: %+v, want wait_timeout", id, m)
			}
		}
	})
	t.Run("the session's end answers both", func(t *testing.T) {
		f, _, b, _, _ := setup(t, 600_000, 1000)
		h := New(Config{Backend: f})
		if r := do(t, h, "DELETE", "/api/v1/sessions/"+sessionOf(t, f, "B"), ""); r.status != 200 {
			t.Fatalf("delete session: %s", r.raw)
		}
		got := map[uint64]api.WSMessage{}
		for len(got) < 2 {
			m := b.recv()
			if m.ID == 2 || m.ID == 3 {
				got[m.ID] = m
			} else if m.ID == 0 && m.Error != nil && m.Error.Code == api.CodeSessionExpired {
				t.Fatalf("the session ended with %d of requests 2 and 3 answered: %v", len(got), got)
			}
		}
		for id, m := range got {
			if m.Type != api.TypeError || m.Error.Code != api.CodeSessionExpired {
				t.Fatalf("request %d: %+v, want session_expired", id, m)
			}
		}
	})
	t.Run("a cancel answers both", func(t *testing.T) {
		_, _, b, _, _ := setup(t, 600_000, 1000)
		b.send(`{"id":4,"op":"cancel","lock":"l"}`)
		ans := b.answers(2, 3, 4)
		if m := ans[4]; m.Type != api.TypeOK || m.Cancelled == nil || !*m.Cancelled {
			t.Fatalf("cancel: %+v", m)
		}
		for _, id := range []uint64{2, 3} {
			if m := ans[id]; m.Type != api.TypeError || m.Error == nil || m.Error.Code != api.CodeCancelled {
				t.Fatalf("request %d: %+v, want cancelled", id, m)
			}
		}
	})
	t.Run("a longer retry keeps both waiting, and the grant answers both", func(t *testing.T) {
		f, a, b, tok, _ := setup(t, 1000, 600_000)
		// The leader's timer for the first deadline fires: the wait was
		// extended, so nothing ends.
		f.mu.Lock()
		f.now += 2000
		f.mu.Unlock()
		if res, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpTimeoutWaiter, Lock: "l", ClientID: "B"}); err != nil || len(res.Events) != 0 {
			t.Fatalf("timeout of an extended wait: %+v %v", res, err)
		}
		a.send(`{"id":3,"op":"release","lock":"l","fencing_token":` + itoa(tok) + `}`)
		a.recv()
		ans := b.answers(2, 3)
		if ans[2].Type != api.TypeGranted || ans[3].Type != api.TypeGranted || ans[2].FencingToken != ans[3].FencingToken || ans[2].FencingToken <= tok {
			t.Fatalf("want both granted one new token: %+v / %+v", ans[2], ans[3])
		}
	})
	t.Run("a multi-acquire's retry times out both", func(t *testing.T) {
		f, _, b, _, _ := setup(t, 600_000, 600_000)
		f.timeoutWaiter(t, "l", "B", f.waitDeadline(t, "l", "B", func(int64) bool { return true }))
		b.answers(2, 3)
		b.send(`{"id":5,"op":"acquire","locks":["m","l"],"wait_timeout_ms":600000}`)
		d1 := f.waitDeadline(t, "m", "B", func(int64) bool { return true })
		b.send(`{"id":6,"op":"acquire","locks":["l","m"],"wait_timeout_ms":1000}`)
		d2 := f.waitDeadline(t, "m", "B", func(d int64) bool { return d != d1 })
		f.timeoutWaiter(t, "m", "B", d2)
		for id, m := range b.answers(5, 6) {
			if m.Type != api.TypeError || m.Error == nil || m.Error.Code != api.CodeWaitTimeout {
				t.Fatalf("request %d: %+v, want wait_timeout", id, m)
			}
		}
	})
	t.Run("a wait after the answered one is its own", func(t *testing.T) {
		f, _, b, _, d := setup(t, 600_000, 1000)
		f.timeoutWaiter(t, "l", "B", d)
		b.answers(2, 3)
		// A new wait on the same lock: not answered by anything of the
		// first, and answered by its own end.
		b.send(`{"id":4,"op":"acquire","lock":"l","wait_timeout_ms":5000}`)
		d4 := f.waitDeadline(t, "l", "B", func(int64) bool { return true })
		f.timeoutWaiter(t, "l", "B", d4)
		if m := b.answers(4)[4]; m.Type != api.TypeError || m.Error.Code != api.CodeWaitTimeout {
			t.Fatalf("request 4: %+v", m)
		}
	})
}
