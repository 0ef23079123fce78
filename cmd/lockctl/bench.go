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

	"github.com/spf13/cobra"

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
func (e *env) benchCmd() *cobra.Command {
	var clients, locks int
	var duration, ttl time.Duration
	var mode, prefix string
	c := &cobra.Command{
		Use:   "bench [--clients 16] [--locks 16] [--duration 10s] [--mode session|http]",
		Short: "clients loop acquire → release; print cycles/s and acquire/release latency",
		Long: `Run clients that loop acquire → release on a set of locks and print the
throughput and the acquire and release latency: a quick check of a
deployment, not a comparison (bench/ in the repository compares lockd with
etcd). --mode session: one WebSocket session per client (the client
library); http: plain HTTP acquire and release.`,
		Args: positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if clients < 1 || locks < 1 || duration <= 0 || (mode != "session" && mode != "http") {
				return errors.New("bench: --clients and --locks must be ≥ 1, --duration > 0, --mode session or http")
			}
			return status(e.bench(c.Context(), benchFlags{clients: clients, locks: locks, duration: duration, mode: mode, prefix: prefix, ttl: ttl}))
		},
	}
	fs := c.Flags()
	fs.IntVar(&clients, "clients", 16, "concurrent clients")
	fs.IntVar(&locks, "locks", 16, "distinct locks (clients > locks means contention and hand-offs)")
	durationVar(fs, &duration, "duration", 10*time.Second, "how long to run")
	fs.StringVar(&mode, "mode", "session", "session: one WebSocket session per client (the client library); http: plain HTTP acquire/release")
	fs.StringVar(&prefix, "prefix", "bench/", "lock name prefix")
	durationVar(fs, &ttl, "ttl", 30*time.Second, "lock TTL (http mode)")
	_ = c.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"session", "http"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// benchFlags are bench's flags.
type benchFlags struct {
	clients, locks int
	duration, ttl  time.Duration
	mode, prefix   string
}

func (e *env) bench(ctx context.Context, f benchFlags) int {
	tc, err := e.tlsConfig()
	if err != nil {
		return e.setupFailed(err)
	}
	a, err := e.api()
	if err != nil {
		return e.setupFailed(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, f.duration)
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
	for i := 0; i < f.clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s%d", f.prefix, i%f.locks)
			id := fmt.Sprintf("%s-bench-%d", e.sessionClientID(), i)
			if f.mode == "http" {
				end, _ := runCtx.Deadline()
				for runCtx.Err() == nil {
					// A wait never outlives the run, so no grant lands after it.
					wait := max(time.Until(end), time.Millisecond)
					t0 := time.Now()
					rep, err := a.Acquire(runCtx, name, id, f.ttl, wait)
					t1 := time.Now()
					if err == nil {
						err = a.Release(context.Background(), name, id, rep.FencingToken)
					}
					record(t1.Sub(t0), time.Since(t1), err)
				}
				return
			}
			c, err := client.New(runCtx, client.Config{Endpoints: e.endpoints(), ClientID: id, DialTimeout: -1, // the run bounds it
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
	if f.mode == "http" {
		// An HTTP acquire abandoned when the run ended may still have been
		// granted (the server keeps a departed waiter until its deadline):
		// take each such grant back (acquire is idempotent) and release it.
		time.Sleep(200 * time.Millisecond)
		for i := 0; i < f.clients; i++ {
			name := fmt.Sprintf("%s%d", f.prefix, i%f.locks)
			id := fmt.Sprintf("%s-bench-%d", e.sessionClientID(), i)
			cctx, ccancel := e.ctx(ctx, 0)
			if rep, err := a.Acquire(cctx, name, id, f.ttl, 0); err == nil {
				_ = a.Release(cctx, name, id, rep.FencingToken)
			}
			ccancel()
		}
	}
	res := benchResult{Mode: f.mode, Clients: f.clients, Locks: f.locks, Seconds: elapsed.Seconds(),
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
