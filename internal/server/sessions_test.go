package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestSessionOwnersAndQuotas, on a real member with tokens on: a session
// is its creator's (another lock token can neither delete nor keep alive
// it, so the lock it holds stays held; lock status does not show its id),
// and the leader's configured quotas bound what one lock-only token can
// create: sessions and 24-hour locks past a quota are 429
// resource_exhausted naming it, and leave room for the other tenant.
func TestSessionOwnersAndQuotas(t *testing.T) {
	const (
		tokA   = "token-for-tenant-a-01"
		tokB   = "token-for-tenant-b-01"
		tokM   = "token-for-mallory-001"
		tokOps = "token-for-operators-1"
	)
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "tenant-a", "token": "`+tokA+`", "permissions": [{"prefix": "", "access": "lock"}]},
	  {"name": "tenant-b", "token": "`+tokB+`", "permissions": [{"prefix": "", "access": "lock"}]},
	  {"name": "mallory", "token": "`+tokM+`", "permissions": [{"prefix": "m/", "access": "lock"}]},
	  {"name": "ops", "token": "`+tokOps+`", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`)
	quotas := locktable.Quotas{Sessions: 5, SessionsPerOwner: 3, Locks: 100, LocksPerOwner: 4}
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Auth, cfg.PeerToken, cfg.Quotas = store, tokOps, quotas
	}})
	l := c.WaitLeader(15 * time.Second)
	hc := &http.Client{Timeout: 10 * time.Second}
	do := func(token, method, path string, body any) (int, map[string]any) {
		t.Helper()
		return call(t, hc, method, l.URL()+path, token, body)
	}
	msg := func(body map[string]any) string {
		e, _ := body["error"].(map[string]any)
		s, _ := e["message"].(string)
		return s
	}

	// Ownership.
	st, body := do(tokA, "POST", "/api/v1/sessions", map[string]any{"client_id": "a-worker", "ttl_ms": 3600000})
	sid, _ := body["session_id"].(string)
	if st != 200 || sid == "" {
		t.Fatalf("create session: %d %v", st, body)
	}
	if st, body := do(tokA, "POST", "/api/v1/locks/billing%2Fx/acquire", map[string]any{"client_id": "a-worker", "session_id": sid}); st != 200 {
		t.Fatalf("acquire through the session: %d %v", st, body)
	}
	if st, body := do(tokM, "DELETE", "/api/v1/sessions/"+sid, nil); st != 403 || errCode(body) != "permission_denied" {
		t.Fatalf("another token deleting the session: %d %v", st, body)
	}
	if st, body := do(tokM, "POST", "/api/v1/sessions/"+sid+"/keepalive", nil); st != 403 {
		t.Fatalf("another token keeping the session alive: %d %v", st, body)
	}
	st, body = do(tokOps, "GET", "/api/v1/locks/billing%2Fx", nil)
	if st != 200 || body["held"] != true || body["client_id"] != "a-worker" {
		t.Fatalf("the lock after another token's attempts: %d %v", st, body)
	}
	if _, ok := body["session_id"]; ok {
		t.Fatalf("lock status shows the session id: %v", body)
	}

	// Quotas: tenant-a has one session and one lock so far.
	for i := 0; i < 2; i++ {
		if st, body := do(tokA, "POST", "/api/v1/sessions", map[string]any{"client_id": "a-worker", "ttl_ms": 3600000}); st != 200 {
			t.Fatalf("session %d: %d %v", i+2, st, body)
		}
	}
	st, body = do(tokA, "POST", "/api/v1/sessions", map[string]any{"client_id": "a-worker", "ttl_ms": 3600000})
	if st != 429 || errCode(body) != "resource_exhausted" || !strings.Contains(msg(body), "max-sessions-per-token (3)") {
		t.Fatalf("a fourth session of one token: %d %v", st, body)
	}
	for i := 0; i < 3; i++ {
		if st, body := do(tokA, "POST", fmt.Sprintf("/api/v1/locks/day%%2F%d/acquire", i), map[string]any{"client_id": "a", "ttl_ms": 86400000}); st != 200 {
			t.Fatalf("24-hour lock %d: %d %v", i, st, body)
		}
	}
	st, body = do(tokA, "POST", "/api/v1/locks/day%2F3/acquire", map[string]any{"client_id": "a", "ttl_ms": 86400000})
	if st != 429 || errCode(body) != "resource_exhausted" || !strings.Contains(msg(body), "max-locks-per-token (4)") {
		t.Fatalf("a fifth lock of one token: %d %v", st, body)
	}
	// The other tenant is not starved by the first, until the cluster-wide
	// quota.
	if st, body := do(tokB, "POST", "/api/v1/locks/day%2F3/acquire", map[string]any{"client_id": "b", "ttl_ms": 86400000}); st != 200 {
		t.Fatalf("the other tenant's lock: %d %v", st, body)
	}
	for i := 0; i < 2; i++ {
		if st, body := do(tokB, "POST", "/api/v1/sessions", map[string]any{"client_id": "b-worker"}); st != 200 {
			t.Fatalf("the other tenant's session %d: %d %v", i, st, body)
		}
	}
	st, body = do(tokB, "POST", "/api/v1/sessions", map[string]any{"client_id": "b-worker"})
	if st != 429 || !strings.Contains(msg(body), "max-sessions (5)") {
		t.Fatalf("a sixth session in the cluster: %d %v", st, body)
	}
	// The owner ends its session: room again.
	if st, body := do(tokA, "DELETE", "/api/v1/sessions/"+sid, nil); st != 200 {
		t.Fatalf("the owner's delete: %d %v", st, body)
	}
	if st, body := do(tokB, "POST", "/api/v1/sessions", map[string]any{"client_id": "b-worker"}); st != 200 {
		t.Fatalf("a session after one ended: %d %v", st, body)
	}
}
