package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testutil"
)

const redirectToken = "secret-token-0001"

// recorder is a server that records every request it gets (and the
// Authorization header it came with) and answers like a leader would.
type recorder struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.auths = append(rec.auths, r.Header.Get("Authorization"))
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"lock":"x","held":false,"waiters":0}`)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) hits() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.auths...)
}

// redirectTo answers every request with a 307 as a follower does: leader
// in X-Lockd-Leader (unless ""), Location on location (unless "").
func redirectTo(leader, location string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if leader != "" {
			w.Header().Set(api.HeaderLeader, leader)
		}
		if location != "" {
			w.Header().Set("Location", location+r.URL.RequestURI())
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTemporaryRedirect)
		_, _ = io.WriteString(w, `{"error":{"code":"not_leader","message":"follower"},"leader":"`+leader+`"}`)
	}
}

// tlsConfigFor trusts the certificate of an httptest TLS server.
func tlsConfigFor(s *httptest.Server) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(s.Certificate())
	return &tls.Config{RootCAs: pool}
}

// TestAPIRedirectStaysInCluster: the HTTP API follows a 307 (with its
// token) only to a configured endpoint or to the leader a configured
// endpoint names, and never from https to http. A host outside the cluster
// never receives a request, let alone the token.
func TestAPIRedirectStaysInCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the endpoint to configure (and its TLS settings)
		// and the server that must never be reached.
		setup func(t *testing.T) (endpoint string, tc *tls.Config, foreign *recorder)
		fatal bool // refused at once, not retried until ctx ends
	}{
		{
			name: "Location to a foreign host, no leader named",
			setup: func(t *testing.T) (string, *tls.Config, *recorder) {
				f := newRecorder(t)
				m := httptest.NewServer(redirectTo("", f.URL))
				t.Cleanup(m.Close)
				return m.URL, nil, f
			},
			fatal: true,
		},
		{
			name: "Location elsewhere than the leader named",
			setup: func(t *testing.T) (string, *tls.Config, *recorder) {
				f := newRecorder(t)
				leader := newRecorder(t)
				m := httptest.NewServer(redirectTo(leader.URL, f.URL))
				t.Cleanup(m.Close)
				return m.URL, nil, f
			},
			fatal: true,
		},
		{
			name: "a named leader points on to a foreign host",
			setup: func(t *testing.T) (string, *tls.Config, *recorder) {
				f := newRecorder(t)
				l := httptest.NewServer(redirectTo(f.URL, f.URL))
				t.Cleanup(l.Close)
				m := httptest.NewServer(redirectTo(l.URL, l.URL))
				t.Cleanup(m.Close)
				return m.URL, nil, f
			},
		},
		{
			name: "https member names an http leader",
			setup: func(t *testing.T) (string, *tls.Config, *recorder) {
				f := newRecorder(t)
				m := httptest.NewTLSServer(redirectTo(f.URL, f.URL))
				t.Cleanup(m.Close)
				return m.URL, tlsConfigFor(m), f
			},
			fatal: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint, tlsc, foreign := tc.setup(t)
			a, err := client.NewAPI(client.APIConfig{Endpoints: []string{endpoint}, TLSConfig: tlsc, Token: redirectToken, MaxBackoff: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			start := time.Now()
			_, err = a.Status(ctx, "x", false)
			t.Logf("status: %v", err)
			if hits := foreign.hits(); len(hits) != 0 {
				t.Fatalf("the foreign host got %d requests (the first with Authorization %q)", len(hits), hits[0])
			}
			switch {
			case err == nil:
				t.Fatal("status succeeded through a refused redirect")
			case tc.fatal && !errors.Is(err, client.ErrUntrustedRedirect):
				t.Fatalf("error %v, want ErrUntrustedRedirect", err)
			case tc.fatal && time.Since(start) > 500*time.Millisecond:
				t.Fatalf("refused only after %v; want at once", time.Since(start))
			case !tc.fatal && (!errors.Is(err, client.ErrNoLeader) || !strings.Contains(err.Error(), "untrusted redirect")):
				t.Fatalf("error %v, want no leader after refused redirects", err)
			}
			if l := a.Leader(); l == foreign.URL {
				t.Fatalf("the foreign host became the leader to try first")
			}
		})
	}
}

// TestAPIRedirectToNamedLeader: what a follower in the endpoints names as
// leader is followed, token and all, and that leader may send the client
// back to a configured endpoint.
func TestAPIRedirectToNamedLeader(t *testing.T) {
	leader := newRecorder(t)
	follower := httptest.NewServer(redirectTo(leader.URL, leader.URL))
	defer follower.Close()
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{follower.URL}, Token: redirectToken})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Status(t.Context(), "x", false); err != nil {
		t.Fatal(err)
	}
	if hits := leader.hits(); len(hits) != 1 || hits[0] != "Bearer "+redirectToken {
		t.Fatalf("leader got %q", hits)
	}
	if a.Leader() != leader.URL {
		t.Fatalf("leader %q, want %q", a.Leader(), leader.URL)
	}
}

// wsMember is a fake member for the session's WebSocket: it answers the
// hello as hello says (nil: not a WebSocket, a plain 200), and every plain
// HTTP request with http.
type wsMember struct {
	*httptest.Server
	hellos atomic.Int32
}

func newWSMember(t *testing.T, tlsOn bool, hello func(w http.ResponseWriter, r *http.Request, n int32), plain http.HandlerFunc) *wsMember {
	m := &wsMember{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/ws" {
			hello(w, r, m.hellos.Add(1))
			return
		}
		plain(w, r)
	})
	if tlsOn {
		m.Server = httptest.NewTLSServer(h)
	} else {
		m.Server = httptest.NewServer(h)
	}
	t.Cleanup(m.Close)
	return m
}

// wsReply accepts the WebSocket, reads the hello and answers with reply
// (its id set to the hello's), then pushes push (if any) and closes.
func wsReply(t *testing.T, w http.ResponseWriter, r *http.Request, reply api.WSMessage, push *api.WSMessage) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		t.Logf("accept: %v", err)
		return
	}
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	_, data, err := c.Read(ctx)
	if err != nil {
		return
	}
	var req api.WSRequest
	_ = json.Unmarshal(data, &req)
	reply.ID = req.ID
	for _, m := range []*api.WSMessage{&reply, push} {
		if m == nil {
			continue
		}
		b, _ := json.Marshal(m)
		if c.Write(ctx, websocket.MessageText, b) != nil {
			return
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func notLeader(leader string) api.WSMessage {
	return api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: api.CodeNotLeader, Message: "follower"}, Leader: leader}
}

// TestSessionRedirectStaysInCluster: the WebSocket dial follows a 307 or a
// not_leader reply only within the cluster, as the HTTP API does.
func TestSessionRedirectStaysInCluster(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{}`) }
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, foreign string) (endpoint string, tc *tls.Config)
		fatal bool
	}{
		{
			name: "not_leader names an http leader to an https client",
			setup: func(t *testing.T, foreign string) (string, *tls.Config) {
				m := newWSMember(t, true, func(w http.ResponseWriter, r *http.Request, _ int32) {
					wsReply(t, w, r, notLeader(foreign), nil)
				}, ok)
				return m.URL, tlsConfigFor(m.Server)
			},
			fatal: true,
		},
		{
			name: "307 from https to http",
			setup: func(t *testing.T, foreign string) (string, *tls.Config) {
				m := newWSMember(t, true, func(w http.ResponseWriter, r *http.Request, _ int32) {
					redirectTo(foreign, foreign)(w, r)
				}, ok)
				return m.URL, tlsConfigFor(m.Server)
			},
			fatal: true,
		},
		{
			name: "307 with a Location to a foreign host, no leader named",
			setup: func(t *testing.T, foreign string) (string, *tls.Config) {
				m := newWSMember(t, false, func(w http.ResponseWriter, r *http.Request, _ int32) {
					redirectTo("", foreign)(w, r)
				}, ok)
				return m.URL, nil
			},
			fatal: true,
		},
		{
			name: "a named leader's not_leader names a foreign host",
			setup: func(t *testing.T, foreign string) (string, *tls.Config) {
				l := newWSMember(t, false, func(w http.ResponseWriter, r *http.Request, _ int32) {
					wsReply(t, w, r, notLeader(foreign), nil)
				}, redirectTo(foreign, foreign))
				m := newWSMember(t, false, func(w http.ResponseWriter, r *http.Request, _ int32) {
					wsReply(t, w, r, notLeader(l.URL), nil)
				}, redirectTo(l.URL, l.URL))
				return m.URL, nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			foreign := newRecorder(t)
			endpoint, tlsc := tc.setup(t, foreign.URL)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			start := time.Now()
			c, err := client.New(ctx, client.Config{Endpoints: []string{endpoint}, TLSConfig: tlsc, Token: redirectToken,
				AttemptTimeout: 500 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, CloseTimeout: 200 * time.Millisecond})
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			t.Logf("New: %v", err)
			if hits := foreign.hits(); len(hits) != 0 {
				t.Fatalf("the foreign host got %d requests (the first with Authorization %q)", len(hits), hits[0])
			}
			switch {
			case tc.fatal && !errors.Is(err, client.ErrUntrustedRedirect):
				t.Fatalf("error %v, want ErrUntrustedRedirect", err)
			case tc.fatal && time.Since(start) > 500*time.Millisecond:
				t.Fatalf("refused only after %v; want at once", time.Since(start))
			case !tc.fatal && !errors.Is(err, client.ErrNoLeader):
				t.Fatalf("error %v, want no leader", err)
			}
		})
	}
}

// TestSessionPushedLeaderStaysInCluster: a not_leader pushed on a live
// connection by a member the client reached through a redirect (not one of
// its endpoints) does not make a foreign host the next member to dial.
func TestSessionPushedLeaderStaysInCluster(t *testing.T) {
	foreign := newRecorder(t)
	var l *wsMember
	l = newWSMember(t, false, func(w http.ResponseWriter, r *http.Request, n int32) {
		hello := api.WSMessage{Type: api.TypeHello, SessionID: "s1", SessionTTLms: 5000}
		push := notLeader(foreign.URL)
		wsReply(t, w, r, hello, &push)
	}, ok200)
	m := newWSMember(t, false, func(w http.ResponseWriter, r *http.Request, _ int32) {
		wsReply(t, w, r, notLeader(l.URL), nil)
	}, redirectTo(l.URL, l.URL))
	c, err := client.New(t.Context(), client.Config{Endpoints: []string{m.URL}, Token: redirectToken,
		AttemptTimeout: 500 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 5*time.Second, "three connections to the named leader", func() bool { return l.hellos.Load() >= 3 })
	if hits := foreign.hits(); len(hits) != 0 {
		t.Fatalf("the foreign host got %d requests (the first with Authorization %q)", len(hits), hits[0])
	}
}

func ok200(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{}`)
}
