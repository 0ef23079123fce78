package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

func scrape(t *testing.T, url, accept string) (contentType, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return resp.Header.Get("Content-Type"), string(b)
}

// TestMetricsOpenMetricsOnRequest: /metrics answers in Prometheus' text
// format by default and in OpenMetrics when the Accept header asks for it
// (as Prometheus' scraper does).
func TestMetricsOpenMetricsOnRequest(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)

	ct, body := scrape(t, l.URL(), "")
	if !strings.HasPrefix(ct, "text/plain") || !strings.Contains(ct, "version=0.0.4") {
		t.Fatalf("default Content-Type %q, want text/plain; version=0.0.4", ct)
	}
	if strings.Contains(body, "# EOF") {
		t.Fatal("the text format carries OpenMetrics' # EOF")
	}
	ct, body = scrape(t, l.URL(), "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
	if !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q for an OpenMetrics scrape", ct)
	}
	if !strings.HasSuffix(body, "# EOF\n") || !strings.Contains(body, "# TYPE lockd_grants counter\n") {
		t.Fatalf("not OpenMetrics (counters are typed without _total, the body ends in # EOF):\n%.2000s", body)
	}
}

// TestMetricsOperatorSeries: the series the dashboard and the alerts use
// beyond the basic ones: per-quota use and limit (cluster-wide quotas
// only, read without a walk), refusals pre-set at zero for every code and
// operation, watches open, snapshot failures.
func TestMetricsOperatorSeries(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Quotas = locktable.Quotas{Sessions: 10, Locks: 5, WaitersPerLock: 3}
	}})
	l := c.WaitLeader(10 * time.Second)
	for _, name := range []string{"a", "b"} {
		if r := testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "c", "ttl_ms": 60000}); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	if r := testutil.Post(l.URL()+"/api/v1/sessions", map[string]any{"client_id": "s"}); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	// A blocking query parks a watch until it answers.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go testutil.Call(ctx, http.MethodGet, l.URL()+"/api/v1/locks/a?index=999999&wait=30s", nil)

	families := func() map[string]string {
		_, body := scrape(t, l.URL(), "")
		out := map[string]string{}
		for _, line := range strings.Split(body, "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			out[line[:i]] = line[i+1:]
		}
		return out
	}
	testutil.WaitFor(t, 10*time.Second, "the blocking query to park", func() bool { return families()["lockd_watches"] == "1" })
	got := families()
	for series, want := range map[string]string{
		`lockd_quota_used{quota="max-locks"}`:                                "2",
		`lockd_quota_limit{quota="max-locks"}`:                               "5",
		`lockd_quota_used{quota="max-sessions"}`:                             "1",
		`lockd_quota_limit{quota="max-sessions"}`:                            "10",
		`lockd_requests_refused_total{code="overloaded",op="acquire"}`:       "0",
		`lockd_requests_refused_total{code="resource_exhausted",op="other"}`: "0",
		`lockd_requests_refused_total{code="resource_exhausted",op="watch"}`: "0",
		`lockd_raft_snapshot_failures_total`:                                 "0",
		`lockd_watches`:                                                      "1",
	} {
		if got[series] != want {
			t.Errorf("%s = %q, want %s", series, got[series], want)
		}
	}
	for _, q := range []string{"max-grants", "max-value-bytes"} { // no limit set: 0
		if got[`lockd_quota_limit{quota="`+q+`"}`] != "0" || got[`lockd_quota_used{quota="`+q+`"}`] == "" {
			t.Errorf("quota %s: used %q limit %q", q, got[`lockd_quota_used{quota="`+q+`"}`], got[`lockd_quota_limit{quota="`+q+`"}`])
		}
	}
	if got[`lockd_quota_used{quota="max-grants"}`] != "2" {
		t.Errorf("max-grants use %s, want 2 (two held locks)", got[`lockd_quota_used{quota="max-grants"}`])
	}
	for series := range got {
		if strings.Contains(series, "max-waiters-per-lock") || strings.Contains(series, "per-token") || strings.Contains(series, "per-session") {
			t.Errorf("%s exported: a per-key quota has no cluster-wide use", series)
		}
	}
	// Over the lock quota: refused, counted under acquire.
	for _, name := range []string{"c", "d", "e", "f"} {
		testutil.Post(lockURL(l, name, "acquire"), map[string]any{"client_id": "c", "ttl_ms": 60000})
	}
	got = families()
	if got[`lockd_quota_used{quota="max-locks"}`] != "5" || got[`lockd_requests_refused_total{code="resource_exhausted",op="acquire"}`] != "1" {
		t.Fatalf("after the quota filled: used %s, refused %s", got[`lockd_quota_used{quota="max-locks"}`],
			got[`lockd_requests_refused_total{code="resource_exhausted",op="acquire"}`])
	}
}
