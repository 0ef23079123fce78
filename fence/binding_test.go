package fence

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// signedWrite is the headers of a write under lock with token, proved by
// a proof of an exclusive grant expiring at exp.
func signedWrite(lock string, token uint64, exp time.Time) []string {
	_, priv := testKey()
	return []string{HeaderToken, uitoa(token), HeaderLock, lock, HeaderProof, Sign(priv, lock, token, exp.UnixMilli())}
}

// TestServerProofForOneLockCannotWriteAnotherKey is the reported attack: a
// tenant limited to lock prefix a/ acquired a/x (its token is higher than
// billing's: tokens are global), released it, waited out its TTL, and
// wrote key ledger, guarded by billing/ledger, with that old proof. The
// write must be refused (403) and change nothing, and billing's live
// holder must go on writing.
func TestServerProofForOneLockCannotWriteAnotherKey(t *testing.T) {
	pub, _ := testKey()
	h := newTestServer(t, ServerConfig{VerifyKey: pub})
	live := time.Now().Add(time.Minute)

	wantWrite(t, put(h, "ledger", "balance 100", signedWrite("billing/ledger", 10, live)...), 10)

	for _, tc := range []struct {
		name    string
		headers []string
	}{
		{"expired proof of a/x", signedWrite("a/x", 20, time.Now().Add(-time.Second))},
		{"live proof of a/x", signedWrite("a/x", 21, live)},
		{"proof of a/x sent as billing/ledger", append(signedWrite("a/x", 22, live)[:2], HeaderLock, "billing/ledger", HeaderProof, signedWrite("a/x", 22, live)[5])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, put(h, "ledger", "balance 0", tc.headers...), 403, api.CodePermissionDenied, "")
			wantValue(t, h, "ledger", "balance 100", 10)
		})
	}
	// Billing's holder is not fenced out by the tenant's token.
	wantWrite(t, put(h, "ledger", "balance 90", signedWrite("billing/ledger", 10, live)...), 10)
	wantWrite(t, put(h, "ledger", "balance 80", signedWrite("billing/ledger", 30, live)...), 30)
	wantValue(t, h, "ledger", "balance 80", 30)
}

// TestServerRefusesExpiredProof: with a verify key, a proof whose grant has
// expired is refused even when its token is still the highest.
func TestServerRefusesExpiredProof(t *testing.T) {
	pub, _ := testKey()
	h := newTestServer(t, ServerConfig{VerifyKey: pub})
	wantWrite(t, put(h, "x", "v1", signedWrite("res", 7, time.Now().Add(time.Minute))...), 7)
	wantError(t, put(h, "x", "late", signedWrite("res", 7, time.Now().Add(-time.Second))...), 403, api.CodePermissionDenied, "expired")
	wantError(t, put(h, "x", "late", signedWrite("res", 8, time.Now().Add(-time.Second))...), 403, api.CodePermissionDenied, "expired")
	wantValue(t, h, "x", "v1", 7)
}

// TestServerProofExpiryEdges pins the clock: a proof is good until the
// millisecond before its expiry; a grant without an expiry of its own
// (expiry 0: a session lock without TTL) never expires; a stale token
// whose proof has also expired is answered as stale.
func TestServerProofExpiryEdges(t *testing.T) {
	pub, priv := testKey()
	now := time.UnixMilli(1_800_000_000_000)
	h := newTestServer(t, ServerConfig{VerifyKey: pub, Now: func() time.Time { return now }})
	wantWrite(t, put(h, "x", "v5", signedWrite("res", 5, now.Add(time.Millisecond))...), 5)
	wantError(t, put(h, "x", "v6", signedWrite("res", 6, now)...), 403, api.CodePermissionDenied, "expired")
	noExpiry := []string{HeaderToken, "6", HeaderLock, "res", HeaderProof, Sign(priv, "res", 6, 0)}
	wantWrite(t, put(h, "x", "v6", noExpiry...), 6)
	w := put(h, "x", "old", signedWrite("res", 5, now.Add(-time.Hour))...)
	wantError(t, w, 409, api.CodeStaleToken, "5")
	wantValue(t, h, "x", "v6", 6)
}

// TestServerRefusesSharedProof: a shared grant's proof is valid, and a
// reader's: it never writes.
func TestServerRefusesSharedProof(t *testing.T) {
	pub, priv := testKey()
	h := newTestServer(t, ServerConfig{VerifyKey: pub})
	exp := time.Now().Add(time.Minute).UnixMilli()
	wantWrite(t, put(h, "x", "by the writer", signedWrite("res", 7, time.UnixMilli(exp))...), 7)
	shared := SignGrant(priv, Grant{Lock: "res", Token: 8, Mode: ModeShared, ExpiresAt: exp})
	wantError(t, put(h, "x", "by a reader", HeaderToken, "8", HeaderLock, "res", HeaderProof, shared), 403, api.CodePermissionDenied, "shared")
	wantError(t, put(h, "fresh", "by a reader", HeaderToken, "8", HeaderLock, "res", HeaderProof, shared), 403, api.CodePermissionDenied, "shared")
	wantValue(t, h, "x", "by the writer", 7)
	if w := serve(h, req("GET", "/v1/objects/fresh", "")); w.Code != 404 || w.Header().Get(HeaderToken) != "" {
		t.Fatalf("a reader's refused write left a record: %d %q", w.Code, w.Header().Get(HeaderToken))
	}
}

// TestServerGuards: --guard PREFIX=LOCK binds keys before any write, the
// longest matching prefix wins, and a guard overrides a binding made by an
// earlier first write.
func TestServerGuards(t *testing.T) {
	pub, _ := testKey()
	live := time.Now().Add(time.Minute)
	store := NewMemoryStore()
	// Before the guards exist, "report" is bound by its first write.
	h := newTestServer(t, ServerConfig{Store: store, VerifyKey: pub})
	wantWrite(t, put(h, "report", "r1", signedWrite("reports/old", 3, live)...), 3)

	guards, err := NewGuards(
		Guard{Prefix: "ledger", Lock: "billing/ledger"},
		Guard{Prefix: "ledger/eu", Lock: "billing/eu"}, // a key is matched as decoded: ledger%2Feu%2Fde is ledger/eu/de
		Guard{Prefix: "report", Lock: "reports/new"},
	)
	if err != nil {
		t.Fatal(err)
	}
	h = newTestServer(t, ServerConfig{Store: store, VerifyKey: pub, Guards: guards})
	// A guarded key cannot be claimed by the first writer.
	wantError(t, put(h, "ledger", "evil", signedWrite("a/x", 20, live)...), 403, api.CodePermissionDenied, "billing/ledger")
	wantWrite(t, put(h, "ledger", "l1", signedWrite("billing/ledger", 10, live)...), 10)
	wantWrite(t, put(h, "ledger-2024", "l2", signedWrite("billing/ledger", 10, live)...), 10)
	// The longest prefix wins.
	wantError(t, put(h, "ledger%2Feu%2Fde", "x", signedWrite("billing/ledger", 11, live)...), 403, api.CodePermissionDenied, "billing/eu")
	wantWrite(t, put(h, "ledger%2Feu%2Fde", "eu", signedWrite("billing/eu", 11, live)...), 11)
	// An unguarded key is still bound by its first write.
	wantWrite(t, put(h, "notes", "n", signedWrite("notes/lock", 12, live)...), 12)
	wantError(t, put(h, "notes", "n", signedWrite("a/x", 20, live)...), 403, api.CodePermissionDenied, "notes/lock")
	// The guard wins over the earlier binding.
	wantError(t, put(h, "report", "r2", signedWrite("reports/old", 4, live)...), 403, api.CodePermissionDenied, "reports/new")
	wantWrite(t, put(h, "report", "r2", signedWrite("reports/new", 4, live)...), 4)
	// Without proofs, the guard still needs its lock named.
	plain := newTestServer(t, ServerConfig{Guards: guards})
	wantError(t, put(plain, "ledger", "v", HeaderToken, "1"), 403, api.CodePermissionDenied, "billing/ledger")
	wantWrite(t, put(plain, "ledger", "v", HeaderToken, "1", HeaderLock, "billing/ledger"), 1)

	for key, lock := range map[string]string{"ledger": "billing/ledger", "ledger%2Feu%2Fde": "billing/eu", "notes": "notes/lock", "report": "reports/new"} {
		if w := serve(h, req("GET", "/v1/objects/"+key, "")); w.Header().Get(HeaderLock) != lock {
			t.Errorf("GET %s: Fencing-Lock %q, want %q", key, w.Header().Get(HeaderLock), lock)
		}
	}
}

// TestServerFirstWriteBindsKey without proofs: the first write naming a
// lock binds the key; a write naming another lock, or none, is refused
// whatever its token; a key written without a lock stays unbound.
func TestServerFirstWriteBindsKey(t *testing.T) {
	h := newTestServer(t, ServerConfig{})
	wantWrite(t, put(h, "k", "v1", HeaderToken, "5", HeaderLock, "L1"), 5)
	wantError(t, put(h, "k", "v2", HeaderToken, "99", HeaderLock, "L2"), 403, api.CodePermissionDenied, "L1")
	wantError(t, put(h, "k", "v2", HeaderToken, "99"), 403, api.CodePermissionDenied, "L1")
	wantValue(t, h, "k", "v1", 5)
	wantWrite(t, put(h, "k", "v3", HeaderToken, "6", HeaderLock, "L1"), 6)

	wantWrite(t, put(h, "u", "v1", HeaderToken, "1"), 1)
	if w := serve(h, req("GET", "/v1/objects/u", "")); w.Header().Get(HeaderLock) != "" {
		t.Fatalf("a lockless write bound the key to %q", w.Header().Get(HeaderLock))
	}
}

// TestServerBindingSurvivesRestart: the binding is in the bbolt file with
// the token and the value.
func TestServerBindingSurvivesRestart(t *testing.T) {
	pub, _ := testKey()
	live := time.Now().Add(time.Minute)
	path := filepath.Join(t.TempDir(), "fencestore.db")
	store, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestServer(t, ServerConfig{Store: store, VerifyKey: pub})
	wantWrite(t, put(h, "ledger", "v10", signedWrite("billing/ledger", 10, live)...), 10)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	h = newTestServer(t, ServerConfig{Store: openBolt(t, path), VerifyKey: pub})
	wantError(t, put(h, "ledger", "evil", signedWrite("a/x", 20, live)...), 403, api.CodePermissionDenied, "billing/ledger")
	wantValue(t, h, "ledger", "v10", 10)
	wantWrite(t, put(h, "ledger", "v11", signedWrite("billing/ledger", 11, live)...), 11)
}

// TestServerAdminReset: without proofs any client can send the largest
// token and block a key for good; DELETE /v1/objects/{key}/fence with the
// admin token is the way out.
func TestServerAdminReset(t *testing.T) {
	const admin = "0123456789abcdef-admin"
	const maxToken = "18446744073709551615"
	reset := func(h http.Handler, key, query, bearer string) *httptest.ResponseRecorder {
		r := req("DELETE", "/v1/objects/"+key+"/fence"+query, "")
		if bearer != "" {
			r.Header.Set("Authorization", "Bearer "+bearer)
		}
		return serve(h, r)
	}

	t.Run("off without an admin token", func(t *testing.T) {
		h := newTestServer(t, ServerConfig{})
		wantWrite(t, put(h, "k", "blocked", HeaderToken, maxToken), ^uint64(0))
		wantError(t, put(h, "k", "v", HeaderToken, "5"), 409, api.CodeStaleToken, "5")
		wantError(t, reset(h, "k", "", admin), 403, api.CodePermissionDenied, "--admin-token-file")
	})

	h := newTestServer(t, ServerConfig{AdminToken: admin})
	wantWrite(t, put(h, "k", "blocked", HeaderToken, maxToken, HeaderLock, "wrong"), ^uint64(0))
	wantError(t, put(h, "k", "v", HeaderToken, "5", HeaderLock, "right"), 403, api.CodePermissionDenied, "wrong")

	w := reset(h, "k", "", "")
	wantError(t, w, 401, api.CodeUnauthenticated, "Bearer")
	if w.Header().Get("WWW-Authenticate") == "" {
		t.Fatal("401 without WWW-Authenticate")
	}
	wantError(t, reset(h, "k", "", admin+"x"), 401, api.CodeUnauthenticated, "")
	wantError(t, reset(h, "k", "?fencing_token=abc", admin), 400, api.CodeInvalidArgument, "fencing_token")
	if w := serve(h, req("POST", "/v1/objects/k/fence", "")); w.Code != 405 || w.Header().Get("Allow") != "DELETE" {
		t.Fatalf("POST .../fence: %d, Allow %q", w.Code, w.Header().Get("Allow"))
	}
	wantValue(t, h, "k", "blocked", ^uint64(0))

	w = reset(h, "k", "?fencing_token=7", admin)
	if w.Code != 200 {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	var reply ResetReply
	if err := json.Unmarshal(w.Body.Bytes(), &reply); err != nil {
		t.Fatal(err)
	}
	if reply != (ResetReply{OK: true, FencingToken: 7, PreviousToken: ^uint64(0), PreviousLock: "wrong"}) {
		t.Fatalf("reset reply %s", w.Body)
	}
	wantValue(t, h, "k", "blocked", 7) // the value stays until the next write
	wantError(t, put(h, "k", "v", HeaderToken, "6", HeaderLock, "right"), 409, api.CodeStaleToken, "6")
	wantWrite(t, put(h, "k", "v", HeaderToken, "7", HeaderLock, "right"), 7)
	wantError(t, put(h, "k", "v", HeaderToken, "8", HeaderLock, "wrong"), 403, api.CodePermissionDenied, "right")

	w = reset(h, "k", "", admin)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"fencing_token":0`) {
		t.Fatalf("reset to 0: %d %s", w.Code, w.Body)
	}
	wantWrite(t, put(h, "k", "v", HeaderToken, "1", HeaderLock, "any"), 1)

	if _, err := NewServer(ServerConfig{Store: NewMemoryStore(), AdminToken: "short"}); err == nil {
		t.Fatal("NewServer accepted a 5-byte admin token")
	}
}
