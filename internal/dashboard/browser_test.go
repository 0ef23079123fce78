package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

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
	Conn    string `json:"conn"`
	ConnMsg string `json:"conn_msg"`
	Leader  string `json:"leader"`
	Term    string `json:"term"`
	Self    string `json:"self"`
	Notice  string `json:"notice"`
	Members []struct {
		ID   string `json:"id"`
		Role string `json:"role"`
		Tags string `json:"tags"`
	} `json:"members"`
	Locks []pageLock `json:"locks"`
}

type pageLock struct {
	Name   string `json:"name"`
	Holder string `json:"holder"`
	Token  string `json:"token"`
	TTL    string `json:"ttl"`
	Queue  string `json:"queue"`
}

func (p pageState) lock(name string) (pageLock, bool) {
	for _, l := range p.Locks {
		if l.Name == name {
			return l, true
		}
	}
	return pageLock{}, false
}

func (p pageState) role(id string) string {
	for _, m := range p.Members {
		if m.ID == id {
			return m.Role
		}
	}
	return ""
}

const readPage = `JSON.stringify({
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
  })),
  locks: [...document.querySelectorAll('#locks-body tr')].map(tr => ({
    name: tr.dataset.lock,
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
					return p
				}
			}
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("page did not show %s within %s; last read error: %v; page: %+v", what, timeout, lastErr, last)
	return last
}

func TestDashboardInBrowser(t *testing.T) {
	bin := chromium(t)
	c := testutil.NewCluster(t, 3, testutil.Options{})
	leader := c.WaitLeader(15 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The browser: headless, as root in a container, nothing talking to
	// the network but the page.
	var logOpen atomic.Bool
	logOpen.Store(true)
	defer logOpen.Store(false)
	logf := func(format string, args ...any) {
		if logOpen.Load() {
			t.Logf("chromedp: "+format, args...)
		}
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
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
	)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithErrorf(logf))
	defer func() {
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
	}()

	// Start the browser and record uncaught exceptions of the page.
	if err := chromedp.Do(browser, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	var exMu sync.Mutex
	var exceptions []string
	if err := chromedp.Listen(browser, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
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
	defer func() {
		exMu.Lock()
		defer exMu.Unlock()
		for _, e := range exceptions {
			t.Errorf("uncaught exception in the page: %s", e)
		}
	}()

	// A 1280 px wide page at 2x (a crisp screenshot; the full page is
	// captured), light theme.
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1280, 600, chromedp.EmulateScale(2))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(browser, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "light"}}}); err != nil {
		t.Fatal(err)
	}

	// Open the page on the leader, through the /ui redirect.
	if err := chromedp.Do(browser, chromedp.Navigate(leader.URL()+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, "the leader, live", 10*time.Second, func(p pageState) bool {
		return p.Conn == "live" && p.Leader == leader.ID && p.Self == leader.ID && p.role(leader.ID) == "Leader" && len(p.Members) == 3
	})

	// Take locks while the page is open: it must show them without a reload.
	acquire := func(name string, body map[string]any) uint64 {
		t.Helper()
		r := testutil.Call(ctx, http.MethodPost, leader.URL()+"/api/v1/locks/"+strings.ReplaceAll(name, "/", "%2F")+"/acquire", body)
		if r.Status != 200 || r.Body["acquired"] != true {
			t.Fatalf("acquire %s: %d %s", name, r.Status, r.Raw)
		}
		return r.Uint("fencing_token")
	}
	token := acquire("payment-processor", map[string]any{"client_id": "worker-7", "ttl_ms": 90000})
	acquire("inventory/rebalance", map[string]any{"client_id": "planner-2", "ttl_ms": 45000})
	sess := testutil.Call(ctx, http.MethodPost, leader.URL()+"/api/v1/sessions", map[string]any{"client_id": "cron-1", "ttl_ms": 60000})
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
	// The countdown runs in the page.
	before, _ := p.lock("payment-processor")
	p = waitPage(t, browser, "the time left counting down", 5*time.Second, func(p pageState) bool {
		l, _ := p.lock("payment-processor")
		return l.TTL != before.TTL
	})
	t.Logf("page shows payment-processor: %+v", before)

	// Kill the leader: the page loses its stream, moves to another member,
	// and shows the new leader, with the locks intact.
	old := leader.ID
	c.Kill(old)
	var rest []string
	for _, m := range c.Up() {
		rest = append(rest, m.ID)
	}
	newLeader := c.WaitLeaderAmong(rest, 15*time.Second)
	p = waitPage(t, browser, "the new leader "+newLeader.ID, 20*time.Second, func(p pageState) bool {
		l, ok := p.lock("payment-processor")
		return p.Conn == "live" && p.Leader == newLeader.ID && p.Self == newLeader.ID && p.Notice == "" &&
			strings.Contains(p.Members[0].Tags+p.Members[1].Tags+p.Members[2].Tags, "unreachable") &&
			p.role(newLeader.ID) == "Leader" && p.role(old) == "Follower" &&
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
		if m.ID != newLeader.ID {
			follower = m
		}
	}
	if err := chromedp.Do(browser, chromedp.Navigate(follower.URL()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	onFollower := func(p pageState) bool {
		l, ok := p.lock("payment-processor")
		return p.Conn == "live" && p.Self == follower.ID && p.Leader == newLeader.ID &&
			strings.Contains(p.Notice, "local replica") && ok && l.Token == tokenText
	}
	waitPage(t, browser, "the follower's view", 10*time.Second, onFollower)
	time.Sleep(time.Second)
	waitPage(t, browser, "the follower's view, still", time.Second, onFollower)
}

// waitQueue waits until the leader reports n waiters on a lock.
func waitQueue(t *testing.T, ctx context.Context, base, lock string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r := testutil.Call(ctx, http.MethodGet, base+"/api/v1/locks/"+lock, nil)
		if r.Status == 200 && r.Uint("waiters") == uint64(n) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(fmt.Sprintf("%s never had %d waiters", lock, n))
}
