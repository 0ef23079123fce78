package fence

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

func newTestServer(t *testing.T, cfg ServerConfig) http.Handler {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = NewMemoryStore()
	}
	h, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func put(h http.Handler, key, value string, headers ...string) *httptest.ResponseRecorder {
	return serve(h, req("PUT", "/v1/objects/"+key, value, headers...))
}

func wantWrite(t *testing.T, w *httptest.ResponseRecorder, token uint64) {
	t.Helper()
	if w.Code != 200 {
		t.Fatalf("PUT: %d %s", w.Code, w.Body)
	}
	var reply WriteReply
	if err := json.Unmarshal(w.Body.Bytes(), &reply); err != nil {
		t.Fatal(err)
	}
	if !reply.OK || reply.FencingToken != token {
		t.Fatalf("reply = %s, want ok with fencing_token %d", w.Body, token)
	}
	if !bytes.Contains(w.Body.Bytes(), []byte(`"ok":true`)) {
		t.Fatalf("reply %s lacks \"ok\":true", w.Body)
	}
}

func wantValue(t *testing.T, h http.Handler, key, value string, token uint64) {
	t.Helper()
	w := serve(h, req("GET", "/v1/objects/"+key, ""))
	if w.Code != 200 || w.Body.String() != value || w.Header().Get(HeaderToken) != uitoa(token) {
		t.Fatalf("GET %s = %d %q token %q; want 200 %q token %d",
			key, w.Code, w.Body, w.Header().Get(HeaderToken), value, token)
	}
}

func TestServer(t *testing.T) {
	tok := func(n uint64) []string { return []string{HeaderToken, uitoa(n), HeaderLock, "res"} }
	tests := []struct {
		name string
		run  func(t *testing.T, h http.Handler)
	}{
		{"put then get", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "hello", tok(3)...), 3)
			wantValue(t, h, "x", "hello", 3)
		}},
		{"stale token gets 409 with highest_token and the value stays", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "from-B", tok(6)...), 6)
			w := put(h, "x", "from-A", tok(5)...)
			wantError(t, w, 409, api.CodeStaleToken, "5")
			var reply StaleTokenReply
			if err := json.Unmarshal(w.Body.Bytes(), &reply); err != nil || reply.HighestToken != 6 {
				t.Fatalf("reply %s: highest_token want 6", w.Body)
			}
			wantValue(t, h, "x", "from-B", 6)
		}},
		{"equal token accepted", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "one", tok(6)...), 6)
			wantWrite(t, put(h, "x", "two", tok(6)...), 6)
			wantValue(t, h, "x", "two", 6)
		}},
		{"higher token accepted", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "one", tok(6)...), 6)
			wantWrite(t, put(h, "x", "two", tok(60)...), 60)
			wantValue(t, h, "x", "two", 60)
		}},
		{"Fencing-Lock is optional without a verify key", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "v", HeaderToken, "1"), 1)
		}},
		{"missing token gets 400", func(t *testing.T, h http.Handler) {
			wantError(t, put(h, "y", "x"), 400, api.CodeInvalidArgument, HeaderToken)
			wantError(t, serve(h, req("GET", "/v1/objects/y", "")), 404, api.CodeNotFound, "y")
		}},
		{"malformed token gets 400", func(t *testing.T, h http.Handler) {
			for _, bad := range []string{"", "x", "-3", "3.0", "18446744073709551616"} {
				wantError(t, put(h, "y", "x", HeaderToken, bad), 400, api.CodeInvalidArgument, HeaderToken)
			}
		}},
		{"get of an absent key gets 404", func(t *testing.T, h http.Handler) {
			wantError(t, serve(h, req("GET", "/v1/objects/nope", "")), 404, api.CodeNotFound, "nope")
		}},
		{"empty value", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "x", "", tok(1)...), 1)
			wantValue(t, h, "x", "", 1)
		}},
		{"binary value", func(t *testing.T, h http.Handler) {
			v := "\x00\xff\x01binary"
			wantWrite(t, put(h, "x", v, tok(1)...), 1)
			wantValue(t, h, "x", v, 1)
		}},
		{"escaped slash in key", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "jobs%2Fnightly", "v", tok(1)...), 1)
			wantValue(t, h, "jobs%2Fnightly", "v", 1)
			wantError(t, put(h, "jobs%2Fnightly", "old", tok(0)...), 409, api.CodeStaleToken, "0")
		}},
		{"keys are independent", func(t *testing.T, h http.Handler) {
			wantWrite(t, put(h, "a", "a", tok(100)...), 100)
			wantWrite(t, put(h, "b", "b", tok(1)...), 1)
		}},
		{"value larger than the limit gets 413", func(t *testing.T, h http.Handler) {
			big := strings.Repeat("v", DefaultMaxValueBytes+1)
			wantError(t, put(h, "x", big, tok(1)...), 413, api.CodePayloadTooLarge, "larger")
			wantError(t, serve(h, req("GET", "/v1/objects/x", "")), 404, api.CodeNotFound, "x")
			wantWrite(t, put(h, "x", big[1:], tok(1)...), 1)
		}},
		{"value larger than the limit without Content-Length gets 413", func(t *testing.T, h http.Handler) {
			r := req("PUT", "/v1/objects/x", "", tok(1)...)
			r.Body = io.NopCloser(io.LimitReader(zeros{}, DefaultMaxValueBytes+10))
			r.ContentLength = -1
			wantError(t, serve(h, r), 413, api.CodePayloadTooLarge, "larger")
		}},
		{"key too long gets 400", func(t *testing.T, h http.Handler) {
			wantError(t, put(h, strings.Repeat("k", MaxKeyBytes+1), "v", tok(1)...), 400, api.CodeInvalidArgument, "key")
		}},
		{"other methods get 405", func(t *testing.T, h http.Handler) {
			w := serve(h, req("POST", "/v1/objects/x", "v", tok(1)...))
			if w.Code != 405 || w.Header().Get("Allow") == "" {
				t.Fatalf("POST: %d, Allow %q", w.Code, w.Header().Get("Allow"))
			}
		}},
		{"unknown path gets JSON 404", func(t *testing.T, h http.Handler) {
			wantError(t, serve(h, req("GET", "/v2/else", "")), 404, api.CodeNotFound, "/v2/else")
			wantError(t, serve(h, req("GET", "/v1/objects/", "")), 404, api.CodeNotFound, "/v1/objects/")
		}},
		{"healthz", func(t *testing.T, h http.Handler) {
			if w := serve(h, req("GET", "/healthz", "")); w.Code != 200 {
				t.Fatalf("healthz: %d", w.Code)
			}
			if w := serve(h, req("POST", "/healthz", "")); w.Code != 405 {
				t.Fatalf("POST healthz: %d", w.Code)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newTestServer(t, ServerConfig{})) })
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestServerVerifyKey(t *testing.T) {
	pub, priv := testKey()
	forger := ed25519.NewKeyFromSeed([]byte("someone-else-seed-0123456789abcd"))
	exp := time.Now().Add(time.Minute).UnixMilli()
	h := newTestServer(t, ServerConfig{VerifyKey: pub})
	signed := func(lock string, token uint64) []string {
		return []string{HeaderToken, uitoa(token), HeaderLock, lock, HeaderProof, Sign(priv, lock, token, exp)}
	}

	wantWrite(t, put(h, "x", "v7", signed("res", 7)...), 7)
	tests := []struct {
		name    string
		headers []string
		status  int
		code    string
	}{
		{"missing proof", []string{HeaderToken, "8", HeaderLock, "res"}, 403, api.CodePermissionDenied},
		{"token only", []string{HeaderToken, "8"}, 403, api.CodePermissionDenied},
		{"missing lock", []string{HeaderToken, "8", HeaderProof, Sign(priv, "res", 8, exp)}, 403, api.CodePermissionDenied},
		{"forged", []string{HeaderToken, "8", HeaderLock, "res", HeaderProof, Sign(forger, "res", 8, exp)}, 403, api.CodePermissionDenied},
		{"replayed for a higher token", []string{HeaderToken, "8", HeaderLock, "res", HeaderProof, Sign(priv, "res", 7, exp)}, 403, api.CodePermissionDenied},
		{"missing token", []string{HeaderLock, "res", HeaderProof, Sign(priv, "res", 8, exp)}, 400, api.CodeInvalidArgument},
		{"valid proof, stale token", signed("res", 6), 409, api.CodeStaleToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, put(h, "x", "bad", tc.headers...), tc.status, tc.code, "")
			wantValue(t, h, "x", "v7", 7)
		})
	}
	if _, err := NewServer(ServerConfig{Store: NewMemoryStore(), VerifyKey: pub[:5]}); err == nil {
		t.Fatal("NewServer accepted a 5-byte verify key")
	}
	if _, err := NewServer(ServerConfig{}); err == nil {
		t.Fatal("NewServer accepted a config without a Store")
	}
}

func TestServerRestartKeepsHighest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencestore.db")
	store, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestServer(t, ServerConfig{Store: store})
	wantWrite(t, put(h, "x", "v9", HeaderToken, "9"), 9)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	h = newTestServer(t, ServerConfig{Store: openBolt(t, path)})
	wantValue(t, h, "x", "v9", 9)
	wantError(t, put(h, "x", "v8", HeaderToken, "8"), 409, api.CodeStaleToken, "8")
	wantValue(t, h, "x", "v9", 9)
	wantWrite(t, put(h, "x", "v10", HeaderToken, "10"), 10)
}

// TestServerConcurrentWritersNeverGoBackwards races PUTs with tokens 1..n
// on one key through a real HTTP server: the highest token's value must be
// the one kept, the stored token never goes down, and every refusal names a
// higher token.
func TestServerConcurrentWritersNeverGoBackwards(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			rec := &recordingPutStore{Store: sf.open(t)}
			ts := httptest.NewServer(newTestServer(t, ServerConfig{Store: rec}))
			defer ts.Close()
			const rounds, writers = 10, 8
			for round := 0; round < rounds; round++ {
				key := fmt.Sprintf("k%d", round)
				var wg sync.WaitGroup
				for i := 1; i <= writers; i++ {
					token := uint64(i)
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, _ := http.NewRequest("PUT", ts.URL+"/v1/objects/"+key, strings.NewReader(uitoa(token)))
						r.Header.Set(HeaderToken, uitoa(token))
						resp, err := ts.Client().Do(r)
						if err != nil {
							t.Error(err)
							return
						}
						defer resp.Body.Close()
						switch resp.StatusCode {
						case 200:
						case 409:
							var reply StaleTokenReply
							if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil || reply.HighestToken <= token {
								t.Errorf("token %d: 409 with highest %d (%v)", token, reply.HighestToken, err)
							}
						default:
							t.Errorf("token %d: status %d", token, resp.StatusCode)
						}
					}()
				}
				wg.Wait()
				w := serve(ts.Config.Handler, req("GET", "/v1/objects/"+key, ""))
				if w.Body.String() != uitoa(writers) || w.Header().Get(HeaderToken) != uitoa(writers) {
					t.Fatalf("round %d: value %q token %s, want %d", round, w.Body, w.Header().Get(HeaderToken), writers)
				}
			}
			if log := rec.puts(); !nonDecreasingPerKey(log) {
				t.Fatalf("puts out of order: %v", log)
			}
		})
	}
}

type keyToken struct {
	key   string
	token uint64
}

// recordingPutStore logs accepted Puts in the order they were accepted.
type recordingPutStore struct {
	Store
	mu  sync.Mutex
	log []keyToken
}

func (s *recordingPutStore) Put(key string, w Write, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.Store.Put(key, w, value)
	if err == nil {
		s.log = append(s.log, keyToken{key, w.Token})
	}
	return err
}

func (s *recordingPutStore) puts() []keyToken {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]keyToken(nil), s.log...)
}

func nonDecreasingPerKey(log []keyToken) bool {
	last := map[string]uint64{}
	for _, kt := range log {
		if kt.token < last[kt.key] {
			return false
		}
		last[kt.key] = kt.token
	}
	return true
}
