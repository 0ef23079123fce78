package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

const (
	tokAlpha = "token-for-alpha-00000"
	tokBeta  = "token-for-beta-000000"
)

// reloadable is a token file and its store, rewritten by the test.
type reloadable struct {
	t     *testing.T
	path  string
	store *auth.Store
}

func newReloadable(t *testing.T, tokens string) *reloadable {
	t.Helper()
	r := &reloadable{t: t, path: filepath.Join(t.TempDir(), "tokens.json")}
	if err := os.WriteFile(r.path, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := auth.Load(r.path)
	if err != nil {
		t.Fatal(err)
	}
	r.store = s
	return r
}

func (r *reloadable) reload(tokens string) {
	r.t.Helper()
	if err := os.WriteFile(r.path, []byte(tokens), 0o600); err != nil {
		r.t.Fatal(err)
	}
	if err := r.store.Reload(); err != nil {
		r.t.Fatal(err)
	}
}

func tokenEntry(name, token string, perms ...string) string {
	var ps []string
	for i := 0; i+1 < len(perms); i += 2 {
		ps = append(ps, fmt.Sprintf(`{"prefix": %q, "access": %q}`, perms[i], perms[i+1]))
	}
	return fmt.Sprintf(`{"name": %q, "token": %q, "permissions": [%s]}`, name, token, strings.Join(ps, ","))
}

func tokensFile(entries ...string) string {
	return `{"tokens": [` + strings.Join(entries, ",") + `]}`
}

// replyTo reads frames until the reply to id, collecting the others.
func (w *wsClient) replyTo(id uint64, others *[]api.WSMessage) api.WSMessage {
	w.t.Helper()
	for {
		m := w.recv()
		if m.ID == id {
			return m
		}
		if others != nil {
			*others = append(*others, m)
		}
	}
}

func wantError(t *testing.T, what string, m api.WSMessage, code string) {
	t.Helper()
	if m.Type != api.TypeError || m.Error == nil || m.Error.Code != code {
		t.Fatalf("%s: %+v (error %+v), want error %s", what, m, m.Error, code)
	}
}

// TestWebSocketTokenRemovedOnReload (SPEC 20): a token removed from the
// token file stops working on a WebSocket opened before the reload: its
// watches end at the reload, each with an error frame; every later request
// — an acquire, a new prefix watch, a keepalive, a release — is 401
// unauthenticated and proposes nothing; the session and its lock stay (the
// session ends as sessions do). When the token comes back, with less
// access, the connection serves it again under the new access.
func TestWebSocketTokenRemovedOnReload(t *testing.T) {
	rf := newReloadable(t, tokensFile(
		tokenEntry("alpha", tokAlpha, "a/", "lock", "shared/", "read"),
		tokenEntry("beta", tokBeta, "", "lock")))
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, Auth: rf.store}))
	defer srv.Close()

	a := dialWSAs(t, srv, tokAlpha)
	a.send(`{"id":1,"op":"hello","client_id":"alpha-1"}`)
	hello := a.recv()
	if hello.Type != api.TypeHello || hello.SessionID == "" {
		t.Fatalf("hello: %+v", hello)
	}
	a.send(`{"id":2,"op":"acquire","lock":"a/1"}`)
	if m := a.replyTo(2, nil); m.Type != api.TypeGranted {
		t.Fatalf("acquire a/1: %+v", m)
	}
	a.send(`{"id":3,"op":"watch","prefix":"shared/"}`)
	wPrefix := a.replyTo(3, nil).WatchID
	a.send(`{"id":4,"op":"watch","lock":"a/1"}`)
	wLock := a.replyTo(4, nil).WatchID
	if wPrefix == 0 || wLock == 0 {
		t.Fatalf("watches: %d %d", wPrefix, wLock)
	}
	for m := a.recv(); m.Type != api.TypeChanged; m = a.recv() { // a/1's first picture
		if m.Type != api.TypeSynced {
			t.Fatalf("before the reload: %+v", m)
		}
	}

	rf.reload(tokensFile(tokenEntry("beta", tokBeta, "", "lock")))
	ended := map[uint64]string{}
	for len(ended) < 2 {
		m := a.recv()
		if m.Type == api.TypeSynced {
			continue // a watch's initial frames end with it; it may come late
		}
		if m.Type != api.TypeError || m.WatchID == 0 || m.Error == nil {
			t.Fatalf("after the reload: %+v, want the watches' end", m)
		}
		ended[m.WatchID] = m.Error.Code
	}
	if ended[wPrefix] != api.CodeUnauthenticated || ended[wLock] != api.CodeUnauthenticated {
		t.Fatalf("watch ends: %v, want unauthenticated for %d and %d", ended, wPrefix, wLock)
	}

	proposed := f.proposed.Load()
	for i, req := range []string{
		`{"id":10,"op":"acquire","lock":"a/2"}`,
		`{"id":11,"op":"acquire","locks":["a/3","a/4"]}`,
		`{"id":12,"op":"watch","prefix":""}`,
		`{"id":13,"op":"watch","lock":"a/1"}`,
		`{"id":14,"op":"keepalive"}`,
		`{"id":15,"op":"release","lock":"a/1","fencing_token":1}`,
		`{"id":16,"op":"renew","lock":"a/1","fencing_token":1}`,
		`{"id":17,"op":"value","lock":"a/1","fencing_token":1,"value":"v"}`,
		fmt.Sprintf(`{"id":18,"op":"unwatch","watch_id":%d}`, wLock),
	} {
		a.send(req)
		wantError(t, req, a.replyTo(uint64(10+i), nil), api.CodeUnauthenticated)
	}
	// A beta connection's changes under shared/ reach nobody on alpha's.
	b := dialWSAs(t, srv, tokBeta)
	b.send(`{"id":1,"op":"hello","client_id":"beta-1"}`)
	b.recv()
	b.send(`{"id":2,"op":"acquire","lock":"shared/x"}`)
	if m := b.replyTo(2, nil); m.Type != api.TypeGranted {
		t.Fatalf("beta acquire: %+v", m)
	}
	if n := f.proposed.Load() - proposed; n != 2 { // beta's hello and acquire
		t.Fatalf("%d commands proposed, want beta's 2: refused requests proposed", n)
	}
	a.send(`{"id":19,"op":"keepalive"}`)
	var between []api.WSMessage
	wantError(t, "keepalive", a.replyTo(19, &between), api.CodeUnauthenticated)
	if len(between) > 0 {
		t.Fatalf("frames for a removed token: %+v", between)
	}
	var alive, held bool
	f.View(func(tb *locktable.Table) {
		_, alive = tb.Session(hello.SessionID)
		held = tb.Get("a/1").Held
	})
	if !alive || !held {
		t.Fatalf("the reload ended the session (%v) or its lock (%v); sessions end only by expiry or delete", alive, held)
	}

	// Back, with lock on a/ only: served again, under the new access.
	rf.reload(tokensFile(tokenEntry("alpha", tokAlpha, "a/", "lock"), tokenEntry("beta", tokBeta, "", "lock")))
	a.send(`{"id":20,"op":"acquire","lock":"a/5"}`)
	if m := a.replyTo(20, nil); m.Type != api.TypeGranted {
		t.Fatalf("acquire after the token came back: %+v", m)
	}
	a.send(`{"id":21,"op":"watch","prefix":"shared/"}`)
	wantError(t, "watch shared/ without read access", a.replyTo(21, nil), api.CodePermissionDenied)
	a.send(`{"id":22,"op":"keepalive"}`)
	if m := a.replyTo(22, nil); m.Type != api.TypeOK {
		t.Fatalf("keepalive after the token came back: %+v", m)
	}
}

// TestWebSocketAccessNarrowedOnReload (SPEC 20): a token that loses access
// on reload gets 403 for what it lost, on the same connection, and keeps
// what it still has: watches outside the new access end with an error
// frame naming them, a watch inside it goes on; acquires, renewals,
// releases and values of locks it lost are refused; keepalives go on while
// it has lock access somewhere. Access gained on reload is usable at once.
func TestWebSocketAccessNarrowedOnReload(t *testing.T) {
	rf := newReloadable(t, tokensFile(tokenEntry("alpha", tokAlpha, "", "lock")))
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, Auth: rf.store}))
	defer srv.Close()

	a := dialWSAs(t, srv, tokAlpha)
	a.send(`{"id":1,"op":"hello","client_id":"alpha-1"}`)
	a.recv()
	a.send(`{"id":2,"op":"acquire","lock":"b/1"}`)
	gb := a.replyTo(2, nil)
	a.send(`{"id":3,"op":"acquire","lock":"a/1"}`)
	ga := a.replyTo(3, nil)
	if gb.Type != api.TypeGranted || ga.Type != api.TypeGranted {
		t.Fatalf("acquires: %+v %+v", gb, ga)
	}
	a.send(`{"id":4,"op":"watch","prefix":""}`)
	wAll := a.replyTo(4, nil).WatchID
	a.send(`{"id":5,"op":"watch","prefix":"b/"}`)
	wB := a.replyTo(5, nil).WatchID
	a.send(`{"id":6,"op":"watch","lock":"a/1"}`)
	wA := a.replyTo(6, nil).WatchID

	rf.reload(tokensFile(tokenEntry("alpha", tokAlpha, "a/", "lock", "c/", "lock")))
	ended := map[uint64]*api.WSMessage{}
	deadline := time.Now().Add(5 * time.Second)
	for len(ended) < 2 && time.Now().Before(deadline) {
		m := a.recv()
		if m.Type == api.TypeError && m.WatchID != 0 {
			ended[m.WatchID] = &m
		}
	}
	for _, id := range []uint64{wAll, wB} {
		m := ended[id]
		if m == nil || m.Error.Code != api.CodePermissionDenied || !strings.Contains(m.Error.Message, "prefix") {
			t.Fatalf("watch %d: %+v, want its end with permission_denied naming the prefix", id, m)
		}
	}
	if ended[wA] != nil {
		t.Fatalf("the watch of a/1, still readable, ended: %+v", ended[wA])
	}

	for i, req := range []string{
		`{"id":10,"op":"acquire","lock":"b/2"}`,
		`{"id":11,"op":"acquire","locks":["a/2","b/3"]}`,
		fmt.Sprintf(`{"id":12,"op":"renew","lock":"b/1","fencing_token":%d}`, gb.FencingToken),
		fmt.Sprintf(`{"id":13,"op":"value","lock":"b/1","fencing_token":%d,"value":"v"}`, gb.FencingToken),
		fmt.Sprintf(`{"id":14,"op":"release","lock":"b/1","fencing_token":%d}`, gb.FencingToken),
		`{"id":15,"op":"watch","lock":"b/1"}`,
	} {
		a.send(req)
		wantError(t, req, a.replyTo(uint64(10+i), nil), api.CodePermissionDenied)
	}
	// What it kept, and what it gained.
	a.send(fmt.Sprintf(`{"id":20,"op":"renew","lock":"a/1","fencing_token":%d}`, ga.FencingToken))
	var frames []api.WSMessage
	if m := a.replyTo(20, &frames); m.Type != api.TypeOK {
		t.Fatalf("renew a/1: %+v", m)
	}
	a.send(`{"id":21,"op":"acquire","lock":"c/1"}`)
	if m := a.replyTo(21, &frames); m.Type != api.TypeGranted {
		t.Fatalf("acquire c/1, gained on reload: %+v", m)
	}
	a.send(`{"id":22,"op":"keepalive"}`)
	if m := a.replyTo(22, &frames); m.Type != api.TypeOK {
		t.Fatalf("keepalive: %+v", m)
	}
	sawA := false
	check := func(m api.WSMessage) {
		if m.Type == api.TypeChanged && (m.WatchID == wAll || m.WatchID == wB) {
			t.Fatalf("a change of an ended watch: %+v", m)
		}
		sawA = sawA || (m.Type == api.TypeChanged && m.WatchID == wA)
	}
	for _, m := range frames {
		check(m)
	}
	// The renewal's change frame and the replies travel independently: it
	// may come after the last reply.
	for deadline := time.Now().Add(5 * time.Second); !sawA && time.Now().Before(deadline); {
		check(a.recv())
	}
	if !sawA {
		t.Fatalf("the watch of a/1 did not show its renewal: %+v", frames)
	}

	// No lock access left: keepalives are refused too; watches it may read
	// go on.
	rf.reload(tokensFile(tokenEntry("alpha", tokAlpha, "a/", "read")))
	a.send(`{"id":30,"op":"keepalive"}`)
	wantError(t, "keepalive without lock access", a.replyTo(30, nil), api.CodePermissionDenied)
	a.send(`{"id":31,"op":"watch","prefix":"a/"}`)
	if m := a.replyTo(31, nil); m.Type != api.TypeOK {
		t.Fatalf("watch a/ with read access: %+v", m)
	}
}

// TestWebSocketReadToken (SPEC "Watches", 20): a token with read access
// only may open a WebSocket. Its hello opens no session (read_only, no
// session_id; a resume is 403), and the connection serves watch and
// unwatch of what the token may read; every other op is 403 and proposes
// nothing. A token without any access cannot connect. Serving frames reads
// no file: the token file can be gone.
func TestWebSocketReadToken(t *testing.T) {
	rf := newReloadable(t, tokensFile(
		tokenEntry("reader", tokReader, "jobs/", "read"),
		tokenEntry("nobody", tokMallory),
		tokenEntry("alpha", tokAlpha, "", "lock")))
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, Auth: rf.store}))
	defer srv.Close()

	if _, resp, err := dialWS2(srv, tokMallory); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("a token without access connected: %v %v", resp, err)
	}
	w := dialWSAs(t, srv, tokAlpha)
	w.send(`{"id":1,"op":"hello","client_id":"writer"}`)
	w.recv()
	w.send(`{"id":2,"op":"acquire","lock":"jobs/a","value":"v1"}`)
	if m := w.replyTo(2, nil); m.Type != api.TypeGranted {
		t.Fatalf("acquire: %+v", m)
	}
	if err := os.Remove(rf.path); err != nil {
		t.Fatal(err)
	}

	r := dialWSAs(t, srv, tokReader)
	r.send(`{"id":1,"op":"watch","prefix":"jobs/"}`)
	wantError(t, "watch before hello", r.recv(), api.CodeInvalidArgument)
	r.send(`{"id":2,"op":"hello","client_id":"dash","session_id":"s1.abc"}`)
	wantError(t, "a read token's resume", r.recv(), api.CodePermissionDenied)
	proposed := f.proposed.Load()
	r.send(`{"id":3,"op":"hello","client_id":"dash","session_ttl_ms":5000}`)
	h := r.recv()
	if h.Type != api.TypeHello || h.ID != 3 || !h.ReadOnly || h.SessionID != "" {
		t.Fatalf("a read token's hello: %+v, want hello read_only without a session", h)
	}
	sessions := 0
	f.View(func(tb *locktable.Table) { _, sessions = tb.Size() })
	if sessions != 1 {
		t.Fatalf("%d sessions, want the writer's only", sessions)
	}
	r.send(`{"id":4,"op":"hello","client_id":"dash"}`)
	wantError(t, "a second hello", r.recv(), api.CodeInvalidArgument)
	for i, req := range []string{
		`{"id":10,"op":"acquire","lock":"jobs/b"}`,
		`{"id":11,"op":"acquire","locks":["jobs/b","jobs/c"]}`,
		`{"id":12,"op":"release","lock":"jobs/a","fencing_token":1}`,
		`{"id":13,"op":"renew","lock":"jobs/a","fencing_token":1}`,
		`{"id":14,"op":"value","lock":"jobs/a","fencing_token":1,"value":"x"}`,
		`{"id":15,"op":"keepalive"}`,
		`{"id":16,"op":"watch","prefix":""}`,
		`{"id":17,"op":"watch","lock":"other"}`,
	} {
		r.send(req)
		wantError(t, req, r.replyTo(uint64(10+i), nil), api.CodePermissionDenied)
	}
	if n := f.proposed.Load() - proposed; n != 0 {
		t.Fatalf("%d commands proposed by a read-only connection", n)
	}
	r.send(`{"id":20,"op":"watch","prefix":"jobs/"}`)
	ok := r.replyTo(20, nil)
	if ok.Type != api.TypeOK || ok.WatchID == 0 {
		t.Fatalf("watch jobs/: %+v", ok)
	}
	if m := r.recv(); m.Type != api.TypeChanged || m.Lock != "jobs/a" || m.Status.Value != "v1" {
		t.Fatalf("first picture: %+v", m)
	}
	w.send(`{"id":3,"op":"value","lock":"jobs/a","fencing_token":1,"value":"v2"}`)
	w.replyTo(3, nil)
	for {
		m := r.recv()
		if m.Type == api.TypeChanged && m.Lock == "jobs/a" && m.Status.Value == "v2" {
			break
		}
	}
	r.send(fmt.Sprintf(`{"id":21,"op":"unwatch","watch_id":%d}`, ok.WatchID))
	if m := r.replyTo(21, nil); m.Type != api.TypeOK {
		t.Fatalf("unwatch: %+v", m)
	}
	// The member loses its leadership: the read-only connection is told and
	// closed, as a session's is.
	f.hub.Reset(notify.ErrLeadershipLost)
	if m := r.recv(); m.Type != api.TypeError || m.Error.Code != api.CodeNotLeader {
		t.Fatalf("after the leadership was lost: %+v", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := r.c.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("the connection stayed open after not_leader: %v", err)
	}
}

// TestWebSocketReloadRace: reloads racing a connection's requests and
// watches (run with -race): every request is answered, and a watch that
// outlives the last reload is one the final rules allow.
func TestWebSocketReloadRace(t *testing.T) {
	with := tokensFile(tokenEntry("alpha", tokAlpha, "a/", "lock", "b/", "read"))
	without := tokensFile(tokenEntry("alpha", tokAlpha, "a/", "lock"))
	rf := newReloadable(t, with)
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, Auth: rf.store}))
	defer srv.Close()
	a := dialWSAs(t, srv, tokAlpha)
	a.send(`{"id":1,"op":"hello","client_id":"alpha-1"}`)
	a.recv()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i <= 20; i++ { // ends without b/
			if i%2 == 0 {
				os.WriteFile(rf.path, []byte(without), 0o600)
			} else {
				os.WriteFile(rf.path, []byte(with), 0o600)
			}
			if err := rf.store.Reload(); err != nil {
				t.Error(err)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	const n = 40
	for i := 0; i < n; i++ {
		a.send(fmt.Sprintf(`{"id":%d,"op":"watch","prefix":"b/"}`, 100+i))
	}
	wg.Wait() // the last rules: without b/
	answered := map[uint64]bool{}
	open := map[uint64]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for len(answered) < n && time.Now().Before(deadline) {
		m := a.recv()
		switch {
		case m.ID >= 100 && m.Type == api.TypeOK:
			answered[m.ID] = true
			open[m.WatchID] = true
		case m.ID >= 100:
			answered[m.ID] = true
		case m.Type == api.TypeError && m.WatchID != 0:
			delete(open, m.WatchID)
		}
	}
	if len(answered) < n {
		t.Fatalf("%d of %d watch requests answered", len(answered), n)
	}
	// The re-check of the last reload ends every watch of b/: none was
	// registered after a re-check with access decided before its reload.
	deadline = time.Now().Add(5 * time.Second)
	for len(open) > 0 && time.Now().Before(deadline) {
		if m := a.recv(); m.Type == api.TypeError && m.WatchID != 0 {
			delete(open, m.WatchID)
		}
	}
	if len(open) > 0 {
		t.Fatalf("watches of b/ outlived the reload that took read access to b/ away: %v", open)
	}
}

// dialWS2 dials the WebSocket with a token and returns the handshake's
// outcome.
func dialWS2(srv *httptest.Server, token string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/api/v1/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
}

// TestBlockingQueryRechecksToken (SPEC 20): a blocking query parked before
// a reload that removed its token answers 401 when the change comes, not
// the lock's status; one whose token lost read access answers 403.
func TestBlockingQueryRechecksToken(t *testing.T) {
	rf := newReloadable(t, tokensFile(
		tokenEntry("alpha", tokAlpha, "", "read"),
		tokenEntry("reader", tokReader, "", "read"),
		tokenEntry("beta", tokBeta, "", "lock")))
	f := newFake()
	srv := httptest.NewServer(New(Config{Backend: f, Auth: rf.store}))
	defer srv.Close()
	park := func(token string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", srv.URL+"/api/v1/locks/x?index=0&wait=10s", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	// x has no state: its index is the applied index, 0; the queries park.
	a, r := park(tokAlpha), park(tokReader)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if f.watches.Count() >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the queries did not park")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rf.reload(tokensFile(tokenEntry("reader", tokReader, "y", "read"), tokenEntry("beta", tokBeta, "", "lock")))
	if rep := doAs(t, srv.Config.Handler, tokBeta, "POST", "/api/v1/locks/x/acquire", `{"client_id":"b","ttl_ms":60000}`); rep.status != 200 {
		t.Fatalf("acquire: %d %s", rep.status, rep.raw)
	}
	if code := <-a; code != 401 {
		t.Fatalf("the removed token's parked query answered %d, want 401", code)
	}
	if code := <-r; code != 403 {
		t.Fatalf("the parked query of a token that lost read access answered %d, want 403", code)
	}
}
