package server_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// wsClient is a bare WebSocket client of one connection for these tests.
type wsClient struct {
	t    *testing.T
	ctx  context.Context
	conn *websocket.Conn
}

func dialWS(t *testing.T, ctx context.Context, base, client string) *wsClient {
	t.Helper()
	conn, _, err := websocket.Dial(ctx, strings.Replace(base, "http", "ws", 1)+"/api/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	w := &wsClient{t: t, ctx: ctx, conn: conn}
	w.send(map[string]any{"id": 1, "op": "hello", "client_id": client, "session_ttl_ms": 60000})
	if m := w.read(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	return w
}

func (w *wsClient) send(v any) {
	w.t.Helper()
	b, _ := json.Marshal(v)
	if err := w.conn.Write(w.ctx, websocket.MessageText, b); err != nil {
		w.t.Fatal(err)
	}
}

func (w *wsClient) read() api.WSMessage {
	w.t.Helper()
	_, b, err := w.conn.Read(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var m api.WSMessage
	if err := json.Unmarshal(b, &m); err != nil {
		w.t.Fatal(err)
	}
	return m
}

// readUntil reads frames until one with the given id arrives.
func (w *wsClient) readUntil(id uint64) api.WSMessage {
	w.t.Helper()
	for {
		if m := w.read(); m.ID == id {
			return m
		}
	}
}

// SPEC 18 over HTTP: a queued wait is withdrawn; the waiting acquire is
// answered 409 cancelled at once; the queue moves on; a second cancel
// finds nothing; the holder keeps its grant.
func TestCancelHTTP(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	h := testutil.Post(lockURL(l, "c1", "acquire"), map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if h.Status != 200 {
		t.Fatalf("holder: %s", h.Raw)
	}
	got := make(chan testutil.Reply, 1)
	go func() {
		got <- testutil.Post(lockURL(l, "c1", "acquire"), map[string]any{"client_id": "w", "ttl_ms": 10000, "wait_timeout_ms": 20000})
	}()
	testutil.WaitFor(t, 5*time.Second, "the waiter to queue", func() bool {
		return testutil.Get(lockURL(l, "c1", "")).Uint("waiters") == 1
	})
	// Someone behind w, to see the queue move on.
	got2 := make(chan testutil.Reply, 1)
	go func() {
		got2 <- testutil.Post(lockURL(l, "c1", "acquire"), map[string]any{"client_id": "w2", "ttl_ms": 10000, "wait_timeout_ms": 20000})
	}()
	testutil.WaitFor(t, 5*time.Second, "the second waiter to queue", func() bool {
		return testutil.Get(lockURL(l, "c1", "")).Uint("waiters") == 2
	})
	r := testutil.Post(lockURL(l, "c1", "cancel"), map[string]any{"client_id": "w"})
	if r.Status != 200 || r.Body["cancelled"] != true {
		t.Fatalf("cancel: %s", r.Raw)
	}
	select {
	case w := <-got:
		if w.Status != 409 || w.Code() != api.CodeCancelled {
			t.Fatalf("the withdrawn acquire: %s", w.Raw)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the withdrawn acquire was not answered within 2 s")
	}
	if r := testutil.Post(lockURL(l, "c1", "cancel"), map[string]any{"client_id": "w"}); r.Status != 200 || r.Body["cancelled"] != false {
		t.Fatalf("second cancel: %s", r.Raw)
	}
	if st := testutil.Get(lockURL(l, "c1", "")); st.Body["client_id"] != "holder" || st.Uint("waiters") != 1 {
		t.Fatalf("after the cancel: %s", st.Raw)
	}
	// The one behind w is next.
	testutil.Post(lockURL(l, "c1", "release"), map[string]any{"client_id": "holder", "fencing_token": h.Uint("fencing_token")})
	if w2 := <-got2; w2.Status != 200 {
		t.Fatalf("the waiter behind the withdrawn one: %s", w2.Raw)
	}
	// Bad input changes nothing.
	for _, body := range []map[string]any{{}, {"client_id": ""}, {"client_id": "w", "locks": []string{"a", "b"}}, {"client_id": "w", "x": 1}} {
		if r := testutil.Post(lockURL(l, "c1", "cancel"), body); r.Status != 400 {
			t.Fatalf("cancel %v: %s", body, r.Raw)
		}
	}
}

// A multi-acquire's wait is withdrawn by its names, over HTTP.
func TestCancelMultiHTTP(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	if r := testutil.Post(lockURL(l, "m/b", "acquire"), map[string]any{"client_id": "holder", "ttl_ms": 60000}); r.Status != 200 {
		t.Fatalf("holder: %s", r.Raw)
	}
	got := make(chan testutil.Reply, 1)
	go func() {
		got <- testutil.Post(l.URL()+"/api/v1/acquire", map[string]any{"client_id": "m", "locks": []string{"m/b", "m/a"},
			"ttl_ms": 10000, "wait_timeout_ms": 20000})
	}()
	testutil.WaitFor(t, 5*time.Second, "the multi-acquire to queue", func() bool {
		return testutil.Get(lockURL(l, "m/b", "")).Uint("waiters") == 1
	})
	r := testutil.Post(l.URL()+"/api/v1/cancel", map[string]any{"client_id": "m", "locks": []string{"m/a", "m/b"}})
	if r.Status != 200 || r.Body["cancelled"] != true {
		t.Fatalf("cancel: %s", r.Raw)
	}
	if w := <-got; w.Status != 409 || w.Code() != api.CodeCancelled {
		t.Fatalf("the withdrawn multi-acquire: %s", w.Raw)
	}
	if st := testutil.Get(lockURL(l, "m/a", "")); st.Uint("waiters") != 0 {
		t.Fatalf("m/a still has a waiter: %s", st.Raw)
	}
	if r := testutil.Post(l.URL()+"/api/v1/cancel", map[string]any{"client_id": "m", "locks": []string{"m/a"}}); r.Status != 400 {
		t.Fatalf("one name: %s", r.Raw)
	}
}

// SPEC 18 over WebSocket, with a renewal's fresh proof (review finding 6)
// on the same connection.
func TestCancelAndRenewProofWebSocket(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Signer = func(g fence.Grant) string { return fence.SignGrant(priv, g) }
	}})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder := dialWS(t, ctx, l.URL(), "holder")
	holder.send(map[string]any{"id": 2, "op": "acquire", "lock": "x", "ttl_ms": 1000})
	g := holder.readUntil(2)
	if g.Type != api.TypeGranted || g.FencingProof == "" {
		t.Fatalf("grant: %+v", g)
	}
	first, err := fence.VerifyGrant(pub, "x", g.FencingToken, g.FencingProof)
	if err != nil {
		t.Fatal(err)
	}

	w := dialWS(t, ctx, l.URL(), "waiter")
	w.send(map[string]any{"id": 2, "op": "acquire", "lock": "x", "wait_timeout_ms": 30000})
	testutil.WaitFor(t, 5*time.Second, "the waiter to queue", func() bool {
		return testutil.Get(lockURL(l, "x", "")).Uint("waiters") == 1
	})
	w.send(map[string]any{"id": 3, "op": "cancel", "lock": "x"})
	var ok, refused *api.WSMessage
	for ok == nil || refused == nil {
		m := w.read()
		switch m.ID {
		case 2:
			refused = &m
		case 3:
			ok = &m
		}
	}
	if refused.Type != api.TypeError || refused.Error.Code != api.CodeCancelled {
		t.Fatalf("the withdrawn acquire: %+v", refused)
	}
	if ok.Type != api.TypeOK || ok.Cancelled == nil || !*ok.Cancelled {
		t.Fatalf("the cancel's reply: %+v", ok)
	}
	w.send(map[string]any{"id": 4, "op": "cancel", "lock": "x"})
	if m := w.readUntil(4); m.Type != api.TypeOK || m.Cancelled == nil || *m.Cancelled {
		t.Fatalf("a cancel with nothing queued: %+v", m)
	}

	// Renew well after the first proof's expiry would have passed.
	time.Sleep(600 * time.Millisecond)
	holder.send(map[string]any{"id": 3, "op": "renew", "lock": "x", "fencing_token": g.FencingToken, "ttl_ms": 5000})
	rn := holder.readUntil(3)
	if rn.Type != api.TypeOK || rn.FencingProof == "" {
		t.Fatalf("renew: %+v", rn)
	}
	renewed, err := fence.VerifyGrant(pub, "x", g.FencingToken, rn.FencingProof)
	if err != nil {
		t.Fatal(err)
	}
	exp, _ := api.ParseTime(rn.ExpiresAt)
	if renewed.ExpiresAt != exp.UnixMilli() || renewed.ExpiresAt <= first.ExpiresAt {
		t.Fatalf("renewed proof expires at %d (reply %s); the first at %d", renewed.ExpiresAt, rn.ExpiresAt, first.ExpiresAt)
	}
	time.Sleep(500 * time.Millisecond) // past the first expiry
	if renewed.Expired(time.Now()) || !first.Expired(time.Now()) {
		t.Fatal("the renewed proof is not the one that outlives the first expiry")
	}

	// And over HTTP.
	a := testutil.Post(lockURL(l, "y", "acquire"), map[string]any{"client_id": "hc", "ttl_ms": 1000})
	r := testutil.Post(lockURL(l, "y", "renew"), map[string]any{"client_id": "hc", "fencing_token": a.Uint("fencing_token"), "ttl_ms": 5000})
	p, _ := r.Body["fencing_proof"].(string)
	hg, err := fence.VerifyGrant(pub, "y", a.Uint("fencing_token"), p)
	exp, _ = api.ParseTime(r.Body["expires_at"].(string))
	if r.Status != 200 || err != nil || hg.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("HTTP renew: %s (%v)", r.Raw, err)
	}
}

// A release that hands the lock on to another acquire of the same client
// (issue: one Client, fair and fast on one hot lock): one committed step,
// a new token, FIFO across clients kept; a malformed hand-off changes
// nothing.
func TestHandOffWebSocket(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := dialWS(t, ctx, l.URL(), "proc")
	w.send(map[string]any{"id": 2, "op": "acquire", "lock": "hot", "ttl_ms": 30000})
	g := w.readUntil(2)
	if g.Type != api.TypeGranted {
		t.Fatalf("grant: %+v", g)
	}
	commit := func() uint64 { return testutil.Get(l.URL() + "/api/v1/status").Uint("commit_index") }

	// Malformed hand-offs are refused before anything is proposed.
	for i, h := range []map[string]any{
		{"id": 0},
		{"id": 3, "lock": "other"},
		{"id": 3, "op": "release"},
		{"id": 3, "locks": []string{"a", "b"}},
		{"id": 3, "ttl_ms": 5},
		{"id": 3, "bogus": 1},
	} {
		w.send(map[string]any{"id": 100 + i, "op": "release", "lock": "hot", "fencing_token": g.FencingToken, "handoff": h})
		if m := w.readUntil(uint64(100 + i)); m.Type != api.TypeError {
			t.Fatalf("hand-off %v: %+v", h, m)
		}
	}
	if st := testutil.Get(lockURL(l, "hot", "")); st.Uint("fencing_token") != g.FencingToken {
		t.Fatalf("a refused hand-off changed the lock: %s", st.Raw)
	}

	// Nobody waits: one commit releases and grants anew.
	before := commit()
	w.send(map[string]any{"id": 4, "op": "release", "lock": "hot", "fencing_token": g.FencingToken,
		"handoff": map[string]any{"id": 5, "ttl_ms": 30000, "wait_timeout_ms": 10000}})
	var rel, next *api.WSMessage
	for rel == nil || next == nil {
		m := w.read()
		switch m.ID {
		case 4:
			rel = &m
		case 5:
			next = &m
		}
	}
	if rel.Type != api.TypeOK || next.Type != api.TypeGranted || next.FencingToken <= g.FencingToken {
		t.Fatalf("hand-off: release %+v, acquire %+v", rel, next)
	}
	if d := commit() - before; d != 1 {
		t.Fatalf("the hand-off took %d log entries, want 1", d)
	}

	// Another client waits: it is served first, the hand-off queues.
	other := make(chan testutil.Reply, 1)
	go func() {
		other <- testutil.Post(lockURL(l, "hot", "acquire"), map[string]any{"client_id": "other", "ttl_ms": 30000, "wait_timeout_ms": 10000})
	}()
	testutil.WaitFor(t, 5*time.Second, "the other client to queue", func() bool {
		return testutil.Get(lockURL(l, "hot", "")).Uint("waiters") == 1
	})
	w.send(map[string]any{"id": 6, "op": "release", "lock": "hot", "fencing_token": next.FencingToken,
		"handoff": map[string]any{"id": 7, "ttl_ms": 30000, "wait_timeout_ms": 10000}})
	if m := w.readUntil(6); m.Type != api.TypeOK {
		t.Fatalf("release of the second hand-off: %+v", m)
	}
	o := <-other
	if o.Status != 200 || o.Uint("fencing_token") <= next.FencingToken {
		t.Fatalf("the client that waited first: %s", o.Raw)
	}
	testutil.Post(lockURL(l, "hot", "release"), map[string]any{"client_id": "other", "fencing_token": o.Uint("fencing_token")})
	if m := w.readUntil(7); m.Type != api.TypeGranted || m.FencingToken <= o.Uint("fencing_token") {
		t.Fatalf("the queued hand-off: %+v", m)
	}
}
