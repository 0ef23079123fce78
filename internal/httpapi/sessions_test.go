package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
)

const (
	tokBilling = "token-for-billing-000"
	tokMallory = "token-for-mallory-000"
	tokOps     = "token-for-ops-0000000"
	tokReader  = "token-for-reader-0000"
)

// authStore has a lock token for billing/, another for m/, an admin and a
// read-only token.
func authStore(t *testing.T) *auth.Store {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.json")
	err := os.WriteFile(p, []byte(`{"tokens": [
	  {"name": "billing", "token": "`+tokBilling+`", "permissions": [{"prefix": "billing/", "access": "lock"}]},
	  {"name": "mallory", "token": "`+tokMallory+`", "permissions": [{"prefix": "m/", "access": "lock"}]},
	  {"name": "ops", "token": "`+tokOps+`", "permissions": [{"prefix": "", "access": "admin"}]},
	  {"name": "reader", "token": "`+tokReader+`", "permissions": [{"prefix": "", "access": "read"}]}
	]}`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// doAs is do with a bearer token.
func doAs(t *testing.T, h http.Handler, token, method, path, body string) reply {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	r := reply{status: rec.Code, header: rec.Header(), raw: rec.Body.String()}
	_ = json.Unmarshal(rec.Body.Bytes(), &r.body)
	return r
}

func dialWSAs(t *testing.T, srv *httptest.Server, token string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/api/v1/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(websocket.StatusNormalClosure, "") })
	return &wsClient{t: t, c: c}
}

// TestSessionIDIsACapability (SPEC semantics 11): a session id is shown
// only in the reply that creates it; lock status and lists never show it;
// keepalive, delete, resume and acquire through a session need the
// identity that created it or an admin token; and a stranger is answered
// alike whether the session exists or not.
func TestSessionIDIsACapability(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f, Auth: authStore(t)})
	srv := httptest.NewServer(h)
	defer srv.Close()

	c := doAs(t, h, tokBilling, "POST", "/api/v1/sessions", `{"client_id":"biller","ttl_ms":60000}`)
	sid, _ := c.body["session_id"].(string)
	if c.status != 200 || sid == "" {
		t.Fatalf("create: %s", c.raw)
	}
	if r := doAs(t, h, tokBilling, "POST", "/api/v1/locks/billing%2Fx/acquire", `{"client_id":"biller","session_id":"`+sid+`"}`); r.status != 200 {
		t.Fatalf("acquire through the session: %s", r.raw)
	}
	f.View(func(tb *locktable.Table) {
		if s, _ := tb.Session(sid); s.Owner != "billing" {
			t.Errorf("session owner %q, want billing", s.Owner)
		}
	})

	// Status shows the holder, never the session id, to anyone.
	for _, tok := range []string{tokReader, tokOps, tokBilling} {
		for _, path := range []string{"/api/v1/locks/billing%2Fx", "/api/v1/locks?prefix=billing/", "/api/v1/locks"} {
			if tok == tokBilling && path == "/api/v1/locks" {
				continue // billing may read billing/ only
			}
			r := doAs(t, h, tok, "GET", path, "")
			if r.status != 200 || !strings.Contains(r.raw, `"biller"`) {
				t.Fatalf("GET %s: %s", path, r.raw)
			}
			if strings.Contains(r.raw, sid) || strings.Contains(r.raw, "session_id") {
				t.Fatalf("GET %s shows the session id: %s", path, r.raw)
			}
		}
	}

	// A session id that was never issued, with billing's tag.
	gone := "0" + sid[1:]
	if gone == sid {
		gone = "1" + sid[1:]
	}
	// Mallory (lock access on m/) may not touch billing's session, and is
	// told the same whether it exists or not.
	for _, id := range []string{sid, gone, "legacy-untagged-and-unknown"} {
		want, code := 403, api.CodePermissionDenied
		if id == "legacy-untagged-and-unknown" {
			want, code = 404, api.CodeSessionExpired // no tag: nobody's, gone for all
		}
		for _, rq := range []struct{ method, path, body string }{
			{"POST", "/api/v1/sessions/" + id + "/keepalive", ""},
			{"DELETE", "/api/v1/sessions/" + id, ""},
			{"POST", "/api/v1/locks/m%2Fy/acquire", `{"client_id":"mal","session_id":"` + id + `"}`},
		} {
			if r := doAs(t, h, tokMallory, rq.method, rq.path, rq.body); r.status != want || r.code() != code {
				t.Fatalf("mallory %s %s (session %s): %d %s, want %d %s", rq.method, rq.path, id, r.status, r.raw, want, code)
			}
		}
		m := dialWSAs(t, srv, tokMallory)
		m.send(`{"id":1,"op":"hello","client_id":"biller","session_id":"` + id + `"}`)
		if r := m.recv(); r.Type != api.TypeError || r.Error.Code != code {
			t.Fatalf("mallory resuming %s: %+v, want %s", id, r, code)
		}
	}
	if r := doAs(t, h, tokReader, "GET", "/api/v1/locks/billing%2Fx", ""); r.body["held"] != true || r.body["client_id"] != "biller" {
		t.Fatalf("billing's lock after mallory's attempts: %s", r.raw)
	}

	// The owner: its session works, a session of its that is gone is
	// session_expired.
	if r := doAs(t, h, tokBilling, "POST", "/api/v1/sessions/"+sid+"/keepalive", ""); r.status != 200 {
		t.Fatalf("owner keepalive: %s", r.raw)
	}
	if r := doAs(t, h, tokBilling, "POST", "/api/v1/sessions/"+gone+"/keepalive", ""); r.status != 404 || r.code() != api.CodeSessionExpired {
		t.Fatalf("owner keepalive of a gone session: %s", r.raw)
	}
	b := dialWSAs(t, srv, tokBilling)
	b.send(`{"id":1,"op":"hello","client_id":"biller","session_id":"` + sid + `"}`)
	if r := b.recv(); r.Type != api.TypeHello || r.SessionID != sid {
		t.Fatalf("owner resume: %+v", r)
	}
	// An admin may use any session and is told the truth.
	if r := doAs(t, h, tokOps, "POST", "/api/v1/sessions/"+sid+"/keepalive", ""); r.status != 200 {
		t.Fatalf("admin keepalive: %s", r.raw)
	}
	if r := doAs(t, h, tokOps, "POST", "/api/v1/sessions/"+gone+"/keepalive", ""); r.status != 404 {
		t.Fatalf("admin keepalive of a gone session: %s", r.raw)
	}
	if r := doAs(t, h, tokBilling, "DELETE", "/api/v1/sessions/"+sid, ""); r.status != 200 {
		t.Fatalf("owner delete: %s", r.raw)
	}
	if r := doAs(t, h, tokReader, "GET", "/api/v1/locks/billing%2Fx", ""); r.body["held"] != false {
		t.Fatalf("the owner's delete must free the lock: %s", r.raw)
	}

	// A WebSocket session belongs to the connection's token too.
	w := dialWSAs(t, srv, tokBilling)
	w.send(`{"id":1,"op":"hello","client_id":"ws-biller"}`)
	wsid := w.recv().SessionID
	if r := doAs(t, h, tokMallory, "DELETE", "/api/v1/sessions/"+wsid, ""); r.status != 403 {
		t.Fatalf("mallory deleting a WebSocket session: %s", r.raw)
	}
	if r := doAs(t, h, tokBilling, "POST", "/api/v1/sessions/"+wsid+"/keepalive", ""); r.status != 200 {
		t.Fatalf("owner keepalive of its WebSocket session: %s", r.raw)
	}
}

// TestOwnerlessSessionsUnderAuth: a session with no recorded owner (made
// while auth was off, or before owners were recorded) belongs to no token:
// only an admin may use it; anyone else is told session_expired.
func TestOwnerlessSessionsUnderAuth(t *testing.T) {
	f := newFake()
	if res, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpCreateSession, SessionID: "old-session",
		ClientID: "c", TTLms: 60000}); err != nil || res.Code != locktable.OK {
		t.Fatalf("setup: %+v %v", res, err)
	}
	h := New(Config{Backend: f, Auth: authStore(t)})
	if r := doAs(t, h, tokBilling, "POST", "/api/v1/sessions/old-session/keepalive", ""); r.status != 404 || r.code() != api.CodeSessionExpired {
		t.Fatalf("lock token on an owner-less session: %s", r.raw)
	}
	if r := doAs(t, h, tokOps, "POST", "/api/v1/sessions/old-session/keepalive", ""); r.status != 200 {
		t.Fatalf("admin on an owner-less session: %s", r.raw)
	}
}

// TestSessionsWithoutAuth: with auth off every caller is the one anonymous
// identity, so every caller may use every session (as before owners).
func TestSessionsWithoutAuth(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	c := do(t, h, "POST", "/api/v1/sessions", `{"client_id":"c","ttl_ms":5000}`)
	sid, _ := c.body["session_id"].(string)
	if c.status != 200 || sid == "" {
		t.Fatalf("create: %s", c.raw)
	}
	if r := do(t, h, "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","session_id":"`+sid+`"}`); r.status != 200 {
		t.Fatalf("acquire: %s", r.raw)
	}
	if g := do(t, h, "GET", "/api/v1/locks/x", ""); strings.Contains(g.raw, sid) {
		t.Fatalf("status shows the session id: %s", g.raw)
	}
	if r := do(t, h, "POST", "/api/v1/sessions/"+sid+"/keepalive", ""); r.status != 200 {
		t.Fatalf("keepalive: %s", r.raw)
	}
	if r := do(t, h, "DELETE", "/api/v1/sessions/"+sid, ""); r.status != 200 {
		t.Fatalf("delete: %s", r.raw)
	}
}

// quotaFake stamps quotas into the commands, as the leader does.
type quotaFake struct {
	*fakeBackend
	q locktable.Quotas
}

func (f quotaFake) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	if cmd.Op == locktable.OpAcquire || cmd.Op == locktable.OpCreateSession {
		cmd.Quotas = f.q
	}
	return f.fakeBackend.Propose(ctx, cmd)
}

// TestQuotasAnswer429: a request over a quota gets 429 resource_exhausted
// naming the quota and its value, over HTTP and WebSocket, and nothing
// changes.
func TestQuotasAnswer429(t *testing.T) {
	f := quotaFake{fakeBackend: newFake(), q: locktable.Quotas{Sessions: 3, Locks: 2, WaitersPerLock: 1}}
	obs := &recordingObserver{}
	h := New(Config{Backend: f, Observer: obs})
	srv := httptest.NewServer(h)
	defer srv.Close()
	refused := func(what string, code, msg string, quota, limit string) {
		t.Helper()
		if code != api.CodeResourceExhausted || !strings.Contains(msg, quota) || !strings.Contains(msg, "("+limit+")") {
			t.Fatalf("%s: %s %q; want resource_exhausted naming %s (%s)", what, code, msg, quota, limit)
		}
	}
	for _, name := range []string{"a", "b"} {
		if r := do(t, h, "POST", "/api/v1/locks/"+name+"/acquire", `{"client_id":"c1","ttl_ms":60000}`); r.status != 200 {
			t.Fatalf("acquire %s: %s", name, r.raw)
		}
	}
	before := f.snapshot()
	r := do(t, h, "POST", "/api/v1/locks/c/acquire", `{"client_id":"c1","ttl_ms":86400000}`)
	if r.status != 429 {
		t.Fatalf("a third lock: %d %s", r.status, r.raw)
	}
	refused("a third lock", r.code(), r.message(), "max-locks", "2")
	if string(before) != string(f.snapshot()) {
		t.Fatal("a refused acquire changed the state")
	}

	w1 := dialWS(t, srv)
	w1.send(`{"id":1,"op":"hello","client_id":"w1"}`)
	w1.recv()
	w1.send(`{"id":2,"op":"acquire","lock":"a","wait_timeout_ms":60000}`)
	waitFor(t, "w1 queued on a", func() bool {
		n := 0
		f.View(func(tb *locktable.Table) { n = len(tb.Waiters("a")) })
		return n == 1
	})
	w2 := dialWS(t, srv)
	w2.send(`{"id":1,"op":"hello","client_id":"w2"}`)
	w2.recv()
	mid := f.snapshot()
	w2.send(`{"id":2,"op":"acquire","lock":"a","wait_timeout_ms":60000}`)
	if m := w2.recv(); m.Type != api.TypeError || m.ID != 2 {
		t.Fatalf("a second waiter: %+v", m)
	} else {
		refused("a second waiter", m.Error.Code, m.Error.Message, "max-waiters-per-lock", "1")
	}
	if string(mid) != string(f.snapshot()) {
		t.Fatal("a refused WebSocket acquire changed the state")
	}

	if r := do(t, h, "POST", "/api/v1/sessions", `{"client_id":"s3"}`); r.status != 200 {
		t.Fatalf("a third session: %s", r.raw)
	}
	mid = f.snapshot()
	r = do(t, h, "POST", "/api/v1/sessions", `{"client_id":"s4","ttl_ms":3600000}`)
	if r.status != 429 {
		t.Fatalf("a fourth session: %d %s", r.status, r.raw)
	}
	refused("a fourth session", r.code(), r.message(), "max-sessions", "3")
	w3 := dialWS(t, srv)
	w3.send(`{"id":1,"op":"hello","client_id":"w3"}`)
	if m := w3.recv(); m.Type != api.TypeError {
		t.Fatalf("a WebSocket hello over the session quota: %+v", m)
	} else {
		refused("a WebSocket hello", m.Error.Code, m.Error.Message, "max-sessions", "3")
	}
	if string(mid) != string(f.snapshot()) {
		t.Fatal("a refused session changed the state")
	}
	// Each refusal is counted once, under its operation
	// (lockd_requests_refused_total).
	want := []string{"resource_exhausted/acquire", "resource_exhausted/acquire", "resource_exhausted/create_session", "resource_exhausted/create_session"}
	if got := obs.takeRefusals(); !slices.Equal(got, want) {
		t.Fatalf("refusals recorded %v, want %v", got, want)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
