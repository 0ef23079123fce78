package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// The overload phase (SPEC 15): flood generators offer far more work than
// the cluster commits — open-loop acquire-and-release cycles over HTTP at
// a fixed rate whatever comes back, and now and then a burst of waits over
// WebSocket — while the other workers and the nemesis go on as ever. The
// flood's own requests are counted, not recorded: the history is what the
// other workers saw while the members were overloaded, and it is checked
// by the same checkers as ever. What the flood may be answered is part of
// the contract: a grant, a refusal of the state machine, or a refusal of
// admission (503 overloaded, or 429 resource_exhausted for a client's
// share) that carries its Retry-After; anything else is a violation, as is
// a connection the server cuts.

// floodStats counts what the flood was answered.
type floodStats struct {
	mu       sync.Mutex
	sent     int64
	granted  int64
	codes    map[string]int64
	noRetry  int64 // admission refusals without a retry delay
	odd      []string
	cuts     int64 // WebSocket connections the server closed or cut with an error frame
	burstSet int64 // waits the bursts queued
}

func (s *floodStats) add(code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.codes == nil {
		s.codes = map[string]int64{}
	}
	s.codes[code]++
}

func (s *floodStats) oddReply(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.odd) < 20 {
		s.odd = append(s.odd, fmt.Sprintf(format, a...))
	}
}

// floodRate is the cycles per second each HTTP flood generator starts;
// floodInflight bounds what one generator has in flight (beyond it a cycle
// is skipped and counted, so the test process itself stays bounded).
const (
	floodRate     = 600
	floodInflight = 128
	floodLocks    = 256
)

// floodHTTP starts acquire-and-release cycles on flood locks at floodRate,
// each in its own goroutine, until ctx ends.
func (w *Workload) floodHTTP(ctx context.Context, id int, rng *rand.Rand) {
	var inflight sync.WaitGroup
	defer inflight.Wait()
	slots := make(chan struct{}, floodInflight)
	tick := time.NewTicker(time.Second / floodRate)
	defer tick.Stop()
	st := &w.flood
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			st.add("skipped_by_the_test")
			continue
		}
		lock := fmt.Sprintf(unrecordedPrefix+"flood-%d", rng.IntN(floodLocks))
		cid := fmt.Sprintf("fl%d-%d", id, n)
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-slots }()
			w.floodCycle(ctx, lock, cid)
		}()
	}
}

// floodCycle sends one acquire (a try with a short TTL) and, when granted,
// its release; every answer is classified.
func (w *Workload) floodCycle(ctx context.Context, lock, cid string) {
	st := &w.flood
	atomic.AddInt64(&st.sent, 1)
	ttl := int64(2000)
	var ar api.AcquireReply
	code := w.floodPost(ctx, lockPath(lock, "acquire"), api.AcquireRequest{ClientID: cid, TTLms: &ttl}, &ar)
	if code != "granted" {
		return
	}
	atomic.AddInt64(&st.granted, 1)
	// The release keeps a promise: admitted before acquires, but retried
	// like anything refused for now.
	for try := 0; try < 20 && ctx.Err() == nil; try++ {
		var rr api.ReleaseReply
		c := w.floodPost(context.WithoutCancel(ctx), lockPath(lock, "release"), api.ReleaseRequest{ClientID: cid, FencingToken: ar.FencingToken}, &rr)
		if c != "overloaded" && c != "resource_exhausted" {
			return
		}
	}
}

// floodPost sends one request to a member (following 307s) and classifies
// the answer: "granted" for a 2xx decoded into out, else the error code.
func (w *Workload) floodPost(ctx context.Context, path string, body, out any) string {
	st := &w.flood
	b, _ := json.Marshal(body)
	eps := w.opts.Endpoints
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, eps[rand.IntN(len(eps))]+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.hc.Do(req)
	if err != nil {
		st.add("transport")
		return "transport"
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 == 2 {
		if json.Unmarshal(data, out) != nil {
			st.oddReply("%s: 200 %q", path, data)
		}
		return "granted"
	}
	var er api.ErrorReply
	_ = json.Unmarshal(data, &er)
	code := er.Error.Code
	st.add(code)
	switch {
	case code == api.CodeOverloaded || (code == api.CodeResourceExhausted && resp.StatusCode == 429 && resp.Header.Get("Retry-After") != ""):
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 1 {
			atomic.AddInt64(&st.noRetry, 1)
			st.oddReply("%s: %d %s without a Retry-After of at least 1 s (%q)", path, resp.StatusCode, code, resp.Header.Get("Retry-After"))
		}
	case code == api.CodeLockHeld, code == api.CodeNotHolder, code == api.CodeNoLeader, code == api.CodeResourceExhausted:
		// The state machine's refusals, a quota's, and no leader (faults).
	default:
		st.oddReply("%s: %d %q", path, resp.StatusCode, data)
	}
	return code
}

// floodBurst, every few seconds, opens a few WebSocket sessions and sends a
// burst of waits on flood locks: most queue, some are refused for now
// (with retry_after_ms), all end by their wait deadline. A connection the
// server cuts with an internal error frame is counted.
func (w *Workload) floodBurst(ctx context.Context, rng *rand.Rand) {
	st := &w.flood
	for round := 0; ctx.Err() == nil; round++ {
		if !sleep(ctx, jitter(rng, 2*time.Second, 5*time.Second)) {
			return
		}
		var wg sync.WaitGroup
		for c := 0; c < 4; c++ {
			seed := rng.Int64() // rng is this goroutine's alone
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.burstConn(ctx, fmt.Sprintf("burst%d-%d", round, c), 500, seed)
			}()
		}
		wg.Wait()
		_ = st
	}
}

// burstConn sends n waiting acquires on one session and reads until each
// is answered or the connection ends.
func (w *Workload) burstConn(ctx context.Context, cid string, n int, seed int64) {
	st := &w.flood
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	eps := w.opts.Endpoints
	var conn *websocket.Conn
	for _, ep := range eps {
		c, _, err := websocket.Dial(ctx, wsURL(ep), nil)
		if err != nil {
			continue
		}
		c.SetReadLimit(1 << 20)
		if err := wsJSON(ctx, c, api.WSRequest{ID: 1, Op: api.OpHello, ClientID: cid}); err != nil {
			c.CloseNow()
			continue
		}
		var m api.WSMessage
		if wsRead(ctx, c, &m) != nil || m.Type != api.TypeHello {
			c.CloseNow()
			continue // a follower, or refused for now
		}
		conn = c
		break
	}
	if conn == nil {
		return
	}
	defer conn.CloseNow()
	ttl := int64(1000)
	for i := 0; i < n; i++ {
		wait := int64(500 + rng.IntN(2500))
		req := api.WSRequest{ID: uint64(10 + i), Op: api.OpAcquire, Lock: fmt.Sprintf(unrecordedPrefix+"flood-%d", rng.IntN(floodLocks)), TTLms: &ttl, WaitTimeoutMs: &wait}
		if wsJSON(ctx, conn, req) != nil {
			return
		}
	}
	answered := 0
	for answered < n {
		var m api.WSMessage
		if err := wsRead(ctx, conn, &m); err != nil {
			// A member killed, paused or cut off by the nemesis ends the
			// connection without a close frame (EOF, or this deadline); a
			// member that ends it on purpose says why in its close status.
			// Only a close the server chose while it still led counts.
			switch websocket.CloseStatus(err) {
			case -1, websocket.StatusNormalClosure, websocket.StatusGoingAway:
			default:
				if ctx.Err() == nil {
					atomic.AddInt64(&st.cuts, 1)
					st.oddReply("burst %s: the server closed the connection with %d of %d answered: %v", cid, answered, n, err)
				}
			}
			return
		}
		switch {
		case m.Type == api.TypeError && m.ID == 0 && m.Error != nil && m.Error.Code == api.CodeNotLeader:
			return // leadership moved (a fault): a client follows it
		case m.Type == api.TypeError && m.ID == 0:
			atomic.AddInt64(&st.cuts, 1)
			st.oddReply("burst %s: pushed error %+v", cid, m.Error)
			return
		case m.ID < 10:
		case m.Type == api.TypeGranted:
			answered++
			st.add("granted_after_wait")
			atomic.AddInt64(&st.burstSet, 1)
			_ = wsJSON(ctx, conn, api.WSRequest{ID: 1_000_000 + m.ID, Op: api.OpRelease, Lock: m.Lock, FencingToken: m.FencingToken})
		case m.Type == api.TypeError && m.ID >= 1_000_000:
		case m.Type == api.TypeError && m.Error != nil:
			answered++
			st.add(m.Error.Code)
			if m.Error.Code == api.CodeOverloaded && m.RetryAfterMs <= 0 {
				atomic.AddInt64(&st.noRetry, 1)
				st.oddReply("burst %s: overloaded without retry_after_ms", cid)
			}
			if m.Error.Code == api.CodeInternal {
				atomic.AddInt64(&st.cuts, 1)
				st.oddReply("burst %s: %s", cid, m.Error.Message)
			}
		}
	}
}

func wsJSON(ctx context.Context, c *websocket.Conn, v any) error {
	b, _ := json.Marshal(v)
	return c.Write(ctx, websocket.MessageText, b)
}

func wsRead(ctx context.Context, c *websocket.Conn, m *api.WSMessage) error {
	_, b, err := c.Read(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, m)
}

// FloodReport is what the flood was answered, kept in the history so that
// -chaos.replay checks it again.
type FloodReport struct {
	Sent    int64            `json:"sent"`
	Granted int64            `json:"granted"`
	Codes   map[string]int64 `json:"codes"`
	NoRetry int64            `json:"no_retry_after"`
	Odd     []string         `json:"odd,omitempty"`
	Cuts    int64            `json:"cuts"`
	Queued  int64            `json:"burst_granted"`
}

func (s *floodStats) report() *FloodReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	codes := map[string]int64{}
	for k, v := range s.codes {
		codes[k] = v
	}
	return &FloodReport{Sent: atomic.LoadInt64(&s.sent), Granted: atomic.LoadInt64(&s.granted), Codes: codes,
		NoRetry: atomic.LoadInt64(&s.noRetry), Odd: append([]string(nil), s.odd...), Cuts: atomic.LoadInt64(&s.cuts),
		Queued: atomic.LoadInt64(&s.burstSet)}
}

// checkFlood: every admission refusal the flood got carried its retry
// delay (flood-refusal), every answer was one the API has for it
// (flood-reply), and no connection was cut because the server fell behind
// (flood-cut).
func checkFlood(h History, v *violations) {
	f := h.Flood
	if f == nil {
		return
	}
	if f.NoRetry > 0 {
		v.add("flood-refusal", nil, "%d admission refusals without a retry delay (Retry-After, retry_after_ms)", f.NoRetry)
	}
	if f.Cuts > 0 {
		v.add("flood-cut", nil, "%d WebSocket connections cut by the server while overloaded", f.Cuts)
	}
	for _, o := range f.Odd {
		v.add("flood-reply", nil, "an answer the API does not have for it: %s", o)
	}
}
