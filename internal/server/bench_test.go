package server_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// BenchmarkAcquireRelease measures one acquire+release cycle over HTTP
// against the leader of a 3-member loopback cluster with durable (bolt)
// logs, and reports the latency percentiles of the cycles.
func BenchmarkAcquireRelease(b *testing.B) {
	c := testutil.NewCluster(b, 3, testutil.Options{Heartbeat: 300 * time.Millisecond})
	l := c.WaitLeader(10 * time.Second)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	post := func(url, body string) []byte {
		resp, err := client.Post(url, "application/json", bytes.NewBufferString(body))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d %s", url, resp.StatusCode, out)
		}
		return out
	}
	base := l.URL() + "/api/v1/locks/bench/"
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		out := post(base+"acquire", `{"client_id":"bench","ttl_ms":10000}`)
		var tok uint64
		if j := bytes.Index(out, []byte(`"fencing_token":`)); j >= 0 {
			fmt.Sscan(string(out[j+len(`"fencing_token":`):]), &tok)
		}
		post(base+"release", fmt.Sprintf(`{"client_id":"bench","fencing_token":%d}`, tok))
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkAcquireReleaseParallel runs 32 clients on 32 locks against the
// leader; ns/op is per acquire+release cycle across all clients.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c := testutil.NewCluster(b, 3, testutil.Options{Heartbeat: 300 * time.Millisecond})
	l := c.WaitLeader(10 * time.Second)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	post := func(url, body string) []byte {
		resp, err := client.Post(url, "application/json", bytes.NewBufferString(body))
		if err != nil {
			b.Error(err)
			return nil
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			b.Errorf("%s: %d %s", url, resp.StatusCode, out)
		}
		return out
	}
	var next atomic.Int64
	b.SetParallelism(16) // 16 × GOMAXPROCS(2) = 32 clients
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := next.Add(1)
		base := fmt.Sprintf("%s/api/v1/locks/p%d/", l.URL(), id)
		cid := fmt.Sprintf("c%d", id)
		for pb.Next() {
			out := post(base+"acquire", `{"client_id":"`+cid+`","ttl_ms":10000}`)
			var tok uint64
			if j := bytes.Index(out, []byte(`"fencing_token":`)); j >= 0 {
				fmt.Sscan(string(out[j+len(`"fencing_token":`):]), &tok)
			}
			post(base+"release", fmt.Sprintf(`{"client_id":"%s","fencing_token":%d}`, cid, tok))
		}
	})
}
