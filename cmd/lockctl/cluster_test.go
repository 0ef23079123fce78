package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testutil"
)

// plainCluster starts n members over plain HTTP without tokens and returns
// them with the environment of a lockctl speaking to them.
func plainCluster(t *testing.T, n int) (*testutil.Cluster, map[string]string) {
	t.Helper()
	c := testutil.NewCluster(t, n, testutil.Options{})
	return c, map[string]string{"LOCKD_ENDPOINTS": strings.Join(c.URLsFollowersFirst(), ",")}
}

// acquireJSON runs lockctl acquire -o json and returns the grant.
func acquireJSON(t *testing.T, env map[string]string, name, clientID string) api.AcquireReply {
	t.Helper()
	code, out, errs := cli(t, env, "acquire", name, "--ttl", "1m", "--client-id", clientID, "-o", "json")
	var rep api.AcquireReply
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || !rep.Acquired {
		t.Fatalf("acquire %s: %d %q %q", name, code, out, errs)
	}
	return rep
}

// TestSnapshotRestoreMinToken: an old backup restored into a fresh cluster
// with --min-token 5000 makes the next grant's token 5001.
func TestSnapshotRestoreMinToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters")
	}
	_, senv := plainCluster(t, 1)
	if rep := acquireJSON(t, senv, "old", "w"); rep.FencingToken != 1 {
		t.Fatalf("first token %d", rep.FencingToken)
	}
	file := filepath.Join(t.TempDir(), "old.snap")
	if code, _, errs := cli(t, senv, "snapshot", "save", file); code != exitOK {
		t.Fatalf("snapshot save: %d %q", code, errs)
	}

	_, denv := plainCluster(t, 1)
	code, out, errs := cli(t, denv, "snapshot", "restore", file, "--min-token", "5000", "-o", "json")
	var rep map[string]any
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep["min_token"] != float64(5000) {
		t.Fatalf("snapshot restore --min-token 5000: %d %q %q", code, out, errs)
	}
	if got := acquireJSON(t, denv, "new", "w").FencingToken; got != 5001 {
		t.Fatalf("first token after --min-token 5000: %d, want 5001", got)
	}
	// The restored lock came along with its old token.
	code, out, _ = cli(t, denv, "status", "old", "-o", "json")
	var st api.LockStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || !st.Held || st.FencingToken != 1 {
		t.Fatalf("status old: %d %q", code, out)
	}
	code, _, errs = cli(t, denv, "snapshot", "restore", file, "--min-token", "-1")
	if code != exitUsage || !strings.Contains(errs, "min-token") {
		t.Fatalf("--min-token -1: %d %q", code, errs)
	}
}

// TestListEveryPage: lockctl list prints every lock, however many pages
// the server sends them in; --limit and --after page by hand.
func TestListEveryPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	const n = 1005 // the server's default page is 1000
	c, env := plainCluster(t, 1)
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{c.WaitLeader(10 * time.Second).URL()}})
	if err != nil {
		t.Fatal(err)
	}
	names := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for name := range names {
				if _, err := a.Acquire(t.Context(), name, "w", time.Hour, 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range n {
		names <- fmt.Sprintf("big/%04d", i)
	}
	close(names)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	acquireJSON(t, env, "other", "w") // outside the prefix

	code, out, errs := cli(t, env, "list", "--prefix", "big/")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != n+1 || !strings.HasPrefix(lines[1], "big/0000 ") || !strings.HasPrefix(lines[n], "big/1004 ") {
		t.Fatalf("list: exit %d, %d lines (want %d), stderr %q", code, len(lines), n+1, errs)
	}
	code, out, _ = cli(t, env, "list", "--prefix", "big/", "-o", "json")
	var all api.LockList
	if code != exitOK || json.Unmarshal([]byte(out), &all) != nil || len(all.Locks) != n || all.Next != "" {
		t.Fatalf("list -o json: exit %d, %d locks, next %q", code, len(all.Locks), all.Next)
	}

	code, out, errs = cli(t, env, "list", "--prefix", "big/", "--limit", "2", "--after", "big/0999")
	if code != exitOK || !strings.Contains(out, "big/1000") || !strings.Contains(out, "big/1001") || strings.Contains(out, "big/1002") ||
		!strings.Contains(errs, "--after big/1001") {
		t.Fatalf("list --limit 2 --after big/0999: %d %q %q", code, out, errs)
	}
	code, out, _ = cli(t, env, "list", "--prefix", "big/", "--limit", "1003", "-o", "json")
	var some api.LockList
	if code != exitOK || json.Unmarshal([]byte(out), &some) != nil || len(some.Locks) != 1003 || some.Next != "big/1002" {
		t.Fatalf("list --limit 1003 -o json: exit %d, %d locks, next %q", code, len(some.Locks), some.Next)
	}
	code, out, errs = cli(t, env, "list", "--limit", "1003", "--after", "big/1002")
	if code != exitOK || !strings.Contains(out, "big/1004") || !strings.Contains(out, "other") || errs != "" {
		t.Fatalf("list --after big/1002: %d %q %q", code, out, errs)
	}
}
