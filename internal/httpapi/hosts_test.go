package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// TestHostCheck (SPEC 19): a DNS-rebound page sends Host = Origin = its
// own name; every request naming a host that is not the member's is
// refused 403 permission_denied naming it — an acquire, a revoke, a
// backup, a status read, the health and metrics endpoints, a path nobody
// serves, and the WebSocket upgrade — and nothing is proposed. The
// member's own names, localhost, IP literals and --allowed-hosts names are
// served, whatever the port and case.
func TestHostCheck(t *testing.T) {
	f := newFake()
	hc, err := NewHostCheck([]string{"0.0.0.0:7070", "lockd-1.internal:7070", "https://Lockd.Example.COM:8443/"}, []string{"lb.example.net", "Scrape.Example"})
	if err != nil {
		t.Fatal(err)
	}
	h := New(Config{Backend: f, Hosts: hc, Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("m 1\n")) })})
	serve := func(method, path, host string, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	acq := `{"client_id":"c","ttl_ms":60000}`
	for _, host := range []string{"evil.example:7070", "evil.example", "EVIL.example.:80", "127.0.0.1.evil.example:7070",
		"lockd-1.internal.evil.example", "localhost.evil.example:7070", "[evil.example]:7070", "lockd-1:7070", "2130706433:7070"} {
		for _, rq := range []struct{ method, path, body string }{
			{"POST", "/api/v1/locks/victim/acquire", acq},
			{"DELETE", "/api/v1/locks/victim", ""},
			{"GET", "/api/v1/snapshot", ""},
			{"GET", "/api/v1/locks/victim", ""},
			{"GET", "/api/v1/ws", ""},
			{"GET", "/healthz", ""},
			{"GET", "/readyz", ""},
			{"GET", "/metrics", ""},
			{"GET", "/ui/", ""},
		} {
			rec := serve(rq.method, rq.path, host, rq.body)
			var er api.ErrorReply
			_ = json.Unmarshal(rec.Body.Bytes(), &er)
			if rec.Code != 403 || er.Error.Code != api.CodePermissionDenied || !strings.Contains(er.Error.Message, `"`+host+`"`) {
				t.Errorf("Host %s: %s %s = %d %s, want 403 permission_denied naming the host", host, rq.method, rq.path, rec.Code, rec.Body)
			}
		}
	}
	if n := f.proposed.Load(); n != 0 {
		t.Fatalf("%d commands proposed by refused requests", n)
	}
	for i, host := range []string{"127.0.0.1:7070", "localhost:7070", "LOCALHOST", "localhost.:9", "[::1]:7070", "10.1.2.3",
		"lockd-1.internal:7070", "lockd-1.internal:1234", "lockd.example.com:8443", "LB.example.net:443", "scrape.example", "0.0.0.0:7070", ""} {
		if rec := serve("POST", "/api/v1/locks/ok"+string(rune('a'+i))+"/acquire", host, acq); rec.Code != 200 {
			t.Errorf("Host %q: acquire = %d %s, want 200", host, rec.Code, rec.Body)
		}
		if rec := serve("GET", "/metrics", host, ""); rec.Code != 200 {
			t.Errorf("Host %q: metrics = %d %s, want 200", host, rec.Code, rec.Body)
		}
	}

	for _, host := range []string{"::1", "[fe80::1%25eth0]:7070"} {
		if err := hc.check(host); err != nil {
			t.Errorf("Host %s: %v", host, err)
		}
	}
	any, err := NewHostCheck(nil, []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	if err := any.check("evil.example:7070"); err != nil {
		t.Fatalf("--allowed-hosts '*' refused a host: %v", err)
	}
}

// TestHostCheckWebSocket: a WebSocket upgrade whose Host is foreign is
// refused before it is accepted (no 101), with the JSON error.
func TestHostCheckWebSocket(t *testing.T) {
	f := newFake()
	hc, err := NewHostCheck([]string{"127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Backend: f, Hosts: hc}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/ws"
	port := srv.URL[strings.LastIndexByte(srv.URL, ':'):]
	hdr := http.Header{"Origin": {"http://evil.example" + port}}
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr, Host: "evil.example" + port})
	if err == nil {
		c.CloseNow()
		t.Fatal("the upgrade with a foreign Host was accepted")
	}
	if resp == nil || resp.StatusCode != 403 {
		t.Fatalf("upgrade with a foreign Host: %v %v, want 403", resp, err)
	}
	c, _, err = websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("upgrade with the member's address: %v", err)
	}
	c.CloseNow()
}

func TestAllowedHostsParse(t *testing.T) {
	got, err := ParseAllowedHosts(" a.example, ,B-2.example,*,")
	if err != nil || strings.Join(got, "|") != "a.example|B-2.example|*" {
		t.Fatalf("ParseAllowedHosts = %q, %v", got, err)
	}
	for _, bad := range []string{"a.example:7070", "http://a.example", "a b", "a\x1b.example", "é.example", strings.Repeat("a", 254)} {
		if _, err := ParseAllowedHosts(bad); err == nil {
			t.Errorf("ParseAllowedHosts(%q) accepted", bad)
		}
	}
}
