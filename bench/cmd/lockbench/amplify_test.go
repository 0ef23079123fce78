package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/lockd/lockd/api"
)

func TestAmpValue(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4096} {
		for _, i := range []int{0, 7, 1_000_003} {
			v := ampValue(i, n)
			if len(v) != n || !utf8.ValidString(v) {
				t.Fatalf("ampValue(%d, %d) is %d bytes", i, n, len(v))
			}
		}
	}
	if ampValue(1, 4096) == ampValue(2, 4096) {
		t.Fatal("two holders' values are equal")
	}
}

func TestAmpOptsValidate(t *testing.T) {
	ok := ampOpts{cases: []string{"a", "e"}, holders: 10_000, valueBytes: 4096, queries: 200, queryWait: 5 * time.Minute,
		watches: 60, changes: 5, watchConns: 16, watchesPerConn: 1024, readers: 50, valueLocks: 20_000,
		settle: time.Second, caseTimeout: time.Minute, sample: 50 * time.Millisecond, concurrency: 32}
	if err := ok.validate(1); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(o *ampOpts){
		"case":        func(o *ampOpts) { o.cases = []string{"z"} },
		"no case":     func(o *ampOpts) { o.cases = nil },
		"holders":     func(o *ampOpts) { o.holders = 10_001 },
		"value":       func(o *ampOpts) { o.valueBytes = 4097 },
		"wait":        func(o *ampOpts) { o.queryWait = 11 * time.Minute },
		"negative":    func(o *ampOpts) { o.watches = -1 },
		"concurrency": func(o *ampOpts) { o.concurrency = 0 },
	} {
		o := ok
		bad(&o)
		if o.validate(1) == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if ok.validate(0) == nil {
		t.Error("0 members accepted")
	}
}

// TestReadStuckCountsWhatTheServerSent: a server that queued frames for a
// client that did not read, then gave up on it.
func TestReadStuckCountsWhatTheServerSent(t *testing.T) {
	frames := []api.WSMessage{
		{ID: 1, Type: api.TypeHello, SessionID: "s1"},
		{ID: 2, Type: api.TypeOK, WatchID: 1},
		{ID: 3, Type: api.TypeOK, WatchID: 2},
		{Type: api.TypeChanged, WatchID: 1, Index: 5},
		{Type: api.TypeChanged, WatchID: 2, Index: 5},
		{Type: api.TypeResync, WatchID: 1},
		{ID: 4, Type: api.TypeError, Error: &api.Error{Code: api.CodeResourceExhausted, Message: "watches"}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		for _, f := range frames {
			b, _ := json.Marshal(f)
			_ = c.Write(r.Context(), websocket.MessageText, b)
		}
		_ = c.Close(websocket.StatusPolicyViolation, "too slow")
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialStuck(ctx, srv.URL, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	seen, n := readStuck(ctx, c, 5*time.Second, 1<<20)
	want := map[string]int64{"frame hello": 1, "frame ok": 2, "frame changed": 2, "frame resync": 1,
		"frame error resource_exhausted": 1, "connection closed by the server (1008)": 1}
	if len(seen) != len(want) || n == 0 {
		t.Fatalf("seen %v (%d bytes)", seen, n)
	}
	for _, s := range seen {
		if want[s.Code] != s.Count {
			t.Fatalf("seen %v, want %v", seen, want)
		}
	}
}
