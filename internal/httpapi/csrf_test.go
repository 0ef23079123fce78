package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCrossSiteRequestsRefused: a web page on another site cannot change
// state on a member (the default member has no authentication). A form
// with enctype=text/plain, a no-preflight fetch with no type, and any
// request from a foreign Origin are refused before anything is proposed;
// same-origin and non-browser requests still work.
func TestCrossSiteRequestsRefused(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	send := func(path, body string, hdr map[string]string) reply {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Host = "127.0.0.1:7070"
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return reply{status: rec.Code, raw: rec.Body.String()}
	}
	acq := `{"client_id":"evil","ttl_ms":60000}`
	for _, tc := range []struct {
		name string
		path string
		hdr  map[string]string
		want int
	}{
		{"form text/plain", "/api/v1/locks/x/acquire", map[string]string{"Content-Type": "text/plain"}, 400},
		{"form urlencoded", "/api/v1/locks/x/acquire", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 400},
		{"no content type", "/api/v1/locks/x/acquire", nil, 400},
		{"foreign origin", "/api/v1/locks/x/acquire", map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, 403},
		{"cross-site fetch", "/api/v1/locks/x/acquire", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403},
		{"restore from a form", "/api/v1/snapshot/restore?force=true", map[string]string{"Content-Type": "text/plain"}, 400},
		{"restore from a foreign origin", "/api/v1/snapshot/restore?force=true", map[string]string{"Content-Type": "application/octet-stream", "Origin": "http://evil.example"}, 403},
	} {
		body := acq
		if strings.Contains(tc.path, "restore") {
			body = string(f.snapshot())
		}
		if r := send(tc.path, body, tc.hdr); r.status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.raw, tc.want)
		}
	}
	if n := f.proposed.Load(); n != 0 {
		t.Fatalf("%d commands proposed by refused requests", n)
	}
	if r := send("/api/v1/locks/x/acquire", acq, map[string]string{"Content-Type": "application/json; charset=utf-8", "Origin": "http://127.0.0.1:7070"}); r.status != 200 {
		t.Fatalf("same-origin acquire: %d %s", r.status, r.raw)
	}
	if r := send("/api/v1/locks/y/acquire", acq, map[string]string{"Content-Type": "application/json"}); r.status != 200 {
		t.Fatalf("acquire without Origin: %d %s", r.status, r.raw)
	}
}
