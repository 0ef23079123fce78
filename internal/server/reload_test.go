package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestReloadReachesOpenWebSockets (SPEC 20, through Server.Reload as
// SIGHUP runs it): a token removed from the token file stops working on a
// WebSocket opened before: its prefix watch ends with an error push, a new
// acquire and a keepalive are 401, and no lock is granted to it; its
// session stays until it expires.
func TestReloadReachesOpenWebSockets(t *testing.T) {
	path, store := testutil.AuthFile(t, `{"tokens":[
	  {"name":"tenant","token":"tenant-secret-0123456","permissions":[{"prefix":"","access":"lock"}]},
	  {"name":"ops","token":"ops-secret-0123456789","permissions":[{"prefix":"","access":"admin"}]}]}`)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) { cfg.Auth = store }})
	l := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(l.URL(), "http", "ws", 1)+"/api/v1/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer tenant-secret-0123456"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	send := func(req string) {
		t.Helper()
		if err := conn.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() api.WSMessage {
		t.Helper()
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m api.WSMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	send(`{"id":1,"op":"hello","client_id":"t1"}`)
	if m := recv(); m.Type != api.TypeHello || m.SessionID == "" {
		t.Fatalf("hello: %+v", m)
	}
	send(`{"id":2,"op":"watch","prefix":""}`)
	watch := recv()
	if watch.Type != api.TypeOK {
		t.Fatalf("watch: %+v", watch)
	}
	// The watch's picture (nothing under the empty prefix yet) ends with
	// its synced frame.
	if m := recv(); m.Type != api.TypeSynced || m.WatchID != watch.WatchID {
		t.Fatalf("after the watch: %+v, want its synced frame", m)
	}

	if err := os.WriteFile(path, []byte(`{"tokens":[{"name":"ops","token":"ops-secret-0123456789","permissions":[{"prefix":"","access":"admin"}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if m := recv(); m.Type != api.TypeError || m.WatchID != watch.WatchID || m.Error.Code != api.CodeUnauthenticated {
		t.Fatalf("after the reload: %+v, want the watch's end", m)
	}
	send(`{"id":3,"op":"acquire","lock":"other-tenant/x"}`)
	if m := recv(); m.ID != 3 || m.Type != api.TypeError || m.Error.Code != api.CodeUnauthenticated {
		t.Fatalf("acquire by a removed token: %+v", m)
	}
	send(`{"id":4,"op":"keepalive"}`)
	if m := recv(); m.ID != 4 || m.Type != api.TypeError || m.Error.Code != api.CodeUnauthenticated {
		t.Fatalf("keepalive by a removed token: %+v", m)
	}
	if code, st := call(t, http.DefaultClient, "GET", l.URL()+"/api/v1/locks/other-tenant%2Fx", "ops-secret-0123456789", nil); code != 200 || st["held"] != false {
		t.Fatalf("the removed token's acquire took the lock: %d %v", code, st)
	}
}
