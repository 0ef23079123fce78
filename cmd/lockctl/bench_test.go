package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// TestBenchAgainstRealCluster runs `lockctl bench` in both modes against an
// in-process cluster and checks it completed cycles without errors, and
// that the lock ended free (every acquire was released).
func TestBenchAgainstRealCluster(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	for _, mode := range []string{"session", "http"} {
		code, out, errOut := cli(t, nil, "--endpoints", l.URL(), "-o", "json", "bench",
			"--mode", mode, "--clients", "3", "--locks", "1", "--duration", "1s", "--prefix", "b-"+mode+"/")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s %s", mode, code, out, errOut)
		}
		var res benchResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%s: %v: %s", mode, err, out)
		}
		if res.Cycles == 0 || res.Errors != 0 || res.AcquireP50ms <= 0 {
			t.Fatalf("%s: %+v", mode, res)
		}
		if g := testutil.Get(l.URL() + "/api/v1/locks/b-" + mode + "%2F0"); g.Body["held"] != false {
			t.Fatalf("%s: lock still held after bench: %s", mode, g.Raw)
		}
	}
}
