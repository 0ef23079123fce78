package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type reply struct {
	status int
	body   map[string]any
	header http.Header
	raw    string
}

func (r reply) code() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (r reply) message() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

func do(t *testing.T, h http.Handler, method, path, body string) reply {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if strings.HasPrefix(path, "/api/v1/snapshot/restore") {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	r := reply{status: rec.Code, header: rec.Header(), raw: rec.Body.String()}
	_ = json.Unmarshal(rec.Body.Bytes(), &r.body)
	return r
}

// TestBadInputChangesNothing sends one request per SPEC limit violation
// (and malformed bodies): each gets 400 invalid_argument naming the field
// (413 for an oversized body), nothing is proposed, and the state's bytes
// are unchanged.
func TestBadInputChangesNothing(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	// Some state to protect.
	if r := do(t, h, "POST", "/api/v1/locks/held/acquire", `{"client_id":"owner","ttl_ms":60000}`); r.status != 200 {
		t.Fatalf("setup acquire: %d %s", r.status, r.raw)
	}
	before := f.snapshot()
	proposed := f.proposed.Load()

	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		name, method, path, body string
		status                   int
		code, mention            string
	}{
		{"lock name too long", "POST", "/api/v1/locks/" + long(257) + "/acquire", `{"client_id":"c"}`, 400, "invalid_argument", "lock name"},
		{"lock name bad character", "POST", "/api/v1/locks/bad%20name!/acquire", `{"client_id":"c"}`, 400, "invalid_argument", "lock name"},
		{"lock name non-ASCII", "POST", "/api/v1/locks/caf%C3%A9/acquire", `{"client_id":"c"}`, 400, "invalid_argument", "lock name"},
		{"client_id missing", "POST", "/api/v1/locks/x/acquire", `{"ttl_ms":1000}`, 400, "invalid_argument", "client_id"},
		{"client_id too long", "POST", "/api/v1/locks/x/acquire", `{"client_id":"` + long(129) + `"}`, 400, "invalid_argument", "client_id"},
		{"client_id not printable", "POST", "/api/v1/locks/x/acquire", `{"client_id":"a\u0001b"}`, 400, "invalid_argument", "client_id"},
		{"ttl_ms negative", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","ttl_ms":-5}`, 400, "invalid_argument", "ttl_ms"},
		{"ttl_ms below 100", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","ttl_ms":99}`, 400, "invalid_argument", "ttl_ms"},
		{"ttl_ms above a day", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","ttl_ms":86400001}`, 400, "invalid_argument", "ttl_ms"},
		{"ttl_ms not a number", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","ttl_ms":"10"}`, 400, "invalid_argument", "ttl_ms"},
		{"wait_timeout_ms negative", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","wait_timeout_ms":-1}`, 400, "invalid_argument", "wait_timeout_ms"},
		{"wait_timeout_ms above max", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","wait_timeout_ms":600001}`, 400, "invalid_argument", "wait_timeout_ms"},
		{"unknown field", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c","colour":"red"}`, 400, "invalid_argument", "colour"},
		{"malformed JSON", "POST", "/api/v1/locks/x/acquire", `{"client_id":`, 400, "invalid_argument", "JSON"},
		{"not an object", "POST", "/api/v1/locks/x/acquire", `["c"]`, 400, "invalid_argument", "JSON"},
		{"trailing data", "POST", "/api/v1/locks/x/acquire", `{"client_id":"c"} {"client_id":"d"}`, 400, "invalid_argument", "after the object"},
		{"empty body", "POST", "/api/v1/locks/x/acquire", ``, 400, "invalid_argument", "body"},
		{"body over 64 KiB", "POST", "/api/v1/locks/x/acquire", `{"client_id":"` + long(1<<20) + `"}`, 413, "payload_too_large", "64"},
		{"release without token", "POST", "/api/v1/locks/held/release", `{"client_id":"owner"}`, 400, "invalid_argument", "fencing_token"},
		{"release negative token", "POST", "/api/v1/locks/held/release", `{"client_id":"owner","fencing_token":-1}`, 400, "invalid_argument", "fencing_token"},
		{"renew ttl too small", "POST", "/api/v1/locks/held/renew", `{"client_id":"owner","fencing_token":1,"ttl_ms":1}`, 400, "invalid_argument", "ttl_ms"},
		{"session ttl too small", "POST", "/api/v1/sessions", `{"client_id":"c","ttl_ms":999}`, 400, "invalid_argument", "ttl_ms"},
		{"session ttl too large", "POST", "/api/v1/sessions", `{"client_id":"c","ttl_ms":3600001}`, 400, "invalid_argument", "ttl_ms"},
		{"session without client", "POST", "/api/v1/sessions", `{"ttl_ms":5000}`, 400, "invalid_argument", "client_id"},
		{"list prefix bad", "GET", "/api/v1/locks?prefix=a%20b", ``, 400, "invalid_argument", "prefix"},
		{"add member without raft_addr", "POST", "/api/v1/cluster/members", `{"id":"n9"}`, 400, "invalid_argument", "raft_addr"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, h, tc.method, tc.path, tc.body)
			if r.status != tc.status || r.code() != tc.code {
				t.Fatalf("got %d %q, want %d %q: %s", r.status, r.code(), tc.status, tc.code, r.raw)
			}
			if !strings.Contains(r.message(), tc.mention) {
				t.Fatalf("message %q does not name %q", r.message(), tc.mention)
			}
			if got := f.proposed.Load(); got != proposed {
				t.Fatalf("bad input was proposed (%d proposals, want %d)", got, proposed)
			}
			if !bytes.Equal(f.snapshot(), before) {
				t.Fatal("bad input changed the state")
			}
		})
	}
}

func TestLockLifecycleOverHTTP(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	a := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/acquire", `{"client_id":"a","ttl_ms":10000}`)
	if a.status != 200 || a.body["acquired"] != true || a.body["lock"] != "jobs/nightly" {
		t.Fatalf("acquire: %d %s", a.status, a.raw)
	}
	tok := uint64(a.body["fencing_token"].(float64))
	if _, err := time.Parse(time.RFC3339, a.body["expires_at"].(string)); err != nil {
		t.Fatalf("expires_at: %v", err)
	}
	b := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/acquire", `{"client_id":"b"}`)
	if b.status != 409 || b.code() != "lock_held" || b.body["acquired"] != false || !strings.Contains(b.message(), "a") {
		t.Fatalf("second holder: %d %s", b.status, b.raw)
	}
	again := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/acquire", `{"client_id":"a","ttl_ms":10000}`)
	if again.status != 200 || uint64(again.body["fencing_token"].(float64)) != tok {
		t.Fatalf("idempotent re-acquire: %s", again.raw)
	}
	g := do(t, h, "GET", "/api/v1/locks/jobs%2Fnightly", "")
	if g.body["held"] != true || g.body["client_id"] != "a" {
		t.Fatalf("status: %s", g.raw)
	}
	if r := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/renew", `{"client_id":"b","fencing_token":1}`); r.status != 409 || r.code() != "not_holder" {
		t.Fatalf("renew by non-holder: %s", r.raw)
	}
	if r := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/renew", `{"client_id":"a","fencing_token":1,"ttl_ms":20000}`); r.status != 200 || r.body["renewed"] != true {
		t.Fatalf("renew: %s", r.raw)
	}
	// A waiter is granted on release, with a larger token.
	done := make(chan reply, 1)
	go func() {
		done <- do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/acquire", `{"client_id":"w","ttl_ms":5000,"wait_timeout_ms":5000}`)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if g := do(t, h, "GET", "/api/v1/locks/jobs%2Fnightly", ""); g.body["waiters"] == float64(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/release", `{"client_id":"a","fencing_token":1}`); r.status != 200 || r.body["released"] != true {
		t.Fatalf("release: %s", r.raw)
	}
	w := <-done
	if w.status != 200 || uint64(w.body["fencing_token"].(float64)) <= tok {
		t.Fatalf("waiter: %s", w.raw)
	}
	// A retried release of the released grant is still "released".
	if r := do(t, h, "POST", "/api/v1/locks/jobs%2Fnightly/release", `{"client_id":"a","fencing_token":1}`); r.status != 200 {
		t.Fatalf("retried release: %s", r.raw)
	}
	l := do(t, h, "GET", "/api/v1/locks?prefix=jobs/", "")
	if locks, _ := l.body["locks"].([]any); len(locks) != 1 {
		t.Fatalf("list: %s", l.raw)
	}
}

func TestSessionsOverHTTP(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	s := do(t, h, "POST", "/api/v1/sessions", `{"client_id":"c","ttl_ms":5000}`)
	id, _ := s.body["session_id"].(string)
	if s.status != 200 || id == "" || s.body["ttl_ms"] != float64(5000) {
		t.Fatalf("create: %s", s.raw)
	}
	a := do(t, h, "POST", "/api/v1/locks/s/acquire", `{"client_id":"c","session_id":"`+id+`"}`)
	if a.status != 200 || a.body["expires_at"] != nil {
		t.Fatalf("session lock (no TTL of its own): %s", a.raw)
	}
	if r := do(t, h, "POST", "/api/v1/sessions/"+id+"/keepalive", ""); r.status != 200 || r.body["ttl_ms"] != float64(5000) {
		t.Fatalf("keepalive: %s", r.raw)
	}
	if r := do(t, h, "DELETE", "/api/v1/sessions/"+id, ""); r.status != 200 {
		t.Fatalf("delete: %s", r.raw)
	}
	if g := do(t, h, "GET", "/api/v1/locks/s", ""); g.body["held"] != false {
		t.Fatalf("deleting the session must release its lock: %s", g.raw)
	}
	if r := do(t, h, "POST", "/api/v1/sessions/"+id+"/keepalive", ""); r.status != 404 || r.code() != "session_expired" {
		t.Fatalf("keepalive of a deleted session: %s", r.raw)
	}
	if r := do(t, h, "POST", "/api/v1/locks/s/acquire", `{"client_id":"c","session_id":"`+id+`"}`); r.status != 404 || r.code() != "session_expired" {
		t.Fatalf("acquire with a deleted session: %s", r.raw)
	}
}

func TestFollowerRedirectsAndNoLeader(t *testing.T) {
	f := newFake()
	f.ready, f.leader = false, "http://127.0.0.1:9999"
	h := New(Config{Backend: f})
	r := do(t, h, "POST", "/api/v1/locks/jobs%2Fx/acquire?x=1", `{"client_id":"c"}`)
	if r.status != 307 || r.header.Get("Location") != "http://127.0.0.1:9999/api/v1/locks/jobs%2Fx/acquire?x=1" ||
		r.header.Get("X-Lockd-Leader") != "http://127.0.0.1:9999" {
		t.Fatalf("follower: %d %v %s", r.status, r.header, r.raw)
	}
	if g := do(t, h, "GET", "/api/v1/locks/x?stale=true", ""); g.status != 200 {
		t.Fatalf("stale read on a follower: %s", g.raw)
	}
	f.leader = ""
	r = do(t, h, "POST", "/api/v1/locks/x/acquire", `{"client_id":"c"}`)
	if r.status != 503 || r.code() != "no_leader" || r.header.Get("Retry-After") == "" {
		t.Fatalf("no leader: %d %v %s", r.status, r.header, r.raw)
	}
	if f.proposed.Load() != 0 {
		t.Fatal("a follower proposed")
	}
}

func TestUnknownPathIsJSON404(t *testing.T) {
	h := New(Config{Backend: newFake()})
	r := do(t, h, "GET", "/nope", "")
	if r.status != 404 || r.code() != "not_found" {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	resp := httptest.NewRecorder()
	h.ServeHTTP(resp, httptest.NewRequest("GET", "/healthz", nil))
	b, _ := io.ReadAll(resp.Body)
	if resp.Code != 200 {
		t.Fatalf("healthz: %d %s", resp.Code, b)
	}
}

// TestHTTPOldWaitDoesNotAnswerRetry: as on the WebSocket, the end of an
// earlier wait must not answer a retried acquire of the same client.
func TestHTTPOldWaitDoesNotAnswerRetry(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	a := do(t, h, "POST", "/api/v1/locks/l/acquire", `{"client_id":"A","ttl_ms":60000}`)
	// B's first wait: queued, then its client gives up.
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan int, 1)
	go func() {
		req := httptest.NewRequest("POST", "/api/v1/locks/l/acquire", strings.NewReader(`{"client_id":"B","ttl_ms":60000,"wait_timeout_ms":5}`)).WithContext(ctx)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		first <- rec.Code
	}()
	deadline := time.Now().Add(5 * time.Second)
	for do(t, h, "GET", "/api/v1/locks/l", "").body["waiters"] != float64(1) {
		if time.Now().After(deadline) {
			t.Fatal("first wait never queued")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	<-first
	// B's retry races the first wait's timeout, which commits first.
	f.timeoutBeforeRetry("l", "B")
	retry := make(chan reply, 1)
	go func() {
		retry <- do(t, h, "POST", "/api/v1/locks/l/acquire", `{"client_id":"B","ttl_ms":60000,"wait_timeout_ms":60000}`)
	}()
	for do(t, h, "GET", "/api/v1/locks/l", "").body["waiters"] != float64(1) {
		select {
		case r := <-retry:
			t.Fatalf("the retry was answered before the lock was free: %d %s", r.status, r.raw)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("retry never queued")
		}
		time.Sleep(2 * time.Millisecond)
	}
	select {
	case r := <-retry:
		t.Fatalf("the end of the first wait answered the retry: %d %s", r.status, r.raw)
	case <-time.After(100 * time.Millisecond):
	}
	do(t, h, "POST", "/api/v1/locks/l/release", `{"client_id":"A","fencing_token":`+itoa(uint64(a.body["fencing_token"].(float64)))+`}`)
	if r := <-retry; r.status != 200 || r.body["acquired"] != true {
		t.Fatalf("retry: %d %s", r.status, r.raw)
	}
}
