package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/testutil"
)

// TestBackupRoundTrip saves a backup of a running cluster and restores it
// into a fresh cluster: every lock, waiter and session and the token counter
// come back, and the next token is larger than every token issued before.
func TestBackupRoundTrip(t *testing.T) {
	src := testutil.NewCluster(t, 3, testutil.Options{})
	l := src.WaitLeader(10 * time.Second)
	sess := testutil.Post(l.URL()+"/api/v1/sessions", map[string]any{"client_id": "s-client", "ttl_ms": 60000})
	sid := sess.Str("session_id")
	for _, req := range []struct {
		name string
		body map[string]any
	}{
		{"ttl-lock", map[string]any{"client_id": "a", "ttl_ms": 3600000}},
		{"jobs%2Fnightly", map[string]any{"client_id": "b", "ttl_ms": 3600000}},
		{"session-lock", map[string]any{"client_id": "s-client", "session_id": sid}},
	} {
		if r := testutil.Post(lockURL(l, req.name, "acquire"), req.body); r.Status != 200 {
			t.Fatalf("acquire %s: %s", req.name, r.Raw)
		}
	}
	// A waiter queued behind ttl-lock, through the session.
	go testutil.Post(lockURL(l, "session-lock", "acquire"), map[string]any{"client_id": "w", "ttl_ms": 60000, "wait_timeout_ms": 600000})
	testutil.WaitFor(t, 5*time.Second, "waiter queued", func() bool {
		return testutil.Get(lockURL(l, "session-lock", "")).Body["waiters"] == float64(1)
	})

	resp, err := http.Get(l.URL() + "/api/v1/snapshot")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("backup: %v %v", err, resp)
	}
	backup, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var want *locktable.Table
	want, err = locktable.Restore(backup)
	if err != nil {
		t.Fatalf("backup does not decode: %v", err)
	}

	dst := testutil.NewCluster(t, 3, testutil.Options{})
	dl := dst.WaitLeader(10 * time.Second)
	post := func(url string) *http.Response {
		resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(backup))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// Something in the target: refused without force.
	testutil.Post(lockURL(dl, "other", "acquire"), map[string]any{"client_id": "z", "ttl_ms": 60000})
	if r := post(dl.URL() + "/api/v1/snapshot/restore"); r.StatusCode != 400 {
		t.Fatalf("restore into a non-empty cluster without force: %d", r.StatusCode)
	}
	if r := post(dl.URL() + "/api/v1/snapshot/restore?force=true"); r.StatusCode != 200 {
		t.Fatalf("restore: %d", r.StatusCode)
	}
	testutil.WaitFor(t, 10*time.Second, "every member to hold the restored state", func() bool {
		for _, m := range dst.Up() {
			ok := true
			m.Srv.View(func(tab *locktable.Table) {
				for _, name := range []string{"ttl-lock", "jobs/nightly", "session-lock"} {
					g, w := tab.Get(name), want.Get(name)
					ok = ok && reflect.DeepEqual(g, w)
				}
				_, hasSession := tab.Session(sid)
				ok = ok && hasSession && tab.LastToken() >= want.LastToken() && tab.Get("other").Held == false
			})
			if !ok {
				return false
			}
		}
		return true
	})
	nl := dst.WaitLeader(10 * time.Second)
	if r := testutil.Get(lockURL(nl, "session-lock", "")); r.Body["waiters"] != float64(1) {
		t.Fatalf("waiter lost in restore: %s", r.Raw)
	}
	r := testutil.Post(lockURL(nl, "fresh", "acquire"), map[string]any{"client_id": "n", "ttl_ms": 1000})
	if r.Status != 200 || r.Uint("fencing_token") <= want.LastToken() {
		t.Fatalf("token after restore %d must exceed %d: %s", r.Uint("fencing_token"), want.LastToken(), r.Raw)
	}
	// The restored session is live on the new cluster: keepalive works.
	if k := testutil.Post(nl.URL()+"/api/v1/sessions/"+sid+"/keepalive", nil); k.Status != 200 {
		t.Fatalf("keepalive of a restored session: %s", k.Raw)
	}
	// A corrupt backup is refused and changes nothing.
	bad := append([]byte(nil), backup...)
	bad[len(bad)/2] ^= 0xff
	bad = bad[:len(bad)-3]
	if resp := post2(t, nl.URL()+"/api/v1/snapshot/restore?force=true", bad); resp != 400 {
		t.Fatalf("corrupt backup: %d", resp)
	}
}

func post2(t *testing.T, url string, body []byte) int {
	resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestReadAfterRestore: a linearizable read right after a restore answers
// (the restored state stands for log entries that are no longer in the log).
func TestReadAfterRestore(t *testing.T) {
	src := testutil.NewCluster(t, 1, testutil.Options{})
	l := src.WaitLeader(10 * time.Second)
	testutil.Post(lockURL(l, "x", "acquire"), map[string]any{"client_id": "a", "ttl_ms": 600000})
	resp, err := http.Get(l.URL() + "/api/v1/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	backup, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, force := range []string{"", "?force=true"} {
		if code := post2(t, l.URL()+"/api/v1/snapshot/restore"+force, backup); force != "" && code != 200 {
			t.Fatalf("restore: %d", code)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		r := testutil.Call(ctx, http.MethodGet, lockURL(l, "x", ""), nil)
		cancel()
		if r.Status != 200 || r.Str("client_id") != "a" {
			t.Fatalf("read after restore: %d %s", r.Status, r.Raw)
		}
	}
}
