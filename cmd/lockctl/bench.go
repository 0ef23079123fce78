package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/lockd/lockd/client"
)

// benchResult is what `lockctl bench` prints.
type benchResult struct {
	Mode          string  `json:"mode"`
	Clients       int     `json:"clients"`
	Locks         int     `json:"locks"`
	Seconds       float64 `json:"seconds"`
	Cycles        int     `json:"cycles"`
	Errors        int     `json:"errors"`
	CyclesPerSec  float64 `json:"cycles_per_sec"`
	AcquireP50ms  float64 `json:"acquire_p50_ms"`
	AcquireP99ms  float64 `json:"acquire_p99_ms"`
	AcquireMaxms  float64 `json:"acquire_max_ms"`
	ReleaseP50ms  float64 `json:"release_p50_ms"`
	ReleaseP99ms  float64 `json:"release_p99_ms"`
	FirstErrorMsg string  `json:"first_error,omitempty"`
}

// bench runs clients that loop acquire → release on a set of locks and
// reports throughput and latency: a quick check of a deployment, not a
// comparison (bench/ in the repository compares lockd with etcd).
func (e *env) bench(ctx context.Context, args []string) int {
	fs := e.command("bench", "bench [--clients 16] [--locks 16] [--duration 10s] [--mode session|http] [--prefix bench/]")
	clients := fs.Int("clients", 16, "concurrent clients")
	locks := fs.Int("locks", 16, "distinct locks (clients > locks means contention and hand-offs)")
	duration := fs.Duration("duration", 10*time.Second, "how long to run")
	mode := fs.String("mode", "session", "session: one WebSocket session per client (the client library); http: plain HTTP acquire/release")
	prefix := fs.String("prefix", "bench/", "lock name prefix")
	ttl := fs.Duration("ttl", 30*time.Second, "lock TTL (http mode)")
	if _, code, ok := e.parse(fs, args); !ok {
		return code
	}
	if *clients < 1 || *locks < 1 || *duration <= 0 || (*mode != "session" && *mode != "http") {
		return usageErr(e.stderr, errors.New("bench: --clients and --locks must be ≥ 1, --duration > 0, --mode session or http"))
	}
	tc, err := e.tlsConfig()
	if err != nil {
		return e.setupFailed(err)
	}
	a, err := e.api()
	if err != nil {
		return e.setupFailed(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()

	var (
		mu          sync.Mutex
		acq, rel    []time.Duration
		errs        int
		firstErr    error
		wg          sync.WaitGroup
		start       = time.Now()
		quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))
	)
	record := func(a, r time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			// Every wait lasts until the end of the run, so its wait_timeout
			// marks the end (the server, counting whole milliseconds, may
			// answer a moment before this clock gets there), not an error.
			end, _ := runCtx.Deadline()
			atEnd := errors.Is(err, client.ErrWaitTimeout) && time.Until(end) < 100*time.Millisecond
			if runCtx.Err() == nil && !atEnd {
				errs++
				if firstErr == nil {
					firstErr = err
				}
			}
			return
		}
		acq, rel = append(acq, a), append(rel, r)
	}
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s%d", *prefix, i%*locks)
			id := fmt.Sprintf("%s-bench-%d", e.clientID(), i)
			if *mode == "http" {
				end, _ := runCtx.Deadline()
				for runCtx.Err() == nil {
					// A wait never outlives the run, so no grant lands after it.
					wait := max(time.Until(end), time.Millisecond)
					t0 := time.Now()
					rep, err := a.Acquire(runCtx, name, id, *ttl, wait)
					t1 := time.Now()
					if err == nil {
						err = a.Release(context.Background(), name, id, rep.FencingToken)
					}
					record(t1.Sub(t0), time.Since(t1), err)
				}
				return
			}
			c, err := client.New(runCtx, client.Config{Endpoints: e.endpoints(), ClientID: id,
				Logger: quietLogger, TLSConfig: tc, Token: e.g.token})
			if err != nil {
				record(0, 0, err)
				return
			}
			defer c.Close()
			for runCtx.Err() == nil {
				t0 := time.Now()
				l, err := c.Acquire(runCtx, name)
				t1 := time.Now()
				if err == nil {
					err = l.Release(context.Background())
				}
				record(t1.Sub(t0), time.Since(t1), err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if *mode == "http" {
		// An HTTP acquire abandoned when the run ended may still have been
		// granted (the server keeps a departed waiter until its deadline):
		// take each such grant back (acquire is idempotent) and release it.
		time.Sleep(200 * time.Millisecond)
		for i := 0; i < *clients; i++ {
			name := fmt.Sprintf("%s%d", *prefix, i%*locks)
			id := fmt.Sprintf("%s-bench-%d", e.clientID(), i)
			cctx, ccancel := e.ctx(ctx, 0)
			if rep, err := a.Acquire(cctx, name, id, *ttl, 0); err == nil {
				_ = a.Release(cctx, name, id, rep.FencingToken)
			}
			ccancel()
		}
	}
	res := benchResult{Mode: *mode, Clients: *clients, Locks: *locks, Seconds: elapsed.Seconds(),
		Cycles: len(acq), Errors: errs, CyclesPerSec: float64(len(acq)) / elapsed.Seconds()}
	if firstErr != nil {
		res.FirstErrorMsg = firstErr.Error()
	}
	res.AcquireP50ms, res.AcquireP99ms, res.AcquireMaxms = percentiles(acq)
	res.ReleaseP50ms, res.ReleaseP99ms, _ = percentiles(rel)
	e.print(res, fmt.Sprintf("%s mode, %d clients on %d locks for %.1fs: %d cycles (%.0f/s), %d errors\n"+
		"acquire p50 %.2f ms  p99 %.2f ms  max %.2f ms\nrelease p50 %.2f ms  p99 %.2f ms",
		res.Mode, res.Clients, res.Locks, res.Seconds, res.Cycles, res.CyclesPerSec, res.Errors,
		res.AcquireP50ms, res.AcquireP99ms, res.AcquireMaxms, res.ReleaseP50ms, res.ReleaseP99ms))
	if res.Cycles == 0 {
		return e.fail(fmt.Errorf("no acquire/release cycle completed: %v", firstErr), "bench")
	}
	return exitOK
}

func percentiles(d []time.Duration) (p50, p99, maxv float64) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	return ms(d[len(d)/2]), ms(d[(len(d)*99)/100]), ms(d[len(d)-1])
}
