package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v2"

	"github.com/lockd/lockd/internal/testutil"
)

// notFromLockd are series the rules use that no member exposes, each with
// why.
var notFromLockd = map[string]string{
	"up": "written by Prometheus for every scrape target (LockdMemberDown)",
}

// TestMonitoringOnLiveMembers starts a 3-member cluster of the real binary
// and drives it through what the dashboard and the alerts watch (grants,
// releases, a refusal over a quota, a TTL expiry, a wait timeout, a session
// expiry, a blocking query, snapshots), then checks each member's /metrics
// with promtool (0 problems) and that every series the Grafana dashboard and
// the alert rules name is one the members expose.
func TestMonitoringOnLiveMembers(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found; CI installs Debian's prometheus package (.ci/run)")
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	pc := startCluster(t, 3, "--snapshot-threshold", "16", "--snapshot-interval", "200ms", "--trailing-logs", "8",
		"--max-waiters-per-lock", "1")
	url := pc.procs[pc.leader(15*time.Second)].url()
	for i := 0; i < 20; i++ {
		r := testutil.Post(url+"/api/v1/locks/m/acquire", map[string]any{"client_id": "c", "ttl_ms": 60000})
		testutil.Post(url+"/api/v1/locks/m/release", map[string]any{"client_id": "c", "fencing_token": r.Uint("fencing_token")})
	}
	testutil.Post(url+"/api/v1/locks/held/acquire", map[string]any{"client_id": "a", "ttl_ms": 60000})
	testutil.Post(url+"/api/v1/locks/held/acquire", map[string]any{"client_id": "b", "wait_timeout_ms": 100}) // times out
	go testutil.Post(url+"/api/v1/locks/held/acquire", map[string]any{"client_id": "w", "wait_timeout_ms": 3000})
	testutil.WaitFor(t, 5*time.Second, "a waiter", func() bool { return testutil.Get(url+"/api/v1/locks/held").Uint("waiters") == 1 })
	if r := testutil.Post(url+"/api/v1/locks/held/acquire", map[string]any{"client_id": "x", "wait_timeout_ms": 1000}); r.Status != 429 {
		t.Fatalf("a second waiter over --max-waiters-per-lock 1: %d %s", r.Status, r.Raw)
	}
	testutil.Post(url+"/api/v1/locks/short/acquire", map[string]any{"client_id": "a", "ttl_ms": 100}) // expires
	testutil.Post(url+"/api/v1/sessions", map[string]any{"client_id": "s", "ttl_ms": 1000})           // expires
	go testutil.Get(url + "/api/v1/locks/held?index=999999999&wait=5s")                               // a parked watch

	dash := dashboardSeries(t, "../../deploy/grafana/lockd-dashboard.json")
	rules := rulesSeries(t, "../../deploy/prometheus/lockd-rules.yml")
	var bodies map[string]string
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		bodies = map[string]string{}
		exposed := map[string]bool{}
		for _, id := range pc.up() {
			resp, err := http.Get(pc.procs[id].url() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			bodies[id] = string(b)
			for _, line := range strings.Split(string(b), "\n") {
				if line != "" && line[0] != '#' {
					exposed[line[:strings.IndexAny(line, "{ ")]] = true
				}
			}
		}
		missing = missing[:0]
		for name, where := range dash {
			if !exposed[name] {
				missing = append(missing, name+" (dashboard: "+where+")")
			}
		}
		for name, where := range rules {
			if _, ok := notFromLockd[name]; !ok && !exposed[name] {
				missing = append(missing, name+" (rule "+where+")")
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("series the dashboard or the rules name that no member exposes:\n  %s", strings.Join(missing, "\n  "))
	} else {
		t.Logf("the dashboard names %d series, the rules %d; all exposed", len(dash), len(rules))
	}

	for id, body := range bodies {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("promtool check metrics on %s's /metrics: %v\n%s", id, err, out)
		} else {
			t.Logf("promtool check metrics on %s: 0 problems in %d lines", id, strings.Count(body, "\n"))
		}
	}
}

// dashboardSeries maps each series the dashboard's queries and variables
// name to a panel that names it.
func dashboardSeries(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range d.Templating.List {
		if m := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`).FindStringSubmatch(v.Definition); m != nil {
			out[m[1]] = "variable $" + v.Name
		}
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, s := range seriesIn(tg.Expr) {
				out[s] = p.Title
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("found only %d series in the dashboard: %v", len(out), out)
	}
	return out
}

// rulesSeries maps each series the alert rules name to a rule naming it.
func rulesSeries(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			for _, s := range seriesIn(r.Expr) {
				out[s] = r.Alert + r.Record
			}
		}
	}
	if len(out) < 8 {
		t.Fatalf("found only %d series in the rules: %v", len(out), out)
	}
	return out
}

// promqlWords are PromQL's keywords: identifiers that are not series. The
// grouping ones are followed by a list of labels.
var (
	promqlWords = map[string]bool{"bool": true, "offset": true, "and": true, "or": true, "unless": true, "atan2": true,
		"inf": true, "nan": true, "start": true, "end": true,
		// aggregation operators, also when "by (...)" sits between them and their "("
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
		"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	promqlGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
)

// seriesIn returns the metric names a PromQL expression selects: each
// identifier that is not a function or aggregation (followed by "("), a
// keyword, a label (inside {...} or a by/on/... list), a duration or a
// string. (Prometheus' own parser checks the syntax: test/deploy runs the
// queries through promtool.)
func seriesIn(expr string) []string {
	var out []string
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	skipTo := func(i int, close byte) int { // from an opening bracket to after its closing one, strings skipped
		for i++; i < len(expr) && expr[i] != close; i++ {
			if q := expr[i]; q == '"' || q == '\'' || q == '`' {
				for i++; i < len(expr) && expr[i] != q; i++ {
					if expr[i] == '\\' && q != '`' {
						i++
					}
				}
			}
		}
		return i + 1
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipTo(i, c) // a string: skipTo treats the quote as the bracket
		case c == '{':
			i = skipTo(i, '}')
		case c == '[':
			i = skipTo(i, ']')
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++ // a number or a duration (5m, 1e3)
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && strings.IndexByte(" \t\n", expr[k]) >= 0 {
				k++
			}
			switch {
			case promqlGrouping[strings.ToLower(word)]:
				if k < len(expr) && expr[k] == '(' {
					j = skipTo(k, ')') // by (le, op): labels
				}
			case promqlWords[strings.ToLower(word)]:
			case k < len(expr) && expr[k] == '(':
				// a function or an aggregation: its arguments follow
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestSeriesIn(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`max(lockd_is_leader) < 1 or absent(lockd_is_leader)`, []string{"lockd_is_leader"}},
		{`histogram_quantile(0.99, sum by (le, op) (rate(lockd_propose_duration_seconds_bucket{job=~"$job",op!="x{y}"}[5m])))`,
			[]string{"lockd_propose_duration_seconds_bucket"}},
		{`scalar(max(a_b offset 1m)) - c:d > 0`, []string{"a_b", "c:d"}},
		{"sum without (instance) (x)\n / on (quota) group_left (limit) y > bool 2e3", []string{"x", "y"}},
		{`label_replace(up, "dst", "$1", "src", "(.*)") unless ignoring(le) z[5m:1m]`, []string{"up", "z"}},
		{`rate(q{a='it\'s "x"'}[1h]) and sum(w) by(le)`, []string{"q", "w"}},
	} {
		if got := seriesIn(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("seriesIn(%q) = %v, want %v", c.expr, got, c.want)
		}
	}
}
