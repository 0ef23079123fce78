package fence

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// resource is a toy fenced service: PUT stores the body under the path,
// GET returns it. It records the token of every write it applies.
type resource struct {
	mu      sync.Mutex
	values  map[string]string
	applied []uint64
}

func newResource() *resource { return &resource{values: map[string]string{}} }

func (rs *resource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		rs.mu.Lock()
		v, ok := rs.values[r.URL.Path]
		rs.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, v)
	default:
		adm, ok := FromContext(r.Context())
		if !ok {
			http.Error(w, "no admission in context", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		rs.mu.Lock()
		rs.values[r.URL.Path] = string(body)
		rs.applied = append(rs.applied, adm.Token)
		rs.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

func (rs *resource) value(path string) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.values[path]
}

// req builds a request; headers alternate name, value.
func req(method, path, body string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// wantError checks a JSON error reply.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, code, mention string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	var reply struct {
		Error        api.Error `json:"error"`
		HighestToken *uint64   `json:"highest_token"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &reply); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	if reply.Error.Code != code {
		t.Fatalf("code = %q, want %q; body %s", reply.Error.Code, code, w.Body)
	}
	if !strings.Contains(reply.Error.Message, mention) {
		t.Fatalf("message %q does not mention %q", reply.Error.Message, mention)
	}
	if (code == api.CodeStaleToken) != (reply.HighestToken != nil) {
		t.Fatalf("highest_token present = %v for code %s", reply.HighestToken != nil, code)
	}
}

func TestMiddleware(t *testing.T) {
	tok := func(n uint64) []string { return []string{HeaderToken, uitoa(n)} }
	tests := []struct {
		name string
		run  func(t *testing.T, h http.Handler, rs *resource)
	}{
		{"stale token gets 409 and the value stays", func(t *testing.T, h http.Handler, rs *resource) {
			if w := serve(h, req("PUT", "/x", "new", tok(6)...)); w.Code != 204 {
				t.Fatalf("token 6: %d %s", w.Code, w.Body)
			}
			w := serve(h, req("PUT", "/x", "old", tok(5)...))
			wantError(t, w, 409, api.CodeStaleToken, "5")
			var reply StaleTokenReply
			_ = json.Unmarshal(w.Body.Bytes(), &reply)
			if reply.HighestToken != 6 {
				t.Fatalf("highest_token = %d, want 6", reply.HighestToken)
			}
			if v := rs.value("/x"); v != "new" {
				t.Fatalf("value = %q, want new", v)
			}
		}},
		{"equal token accepted", func(t *testing.T, h http.Handler, rs *resource) {
			for _, body := range []string{"one", "two"} {
				if w := serve(h, req("PUT", "/x", body, tok(6)...)); w.Code != 204 {
					t.Fatalf("%s: %d %s", body, w.Code, w.Body)
				}
			}
			if v := rs.value("/x"); v != "two" {
				t.Fatalf("value = %q, want two", v)
			}
		}},
		{"every write method is fenced", func(t *testing.T, h http.Handler, rs *resource) {
			_ = serve(h, req("PUT", "/x", "v", tok(9)...))
			for _, m := range []string{"POST", "PATCH", "DELETE"} {
				wantError(t, serve(h, req(m, "/x", "old", tok(8)...)), 409, api.CodeStaleToken, "8")
				wantError(t, serve(h, req(m, "/x", "old")), 400, api.CodeInvalidArgument, HeaderToken)
			}
		}},
		{"reads pass through", func(t *testing.T, h http.Handler, rs *resource) {
			_ = serve(h, req("PUT", "/x", "v", tok(1)...))
			if w := serve(h, req("GET", "/x", "")); w.Code != 200 || w.Body.String() != "v" {
				t.Fatalf("GET: %d %s", w.Code, w.Body)
			}
		}},
		{"paths are separate resources", func(t *testing.T, h http.Handler, rs *resource) {
			_ = serve(h, req("PUT", "/a", "a", tok(100)...))
			if w := serve(h, req("PUT", "/b", "b", tok(1)...)); w.Code != 204 {
				t.Fatalf("/b: %d %s", w.Code, w.Body)
			}
		}},
		{"missing token gets 400", func(t *testing.T, h http.Handler, rs *resource) {
			wantError(t, serve(h, req("PUT", "/x", "v")), 400, api.CodeInvalidArgument, HeaderToken)
			if _, ok := rs.values["/x"]; ok {
				t.Fatal("write without token applied")
			}
		}},
		{"malformed tokens get 400", func(t *testing.T, h http.Handler, rs *resource) {
			for _, bad := range []string{"", "abc", "-1", "1.5", "99999999999999999999999", " 7x"} {
				wantError(t, serve(h, req("PUT", "/x", "v", HeaderToken, bad)), 400, api.CodeInvalidArgument, HeaderToken)
			}
			wantError(t, serve(h, req("PUT", "/x", "v", HeaderToken, "1", HeaderToken, "2")),
				400, api.CodeInvalidArgument, HeaderToken)
			wantError(t, serve(h, req("PUT", "/x", "v", HeaderToken, "1", HeaderLock, "bad lock")),
				400, api.CodeInvalidArgument, HeaderLock)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := newResource()
			tc.run(t, Middleware(NewChecker(NewMemoryStore()))(rs), rs)
		})
	}
}

func TestMiddlewareProofs(t *testing.T) {
	pub, priv := testKey()
	forger := ed25519.NewKeyFromSeed([]byte("someone-else-seed-0123456789abcd"))
	exp := time.Now().Add(time.Hour).UnixMilli()
	good := Sign(priv, "res", 7, exp)
	tests := []struct {
		name    string
		headers []string
		status  int
		code    string
		mention string
	}{
		{"valid proof", []string{HeaderToken, "7", HeaderLock, "res", HeaderProof, good}, 204, "", ""},
		{"missing proof", []string{HeaderToken, "7", HeaderLock, "res"}, 403, api.CodePermissionDenied, HeaderProof},
		{"token and nothing else", []string{HeaderToken, "7"}, 403, api.CodePermissionDenied, HeaderProof},
		{"missing lock", []string{HeaderToken, "7", HeaderProof, good}, 403, api.CodePermissionDenied, HeaderLock},
		{"forged by another key", []string{HeaderToken, "7", HeaderLock, "res", HeaderProof, Sign(forger, "res", 7, exp)}, 403, api.CodePermissionDenied, HeaderProof},
		{"proof for another token", []string{HeaderToken, "8", HeaderLock, "res", HeaderProof, good}, 403, api.CodePermissionDenied, HeaderProof},
		{"proof for another lock", []string{HeaderToken, "7", HeaderLock, "other", HeaderProof, good}, 403, api.CodePermissionDenied, HeaderProof},
		{"garbage proof", []string{HeaderToken, "7", HeaderLock, "res", HeaderProof, "xyz"}, 403, api.CodePermissionDenied, HeaderProof},
		{"missing token is still 400", []string{HeaderLock, "res", HeaderProof, good}, 400, api.CodeInvalidArgument, HeaderToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := newResource()
			h := Middleware(NewChecker(nil), WithVerifyKey(pub))(rs)
			w := serve(h, req("PUT", "/x", "v", tc.headers...))
			if tc.status == 204 {
				if w.Code != 204 {
					t.Fatalf("status %d %s", w.Code, w.Body)
				}
				return
			}
			wantError(t, w, tc.status, tc.code, tc.mention)
			if len(rs.applied) != 0 {
				t.Fatal("refused write reached the handler")
			}
		})
	}

	t.Run("expired proofs refused unless WithoutProofExpiry", func(t *testing.T) {
		now := time.UnixMilli(exp)
		clock := WithProofExpiry(func() time.Time { return now })
		past := []string{HeaderToken, "7", HeaderLock, "res", HeaderProof, good}
		h := Middleware(nil, WithVerifyKey(pub), clock)(newResource())
		wantError(t, serve(h, req("PUT", "/x", "v", past...)), 403, api.CodePermissionDenied, "expired")
		// Without a clock option the real one is used: a proof that
		// expired a second ago is refused too.
		h = Middleware(nil, WithVerifyKey(pub))(newResource())
		old := []string{HeaderToken, "7", HeaderLock, "res", HeaderProof, Sign(priv, "res", 7, time.Now().Add(-time.Second).UnixMilli())}
		wantError(t, serve(h, req("PUT", "/x", "v", old...)), 403, api.CodePermissionDenied, "expired")
		h = Middleware(nil, WithVerifyKey(pub), clock, WithoutProofExpiry())(newResource())
		if w := serve(h, req("PUT", "/x", "v", past...)); w.Code != 204 {
			t.Fatalf("with WithoutProofExpiry: %d %s", w.Code, w.Body)
		}
	})

	t.Run("stale token with an expired proof is stale", func(t *testing.T) {
		now := time.UnixMilli(exp)
		h := Middleware(nil, WithVerifyKey(pub), WithProofExpiry(func() time.Time { return now }))(newResource())
		if w := serve(h, req("PUT", "/x", "v", HeaderToken, "9", HeaderLock, "res", HeaderProof, Sign(priv, "res", 9, exp+1))); w.Code != 204 {
			t.Fatalf("token 9: %d %s", w.Code, w.Body)
		}
		wantError(t, serve(h, req("PUT", "/x", "v", HeaderToken, "7", HeaderLock, "res", HeaderProof, good)), 409, api.CodeStaleToken, "7")
	})

	t.Run("shared grant's proof refused", func(t *testing.T) {
		rs := newResource()
		h := Middleware(nil, WithVerifyKey(pub))(rs)
		shared := SignGrant(priv, Grant{Lock: "res", Token: 7, Mode: ModeShared, ExpiresAt: exp})
		wantError(t, serve(h, req("PUT", "/x", "v", HeaderToken, "7", HeaderLock, "res", HeaderProof, shared)), 403, api.CodePermissionDenied, "shared")
		if len(rs.applied) != 0 {
			t.Fatal("a reader's write reached the handler")
		}
	})
}

// TestMiddlewareBindsKeysToLocks: the middleware's version of the
// reported attack, with first-write binding in its store, with WithGuards
// (longest prefix) and with WithLockFunc.
func TestMiddlewareBindsKeysToLocks(t *testing.T) {
	pub, priv := testKey()
	live := time.Now().Add(time.Hour).UnixMilli()
	write := func(lock string, token uint64, exp int64) []string {
		return []string{HeaderToken, uitoa(token), HeaderLock, lock, HeaderProof, Sign(priv, lock, token, exp)}
	}
	wantApplied := func(t *testing.T, w *httptest.ResponseRecorder) {
		t.Helper()
		if w.Code != 204 {
			t.Fatalf("status %d %s, want 204", w.Code, w.Body)
		}
	}

	t.Run("first write binds", func(t *testing.T) {
		rs := newResource()
		h := Middleware(nil, WithVerifyKey(pub))(rs)
		wantApplied(t, serve(h, req("PUT", "/ledger", "balance 100", write("billing/ledger", 10, live)...)))
		wantError(t, serve(h, req("PUT", "/ledger", "balance 0", write("a/x", 20, time.Now().Add(-time.Second).UnixMilli())...)), 403, api.CodePermissionDenied, "billing/ledger")
		wantError(t, serve(h, req("PUT", "/ledger", "balance 0", write("a/x", 21, live)...)), 403, api.CodePermissionDenied, "billing/ledger")
		wantApplied(t, serve(h, req("PUT", "/ledger", "balance 90", write("billing/ledger", 10, live)...)))
		if v := rs.value("/ledger"); v != "balance 90" {
			t.Fatalf("value = %q", v)
		}
	})

	t.Run("guards", func(t *testing.T) {
		g, err := NewGuards(Guard{Prefix: "/ledger", Lock: "billing/ledger"}, Guard{Prefix: "/ledger/eu", Lock: "billing/eu"})
		if err != nil {
			t.Fatal(err)
		}
		rs := newResource()
		h := Middleware(nil, WithVerifyKey(pub), WithGuards(g))(rs)
		wantError(t, serve(h, req("PUT", "/ledger", "evil", write("a/x", 20, live)...)), 403, api.CodePermissionDenied, "billing/ledger")
		wantError(t, serve(h, req("PUT", "/ledger/eu/de", "x", write("billing/ledger", 10, live)...)), 403, api.CodePermissionDenied, "billing/eu")
		wantApplied(t, serve(h, req("PUT", "/ledger/eu/de", "x", write("billing/eu", 10, live)...)))
		wantApplied(t, serve(h, req("PUT", "/ledger/us", "y", write("billing/ledger", 11, live)...)))
		wantApplied(t, serve(h, req("PUT", "/notes", "n", write("a/x", 20, live)...))) // unguarded: first write binds
		if len(rs.applied) != 3 {
			t.Fatalf("applied %v", rs.applied)
		}
	})

	t.Run("lock func", func(t *testing.T) {
		h := Middleware(nil, WithLockFunc(func(r *http.Request, key string) string {
			return "tenant/" + r.URL.Query().Get("tenant")
		}))(newResource())
		wantApplied(t, serve(h, req("PUT", "/x?tenant=a", "v", HeaderToken, "1", HeaderLock, "tenant/a")))
		wantError(t, serve(h, req("PUT", "/x?tenant=b", "v", HeaderToken, "2", HeaderLock, "tenant/a")), 403, api.CodePermissionDenied, "tenant/b")
		wantError(t, serve(h, req("PUT", "/x?tenant=a", "v", HeaderToken, "2")), 403, api.CodePermissionDenied, "tenant/a")
	})
}

func TestMiddlewareKeyFuncAndAdmission(t *testing.T) {
	var got Admission
	h := Middleware(nil,
		WithKeyFunc(func(r *http.Request) string { return "tenant:" + r.URL.Query().Get("t") }),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = FromContext(r.Context())
	}))
	if w := serve(h, req("PUT", "/a?t=1", "", HeaderToken, "10", HeaderLock, "L")); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if want := (Admission{Key: "tenant:1", Token: 10, Lock: "L"}); got != want {
		t.Fatalf("admission = %+v, want %+v", got, want)
	}
	// another path, same key: same token sequence, and the same lock
	wantError(t, serve(h, req("PUT", "/b?t=1", "", HeaderToken, "9", HeaderLock, "L")), 409, api.CodeStaleToken, "9")
	wantError(t, serve(h, req("PUT", "/b?t=1", "", HeaderToken, "11", HeaderLock, "M")), 403, api.CodePermissionDenied, "L")

	// With a proof, the Admission carries the grant's mode and expiry.
	pub, priv := testKey()
	h = Middleware(nil, WithVerifyKey(pub))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = FromContext(r.Context())
	}))
	exp := time.Now().Add(time.Hour).UnixMilli()
	if w := serve(h, req("PUT", "/p", "", HeaderToken, "3", HeaderLock, "L", HeaderProof, Sign(priv, "L", 3, exp))); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if want := (Admission{Key: "/p", Token: 3, Lock: "L", Mode: ModeExclusive, ProofExpiresAt: exp}); got != want {
		t.Fatalf("admission = %+v, want %+v", got, want)
	}
}

// TestMiddlewareConcurrentWritersNeverGoBackwards races writers with tokens
// 1..n on one path. Admission must never let a lower token in after a
// higher one; with WithSerializedWrites the applied writes are in token
// order and the final value is the highest token's.
func TestMiddlewareConcurrentWritersNeverGoBackwards(t *testing.T) {
	for _, serialized := range []bool{false, true} {
		t.Run(fmt.Sprintf("serialized=%v", serialized), func(t *testing.T) {
			const rounds, writers = 30, 8
			for round := 0; round < rounds; round++ {
				rec := &recordingStore{Store: NewMemoryStore()}
				rs := newResource()
				var opts []Option
				if serialized {
					opts = append(opts, WithSerializedWrites())
				}
				srv := httptest.NewServer(Middleware(NewChecker(rec), opts...)(rs))
				var wg sync.WaitGroup
				for i := writers; i >= 1; i-- {
					token := uint64(i)
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, _ := http.NewRequest("PUT", srv.URL+"/x", strings.NewReader(uitoa(token)))
						r.Header.Set(HeaderToken, uitoa(token))
						resp, err := srv.Client().Do(r)
						if err != nil {
							t.Error(err)
							return
						}
						_ = resp.Body.Close()
						if resp.StatusCode != 204 && resp.StatusCode != 409 {
							t.Errorf("token %d: status %d", token, resp.StatusCode)
						}
						if token == writers && resp.StatusCode != 204 {
							t.Errorf("the highest token was refused")
						}
					}()
				}
				wg.Wait()
				srv.Close()
				if !nonDecreasing(rec.admitted()) {
					t.Fatalf("round %d: admitted out of order: %v", round, rec.admitted())
				}
				if serialized {
					if !nonDecreasing(rs.applied) {
						t.Fatalf("round %d: applied out of order: %v", round, rs.applied)
					}
					if v := rs.value("/x"); v != uitoa(writers) {
						t.Fatalf("round %d: value = %q, want %d", round, v, writers)
					}
				}
			}
		})
	}
}

// recordingStore logs the tokens its Store admitted, in admission order.
// Its lock only makes the log's order the admission order; the inner
// store's own atomicity is tested by TestStoreConcurrentWritersNeverGoBackwards.
type recordingStore struct {
	Store
	mu  sync.Mutex
	log []uint64
}

func (s *recordingStore) Admit(key string, w Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.Store.Admit(key, w)
	if err == nil {
		s.log = append(s.log, w.Token)
	}
	return err
}

func (s *recordingStore) admitted() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.log...)
}

func nonDecreasing(xs []uint64) bool {
	for i := 1; i < len(xs); i++ {
		if xs[i] < xs[i-1] {
			return false
		}
	}
	return true
}

func TestMiddlewareLogsRefusals(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil))
	h := Middleware(nil, WithLogger(logger))(newResource())
	_ = serve(h, req("PUT", "/x", "v", HeaderToken, "9", HeaderLock, "res"))
	_ = serve(h, req("PUT", "/x", "v", HeaderToken, "8", HeaderLock, "res"))
	_ = serve(h, req("PUT", "/x", "v"))
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{`"msg":"stale fencing token refused"`, `"token":8`, `"highest":9`, `"code":"invalid_argument"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, buf.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
