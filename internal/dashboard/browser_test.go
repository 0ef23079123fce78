package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// The browser test: a 3-member in-process cluster (real servers over real
// HTTP) and headless Chromium driven through the DevTools protocol. The page
// is opened on the leader; the test takes locks and checks the page shows
// them, kills the leader and checks the page follows the new one, and saves
// a screenshot (to docs/dashboard.png with LOCKD_UPDATE_SCREENSHOT=1).

// chromium finds the browser: $LOCKD_CHROMIUM, else chromium on PATH. With
// none, the test skips, except in CI (CI=true), where it fails: .ci/run
// installs Debian's chromium package when it is missing.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LOCKD_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (looked for $LOCKD_CHROMIUM, chromium, chromium-browser, google-chrome on PATH); " +
		"install it with: apt-get install -y chromium"
	if ci := os.Getenv("CI"); ci != "" && ci != "0" && !strings.EqualFold(ci, "false") {
		t.Fatal(msg + " (CI is set, so this is a failure, not a skip: .ci/run must install it)")
	}
	t.Skip(msg)
	return ""
}

// pageState is what the page shows, read from its DOM.
type pageState struct {
	Auth     bool   `json:"auth"`
	AuthText string `json:"auth_text"`
	Conn     string `json:"conn"`
	ConnMsg  string `json:"conn_msg"`
	Leader   string `json:"leader"`
	Term     string `json:"term"`
	Self     string `json:"self"`
	Notice   string `json:"notice"`
	Members  []struct {
		ID   string `json:"id"`
		Role string `json:"role"`
		Tags string `json:"tags"`
		URL  string `json:"url"`
	} `json:"members"`
	Locks []pageLock `json:"locks"`
}

type pageLock struct {
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`     // the kind's name: exclusive, shared, semaphore N
	KindSub string   `json:"kind_sub"` // "2 holders", "1 of 3 held"
	Delay   string   `json:"delay"`    // "delayed for 59.1 s", "" without a lock-delay
	Holder  string   `json:"holder"`   // the whole cell
	Token   string   `json:"token"`
	TTL     string   `json:"ttl"`
	Queue   string   `json:"queue"`
	Holders []string `json:"holders"` // one line per holder
	Tokens  []string `json:"tokens"`
	TTLs    []string `json:"ttls"`
	Values  []string `json:"values"`
}

func (p pageState) lock(name string) (pageLock, bool) {
	for _, l := range p.Locks {
		if l.Name == name {
			return l, true
		}
	}
	return pageLock{}, false
}

func must(l pageLock, _ bool) pageLock { return l }

func (p pageState) role(id string) string {
	for _, m := range p.Members {
		if m.ID == id {
			return m.Role
		}
	}
	return ""
}

const readPage = `JSON.stringify({
  auth: !document.getElementById('auth').hidden,
  auth_text: document.getElementById('auth-text').textContent,
  conn: document.getElementById('conn').dataset.state,
  conn_msg: document.getElementById('conn-text').textContent,
  leader: document.getElementById('leader').textContent,
  term: document.getElementById('term').textContent,
  self: document.getElementById('self-id').textContent,
  notice: document.getElementById('notice').hidden ? '' : document.getElementById('notice').textContent,
  members: [...document.querySelectorAll('#members-body tr')].map(tr => ({
    id: tr.dataset.member,
    role: tr.querySelector('.role').textContent,
    tags: [...tr.querySelectorAll('.tag')].map(e => e.textContent).join(','),
    url: tr.querySelector('.url a')?.textContent ?? '',
  })),
  locks: [...document.querySelectorAll('#locks-body tr')].map(tr => ({
    name: tr.dataset.lock,
    kind: tr.querySelector('.kind .kind-name').textContent,
    kind_sub: tr.querySelector('.kind .sub')?.textContent ?? '',
    delay: tr.querySelector('.delay')?.textContent ?? '',
    holders: [...tr.querySelectorAll('.holder .line')].map(e => e.textContent),
    tokens: [...tr.querySelectorAll('.token .line')].map(e => e.textContent),
    ttls: [...tr.querySelectorAll('.ttl .line')].map(e => e.textContent),
    values: [...tr.querySelectorAll('.value .line')].map(e => e.textContent),
    holder: tr.querySelector('.holder').textContent,
    token: tr.querySelector('.token').textContent,
    ttl: tr.querySelector('.ttl').textContent,
    queue: tr.querySelector('.queue').textContent,
  })),
})`

// waitPage reads the page until cond holds, failing after timeout with the
// last state it saw.
func waitPage(t *testing.T, ctx context.Context, what string, timeout time.Duration, cond func(pageState) bool) pageState {
	t.Helper()
	p, err := readPageUntil(ctx, timeout, cond)
	if err != nil {
		t.Fatalf("page did not show %s: %v", what, err)
	}
	return p
}

// readPageUntil reads the page until cond holds or timeout passes.
func readPageUntil(ctx context.Context, timeout time.Duration, cond func(pageState) bool) (pageState, error) {
	deadline := time.Now().Add(timeout)
	var last pageState
	var lastErr error
	for time.Now().Before(deadline) {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](readPage))
		if err == nil {
			var p pageState
			if err = json.Unmarshal([]byte(s), &p); err == nil {
				last = p
				if cond(p) {
					return p, nil
				}
			}
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return last, fmt.Errorf("not within %s; last read error: %v; page: %+v", timeout, lastErr, last)
}

func TestDashboardInBrowser(t *testing.T) {
	bin := chromium(t)
	// Registered first, so it runs last: after the cluster and the browser
	// are stopped, nothing of theirs may be left running. (Except
	// hashicorp/raft's readers of inbound connections from a killed member,
	// which its NetworkTransport does not close.)
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"))
	})
	c := testutil.NewCluster(t, 3, testutil.Options{})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	browser := startBrowser(t, ctx, bin)

	// Open the page on the leader, through the /ui redirect. (A young
	// cluster on a busy machine may still move its leadership once: then
	// open it on the new leader.)
	openOnLeader := func() *testutil.Member {
		t.Helper()
		for try := 1; ; try++ {
			l := c.WaitLeader(15 * time.Second)
			if err := chromedp.Do(browser, chromedp.Navigate(l.URL()+"/ui")); err != nil {
				t.Fatal(err)
			}
			_, err := readPageUntil(browser, 10*time.Second, func(p pageState) bool {
				return p.Conn == "live" && p.Leader == l.ID && p.Self == l.ID && p.role(l.ID) == "Leader" && len(p.Members) == 3
			})
			if err == nil {
				return l
			}
			if try == 3 {
				t.Fatalf("page did not show the leader %s, live: %v", l.ID, err)
			}
			t.Logf("opening the page on leader %s: %v; again", l.ID, err)
		}
	}
	leader := openOnLeader()

	// Take locks while the page is open: it must show them without a reload.
	acquire := func(name string, body map[string]any) uint64 {
		t.Helper()
		r := callRetry(ctx, http.MethodPost, leader.URL()+"/api/v1/locks/"+strings.ReplaceAll(name, "/", "%2F")+"/acquire", body)
		if r.Status != 200 || r.Body["acquired"] != true {
			t.Fatalf("acquire %s: %d %s", name, r.Status, r.Raw)
		}
		return r.Uint("fencing_token")
	}
	token := acquire("payment-processor", map[string]any{"client_id": "worker-7", "ttl_ms": 90000})
	acquire("inventory/rebalance", map[string]any{"client_id": "planner-2", "ttl_ms": 45000})
	sess := callRetry(ctx, http.MethodPost, leader.URL()+"/api/v1/sessions", map[string]any{"client_id": "cron-1", "ttl_ms": 60000})
	if sess.Status != 200 {
		t.Fatalf("create session: %d %s", sess.Status, sess.Raw)
	}
	acquire("jobs/nightly-report", map[string]any{"client_id": "cron-1", "session_id": sess.Str("session_id")})

	// Two clients queue behind worker-7 (blocking acquires; they end when
	// the leader dies, and keep their queue places until their deadline).
	waitCtx, stopWaiters := context.WithCancel(ctx)
	var waiters sync.WaitGroup
	defer func() { stopWaiters(); waiters.Wait() }()
	for _, id := range []string{"worker-8", "worker-9"} {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			testutil.Call(waitCtx, http.MethodPost, leader.URL()+"/api/v1/locks/payment-processor/acquire",
				map[string]any{"client_id": id, "ttl_ms": 30000, "wait_timeout_ms": 90000})
		}()
		// FIFO order on the page is not what is checked; still, queue them one by one.
		waitQueue(t, ctx, leader.URL(), "payment-processor", map[string]int{"worker-8": 1, "worker-9": 2}[id])
	}

	tokenText := strconv.FormatUint(token, 10)
	p := waitPage(t, browser, "the locks", 10*time.Second, func(p pageState) bool {
		l, ok := p.lock("payment-processor")
		s, ok2 := p.lock("jobs/nightly-report")
		return ok && ok2 && strings.HasPrefix(l.Holder, "worker-7") && l.Token == tokenText && l.Queue == "2" &&
			strings.HasSuffix(l.TTL, "s") && strings.HasPrefix(s.Holder, "cron-1") && s.TTL == "session"
	})
	// The lock kinds: a shared lock with two holders and their values, a
	// semaphore, and a lock-delay left by a revoked holder.
	tok1 := acquire("config/reader", map[string]any{"client_id": "reader-1", "ttl_ms": 90000, "mode": "shared", "value": "v=1"})
	tok2 := acquire("config/reader", map[string]any{"client_id": "reader-2", "ttl_ms": 80000, "mode": "shared", "value": "v=2"})
	acquire("pool/db", map[string]any{"client_id": "app-1", "ttl_ms": 90000, "limit": 3})
	acquire("election/leader", map[string]any{"client_id": "old-leader", "ttl_ms": 90000, "lock_delay_ms": 60000, "value": "10.0.0.5:7070"})
	if r := callRetry(ctx, http.MethodDelete, leader.URL()+"/api/v1/locks/election%2Fleader", nil); r.Status != 200 {
		t.Fatalf("revoke election/leader: %d %s", r.Status, r.Raw)
	}
	p = waitPage(t, browser, "the lock kinds", 10*time.Second, func(p pageState) bool {
		sh, ok1 := p.lock("config/reader")
		sem, ok2 := p.lock("pool/db")
		el, ok3 := p.lock("election/leader")
		return ok1 && ok2 && ok3 &&
			sh.Kind == "shared" && sh.KindSub == "2 holders" &&
			slices.Equal(sh.Holders, []string{"reader-1", "reader-2"}) && slices.Equal(sh.Values, []string{"v=1", "v=2"}) &&
			slices.Equal(sh.Tokens, []string{strconv.FormatUint(tok1, 10), strconv.FormatUint(tok2, 10)}) &&
			len(sh.TTLs) == 2 && strings.HasSuffix(sh.TTLs[1], "s") &&
			sem.Kind == "semaphore 3" && sem.KindSub == "1 of 3 held" && slices.Equal(sem.Holders, []string{"app-1"}) &&
			strings.HasPrefix(el.Delay, "delayed for ") && strings.HasSuffix(el.Delay, " s") && el.Holder == "free" && el.Kind == "—"
	})
	if l, _ := p.lock("payment-processor"); l.Kind != "exclusive" || l.KindSub != "" {
		t.Errorf("an ordinary lock shows kind %q %q", l.Kind, l.KindSub)
	}
	t.Logf("page shows config/reader: %+v", must(p.lock("config/reader")))

	// The countdown runs in the page.
	before, _ := p.lock("payment-processor")
	p = waitPage(t, browser, "the time left counting down", 5*time.Second, func(p pageState) bool {
		l, _ := p.lock("payment-processor")
		return l.TTL != before.TTL
	})
	t.Logf("page shows payment-processor: %+v", before)

	// Kill the leader: the page loses its stream, moves to another member,
	// and shows the new leader, with the locks intact. It can move only to
	// members whose address it knows: wait until every member's is on the
	// page (each publishes it once it knows the leader).
	waitPage(t, browser, "every member's address", 10*time.Second, func(p pageState) bool {
		for _, m := range p.Members {
			if m.URL == "" {
				return false
			}
		}
		return len(p.Members) == 3
	})
	if l := c.WaitLeader(15 * time.Second); l.ID != leader.ID {
		t.Logf("leadership moved from %s to %s; reopening the page on %s", leader.ID, l.ID, l.ID)
		leader = openOnLeader()
	}
	old := leader.ID
	c.Kill(old)
	var rest []string
	for _, m := range c.Up() {
		rest = append(rest, m.ID)
	}
	newLeader := c.WaitLeaderAmong(rest, 15*time.Second)
	// The page must land on the new leader: a live member that the page
	// names as leader, that serves the page and says it leads (no notice).
	// Two members may still trade leadership on a busy machine, so any of
	// them qualifies, not only the first one elected.
	p = waitPage(t, browser, "a new leader ("+newLeader.ID+" was elected first)", 20*time.Second, func(p pageState) bool {
		l, ok := p.lock("payment-processor")
		tags := ""
		for _, m := range p.Members {
			if m.ID == old {
				tags = m.Tags
			}
		}
		return p.Conn == "live" && slices.Contains(rest, p.Leader) && p.Self == p.Leader && p.Notice == "" &&
			strings.Contains(tags, "unreachable") &&
			p.role(p.Leader) == "Leader" && p.role(old) == "Follower" &&
			ok && strings.HasPrefix(l.Holder, "worker-7") && l.Token == tokenText && l.Queue == "2"
	})
	t.Logf("after killing %s the page shows leader %s (served by %s, term %s)", old, p.Leader, p.Self, p.Term)

	// Let the bars finish their transition, then take the screenshot.
	time.Sleep(500 * time.Millisecond)
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	out := filepath.Join(t.TempDir(), "dashboard.png")
	if os.Getenv("LOCKD_UPDATE_SCREENSHOT") == "1" {
		out = filepath.Join("..", "..", "docs", "dashboard.png")
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot (%d bytes) saved to %s", len(png), out)

	// A page opened on a follower on purpose stays there and says that it
	// shows the follower's local replica.
	var follower *testutil.Member
	for _, m := range c.Up() {
		if m.ID != p.Leader {
			follower = m
		}
	}
	if err := chromedp.Do(browser, chromedp.Navigate(follower.URL()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	onFollower := func(p pageState) bool {
		l, ok := p.lock("payment-processor")
		// (Should this member win an election meanwhile, it says so and
		// drops the notice.)
		stale := p.Leader != follower.ID
		return p.Conn == "live" && p.Self == follower.ID && p.Leader != "" && p.Leader != old &&
			strings.Contains(p.Notice, "local replica") == stale && ok && l.Token == tokenText
	}
	waitPage(t, browser, "the follower's view", 10*time.Second, onFollower)
	time.Sleep(time.Second)
	waitPage(t, browser, "the follower's view, still", 2*time.Second, onFollower)
}

// startBrowser starts headless Chromium for one test: 1280 px wide at 2x
// (a crisp screenshot), light theme, with extra flags from opts. It stops
// when the test ends, and the test fails on any uncaught exception of the
// page.
func startBrowser(t *testing.T, ctx context.Context, bin string, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	var logOpen atomic.Bool
	logOpen.Store(true)
	logf := func(format string, args ...any) {
		if logOpen.Load() {
			t.Logf("chromedp: "+format, args...)
		}
	}
	// Headless, as root in a container, nothing talking to the network
	// but the page.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	}, opts...)...)
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithErrorf(logf))

	var exMu sync.Mutex
	var exceptions []string
	t.Cleanup(func() {
		exMu.Lock()
		for _, e := range exceptions {
			t.Errorf("uncaught exception in the page: %s", e)
		}
		exMu.Unlock()
		// Close the browser and wait for its processes, bounded.
		done := make(chan struct{})
		go func() {
			cancelBrowser()
			cancelAlloc()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("the browser did not stop within 20s")
		}
		logOpen.Store(false)
	})

	// Start the browser; log the page's console, record its exceptions.
	if err := chromedp.Do(browser, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	if err := chromedp.Listen(browser, func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, strings.Trim(string(a.Value), `"`))
			}
			logf("console.%s: %s", e.Type, strings.Join(parts, " "))
		case *runtime.EventExceptionThrown:
			if e.ExceptionDetails == nil {
				return
			}
			msg := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
			exMu.Lock()
			exceptions = append(exceptions, msg)
			exMu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1280, 600, chromedp.EmulateScale(2))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(browser, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "light"}}}); err != nil {
		t.Fatal(err)
	}
	return browser
}

// TestDashboardInBrowserWithAuth: with authentication on, the page asks
// for a token, refuses one without read access to every lock, goes live
// with one that has it and shows the locks taken meanwhile; and no request
// it makes carries the token in its URL: it goes in the Authorization
// header.
func TestDashboardInBrowserWithAuth(t *testing.T) {
	bin := chromium(t)
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"))
	})
	const opsToken, billingToken = "ops-token-0123456789", "billing-token-0123456789"
	_, store := testutil.AuthFile(t, `{"tokens": [
	  {"name": "ops", "token": "`+opsToken+`", "permissions": [{"prefix": "", "access": "admin"}]},
	  {"name": "billing", "token": "`+billingToken+`", "permissions": [{"prefix": "billing/", "access": "lock"}]}
	]}`)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Auth, cfg.PeerToken = store, opsToken
	}})
	m := c.WaitLeader(15 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	browser := startBrowser(t, ctx, bin)
	sent := recordRequests(t, browser)
	if err := chromedp.Do(browser, chromedp.Navigate(m.URL()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, "the token form", 10*time.Second, func(p pageState) bool {
		return p.Auth && p.Conn == "lost" && p.Leader == "—"
	})
	submit := func(token string) {
		t.Helper()
		if err := chromedp.Do(browser, chromedp.Steps(
			chromedp.SetValue(chromedp.CSS("#auth-token"), token),
			chromedp.Click(chromedp.CSS("#auth-submit")),
		)); err != nil {
			t.Fatal(err)
		}
	}
	submit(billingToken)
	waitPage(t, browser, "the refusal of a prefix-only token", 10*time.Second, func(p pageState) bool {
		return p.Auth && strings.Contains(p.AuthText, "lacks read access")
	})
	submit(opsToken)
	waitPage(t, browser, "the dashboard, live", 10*time.Second, func(p pageState) bool {
		return !p.Auth && p.Conn == "live" && p.Leader == m.ID && p.Self == m.ID
	})

	// A lock taken now reaches the page over the stream it holds open.
	r := callToken(ctx, http.MethodPost, m.URL()+"/api/v1/locks/billing%2Finvoices/acquire", opsToken,
		map[string]any{"client_id": "biller-1", "ttl_ms": 60000})
	if r.Status != 200 || r.Body["acquired"] != true {
		t.Fatalf("acquire: %d %s", r.Status, r.Raw)
	}
	tokenText := strconv.FormatUint(r.Uint("fencing_token"), 10)
	waitPage(t, browser, "the lock taken while the page was open", 10*time.Second, func(p pageState) bool {
		l, ok := p.lock("billing/invoices")
		return ok && strings.HasPrefix(l.Holder, "biller-1") && l.Token == tokenText
	})

	reqs := sent.all()
	var streams int
	for _, r := range reqs {
		if strings.Contains(strings.ToLower(r.URL), "access_token") || strings.Contains(r.URL, opsToken) {
			t.Errorf("the page put the token in a URL: %s %s", r.Method, r.URL)
		}
		if strings.HasSuffix(r.URL, "/ui/events") && r.Auth == "Bearer "+opsToken {
			streams++
		}
	}
	if streams == 0 {
		t.Errorf("no request for /ui/events carried the token in its Authorization header; requests: %+v", reqs)
	}
}

// sentRequest is one request the page made, as the browser reports it
// before sending it.
type sentRequest struct {
	Method, URL string
	Auth        string // the Authorization header, "" without one
}

// requestLog records every request the browser sends
// (network.EventRequestWillBeSent).
type requestLog struct {
	mu   sync.Mutex
	reqs []sentRequest
}

func recordRequests(t *testing.T, browser context.Context) *requestLog {
	t.Helper()
	l := &requestLog{}
	if err := chromedp.Listen(browser, func(ev any) {
		e, ok := ev.(*network.EventRequestWillBeSent)
		if !ok || e.Request == nil {
			return
		}
		r := sentRequest{Method: e.Request.Method, URL: e.Request.URL}
		for k, v := range e.Request.Headers {
			if strings.EqualFold(k, "Authorization") {
				r.Auth = fmt.Sprint(v)
			}
		}
		l.mu.Lock()
		l.reqs = append(l.reqs, r)
		l.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *requestLog) all() []sentRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// callToken is testutil.Call with a bearer token.
func callToken(ctx context.Context, method, url, token string, body any) testutil.Reply {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(b))
	if err != nil {
		return testutil.Reply{Raw: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return testutil.Reply{Raw: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := testutil.Reply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// callRetry is testutil.Call retried (for up to 15 s) while the cluster has
// no leader or the member does not answer: a young cluster on a busy
// machine may still change leaders, and the writes used here are safe to
// retry.
func callRetry(ctx context.Context, method, url string, body any) testutil.Reply {
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := testutil.Call(ctx, method, url, body)
		if (r.Status != 0 && r.Status != http.StatusServiceUnavailable) || time.Now().After(deadline) || ctx.Err() != nil {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitQueue waits until the leader reports n waiters on a lock.
func waitQueue(t *testing.T, ctx context.Context, base, lock string, n int) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d waiters on %s", n, lock), func() bool {
		r := testutil.Call(ctx, http.MethodGet, base+"/api/v1/locks/"+lock, nil)
		return r.Status == 200 && r.Uint("waiters") == uint64(n)
	})
}
