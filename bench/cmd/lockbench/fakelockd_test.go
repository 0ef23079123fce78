package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/lockd/lockd/api"
)

// fakeLockd is a stand-in for one lockd member that answers
// /api/v1/cluster and speaks the WebSocket protocol as far as a test
// scripts it: hello opens or resumes sessions, every other request goes to
// handle. It lets the tests show what the bench's clients do with
// refusals, Retry-After, cuts and expired sessions, which a quiet real
// cluster does not produce.
type fakeLockd struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	conns    int
	sessions map[string]bool // session id → alive
	hellos   []api.WSRequest
	// handle serves a request other than hello; it runs on the
	// connection's read goroutine.
	handle func(fc *fakeConn, req api.WSRequest)
}

type fakeConn struct {
	f       *fakeLockd
	c       *websocket.Conn
	n       int // 1 for the first connection
	session string
	wmu     sync.Mutex
}

func newFakeLockd(t *testing.T, handle func(fc *fakeConn, req api.WSRequest)) *fakeLockd {
	f := &fakeLockd{t: t, sessions: map[string]bool{}, handle: handle}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.ClusterStatus{LeaderID: "n1", LeaderHTTP: f.srv.URL})
	})
	mux.HandleFunc("/api/v1/ws", f.serveWS)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// ref is a leaderRef whose only member is the fake.
func (f *fakeLockd) ref() *leaderRef {
	m := &lockdMember{id: "n1", httpURL: f.srv.URL}
	return &leaderRef{lc: &lockdCluster{members: []*lockdMember{m}}, m: m, at: time.Now()}
}

func (f *fakeLockd) serveWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.conns++
	fc := &fakeConn{f: f, c: c, n: f.conns}
	f.mu.Unlock()
	defer c.CloseNow()
	for {
		_, b, err := c.Read(context.Background())
		if err != nil {
			return
		}
		var req api.WSRequest
		if err := json.Unmarshal(b, &req); err != nil {
			f.t.Errorf("fake lockd: bad frame %s", b)
			return
		}
		if req.Op == api.OpHello {
			f.hello(fc, req)
			continue
		}
		f.handle(fc, req)
	}
}

func (f *fakeLockd) hello(fc *fakeConn, req api.WSRequest) {
	f.mu.Lock()
	f.hellos = append(f.hellos, req)
	id := req.SessionID
	alive := f.sessions[id]
	if id == "" {
		id = fmt.Sprintf("s%d", len(f.sessions)+1)
		f.sessions[id], alive = true, true
	}
	f.mu.Unlock()
	if !alive {
		fc.reply(req.ID, api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeSessionExpired, Message: "gone"}})
		return
	}
	fc.session = id
	fc.reply(req.ID, api.WSMessage{Type: api.TypeHello, SessionID: id, SessionTTLms: *req.SessionTTLms})
}

// expire ends a session: a resume of it is refused.
func (f *fakeLockd) expire(id string) {
	f.mu.Lock()
	f.sessions[id] = false
	f.mu.Unlock()
}

func (f *fakeLockd) connCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns
}

func (fc *fakeConn) send(v any) {
	b, _ := json.Marshal(v)
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_ = fc.c.Write(context.Background(), websocket.MessageText, b)
}

func (fc *fakeConn) reply(id uint64, m api.WSMessage) {
	m.ID = id
	fc.send(m)
}

// refuse answers id with code and a Retry-After of ra (none when ra < 0),
// in the field name the bench looks for first.
func (fc *fakeConn) refuse(id uint64, code string, ra time.Duration) {
	m := map[string]any{"id": id, "type": api.TypeError, "error": map[string]any{"code": code, "message": "refused"}}
	if ra >= 0 {
		m["retry_after_ms"] = ra.Milliseconds()
	}
	fc.send(m)
}

// cut ends the connection as lockd does when a connection's event stream
// overflowed: an internal error frame, then a close.
func (fc *fakeConn) cut() {
	fc.send(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeInternal, Message: "event stream overflowed; reconnect and resume the session"}})
	_ = fc.c.Close(websocket.StatusNormalClosure, "closed")
}
