package httpapi

import (
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
)

// TestMultiAcquireAndValueDoors: the request bodies of POST /api/v1/acquire
// and POST /api/v1/locks/{name}/value are checked like every other (exact
// field names, SPEC limits); a valid request is answered 404 not_found —
// the state machine does not serve them yet — and nothing is proposed.
func TestMultiAcquireAndValueDoors(t *testing.T) {
	f := newFake()
	h := New(Config{Backend: f})
	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/api/v1/acquire", `{"client_id":"c","LOCKS":["a","b"]}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a"]}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","a"]}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b c"]}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"mode":"both"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"ttl_ms":1}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"mode":"shared","ttl_ms":5000}`, 404, api.CodeNotFound},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"Value":"v"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","value":"v"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"value":"` + strings.Repeat("v", 4097) + `"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"value":"leader-1"}`, 404, api.CodeNotFound},
	} {
		r := do(t, h, "POST", tc.path, tc.body)
		if r.status != tc.status || r.code() != tc.code {
			t.Errorf("POST %s %.60s: %d %s, want %d %s", tc.path, tc.body, r.status, r.raw, tc.status, tc.code)
		}
	}
	if n := f.proposed.Load(); n != 0 {
		t.Fatalf("%d commands proposed", n)
	}
}
