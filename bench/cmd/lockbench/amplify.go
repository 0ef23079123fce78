package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/lockd/lockd/api"
)

// The amplification benchmark (`lockbench amplify`): what one client with
// a lock token can make the leader hold, case by case (SPEC 16, "memory
// follows bytes"; the goal: the leader grows by less than 64 MiB in each).
// Each case reads the leader's RSS (VmRSS, sampled, and VmHWM after
// resetting it through /proc/<pid>/clear_refs) and Go heap (/metrics
// go_memstats_heap_inuse_bytes, polled) before, at the peak, and after, and
// says what the server answered.
//
//	a  a semaphore with many holders, each with a value, and parked
//	   blocking queries on it (GET ?index=N&wait=5m), then one change
//	b  one WebSocket with watches on that semaphore that never reads its
//	   socket, then changes
//	c  many connections × many watches, opened as fast as possible
//	d  many concurrent plain reads of the semaphore's status, of a list
//	   holding it and of the largest page of its holders
//	e  value bytes: many locks, each with a value of the largest size

type ampOpts struct {
	cases          []string
	holders        int
	valueBytes     int
	queries        int
	queryWait      time.Duration
	watches        int
	changes        int
	rcvBuf         int
	watchConns     int
	watchesPerConn int
	readers        int
	valueLocks     int
	settle         time.Duration
	caseTimeout    time.Duration
	sample         time.Duration
	concurrency    int
	fresh          bool
}

// ampCase is one case's outcome.
type ampCase struct {
	Key        string      `json:"key"`
	Desc       string      `json:"desc"`
	Seconds    float64     `json:"seconds"`
	RSSBefore  float64     `json:"rss_before_mib"`
	RSSPeak    float64     `json:"rss_peak_mib"`
	RSSAfter   float64     `json:"rss_after_mib"`
	HeapBefore float64     `json:"heap_before_mib"`
	HeapPeak   float64     `json:"heap_peak_mib"`
	HeapAfter  float64     `json:"heap_after_mib"`
	Growth     float64     `json:"rss_growth_mib"` // peak − before
	GoalMet    bool        `json:"goal_met"`       // growth < 64 MiB
	Answers    []codeCount `json:"answers"`
	Notes      []string    `json:"notes,omitempty"`
	Error      string      `json:"error,omitempty"`
	// Case b's second phase, after "after": the stuck connection read
	// back and closed. Its peak is reported apart: the goal is about the
	// client that does not read.
	RSSPeakThen    float64 `json:"rss_peak_reading_back_mib,omitempty"`
	HeapPeakThen   float64 `json:"heap_peak_reading_back_mib,omitempty"`
	RSSAfterClose  float64 `json:"rss_after_close_mib,omitempty"`
	HeapAfterClose float64 `json:"heap_after_close_mib,omitempty"`
}

type ampReport struct {
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished"`
	Host       hostInfo  `json:"host"`
	Members    int       `json:"members"`
	LockdFlags []string  `json:"lockd_flags"`
	Options    struct {
		Holders        int     `json:"semaphore_holders"`
		ValueBytes     int     `json:"value_bytes"`
		Queries        int     `json:"parked_queries"`
		Watches        int     `json:"stuck_watches"`
		Changes        int     `json:"changes"`
		WatchConns     int     `json:"watch_connections"`
		WatchesPerConn int     `json:"watches_per_connection"`
		Readers        int     `json:"readers"`
		ValueLocks     int     `json:"value_locks"`
		SettleSeconds  float64 `json:"settle_seconds"`
	} `json:"options"`
	// Setup: loading the semaphore (cases a, b, d share it).
	Setup *ampCase   `json:"semaphore_setup,omitempty"`
	Cases []*ampCase `json:"cases"`
}

const ampGoalMiB = 64

var ampCaseKeys = []string{"a", "b", "c", "d", "e"}

func amplifyMain(args []string) int {
	fs := flag.NewFlagSet("lockbench amplify", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	// One member unless asked: the leader's memory is what is measured.
	cf.members = 1
	fs.Lookup("members").DefValue = "1"
	var o ampOpts
	casesFlag := fs.String("cases", "a,b,c,d,e", "cases to run, from a,b,c,d,e")
	fs.IntVar(&o.holders, "holders", 10_000, "holders of the semaphore (its limit; at most 10000)")
	fs.IntVar(&o.valueBytes, "value-bytes", 4096, "value of each holder and of each lock of case e (at most 4096)")
	fs.IntVar(&o.queries, "queries", 200, "case a: blocking queries parked on the semaphore")
	fs.DurationVar(&o.queryWait, "query-wait", 5*time.Minute, "case a: their wait")
	fs.IntVar(&o.watches, "watches", 60, "case b: watches on the semaphore over one WebSocket that never reads")
	fs.IntVar(&o.changes, "changes", 5, "case b: changes to the semaphore made while it does not read")
	fs.IntVar(&o.rcvBuf, "rcvbuf", 16<<10, "case b: the stuck client's socket receive buffer (bytes)")
	fs.IntVar(&o.watchConns, "watch-conns", 16, "case c: connections")
	fs.IntVar(&o.watchesPerConn, "watches-per-conn", 1024, "case c: watches per connection (on distinct locks)")
	fs.IntVar(&o.readers, "readers", 50, "case d: concurrent readers, each reading the semaphore's status, a list holding it and a page of 10000 of its holders")
	fs.IntVar(&o.valueLocks, "value-locks", 20_000, "case e: locks acquired with a value of --value-bytes")
	fs.DurationVar(&o.settle, "settle", 2*time.Second, "time after a case's last action before reading \"after\"")
	fs.DurationVar(&o.caseTimeout, "case-timeout", 3*time.Minute, "bound of one case")
	fs.DurationVar(&o.sample, "sample", 50*time.Millisecond, "how often the leader's RSS is read during a case")
	fs.IntVar(&o.concurrency, "concurrency", 32, "HTTP clients loading holders and locks")
	fs.BoolVar(&o.fresh, "fresh", true, "restart every member (on its data dir) before each case, so each starts from a fresh process holding the same state")
	lockdFlags := fs.String("lockd-flags", "", "extra lockd flags for every member, space-separated (e.g. \"--max-watches 4096\")")
	quick := fs.Bool("quick", false, "a smoke run: --holders 500 --queries 20 --watches 6 --changes 3 --watch-conns 4 --watches-per-conn 64 --readers 5 --value-locks 500 --settle 500ms, unless set")
	timeout := fs.Duration("timeout", 20*time.Minute, "bound of the whole run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		quickDefaults(set, map[string]func(){
			"holders":          func() { o.holders = 500 },
			"queries":          func() { o.queries = 20 },
			"watches":          func() { o.watches = 6 },
			"changes":          func() { o.changes = 3 },
			"watch-conns":      func() { o.watchConns = 4 },
			"watches-per-conn": func() { o.watchesPerConn = 64 },
			"readers":          func() { o.readers = 5 },
			"value-locks":      func() { o.valueLocks = 500 },
			"settle":           func() { o.settle = 500 * time.Millisecond },
		})
	}
	o.cases = splitList(*casesFlag)
	if err := o.validate(cf.members); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench amplify:", err)
		return 2
	}
	sctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	repo, bin, dir, done, err := cf.prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer done()
	rep := &ampReport{Started: time.Now(), Host: describeHost(repo), Members: cf.members,
		LockdFlags: append([]string{"--log-level", "info"}, strings.Fields(*lockdFlags)...)}
	rep.Options.Holders, rep.Options.ValueBytes, rep.Options.Queries, rep.Options.Watches = o.holders, o.valueBytes, o.queries, o.watches
	rep.Options.Changes, rep.Options.WatchConns, rep.Options.WatchesPerConn = o.changes, o.watchConns, o.watchesPerConn
	rep.Options.Readers, rep.Options.ValueLocks, rep.Options.SettleSeconds = o.readers, o.valueLocks, o.settle.Seconds()
	fmt.Fprintf(os.Stderr, "starting %d lockd member(s) ...\n", cf.members)
	lc, err := startLockd(ctx, bin, filepath.Join(dir, "lockd"), cf.members, rep.LockdFlags)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		return 1
	}
	defer lc.stop()
	runErr := runAmplify(ctx, lc, o, rep)
	rep.Finished = time.Now()
	var md strings.Builder
	writeAmplifyMarkdown(&md, rep)
	writeOutputs(cf.out, "amplify", md.String(), rep)
	fmt.Fprintf(os.Stderr, "wrote %s/amplify.json, amplify.md (%s)\n", cf.out, rep.Finished.Sub(rep.Started).Round(time.Second))
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "lockbench amplify:", runErr)
		return 1
	}
	return 0
}

func (o ampOpts) validate(members int) error {
	if len(o.cases) == 0 {
		return errors.New("no --cases")
	}
	for _, c := range o.cases {
		if !slices.Contains(ampCaseKeys, c) {
			return fmt.Errorf("unknown case %q (want a,b,c,d,e)", c)
		}
	}
	switch {
	case members < 1:
		return errors.New("--members must be positive")
	case o.holders < 1 || o.holders > api.MaxLimit:
		return fmt.Errorf("--holders must be 1–%d (a semaphore's largest limit)", api.MaxLimit)
	case o.valueBytes < 0 || o.valueBytes > api.MaxValueBytes:
		return fmt.Errorf("--value-bytes must be 0–%d", api.MaxValueBytes)
	case o.queries < 0 || o.watches < 0 || o.changes < 0 || o.watchConns < 0 || o.watchesPerConn < 0 || o.readers < 0 || o.valueLocks < 0:
		return errors.New("counts must not be negative")
	case o.queryWait <= 0 || o.queryWait > api.MaxWait:
		return fmt.Errorf("--query-wait must be positive and at most %v", api.MaxWait)
	case o.settle < 0 || o.caseTimeout <= 0 || o.sample <= 0 || o.concurrency < 1:
		return errors.New("--settle, --case-timeout, --sample and --concurrency must be positive")
	}
	return nil
}

// amp carries what the cases share.
type amp struct {
	o      ampOpts
	lc     *lockdCluster
	leader *lockdMember
	hc     *http.Client
	// changer is a holder of the semaphore (the first granted) whose
	// value changes make the cases' changes.
	mu           sync.Mutex
	changer      string
	changerToken uint64
}

const ampSem = "amp-sem"

func runAmplify(ctx context.Context, lc *lockdCluster, o ampOpts, rep *ampReport) error {
	l, err := lc.leader(ctx)
	if err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	a := &amp{o: o, lc: lc, leader: l,
		hc: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	needSem := slices.ContainsFunc(o.cases, func(c string) bool { return c == "a" || c == "b" || c == "d" })
	if needSem {
		rep.Setup = a.measure(ctx, "setup", fmt.Sprintf("a semaphore of %d holders, each with a %d-byte value, loaded by %d HTTP clients", o.holders, o.valueBytes, o.concurrency), a.loadSemaphore, nil)
		printCase(rep.Setup)
	}
	for _, k := range o.cases {
		var c *ampCase
		switch k {
		case "a":
			c = a.measure(ctx, "a", fmt.Sprintf("%d blocking queries parked on the semaphore (GET ?index=N&wait=%v), then one change", o.queries, o.queryWait), a.parkedQueries, nil)
		case "b":
			c = a.stuckWatcher(ctx)
		case "c":
			c = a.measure(ctx, "c", fmt.Sprintf("%d connections × %d watches (distinct locks), opened as fast as possible", o.watchConns, o.watchesPerConn), a.manyWatches, nil)
		case "d":
			c = a.measure(ctx, "d", fmt.Sprintf("%d concurrent readers, each reading the semaphore's status, a list page holding it and a page of %d of its holders", o.readers, api.MaxListLimit), a.bigReads, nil)
		case "e":
			c = a.measure(ctx, "e", fmt.Sprintf("%d locks acquired with a %d-byte value each (%.0f MiB of values)", o.valueLocks, o.valueBytes, float64(o.valueLocks*o.valueBytes)/(1<<20)), a.valueLocks, nil)
		}
		rep.Cases = append(rep.Cases, c)
		printCase(c)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

func printCase(c *ampCase) {
	fmt.Fprintf(os.Stderr, "  %s: RSS %.0f → %.0f (peak) → %.0f MiB, heap %.0f → %.0f → %.0f MiB, %.1f s; %s\n", c.Key, c.RSSBefore, c.RSSPeak, c.RSSAfter,
		c.HeapBefore, c.HeapPeak, c.HeapAfter, c.Seconds, fmtCounts(c.Answers))
}

// tally counts answers by name. Safe for concurrent use.
type tally struct {
	mu sync.Mutex
	m  map[string]int64
}

func (t *tally) add(k string) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]int64{}
	}
	t.m[k]++
	t.mu.Unlock()
}

func (t *tally) counts() []codeCount {
	t.mu.Lock()
	defer t.mu.Unlock()
	return sortedCounts(t.m)
}

// memWatch follows the leader's memory during a case.
type memWatch struct {
	pid     int
	base    string
	stop    chan struct{}
	done    chan struct{}
	rssPeak atomic.Int64 // KiB
	heapMax atomic.Int64 // bytes
}

func watchMemory(pid int, base string, every time.Duration) *memWatch {
	w := &memWatch{pid: pid, base: base, stop: make(chan struct{}), done: make(chan struct{})}
	// Reset VmHWM, so after the case it is this case's peak (Linux ≥ 4.0;
	// without it the sampled maximum stands).
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			rss, _ := memKB(pid)
			if rss > w.rssPeak.Load() {
				w.rssPeak.Store(rss)
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if v := metricValue(ctx, base, "go_memstats_heap_inuse_bytes"); int64(v) > w.heapMax.Load() {
				w.heapMax.Store(int64(v))
			}
			cancel()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	go func() { wg.Wait(); close(w.done) }()
	return w
}

// finish stops watching and returns the peaks (MiB).
func (w *memWatch) finish() (rss, heap float64) {
	close(w.stop)
	<-w.done
	_, hwm := memKB(w.pid)
	return float64(max(w.rssPeak.Load(), hwm)) / 1024, float64(w.heapMax.Load()) / (1 << 20)
}

// checkpoint returns the peaks so far (MiB) and starts a new phase.
func (w *memWatch) checkpoint() (rss, heap float64) {
	_, hwm := memKB(w.pid)
	rss, heap = float64(max(w.rssPeak.Swap(0), hwm))/1024, float64(w.heapMax.Swap(0))/(1<<20)
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", w.pid), []byte("5"), 0)
	return rss, heap
}

// memNow reads the leader's RSS and heap (MiB).
func (a *amp) memNow(ctx context.Context) (rss, heap float64) {
	kb, _ := memKB(a.leader.p.pid())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return float64(kb) / 1024, max(metricValue(cctx, a.leader.httpURL, "go_memstats_heap_inuse_bytes"), 0) / (1 << 20)
}

// measure runs one case between two memory readings, following the peak.
// then, when set, runs after the "after" reading, still under the peak
// watch (case b reads back its stuck connection and closes it there), and
// is followed by the "after close" reading.
func (a *amp) measure(ctx context.Context, key, desc string, run, then func(ctx context.Context, c *ampCase, t *tally) error) *ampCase {
	c := &ampCase{Key: key, Desc: desc}
	if a.o.fresh && key != "setup" {
		if err := a.restart(ctx); err != nil {
			c.Error = "restarting the cluster before the case: " + err.Error()
			return c
		}
	}
	c.RSSBefore, c.HeapBefore = a.memNow(ctx)
	w := watchMemory(a.leader.p.pid(), a.leader.httpURL, a.o.sample)
	cctx, cancel := context.WithTimeout(ctx, a.o.caseTimeout)
	defer cancel()
	t0 := time.Now()
	var t tally
	err := run(cctx, c, &t)
	c.Seconds = time.Since(t0).Seconds()
	sleepCtx(ctx, a.o.settle)
	c.RSSAfter, c.HeapAfter = a.memNow(ctx)
	if then != nil && err == nil {
		c.RSSPeak, c.HeapPeak = w.checkpoint()
		err = then(cctx, c, &t)
		sleepCtx(ctx, a.o.settle)
		c.RSSAfterClose, c.HeapAfterClose = a.memNow(ctx)
		c.RSSPeakThen, c.HeapPeakThen = w.finish()
		c.RSSPeakThen = max(c.RSSPeakThen, c.RSSAfterClose)
		c.HeapPeakThen = max(c.HeapPeakThen, c.HeapAfterClose)
	} else {
		c.RSSPeak, c.HeapPeak = w.finish()
	}
	c.RSSPeak = max(c.RSSPeak, c.RSSAfter, c.RSSBefore)
	c.HeapPeak = max(c.HeapPeak, c.HeapAfter, c.HeapBefore)
	c.Growth = c.RSSPeak - c.RSSBefore
	c.GoalMet = c.Growth < ampGoalMiB
	c.Answers = append(c.Answers, t.counts()...)
	if err != nil {
		c.Error = err.Error()
	}
	return c
}

// restart stops every member (SIGTERM) and starts them again on their data
// dirs, so a case starts on a fresh process holding the same state, not
// on the garbage and the unreturned heap of the one before.
func (a *amp) restart(ctx context.Context) error {
	a.lc.stop()
	if err := a.lc.startAll(ctx); err != nil {
		return err
	}
	l, err := a.lc.leader(ctx)
	if err != nil {
		return err
	}
	a.leader = l
	a.hc.Transport.(*http.Transport).CloseIdleConnections()
	// Let the new process finish starting (its first GC cycles) before
	// the "before" reading.
	sleepCtx(ctx, a.o.settle)
	return nil
}

// value is a value of n bytes for holder i.
func ampValue(i, n int) string {
	p := fmt.Sprintf("v%d-", i)
	if n <= len(p) {
		return p[:n]
	}
	return p + strings.Repeat("x", n-len(p))
}

// post sends body to path on the leader and returns the status, the
// error code (if any) and the body.
func (a *amp) post(ctx context.Context, path string, body any) (int, string, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.leader.httpURL+path, bytes.NewReader(b))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	var e api.ErrorReply
	if resp.StatusCode != http.StatusOK && json.Unmarshal(rb, &e) == nil {
		return resp.StatusCode, e.Error.Code, rb, err
	}
	return resp.StatusCode, "", rb, err
}

// answer names an HTTP answer for the tallies.
func answer(status int, code string) string {
	if code != "" {
		return fmt.Sprintf("%d %s", status, code)
	}
	return fmt.Sprint(status)
}

// loadSemaphore fills the semaphore: one acquire per holder, each with a
// value.
func (a *amp) loadSemaphore(ctx context.Context, c *ampCase, t *tally) error {
	limit, ttl := int64(a.o.holders), int64(api.MaxTTLms)
	var firstRefusal atomic.Value
	err := parallel(ctx, a.o.holders, a.o.concurrency, func(i int) error {
		v := ampValue(i, a.o.valueBytes)
		st, code, body, err := a.post(ctx, "/api/v1/locks/"+ampSem+"/acquire",
			api.AcquireRequest{ClientID: fmt.Sprintf("amp-h-%d", i), TTLms: &ttl, Limit: &limit, Value: &v})
		if err != nil {
			return err
		}
		t.add(answer(st, code))
		if st != http.StatusOK && firstRefusal.Load() == nil {
			firstRefusal.Store(string(bytes.TrimSpace(body)))
		}
		var ar api.AcquireReply
		if st == http.StatusOK && json.Unmarshal(body, &ar) == nil {
			a.mu.Lock()
			if a.changer == "" {
				a.changer, a.changerToken = fmt.Sprintf("amp-h-%d", i), ar.FencingToken
			}
			a.mu.Unlock()
		}
		return nil
	})
	if v := firstRefusal.Load(); v != nil {
		c.Notes = append(c.Notes, "first refusal: "+truncate(v.(string), 300))
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// semIndex reads the semaphore's status and returns its index and size.
func (a *amp) semIndex(ctx context.Context) (uint64, int64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.leader.httpURL+"/api/v1/locks/"+ampSem, nil)
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	var st api.LockStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return 0, 0, fmt.Errorf("status of %s: %s: %v", ampSem, resp.Status, err)
	}
	return st.Index, int64(len(b)), nil
}

// change sets the value of one holder of the semaphore again: a change
// every watcher and parked query of it is told about.
func (a *amp) change(ctx context.Context, k int) (string, error) {
	a.mu.Lock()
	who, tok := a.changer, a.changerToken
	a.mu.Unlock()
	if who == "" {
		return "", errors.New("the semaphore has no holder to change")
	}
	st, code, _, err := a.post(ctx, "/api/v1/locks/"+ampSem+"/value",
		api.ValueRequest{ClientID: who, FencingToken: tok, Value: ampValue(1_000_000+k, a.o.valueBytes)})
	return answer(st, code), err
}

// parkedQueries is case a.
func (a *amp) parkedQueries(ctx context.Context, c *ampCase, t *tally) error {
	idx, size, err := a.semIndex(ctx)
	if err != nil {
		return err
	}
	c.Notes = append(c.Notes, fmt.Sprintf("the semaphore's status was %d bytes before the change", size))
	var wg sync.WaitGroup
	var bytesRead, answered atomic.Int64
	u := fmt.Sprintf("%s/api/v1/locks/%s?index=%d&wait=%s", a.leader.httpURL, ampSem, idx, a.o.queryWait)
	for i := 0; i < a.o.queries; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			resp, err := a.hc.Do(req)
			if err != nil {
				t.add("query: " + errCode(err))
				return
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			bytesRead.Add(n)
			answered.Add(1)
			t.add(fmt.Sprintf("query %d", resp.StatusCode))
		}()
	}
	// The queries are parked once sent; a second lets the last ones in.
	sleepCtx(ctx, time.Second)
	ans, err := a.change(ctx, 0)
	t.add("change " + ans)
	if err != nil {
		return err
	}
	wg.Wait()
	c.Notes = append(c.Notes, fmt.Sprintf("%d of %d queries answered, %.1f MiB in all", answered.Load(), a.o.queries, float64(bytesRead.Load())/(1<<20)))
	return ctx.Err()
}

// stuckWatcher is case b: its "after" is read with the connection still
// open (what the leader holds for it); then the connection is read back,
// to see what the server made of it, and closed ("after close").
func (a *amp) stuckWatcher(ctx context.Context) *ampCase {
	o := a.o
	var stuck *websocket.Conn
	defer func() {
		if stuck != nil {
			_ = stuck.CloseNow()
		}
	}()
	return a.measure(ctx, "b", fmt.Sprintf("one WebSocket with %d watches on the semaphore that never reads its socket (receive buffer %d bytes), then %d changes", o.watches, o.rcvBuf, o.changes),
		func(ctx context.Context, c *ampCase, t *tally) error {
			var err error
			stuck, err = dialStuck(ctx, a.leader.httpURL, o.rcvBuf)
			if err != nil {
				return err
			}
			ttl := int64(60_000)
			frames := []api.WSRequest{{ID: 1, Op: api.OpHello, ClientID: "amp-stuck", SessionTTLms: &ttl}}
			for i := 0; i < o.watches; i++ {
				frames = append(frames, api.WSRequest{ID: uint64(2 + i), Op: api.OpWatch, Lock: ampSem})
			}
			for _, f := range frames {
				b, _ := json.Marshal(f)
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := stuck.Write(wctx, websocket.MessageText, b)
				cancel()
				if err != nil {
					return fmt.Errorf("writing to the stuck connection: %w", err)
				}
			}
			sleepCtx(ctx, time.Second)
			for k := 0; k < o.changes; k++ {
				ans, err := a.change(ctx, k)
				t.add("change " + ans)
				if err != nil {
					return err
				}
				sleepCtx(ctx, 200*time.Millisecond)
			}
			return nil
		},
		func(ctx context.Context, c *ampCase, t *tally) error {
			seen, n := readStuck(ctx, stuck, 10*time.Second, 512<<20)
			for _, s := range seen {
				for i := int64(0); i < s.Count; i++ {
					t.add(s.Code)
				}
			}
			c.Notes = append(c.Notes, fmt.Sprintf("read back from the stuck connection afterwards: %.1f MiB", float64(n)/(1<<20)))
			_ = stuck.CloseNow()
			stuck = nil
			return nil
		})
}

// dialStuck opens a WebSocket whose socket has a small receive buffer and
// that nobody reads.
func dialStuck(ctx context.Context, base string, rcvBuf int) (*websocket.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(rcvBuf)
			}
		}
		return c, err
	}}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, wsURL(base), &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(256 << 20)
	return c, nil
}

// readStuck reads what the server sent a connection that did not read, for
// at most d or limit bytes, and counts it: frames by type (errors by
// code) and how the connection ended; n is the bytes read.
func readStuck(ctx context.Context, c *websocket.Conn, d time.Duration, limit int64) (seen []codeCount, n int64) {
	var t tally
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for n < limit {
		_, b, err := c.Read(rctx)
		if err != nil {
			switch {
			case websocket.CloseStatus(err) != -1:
				t.add(fmt.Sprintf("connection closed by the server (%d)", websocket.CloseStatus(err)))
			case rctx.Err() != nil:
				t.add("connection still open after reading")
			default:
				t.add("connection dropped")
			}
			return t.counts(), n
		}
		n += int64(len(b))
		var m api.WSMessage
		if json.Unmarshal(b, &m) != nil {
			t.add("frame not JSON")
			continue
		}
		k := "frame " + m.Type
		if m.Error != nil {
			k += " " + m.Error.Code
		}
		t.add(k)
	}
	t.add(fmt.Sprintf("stopped reading after %d MiB", limit>>20))
	return t.counts(), n
}

// manyWatches is case c.
func (a *amp) manyWatches(ctx context.Context, c *ampCase, t *tally) error {
	st := newRoleStats()
	ref := &leaderRef{lc: a.lc, m: a.leader, at: time.Now()}
	conns := make([]*wsConn, a.o.watchConns)
	defer func() {
		for _, wc := range conns {
			if wc != nil {
				wc.close()
			}
		}
	}()
	if err := parallel(ctx, len(conns), len(conns)+1, func(k int) error {
		wc, err := dialWS(ctx, ref.get().httpURL, nil, dialOpts{})
		if err != nil {
			return err
		}
		conns[k] = wc
		return wc.hello(ctx, fmt.Sprintf("amp-watch-%d", k), 60_000, "")
	}); err != nil {
		return err
	}
	t0 := time.Now()
	var last atomic.Int64
	var wg sync.WaitGroup
	for k, wc := range conns {
		for i := 0; i < a.o.watchesPerConn; i++ {
			wg.Add(1)
			_, err := wc.send(ctx, api.WSRequest{Op: api.OpWatch, Lock: fmt.Sprintf("amp-w-%d-%d", k, i)}, func(f wsFrame, err error) {
				defer wg.Done()
				last.Store(time.Now().UnixNano())
				switch {
				case err != nil:
					t.add("watch: " + errCode(err))
				case f.Type == api.TypeError && f.Error != nil:
					st.refused(frameErr(f))
					t.add("watch " + f.Error.Code)
				default:
					t.add("watch " + f.Type)
				}
			})
			if err != nil {
				wg.Done()
				t.add("watch: not sent")
			}
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.Notes = append(c.Notes, fmt.Sprintf("every watch answered %.2f s after the first was sent", time.Unix(0, last.Load()).Sub(t0).Seconds()))
	if ra := st.summary("").RetryAfter; ra.Count > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("Retry-After min/p50/max %.0f/%.0f/%.0f ms", ra.MinMs, ra.P50Ms, ra.MaxMs))
	}
	// The watches stay open for the memory reading.
	sleepCtx(ctx, a.o.settle)
	return nil
}

// bigReads is case d.
func (a *amp) bigReads(ctx context.Context, c *ampCase, t *tally) error {
	var bytesRead atomic.Int64
	urls := map[string]string{
		"status":  a.leader.httpURL + "/api/v1/locks/" + ampSem,
		"list":    a.leader.httpURL + "/api/v1/locks?prefix=" + url.QueryEscape("amp-") + "&limit=10",
		"holders": a.leader.httpURL + "/api/v1/locks/" + ampSem + "/holders?limit=" + fmt.Sprint(api.MaxListLimit),
	}
	err := parallel(ctx, a.o.readers, a.o.readers, func(int) error {
		for _, kind := range []string{"status", "list", "holders"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[kind], nil)
			resp, err := a.hc.Do(req)
			if err != nil {
				t.add(kind + ": " + errCode(err))
				continue
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			bytesRead.Add(n)
			t.add(fmt.Sprintf("%s %d", kind, resp.StatusCode))
		}
		return nil
	})
	c.Notes = append(c.Notes, fmt.Sprintf("%.1f MiB read", float64(bytesRead.Load())/(1<<20)))
	return err
}

// valueLocks is case e.
func (a *amp) valueLocks(ctx context.Context, c *ampCase, t *tally) error {
	ttl := int64(api.MaxTTLms)
	var firstRefusal atomic.Value
	err := parallel(ctx, a.o.valueLocks, a.o.concurrency, func(i int) error {
		v := ampValue(i, a.o.valueBytes)
		st, code, body, err := a.post(ctx, fmt.Sprintf("/api/v1/locks/amp-v-%d/acquire", i),
			api.AcquireRequest{ClientID: "amp-values", TTLms: &ttl, Value: &v})
		if err != nil {
			return err
		}
		t.add(answer(st, code))
		if st != http.StatusOK && firstRefusal.Load() == nil {
			firstRefusal.Store(string(bytes.TrimSpace(body)))
		}
		return nil
	})
	if v := firstRefusal.Load(); v != nil {
		c.Notes = append(c.Notes, "first refusal: "+truncate(v.(string), 300))
	}
	return err
}

func writeAmplifyMarkdown(w io.Writer, rep *ampReport) {
	fmt.Fprintf(w, "Amplification run: %d member(s), lockd %s, lockd flags %s. Leader memory per case: RSS (VmRSS sampled every few ms, and VmHWM reset before the case) and Go heap (go_memstats_heap_inuse_bytes, polled); goal: the leader grows by less than %d MiB.\n\n",
		rep.Members, rep.Host.LockdCommit, strings.Join(rep.LockdFlags, " "), ampGoalMiB)
	fmt.Fprintln(w, "| case | what | RSS before / peak / after MiB | growth | heap before / peak / after MiB | what the server answered | took s |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|---|--:|")
	rows := rep.Cases
	if rep.Setup != nil {
		rows = append([]*ampCase{rep.Setup}, rows...)
	}
	for _, c := range rows {
		if c == nil {
			continue
		}
		after := fmt.Sprintf("%.0f", c.RSSAfter)
		heapAfter := fmt.Sprintf("%.0f", c.HeapAfter)
		if c.RSSAfterClose > 0 {
			after += fmt.Sprintf("; reading back: peak %.0f, closed %.0f", c.RSSPeakThen, c.RSSAfterClose)
			heapAfter += fmt.Sprintf("; reading back: peak %.0f, closed %.0f", c.HeapPeakThen, c.HeapAfterClose)
		}
		goal := fmt.Sprintf("%.0f", c.Growth)
		if c.Key != "setup" {
			goal += " " + yesNo(c.GoalMet)
		}
		what := c.Desc
		if c.Error != "" {
			what += " — **stopped: " + c.Error + "**"
		}
		fmt.Fprintf(w, "| %s | %s | %.0f / %.0f / %s | %s | %.0f / %.0f / %s | %s | %.1f |\n", c.Key, what, c.RSSBefore, c.RSSPeak, after, goal,
			c.HeapBefore, c.HeapPeak, heapAfter, fmtCounts(c.Answers), c.Seconds)
	}
	fmt.Fprintln(w)
	for _, c := range rows {
		if c != nil {
			for _, n := range c.Notes {
				fmt.Fprintf(w, "%s: %s.  \n", c.Key, n)
			}
		}
	}
}
