package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// promtool returns the path of promtool (Debian's prometheus package). A
// developer without it skips; CI (CI set) installs it and fails without it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found; CI installs Debian's prometheus package (.ci/run)")
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules: the rules parse and their unit tests pass (among them
// LockdNoLeader firing when every member is down).
func TestAlertRules(t *testing.T) {
	p := promtool(t)
	t.Log(run(t, p, "check", "rules", "../../deploy/prometheus/lockd-rules.yml"))
	t.Log(run(t, p, "test", "rules", "../../deploy/prometheus/lockd-rules_test.yml"))
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			Expr       string `json:"expr"`
			RefID      string `json:"refId"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal([]byte(read(t, "../../deploy/grafana/lockd-dashboard.json")), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// grafanaVars replaces the dashboard's variables with values PromQL
// accepts, as Grafana does before it sends a query.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", ".*", "$instance", ".*")

// TestDashboardIsWellFormed: every panel has a unique id, sits on the
// 24-column grid without overlapping another, and queries the data source
// the dashboard's variable selects; every query is PromQL that Prometheus'
// parser accepts (promtool checks them as recording rules).
func TestDashboardIsWellFormed(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) < 15 {
		t.Fatalf("uid %q title %q, %d panels", d.UID, d.Title, len(d.Panels))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] || !vars["job"] || !vars["instance"] {
		t.Fatalf("variables %v: want datasource, job and instance", vars)
	}
	ids := map[int]string{}
	cells := map[[2]int]string{}
	var exprs []string
	for _, p := range d.Panels {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", p.Title, other, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%q: gridPos %+v is off the grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, taken := cells[[2]int{x, y}]; taken {
					t.Fatalf("%q overlaps %q at (%d,%d)", p.Title, other, x, y)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("%q: no query, or not on the ${datasource} variable", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%q target %s: empty, or not on the ${datasource} variable", p.Title, tg.RefID)
			}
			if !strings.Contains(tg.Expr, `job=~"$job"`) || !strings.Contains(tg.Expr, `instance=~"$instance"`) {
				t.Errorf("%q target %s does not follow the job and instance variables: %s", p.Title, tg.RefID, tg.Expr)
			}
			exprs = append(exprs, grafanaVars.Replace(tg.Expr))
		}
	}
	p := promtool(t)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		b, _ := json.Marshal(e) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, b)
	}
	f := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, p, "check", "rules", f)
	if !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", len(exprs))) {
		t.Fatalf("promtool on the dashboard's %d queries:\n%s", len(exprs), out)
	}
}
