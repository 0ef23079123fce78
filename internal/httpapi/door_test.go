package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"pgregory.net/rapid"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
)

// recordingBackend is the fake backend that also keeps every command
// proposed and every member added, to check what the handlers build.
type recordingBackend struct {
	*fakeBackend
	rmu     sync.Mutex
	cmds    []locktable.Command
	members []api.AddMemberRequest
}

func newRecording() *recordingBackend { return &recordingBackend{fakeBackend: newFake()} }

func (b *recordingBackend) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	b.rmu.Lock()
	b.cmds = append(b.cmds, cmd)
	b.rmu.Unlock()
	return b.fakeBackend.Propose(ctx, cmd)
}

func (b *recordingBackend) AddMember(ctx context.Context, req api.AddMemberRequest) error {
	b.rmu.Lock()
	b.members = append(b.members, req)
	b.rmu.Unlock()
	return nil
}

func (b *recordingBackend) taken() ([]locktable.Command, []api.AddMemberRequest) {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	c, m := b.cmds, b.members
	b.cmds, b.members = nil, nil
	return c, m
}

// jsonString quotes s for a hand-made JSON body, escaping only what JSON
// requires: other bytes, invalid UTF-8 included, go in raw, as a hostile
// client would send them.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestAddMemberValidatesAddresses: every field the add-member endpoint
// stores is checked before anything reaches the backend. The poison pill
// (65,000 bytes of 0xFF in http_addr decode to 195 KB of U+FFFD, over what
// the log decoder reads back) and a raft_addr that is not host:port (the
// leader would wait for a member that can never catch up) are 400 at once.
func TestAddMemberValidatesAddresses(t *testing.T) {
	b := newRecording()
	h := New(Config{Backend: b})
	body := func(id, raft, http string) string {
		return `{"id":` + jsonString(id) + `,"raft_addr":` + jsonString(raft) + `,"http_addr":` + jsonString(http) + `}`
	}
	const okRaft, okHTTP = "127.0.0.1:7071", "http://127.0.0.1:7070"
	for _, tc := range []struct {
		name, id, raft, http string
		ok                   bool
		mention              string
	}{
		{"plain", "n2", okRaft, okHTTP, true, ""},
		{"bare host:port http", "n2", okRaft, "127.0.0.1:7070", true, ""},
		{"https without port", "n2", "lockd-2.internal:7071", "https://lockd-2.example.com", true, ""},
		{"https with path", "n2", okRaft, "https://proxy.example.com:8443/lockd", true, ""},
		{"ipv6", "n2", "[::1]:7071", "http://[::1]:7070", true, ""},
		{"trailing slash", "n2", okRaft, "http://127.0.0.1:7070/", true, ""},

		{"poison pill http_addr", "n9", okRaft, strings.Repeat("\xff", 65000), false, "http_addr"},
		{"http_addr unicode", "n9", okRaft, "http://ключ:7070", false, "http_addr"},
		{"http_addr control character", "n9", okRaft, "http://a\x07b:7070", false, "http_addr"},
		{"http_addr space", "n9", okRaft, "http://a b:7070", false, "http_addr"},
		{"http_addr missing", "n9", okRaft, "", false, "http_addr"},
		{"http_addr too long", "n9", okRaft, "http://" + strings.Repeat("a", 600) + ":1", false, "http_addr"},
		{"http_addr scheme", "n9", okRaft, "ftp://127.0.0.1:21", false, "scheme"},
		{"http_addr no host", "n9", okRaft, "http://:7070", false, "host"},
		{"http_addr no port", "n9", okRaft, "127.0.0.1", false, "http_addr"},
		{"http_addr port zero", "n9", okRaft, "http://127.0.0.1:0", false, "port"},
		{"http_addr port too big", "n9", okRaft, "http://127.0.0.1:65536", false, "port"},
		{"http_addr empty port", "n9", okRaft, "http://127.0.0.1:", false, "port"},
		{"http_addr user", "n9", okRaft, "http://u:p@127.0.0.1:7070", false, "user"},
		{"http_addr query", "n9", okRaft, "http://127.0.0.1:7070/?a=b", false, "query"},
		{"http_addr fragment", "n9", okRaft, "http://127.0.0.1:7070/#x", false, "fragment"},
		{"raft_addr garbage", "n9", "nonsense", okHTTP, false, "raft_addr"},
		{"raft_addr missing", "n9", "", okHTTP, false, "raft_addr"},
		{"raft_addr no port", "n9", "127.0.0.1", okHTTP, false, "raft_addr"},
		{"raft_addr no host", "n9", ":7071", okHTTP, false, "host"},
		{"raft_addr port name", "n9", "127.0.0.1:raft", okHTTP, false, "port"},
		{"raft_addr port zero", "n9", "127.0.0.1:0", okHTTP, false, "port"},
		{"raft_addr port too big", "n9", "127.0.0.1:70000", okHTTP, false, "port"},
		{"raft_addr a URL", "n9", "http://127.0.0.1:7071", okHTTP, false, "raft_addr"},
		{"raft_addr invalid UTF-8", "n9", "\xff\xfe:7071", okHTTP, false, "raft_addr"},
		{"raft_addr too long", "n9", strings.Repeat("a", 600) + ":1", okHTTP, false, "raft_addr"},
		{"raft_addr host too long", "n9", strings.Repeat("a", 254) + ":1", okHTTP, false, "253"},
		{"id missing", "", okRaft, okHTTP, false, "id"},
		{"id too long", strings.Repeat("n", 129), okRaft, okHTTP, false, "id"},
		{"id control character", "n\x01", okRaft, okHTTP, false, "id"},
		// JSON decoding turns invalid UTF-8 into U+FFFD: a printable,
		// bounded id.
		{"id invalid UTF-8", "n\xff", okRaft, okHTTP, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := do(t, h, "POST", "/api/v1/cluster/members", body(tc.id, tc.raft, tc.http))
			_, added := b.taken()
			if tc.ok {
				if r.status != 200 || len(added) != 1 {
					t.Fatalf("got %d %s, %d members added; want 200 and the member", r.status, r.raw, len(added))
				}
				return
			}
			if r.status != 400 || r.code() != api.CodeInvalidArgument || !strings.Contains(r.message(), tc.mention) {
				t.Fatalf("got %d %s; want 400 invalid_argument naming %q", r.status, r.raw, tc.mention)
			}
			if len(added) != 0 {
				t.Fatalf("the backend was asked to add %+v", added)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("refusing took %v", d)
			}
		})
	}
}

// TestAPICommandsRoundTrip: whatever random input the HTTP API accepts, the
// command it proposes passes locktable's Validate and encodes and decodes
// to itself (SPEC semantics 12: what the API accepts always encodes and
// decodes). Inputs are mostly valid, often at the limits, and sometimes
// garbage (invalid UTF-8, overlong, control characters), sent as raw bytes.
func TestAPICommandsRoundTrip(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := newRecording()
		h := New(Config{Backend: b})
		lockName := rapid.OneOf(
			rapid.StringOfN(rapid.SampledFrom([]rune("abcXYZ019._:/-")), 1, api.MaxLockName, -1),
			rapid.StringN(0, 300, -1),
		).Draw(rt, "lock")
		text := func(label string) string {
			return rapid.OneOf(
				rapid.StringOfN(rapid.SampledFrom([]rune("abcXYZ019-_.:@ ")), 1, api.MaxClientID, -1),
				rapid.StringN(1, 40, api.MaxClientID),
				rapid.StringOfN(rapid.Rune(), 1, 200, -1),
				rapid.Just(strings.Repeat("\xff", 130)),
				rapid.Just(strings.Repeat("é", 64)),
				rapid.Just(""),
			).Draw(rt, label)
		}
		host := func(label string) string {
			return rapid.OneOf(
				rapid.StringOfN(rapid.SampledFrom([]rune("abz09-._")), 1, 253, -1),
				rapid.StringOfN(rapid.SampledFrom([]rune("abz09-._")), 1, 20, -1),
				rapid.SampledFrom([]string{"127.0.0.1", "[::1]", "[fe80::1%25eth0]", "lockd-2.example.com"}),
				rapid.StringN(0, 20, -1),
			).Draw(rt, label)
		}
		hostPort := func(label string) string {
			return host(label+".host") + rapid.SampledFrom([]string{":7071", ":7071", ":1", ":65535", ":0", ":65536", ":", ""}).Draw(rt, label+".port")
		}
		num := func(label string) string {
			return rapid.SampledFrom([]string{"", "0", "1", "99", "100", "1000", "30000", "600000", "86400000",
				"86400001", "3600000", "-1", "9223372036854775807"}).Draw(rt, label)
		}
		field := func(name, v string) string {
			if v == "" {
				return "" // absent
			}
			return `"` + name + `":` + v
		}
		obj := func(fields ...string) string {
			var fs []string
			for _, f := range fields {
				if f != "" {
					fs = append(fs, f)
				}
			}
			return "{" + strings.Join(fs, ",") + "}"
		}
		client, session := text("client"), text("session")
		path := "/api/v1/locks/" + strings.ReplaceAll(urlPathEscape(lockName), "/", "%2F")
		var method, target, body string
		switch rapid.IntRange(0, 5).Draw(rt, "endpoint") {
		case 0:
			method, target = "POST", path+"/acquire"
			body = obj(field("client_id", jsonString(client)), field("ttl_ms", num("ttl")),
				field("wait_timeout_ms", rapid.SampledFrom([]string{"", "0", "1", "600000", "600001"}).Draw(rt, "wait")),
				field("session_id", rapid.SampledFrom([]string{"", jsonString(session)}).Draw(rt, "withSession")))
		case 1:
			method, target = "POST", path+"/release"
			body = obj(field("client_id", jsonString(client)), field("fencing_token", num("token")))
		case 2:
			method, target = "POST", path+"/renew"
			body = obj(field("client_id", jsonString(client)), field("fencing_token", num("token")), field("ttl_ms", num("ttl")))
		case 3:
			method, target = "POST", "/api/v1/sessions"
			body = obj(field("client_id", jsonString(client)), field("ttl_ms", num("ttl")))
		case 4:
			method, target = "DELETE", "/api/v1/sessions/"+urlPathEscape(session)
		case 5:
			method, target = "POST", "/api/v1/cluster/members"
			raft := hostPort("raft")
			if rapid.IntRange(0, 4).Draw(rt, "raftText") == 0 {
				raft = text("raft")
			}
			http := rapid.SampledFrom([]string{"http://", "http://", "https://", "", "ftp://"}).Draw(rt, "scheme") +
				hostPort("http") + rapid.SampledFrom([]string{"", "", "/", "/lockd", "/?q", "/#f", "/\x01"}).Draw(rt, "path")
			id := rapid.SampledFrom([]string{"n2", "lockd-7", client}).Draw(rt, "id")
			body = obj(field("id", jsonString(id)), field("raft_addr", jsonString(raft)), field("http_addr", jsonString(http)))
		}
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		cmds, members := b.taken()
		for _, m := range members {
			// What server.AddMember proposes for an added member.
			u := strings.TrimRight(m.HTTPAddr, "/")
			if !strings.Contains(u, "://") {
				u = "http://" + u
			}
			cmds = append(cmds, locktable.Command{Op: locktable.OpSetMember, MemberID: m.ID, RaftAddr: m.RaftAddr, HTTPAddr: u})
		}
		for _, c := range cmds {
			if err := c.Validate(); err != nil {
				rt.Fatalf("%s %s %q (answered %d) proposed a command Validate refuses: %v", method, target, body, rec.Code, err)
			}
			got, err := locktable.DecodeCommand(c.Encode())
			if err != nil || !reflect.DeepEqual(got, c) {
				rt.Fatalf("%s %s %q proposed %+v, which decodes to %+v, %v", method, target, body, c, got, err)
			}
		}
	})
}

// urlPathEscape escapes every byte outside the unreserved set, so that any
// string travels in one path segment.
func urlPathEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestMethodNotAllowed: a known path with a wrong method is 405
// method_not_allowed, with an Allow header naming the right methods and the
// usual JSON error body (SPEC semantics 14). An action word ends a lock path
// whatever the method, so GET .../x/acquire is 405, not a read of lock
// "x/acquire".
func TestMethodNotAllowed(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f, Metrics: http.NotFoundHandler()})
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/api/v1/locks/x/acquire", "POST"},
		{"DELETE", "/api/v1/locks/x/release", "POST"},
		{"GET", "/api/v1/locks/x/renew", "POST"},
		{"GET", "/api/v1/locks/x/value", "POST"},
		{"GET", "/api/v1/locks/jobs/x/acquire", "POST"},
		{"GET", "/api/v1/locks/jobs%2Fx/acquire", "POST"},
		{"GET", "/api/v1/acquire", "POST"},
		{"POST", "/api/v1/locks", "GET"},
		{"PUT", "/api/v1/locks/x", "GET"},
		{"POST", "/api/v1/locks/jobs/x", "GET"},
		{"POST", "/api/v1/ws", "GET"},
		{"GET", "/api/v1/sessions", "POST"},
		{"GET", "/api/v1/sessions/s1/keepalive", "POST"},
		{"POST", "/api/v1/sessions/s1", "DELETE"},
		{"GET", "/api/v1/cluster/members", "POST"},
		{"POST", "/api/v1/cluster/members/n2", "DELETE"},
		{"POST", "/api/v1/cluster", "GET"},
		{"GET", "/api/v1/cluster/transfer-leadership", "POST"},
		{"POST", "/api/v1/status", "GET"},
		{"POST", "/api/v1/snapshot", "GET"},
		{"GET", "/api/v1/snapshot/restore", "POST"},
		{"POST", "/healthz", "GET"},
		{"DELETE", "/readyz", "GET"},
		{"POST", "/metrics", "GET"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := do(t, h, tc.method, tc.path, "")
			if r.status != 405 || r.code() != api.CodeMethodNotAllowed || r.message() == "" {
				t.Fatalf("got %d %s, want 405 method_not_allowed", r.status, r.raw)
			}
			if !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
				t.Fatalf("Content-Type %q", r.header.Get("Content-Type"))
			}
			allow := strings.Split(r.header.Get("Allow"), ", ")
			if !contains(allow, tc.allow) || contains(allow, tc.method) {
				t.Fatalf("Allow %q, want it to name %s and not %s", r.header.Get("Allow"), tc.allow, tc.method)
			}
		})
	}
	if f.proposed.Load() != 0 {
		t.Fatal("a refused method proposed something")
	}
	// HEAD goes where GET goes.
	if r := do(t, h, "HEAD", "/healthz", ""); r.status != 200 {
		t.Fatalf("HEAD /healthz: %d", r.status)
	}
	// Paths the API does not know are still 404.
	for _, p := range []string{"/api/v1/nope", "/api/v1/sessions/a/b/c", "/nope"} {
		if r := do(t, h, "GET", p, ""); r.status != 404 || r.code() != api.CodeNotFound {
			t.Fatalf("GET %s: %d %s", p, r.status, r.raw)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestLockNamesInPaths: a '/' in a lock name may be sent raw or as %2F; a
// path whose last segment is an action word is that action on the name
// before it, any other path is the whole name; an empty name is 400, never
// a redirect.
func TestLockNamesInPaths(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	acquire := func(path string) reply {
		t.Helper()
		return do(t, h, "POST", path, `{"client_id":"c","ttl_ms":60000}`)
	}
	if r := acquire("/api/v1/locks/jobs/nightly/acquire"); r.status != 200 || r.body["lock"] != "jobs/nightly" {
		t.Fatalf("raw slash acquire: %d %s", r.status, r.raw)
	}
	for _, p := range []string{"/api/v1/locks/jobs/nightly", "/api/v1/locks/jobs%2Fnightly", "/api/v1/locks/jobs%2fnightly"} {
		if r := do(t, h, "GET", p, ""); r.status != 200 || r.body["lock"] != "jobs/nightly" || r.body["held"] != true {
			t.Fatalf("GET %s: %d %s", p, r.status, r.raw)
		}
	}
	// A name ending in an action word: %2F keeps the word in the name.
	if r := acquire("/api/v1/locks/x%2Facquire/acquire"); r.status != 200 || r.body["lock"] != "x/acquire" {
		t.Fatalf("acquire of x/acquire: %d %s", r.status, r.raw)
	}
	if r := do(t, h, "GET", "/api/v1/locks/x%2Facquire", ""); r.body["lock"] != "x/acquire" || r.body["held"] != true {
		t.Fatalf("GET x%%2Facquire: %d %s", r.status, r.raw)
	}
	// A lock named like an action, alone in the path, is the whole name.
	if r := acquire("/api/v1/locks/renew/acquire"); r.status != 200 || r.body["lock"] != "renew" {
		t.Fatalf("acquire of renew: %d %s", r.status, r.raw)
	}
	if r := do(t, h, "GET", "/api/v1/locks/renew", ""); r.body["lock"] != "renew" || r.body["held"] != true {
		t.Fatalf("GET renew: %d %s", r.status, r.raw)
	}
	before := f.proposed.Load()
	for _, tc := range []struct{ method, path, body, mention string }{
		{"POST", "/api/v1/locks//acquire", `{"client_id":"c","ttl_ms":5000}`, "empty"},
		{"POST", "/api/v1/locks//release", `{"client_id":"c","fencing_token":1}`, "empty"},
		{"GET", "/api/v1/locks/", "", "empty"},
		{"POST", "/api/v1/locks/a%20b/acquire", `{"client_id":"c"}`, "lock name"},
		{"POST", "/api/v1/sessions//keepalive", "", "id"},
		{"DELETE", "/api/v1/sessions/", "", "id"},
		{"DELETE", "/api/v1/cluster/members/", "", "id"},
	} {
		r := do(t, h, tc.method, tc.path, tc.body)
		if r.status != 400 || r.code() != api.CodeInvalidArgument || !strings.Contains(r.message(), tc.mention) {
			t.Fatalf("%s %s: %d %s, want 400 invalid_argument naming %q", tc.method, tc.path, r.status, r.raw, tc.mention)
		}
	}
	if f.proposed.Load() != before {
		t.Fatal("a refused path proposed something")
	}
}

// TestFieldNamesAreCaseSensitive: encoding/json would take "TTL_MS" for
// ttl_ms; the SPEC's names match exactly, and a name given twice is refused
// too. Nothing is proposed.
func TestFieldNamesAreCaseSensitive(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	for _, body := range []string{
		`{"client_id":"c","TTL_MS":5000}`,
		`{"client_id":"c","Ttl_ms":5000}`,
		`{"Client_ID":"c","ttl_ms":5000}`,
		`{"client_id":"c","client_id":"d"}`,
		`{"client_id":"c","ttl_ms":5000,"Wait_Timeout_Ms":1}`,
	} {
		r := do(t, h, "POST", "/api/v1/locks/cs/acquire", body)
		if r.status != 400 || r.code() != api.CodeInvalidArgument {
			t.Fatalf("%s: %d %s, want 400 invalid_argument", body, r.status, r.raw)
		}
	}
	for path, body := range map[string]string{
		"/api/v1/sessions":                    `{"Client_id":"c"}`,
		"/api/v1/cluster/members":             `{"ID":"n2","raft_addr":"127.0.0.1:1","http_addr":"127.0.0.1:2"}`,
		"/api/v1/cluster/transfer-leadership": `{"TO":"n2"}`,
		"/api/v1/locks/cs/release":            `{"client_id":"c","Fencing_Token":1}`,
		"/api/v1/locks/cs/renew":              `{"client_id":"c","fencing_token":1,"TTL_ms":1000}`,
		"/api/v1/locks/cs2/acquire":           `{"client_id":"c","session_ID":"s"}`,
	} {
		if r := do(t, h, "POST", path, body); r.status != 400 || r.code() != api.CodeInvalidArgument {
			t.Fatalf("%s %s: %d %s, want 400 invalid_argument", path, body, r.status, r.raw)
		}
	}
	if r := do(t, h, "POST", "/api/v1/locks/cs/acquire", `{"client_id":"c","TTL_MS":5000}`); !strings.Contains(r.message(), `"ttl_ms"`) {
		t.Fatalf("the message should name the field meant: %s", r.raw)
	}
	if f.proposed.Load() != 0 {
		t.Fatal("a refused body was proposed")
	}
	// The same on the WebSocket: the frame is refused, answered with its id.
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"w","session_ttl_ms":5000}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	c.send(`{"id":2,"op":"acquire","LOCK":"x"}`)
	if m := c.recv(); m.Type != api.TypeError || m.ID != 2 || m.Error == nil || m.Error.Code != api.CodeInvalidArgument {
		t.Fatalf("frame with LOCK: %+v", m)
	}
}

// TestBodyLimitEverywhere: every endpoint refuses a body over 64 KiB with
// 413 payload_too_large, whether or not it reads one, and with or without a
// Content-Length; a WebSocket frame over 64 KiB is answered
// payload_too_large before the connection closes.
func TestBodyLimitEverywhere(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	big := `{"client_id":"` + strings.Repeat("v", 70000) + `"}`
	for _, p := range []string{
		"/api/v1/locks/x/acquire", "/api/v1/locks/x/release", "/api/v1/locks/x/renew", "/api/v1/locks/x/value",
		"/api/v1/acquire", "/api/v1/sessions", "/api/v1/sessions/s1/keepalive", "/api/v1/cluster/members",
		"/api/v1/cluster/transfer-leadership",
	} {
		if r := do(t, h, "POST", p, big); r.status != 413 || r.code() != api.CodePayloadTooLarge {
			t.Fatalf("POST %s with 70 KB: %d %.200s", p, r.status, r.raw)
		}
	}
	// Without a Content-Length the body is cut off while it is read.
	req := httptest.NewRequest("POST", "/api/v1/locks/x/acquire", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Fatalf("chunked 70 KB acquire: %d %.200s", rec.Code, rec.Body.String())
	}
	if f.proposed.Load() != 0 {
		t.Fatal("an oversized body was proposed")
	}

	srv := httptest.NewServer(h)
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"w","session_ttl_ms":5000}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	c.send(`{"id":2,"op":"acquire","lock":"x","pad":"` + strings.Repeat("p", 70000) + `"}`)
	if m := c.recv(); m.Type != api.TypeError || m.Error == nil || m.Error.Code != api.CodePayloadTooLarge {
		t.Fatalf("70 KB frame: %+v", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.c.Read(ctx); websocket.CloseStatus(err) == -1 {
		t.Fatalf("after an oversized frame the connection should close, got %v", err)
	}
}

// TestListPaging: GET /api/v1/locks pages by limit and after, sorted by
// name, with next naming the last lock of a page when more follow and ""
// on the last page; limit outside 1-10 000 and a malformed after are 400.
func TestListPaging(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	for i := 0; i < 25; i++ {
		if r := do(t, h, "POST", fmt.Sprintf("/api/v1/locks/p%%2F%02d/acquire", i), `{"client_id":"lp","ttl_ms":60000}`); r.status != 200 {
			t.Fatal(r.raw)
		}
	}
	for _, n := range []string{"p", "o%2Fx", "pq%2F1", "p.x"} {
		if r := do(t, h, "POST", "/api/v1/locks/"+n+"/acquire", `{"client_id":"lp","ttl_ms":60000}`); r.status != 200 {
			t.Fatal(r.raw)
		}
	}
	var got []string
	var sizes []int
	after := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatalf("too many pages: %v", sizes)
		}
		path := "/api/v1/locks?prefix=p/&limit=10"
		if after != "" {
			path += "&after=" + after
		}
		r := do(t, h, "GET", path, "")
		if r.status != 200 {
			t.Fatalf("%s: %d %s", path, r.status, r.raw)
		}
		locks, _ := r.body["locks"].([]any)
		sizes = append(sizes, len(locks))
		for _, l := range locks {
			got = append(got, l.(map[string]any)["lock"].(string))
		}
		next, ok := r.body["next"].(string)
		if !ok {
			t.Fatalf("no next in %s", r.raw)
		}
		if next == "" {
			break
		}
		after = next
	}
	var want []string
	for i := 0; i < 25; i++ {
		want = append(want, fmt.Sprintf("p/%02d", i))
	}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(sizes, []int{10, 10, 5}) {
		t.Fatalf("pages %v: %v", sizes, got)
	}
	// The default limit, and everything without a prefix.
	if r := do(t, h, "GET", "/api/v1/locks", ""); len(r.body["locks"].([]any)) != 29 || r.body["next"] != "" {
		t.Fatalf("default list: %s", r.raw)
	}
	for _, q := range []string{"limit=0", "limit=10001", "limit=-1", "limit=ten", "limit=1.5", "after=a%20b", "prefix=a%20b"} {
		r := do(t, h, "GET", "/api/v1/locks?"+q, "")
		if r.status != 400 || r.code() != api.CodeInvalidArgument {
			t.Fatalf("%s: %d %s, want 400", q, r.status, r.raw)
		}
	}
	if r := do(t, h, "GET", "/api/v1/locks?limit=10000&limit=1", ""); r.status != 200 {
		t.Fatalf("limit=10000: %d %s", r.status, r.raw)
	}
}

// TestTryWhileQueued: a try (wait_timeout_ms 0) by a client whose earlier
// wait is queued on the same lock answers at once with 409 lock_held naming
// the holder (it crashed the handler before), and the earlier wait keeps its
// place and is granted on release.
func TestTryWhileQueued(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f}))
	defer srv.Close()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("/api/v1/locks/q/acquire", `{"client_id":"A","ttl_ms":60000}`); code != 200 {
		t.Fatalf("A: %d %s", code, body)
	}
	waited := make(chan string, 1)
	go func() {
		code, body := post("/api/v1/locks/q/acquire", `{"client_id":"B","ttl_ms":60000,"wait_timeout_ms":10000}`)
		waited <- fmt.Sprint(code, " ", body)
	}()
	deadline := time.Now().Add(5 * time.Second)
	waiters := func() (w []locktable.Waiter) {
		f.View(func(t *locktable.Table) { w = t.Waiters("q") })
		return w
	}
	for len(waiters()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("B never queued")
		}
		time.Sleep(2 * time.Millisecond)
	}
	start := time.Now()
	code, body := post("/api/v1/locks/q/acquire", `{"client_id":"B","ttl_ms":60000}`)
	if code != 409 || !strings.Contains(body, `"lock_held"`) || !strings.Contains(body, `"holder":"A"`) {
		t.Fatalf("try by the queued client: %d %s, want 409 lock_held naming A", code, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the try took %v", d)
	}
	if w := waiters(); len(w) != 1 || w[0].ClientID != "B" {
		t.Fatalf("the earlier wait lost its place: %+v", w)
	}
	if code, body := post("/api/v1/locks/q/release", `{"client_id":"A","fencing_token":1}`); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	select {
	case got := <-waited:
		if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"acquired":true`) {
			t.Fatalf("the earlier wait: %s", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the earlier wait was never answered")
	}
}

// TestRestoreLimit: an uploaded backup is bounded by Config.MaxRestoreBytes
// (256 MiB unless set): 413 beyond it, announced or not, and nothing
// restored.
func TestRestoreLimit(t *testing.T) {
	if h := New(Config{Backend: newFake()}); h.maxRestore != 256<<20 || DefaultMaxRestoreBytes != 256<<20 {
		t.Fatalf("default restore limit %d", h.maxRestore)
	}
	f := newFake()
	h := New(Config{Backend: f, MaxRestoreBytes: 1 << 10})
	backup := f.snapshot()
	big := append(append([]byte{}, backup...), bytes.Repeat([]byte{0}, 2<<10)...)
	r := do(t, h, "POST", "/api/v1/snapshot/restore", string(big))
	if r.status != 413 || r.code() != api.CodePayloadTooLarge {
		t.Fatalf("2 KiB backup over a 1 KiB limit: %d %s", r.status, r.raw)
	}
	req := httptest.NewRequest("POST", "/api/v1/snapshot/restore", io.MultiReader(bytes.NewReader(big)))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = -1
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Fatalf("unannounced 2 KiB backup: %d %s", rec.Code, rec.Body.String())
	}
	// Within the limit, and over the 64 KiB of other requests: accepted.
	for i := 0; i < 2000; i++ {
		if _, err := f.Propose(context.Background(), locktable.Command{Op: locktable.OpAcquire,
			Lock: fmt.Sprintf("backup/%04d", i), ClientID: "c", TTLms: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	if backup = f.snapshot(); len(backup) <= api.MaxBodyBytes {
		t.Fatalf("backup of %d bytes, want one over 64 KiB", len(backup))
	}
	h = New(Config{Backend: f, MaxRestoreBytes: 1 << 20})
	req = httptest.NewRequest("POST", "/api/v1/snapshot/restore", bytes.NewReader(backup))
	req.Header.Set("Content-Type", "application/octet-stream")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("restore within the limit: %d %s", rec.Code, rec.Body.String())
	}
}
