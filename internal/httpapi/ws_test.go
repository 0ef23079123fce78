package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
)

type wsClient struct {
	t *testing.T
	c *websocket.Conn
}

func dialWS(t *testing.T, srv *httptest.Server) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/api/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(websocket.StatusNormalClosure, "") })
	return &wsClient{t: t, c: c}
}

func (w *wsClient) send(req string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *wsClient) recv() api.WSMessage {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := w.c.Read(ctx)
	if err != nil {
		w.t.Fatalf("read: %v", err)
	}
	var m api.WSMessage
	if err := json.Unmarshal(b, &m); err != nil {
		w.t.Fatalf("decode %s: %v", b, err)
	}
	return m
}

func TestWebSocketGrantsArePushed(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()

	a := dialWS(t, srv)
	a.send(`{"id":1,"op":"hello","client_id":"A","session_ttl_ms":5000}`)
	ha := a.recv()
	if ha.Type != api.TypeHello || ha.ID != 1 || ha.SessionID == "" {
		t.Fatalf("hello: %+v", ha)
	}
	a.send(`{"id":2,"op":"acquire","lock":"x"}`)
	ga := a.recv()
	if ga.Type != api.TypeGranted || ga.ID != 2 || ga.FencingToken == 0 {
		t.Fatalf("acquire: %+v", ga)
	}

	b := dialWS(t, srv)
	b.send(`{"id":1,"op":"hello","client_id":"B"}`)
	if m := b.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello B: %+v", m)
	}
	b.send(`{"id":7,"op":"acquire","lock":"x","wait_timeout_ms":5000}`)
	b.send(`{"id":8,"op":"keepalive"}`)
	if m := b.recv(); m.Type != api.TypeOK || m.ID != 8 {
		t.Fatalf("keepalive while queued: %+v", m) // the acquire is queued: no reply yet
	}
	a.send(`{"id":3,"op":"release","lock":"x","fencing_token":` + itoa(ga.FencingToken) + `}`)
	if m := a.recv(); m.Type != api.TypeOK || m.ID != 3 {
		t.Fatalf("release: %+v", m)
	}
	gb := b.recv()
	if gb.Type != api.TypeGranted || gb.ID != 7 || gb.FencingToken <= ga.FencingToken {
		t.Fatalf("pushed grant: %+v", gb)
	}

	// Ending B's session from outside pushes "lost".
	if r := do(t, New(Config{Backend: f}), "DELETE", "/api/v1/sessions/"+sessionOf(t, f, "B"), ""); r.status != 200 {
		t.Fatalf("delete session: %s", r.raw)
	}
	lost := b.recv()
	if lost.Type != api.TypeLost || lost.Lock != "x" || lost.Reason != api.ReasonSessionExpired {
		t.Fatalf("lost push: %+v", lost)
	}
}

func TestWebSocketOnFollower(t *testing.T) {
	f := newFake()
	f.ready, f.leader = false, "http://127.0.0.1:9999"
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	c := dialWS(t, srv)
	m := c.recv()
	if m.Type != api.TypeError || m.Error == nil || m.Error.Code != api.CodeNotLeader || m.Leader != "http://127.0.0.1:9999" {
		t.Fatalf("follower: %+v", m)
	}
}

func TestWebSocketResume(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	a := dialWS(t, srv)
	a.send(`{"id":1,"op":"hello","client_id":"A"}`)
	id := a.recv().SessionID
	a.send(`{"id":2,"op":"acquire","lock":"y"}`)
	tok := a.recv().FencingToken
	a.c.Close(websocket.StatusGoingAway, "")

	// A new connection resumes the session; a resent acquire returns the
	// same grant (idempotent).
	a2 := dialWS(t, srv)
	a2.send(`{"id":1,"op":"hello","client_id":"A","session_id":"` + id + `"}`)
	if m := a2.recv(); m.Type != api.TypeHello || m.SessionID != id {
		t.Fatalf("resume: %+v", m)
	}
	a2.send(`{"id":2,"op":"acquire","lock":"y"}`)
	if m := a2.recv(); m.Type != api.TypeGranted || m.FencingToken != tok {
		t.Fatalf("resent acquire: %+v (want token %d)", m, tok)
	}
	// Resuming a session that does not exist fails with session_expired.
	a3 := dialWS(t, srv)
	a3.send(`{"id":1,"op":"hello","client_id":"A","session_id":"nope"}`)
	if m := a3.recv(); m.Type != api.TypeError || m.Error.Code != api.CodeSessionExpired {
		t.Fatalf("resume of unknown session: %+v", m)
	}
}

func itoa(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func sessionOf(t *testing.T, f *fakeBackend, client string) string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.sessions {
		if s, ok := f.table.Session(id); ok && s.ClientID == client {
			return id
		}
	}
	t.Fatalf("no session of %s", client)
	return ""
}

// TestWebSocketOldWaitDoesNotAnswerNewAcquire: the end of an earlier wait of
// a client on a lock, committed while the client's retry is in flight, must
// not be taken for the answer to the retry. (Found by the chaos suite: the
// retry was told wait_timeout, then its wait was granted.)
func TestWebSocketOldWaitDoesNotAnswerNewAcquire(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	a := dialWS(t, srv)
	a.send(`{"id":1,"op":"hello","client_id":"A"}`)
	a.recv()
	a.send(`{"id":2,"op":"acquire","lock":"l"}`)
	ga := a.recv()

	b := dialWS(t, srv)
	b.send(`{"id":1,"op":"hello","client_id":"B"}`)
	b.recv()
	b.send(`{"id":2,"op":"acquire","lock":"l","wait_timeout_ms":5}`) // queued, deadline now+5
	b.send(`{"id":3,"op":"keepalive"}`)
	if m := b.recv(); m.ID != 3 {
		t.Fatalf("want the keepalive reply while queued, got %+v", m)
	}
	// Requests are served concurrently: the keepalive's reply does not mean
	// the acquire is queued yet. Wait until it is, or the hook below would
	// time out a wait that does not exist and catch the first acquire.
	for queued := false; !queued; {
		f.View(func(tb *locktable.Table) {
			for _, w := range tb.Waiters("l") {
				queued = queued || w.ClientID == "B"
			}
		})
		time.Sleep(time.Millisecond)
	}
	// B's retry races the first wait's timeout, which commits first.
	f.timeoutBeforeRetry("l", "B")
	b.send(`{"id":9,"op":"acquire","lock":"l","wait_timeout_ms":600000}`)
	b.send(`{"id":10,"op":"keepalive"}`)
	for {
		m := b.recv()
		if m.ID == 10 {
			break
		}
		// The first wait's end answers the first acquire (requests on one
		// connection are all answered now) and never the retry.
		if m.ID == 9 || (m.ID == 2 && (m.Error == nil || m.Error.Code != api.CodeWaitTimeout)) {
			t.Fatalf("the end of the first wait answered a request: %+v", m)
		}
	}
	a.send(`{"id":3,"op":"release","lock":"l","fencing_token":` + itoa(ga.FencingToken) + `}`)
	a.recv()
	m := b.recv()
	if m.ID == 2 && m.Error != nil && m.Error.Code == api.CodeWaitTimeout {
		m = b.recv() // the first acquire's own answer, if it came after the keepalive
	}
	if m.ID != 9 || m.Type != api.TypeGranted {
		t.Fatalf("the retry must be granted: %+v", m)
	}
}

// A refused single-lock try names the lock and its holder in the frame, as
// the HTTP 409 does, and as a refused multi-acquire does.
func TestWebSocketRefusedTryNamesHolder(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()

	a := dialWS(t, srv)
	a.send(`{"id":1,"op":"hello","client_id":"A"}`)
	if m := a.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello A: %+v", m)
	}
	a.send(`{"id":2,"op":"acquire","lock":"x"}`)
	if m := a.recv(); m.Type != api.TypeGranted {
		t.Fatalf("acquire: %+v", m)
	}
	b := dialWS(t, srv)
	b.send(`{"id":1,"op":"hello","client_id":"B"}`)
	if m := b.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello B: %+v", m)
	}
	b.send(`{"id":2,"op":"acquire","lock":"x"}`)
	m := b.recv()
	if m.Type != api.TypeError || m.ID != 2 || m.Error == nil || m.Error.Code != api.CodeLockHeld || m.Lock != "x" || m.Holder != "A" {
		t.Fatalf("refused try: %+v", m)
	}
	// A try while this connection's own earlier acquire waits: refused at
	// once, naming the holder; the wait keeps its place.
	b.send(`{"id":3,"op":"acquire","lock":"x","wait_timeout_ms":5000}`)
	b.send(`{"id":4,"op":"acquire","lock":"x"}`)
	m = b.recv()
	if m.Type != api.TypeError || m.ID != 4 || m.Error == nil || m.Error.Code != api.CodeLockHeld || m.Lock != "x" || m.Holder != "A" {
		t.Fatalf("try behind a wait: %+v", m)
	}
}
