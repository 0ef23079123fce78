package httpapi

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/auth"
)

// TestPprof: the profiler is absent unless asked for, and with tokens on it
// answers only an admin token.
func TestPprof(t *testing.T) {
	if r := do(t, New(Config{Backend: newFake()}), "GET", "/debug/pprof/", ""); r.status != 404 {
		t.Fatalf("pprof served without Pprof: %d", r.status)
	}
	open := New(Config{Backend: newFake(), Pprof: true})
	if r := do(t, open, "GET", "/debug/pprof/", ""); r.status != 200 || !strings.Contains(r.raw, "goroutine") {
		t.Fatalf("pprof index: %d %.200s", r.status, r.raw)
	}
	if r := do(t, open, "GET", "/debug/pprof/goroutine?debug=1", ""); r.status != 200 || !strings.Contains(r.raw, "goroutine profile") {
		t.Fatalf("goroutine profile: %d %.200s", r.status, r.raw)
	}

	path := filepath.Join(t.TempDir(), "tokens.json")
	os.WriteFile(path, []byte(`{"tokens": [
	  {"name": "app", "token": "token-for-the-app-0001", "permissions": [{"prefix": "", "access": "lock"}]},
	  {"name": "ops", "token": "token-for-operators-01", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`), 0o600)
	store, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	guarded := New(Config{Backend: newFake(), Pprof: true, Auth: store})
	get := func(token string) int {
		req := httptest.NewRequest("GET", "/debug/pprof/heap?debug=1", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		guarded.ServeHTTP(rec, req)
		return rec.Code
	}
	if st := get(""); st != 401 {
		t.Fatalf("no token: %d", st)
	}
	if st := get("token-for-the-app-0001"); st != 403 {
		t.Fatalf("lock token: %d", st)
	}
	if st := get("token-for-operators-01"); st != 200 {
		t.Fatalf("admin token: %d", st)
	}
}
