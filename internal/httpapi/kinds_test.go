package httpapi

import (
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
)

// TestMultiAcquireAndValueDoors: the request bodies of POST /api/v1/acquire
// and POST /api/v1/locks/{name}/value are checked like every other (exact
// field names, SPEC limits); only the two valid requests reach the state
// machine (a multi-acquire of two free locks is granted; a value by a
// client that holds nothing is not_holder).
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
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"mode":"shared","ttl_ms":5000}`, 200, ""},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"limit":2}`, 400, api.CodeInvalidArgument},
		{"/api/v1/acquire", `{"client_id":"c","locks":["a","b"],"lock_delay_ms":60001}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/acquire", `{"client_id":"c","mode":"shared","limit":3}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/acquire", `{"client_id":"c","limit":0}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/acquire", `{"client_id":"c","limit":10001}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/acquire", `{"client_id":"c","mode":"read"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/acquire", `{"client_id":"c","value":"` + strings.Repeat("v", 4097) + `"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"Value":"v"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","value":"v"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"value":"` + strings.Repeat("v", 4097) + `"}`, 400, api.CodeInvalidArgument},
		{"/api/v1/locks/x/value", `{"client_id":"c","fencing_token":1,"value":"leader-1"}`, 409, api.CodeNotHolder},
	} {
		r := do(t, h, "POST", tc.path, tc.body)
		if r.status != tc.status || r.code() != tc.code {
			t.Errorf("POST %s %.60s: %d %s, want %d %s", tc.path, tc.body, r.status, r.raw, tc.status, tc.code)
		}
	}
	if n := f.proposed.Load(); n != 2 {
		t.Fatalf("%d commands proposed", n)
	}
}
