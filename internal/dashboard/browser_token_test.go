package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/dashboard"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
	"github.com/lockd/lockd/internal/testutil"
)

// Browser tests of where the page sends the bearer token. They run the
// dashboard handler alone, on httptest servers (some over TLS) standing for
// members, with a shared fake cluster, so that one test can mix https:// and
// http:// members.

// fakeCluster is the state the fake members serve: one lock table, the
// member list and the leader. (The table is set up before the members
// serve, so their watches never see a change.)
type fakeCluster struct {
	mu      sync.RWMutex
	table   *locktable.Table
	members []api.Member
	leader  string
	watches *notify.Watches
}

// fakeMember is one member's view of a fakeCluster (a dashboard.Source).
type fakeMember struct {
	id string
	c  *fakeCluster
}

func (m fakeMember) Cluster(context.Context) (api.ClusterStatus, error) {
	m.c.mu.RLock()
	defer m.c.mu.RUnlock()
	cs := api.ClusterStatus{LeaderID: m.c.leader, Term: 2, Members: m.c.members}
	for _, x := range m.c.members {
		if x.ID == m.c.leader {
			cs.LeaderHTTP = x.HTTPAddr
		}
	}
	return cs, nil
}

func (m fakeMember) Status() api.NodeStatus {
	m.c.mu.RLock()
	defer m.c.mu.RUnlock()
	state := "Follower"
	if m.id == m.c.leader {
		state = "Leader"
	}
	return api.NodeStatus{ID: m.id, State: state, LeaderID: m.c.leader, Term: 2}
}

func (m fakeMember) View(fn func(t *locktable.Table)) {
	m.c.mu.RLock()
	defer m.c.mu.RUnlock()
	fn(m.c.table)
}

func (m fakeMember) WatchPrefix(prefix string, buf int) *notify.Watch {
	return m.c.watches.WatchPrefix(prefix, buf)
}

// TestDashboardHTTPSPageKeepsTokenOffHTTP: a page served over https:// by
// member a, whose cluster also has an http:// member b and an https://
// member c. When a dies, the page fails over: it asks b without the token
// (b refuses it, and the page moves on rather than asking for a token it
// would not send there), then goes live on c, sending it the token. The
// browser's record of the requests shows the Authorization header went to
// a and c, never to b, and no URL carried the token.
//
// (b is on 127.0.0.1, which Chromium deems potentially trustworthy, so an
// https:// page may fetch from it: the page's own rule is what keeps the
// token off it, not mixed-content blocking.)
func TestDashboardHTTPSPageKeepsTokenOffHTTP(t *testing.T) {
	bin := chromium(t)
	// (Goroutines of an earlier test's cluster may still be winding down.)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	const opsToken = "ops-token-0123456789"
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "ops", "token": "`+opsToken+`", "permissions": [{"prefix": "", "access": "read"}]}
	]}`)

	fc := &fakeCluster{table: locktable.New(), leader: "a", watches: notify.NewWatches(nil)}
	if r := fc.table.Apply(locktable.Command{Op: locktable.OpAcquire, Now: time.Now().UnixMilli(),
		Lock: "payments/settle", ClientID: "worker-7", TTLms: 600000}); !r.Granted {
		t.Fatalf("acquire: %+v", r)
	}
	serve := func(id string, tls bool) *httptest.Server {
		srv := httptest.NewUnstartedServer(dashboard.New(fakeMember{id: id, c: fc}, nil, dashboard.WithAuth(store)))
		if tls {
			srv.StartTLS()
		} else {
			srv.Start()
		}
		return srv
	}
	a, b, c := serve("a", true), serve("b", false), serve("c", true)
	t.Cleanup(func() {
		for _, s := range []*httptest.Server{a, b, c} {
			s.CloseClientConnections()
			s.Close()
		}
	})
	fc.members = []api.Member{{ID: "a", HTTPAddr: a.URL, Voter: true}, {ID: "b", HTTPAddr: b.URL, Voter: true},
		{ID: "c", HTTPAddr: c.URL, Voter: true}}
	if !strings.HasPrefix(a.URL, "https://") || !strings.HasPrefix(b.URL, "http://") {
		t.Fatalf("servers at %s and %s", a.URL, b.URL)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The test servers' certificates are self-signed.
	browser := startBrowser(t, ctx, bin, chromedp.Flag("ignore-certificate-errors", true))
	sent := recordRequests(t, browser)
	if err := chromedp.Do(browser, chromedp.Navigate(a.URL+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, "the token form", 10*time.Second, func(p pageState) bool { return p.Auth })
	if err := chromedp.Do(browser, chromedp.Steps(
		chromedp.SetValue(chromedp.CSS("#auth-token"), opsToken),
		chromedp.Click(chromedp.CSS("#auth-submit")),
	)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, "the dashboard live on a", 10*time.Second, func(p pageState) bool {
		_, ok := p.lock("payments/settle")
		return !p.Auth && p.Conn == "live" && p.Self == "a" && ok
	})

	// a dies; the snapshot the page holds names b before c, so b is tried
	// first.
	a.CloseClientConnections()
	a.Close()
	p := waitPage(t, browser, "the dashboard live on another member, after a died", 20*time.Second, func(p pageState) bool {
		_, ok := p.lock("payments/settle")
		return !p.Auth && p.Conn == "live" && p.Self != "a" && ok
	})
	if p.Self != "c" { // b serves only with the token: the checks below say how it got it
		t.Errorf("the page went live on %s, want c", p.Self)
	}

	var toB, authA, authC int
	for _, r := range sent.all() {
		if strings.Contains(strings.ToLower(r.URL), "access_token") || strings.Contains(r.URL, opsToken) {
			t.Errorf("the page put the token in a URL: %s %s", r.Method, r.URL)
		}
		switch origin(r.URL) {
		case b.URL:
			toB++
			if r.Auth != "" {
				t.Errorf("the https:// page sent Authorization to the http:// member: %s %s", r.Method, r.URL)
			}
		case a.URL:
			if r.Auth == "Bearer "+opsToken {
				authA++
			}
		case c.URL:
			if r.Auth == "Bearer "+opsToken {
				authC++
			}
		}
	}
	// The checks above mean something only if the page did ask b, and did
	// send the token where it may.
	if toB == 0 || authA == 0 || authC == 0 {
		t.Errorf("requests to b: %d; with the token to a: %d, to c: %d; want each > 0; requests: %+v",
			toB, authA, authC, sent.all())
	}
}

// origin returns scheme://host:port of a URL.
func origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// TestDashboardScriptRules evaluates the page's pure network functions
// (static/net.js, as the page loads it) on cases: the rule deciding which
// member origins may receive the token, and the Server-Sent Events parser
// the page reads its stream with.
func TestDashboardScriptRules(t *testing.T) {
	bin := chromium(t)
	// (Goroutines of an earlier test's cluster may still be winding down.)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	fc := &fakeCluster{table: locktable.New(), leader: "a", watches: notify.NewWatches(nil)}
	srv := httptest.NewServer(dashboard.New(fakeMember{id: "a", c: fc}, nil))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	fc.members = []api.Member{{ID: "a", HTTPAddr: srv.URL, Voter: true}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	browser := startBrowser(t, ctx, bin)
	if err := chromedp.Do(browser, chromedp.Navigate(srv.URL+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, "the page, live", 10*time.Second, func(p pageState) bool { return p.Conn == "live" })

	t.Run("tokenAllowed", func(t *testing.T) {
		cases := []struct {
			page, target string
			want         bool
		}{
			{"https://lockd-1.example:7070", "https://lockd-1.example:7070", true}, // its own origin
			{"https://lockd-1.example:7070", "https://lockd-2.example:7070", true}, // another https member
			{"https://lockd-1.example:7070", "http://lockd-2.example:7070", false}, // a downgrade
			{"https://lockd-1.example:7070", "http://lockd-1.example:7071", false},
			{"https://127.0.0.1:7070", "http://127.0.0.1:7170", false}, // even on loopback
			{"https://127.0.0.1:7070", "https://127.0.0.1:7170", true},
			{"http://127.0.0.1:7070", "http://127.0.0.1:7070", true}, // the default member, its own page
			{"http://127.0.0.1:7070", "http://127.0.0.1:7170", true}, // a cluster on one machine
			{"http://localhost:7070", "http://[::1]:7170", true},
			{"http://127.0.0.1:7070", "http://10.0.0.2:7070", false}, // would leave the machine in clear text
			{"http://10.0.0.1:7070", "http://10.0.0.1:7070", true},   // the page's own member
			{"http://10.0.0.1:7070", "http://10.0.0.2:7070", false},
			{"http://10.0.0.1:7070", "https://10.0.0.2:7070", false}, // only the page's own scheme
			{"http://127.0.0.1:7070", "https://127.0.0.1:7170", false},
			{"https://lockd-1.example", "javascript:alert(1)", false},
			{"https://lockd-1.example", "", false},
			{"https://lockd-1.example", "ftp://lockd-1.example", false},
		}
		var pairs [][2]string
		for _, c := range cases {
			pairs = append(pairs, [2]string{c.page, c.target})
		}
		in, _ := json.Marshal(pairs)
		got, err := chromedp.Run(browser, chromedp.Evaluate[[]bool](
			`(`+string(in)+`).map(([p, t]) => lockdNet.tokenAllowed(p, t))`))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(cases) {
			t.Fatalf("%d answers for %d cases", len(got), len(cases))
		}
		for i, c := range cases {
			if got[i] != c.want {
				t.Errorf("tokenAllowed(%q, %q) = %v, want %v", c.page, c.target, got[i], c.want)
			}
		}
	})

	t.Run("sseParser", func(t *testing.T) {
		type event struct {
			Type string `json:"type"`
			Data string `json:"data"`
			ID   string `json:"id"`
		}
		cases := []struct {
			name   string
			stream string
			want   []event
		}{
			{"the server's frames", "retry: 2000\n\nid: 1\ndata: {\"a\":1}\n\nevent: ping\ndata: {\"now\":5}\n\n",
				[]event{{"message", `{"a":1}`, "1"}, {"ping", `{"now":5}`, "1"}}},
			{"CRLF and CR line ends", "id: 7\r\ndata: x\r\r\ndata: y\r\n\r\n",
				[]event{{"message", "x", "7"}, {"message", "y", "7"}}},
			{"data lines joined, no space after the colon", "data:a\ndata: b\ndata\n\n",
				[]event{{"message", "a\nb\n", ""}}},
			{"comments, unknown fields, no data", ": hello\nfoo: bar\nevent: ping\n\nid: 3\n\n", nil},
			{"an unfinished event is not dispatched", "data: done\n\ndata: half", []event{{"message", "done", ""}}},
			{"an id with NUL is ignored", "id: 1\ndata: a\n\nid: 2\x00\ndata: b\n\n",
				[]event{{"message", "a", "1"}, {"message", "b", "1"}}},
		}
		for _, c := range cases {
			in, _ := json.Marshal(c.stream)
			// The same stream, pushed whole, one character at a time, and
			// cut in three at every pair of places.
			out, err := chromedp.Run(browser, chromedp.Evaluate[[][]event](`(() => {
  const s = `+string(in)+`;
  const run = (chunks) => {
    const got = [];
    const p = lockdNet.sseParser((e) => got.push(e));
    for (const c of chunks) p.push(c);
    return got;
  };
  const runs = [run([s]), run([...s])];
  for (let i = 0; i <= s.length; i++) {
    for (let j = i; j <= s.length; j++) runs.push(run([s.slice(0, i), s.slice(i, j), s.slice(j)]));
  }
  return runs;
})()`))
			if err != nil {
				t.Fatal(err)
			}
			for i, got := range out {
				if len(got) != len(c.want) {
					t.Errorf("%s (run %d): events %+v, want %+v", c.name, i, got, c.want)
					break
				}
				for k := range got {
					if got[k] != c.want[k] {
						t.Errorf("%s (run %d): events %+v, want %+v", c.name, i, got, c.want)
						break
					}
				}
			}
		}
	})
}
