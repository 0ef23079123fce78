package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/api"
)

// The overload run's promise keepers — the keepalive-only sessions and the
// holders that renew on a schedule — are the clients whose latency the run
// judges. By default (--probes-process) they run in a process of their
// own, as they would in production, where the clients that flood a cluster
// are not the ones keeping sessions alive. In the bench's own process
// their connection readers, woken by the network, wait behind the flood's
// goroutines in Go's global run queue, which a processor busy with its own
// queue serves once per 61 turns: the bench then measures its own
// scheduling as keepalive latency (a keepalive p99 of 3.75 s while the
// leader answered every keepalive within 100 ms). A separate process is
// scheduled by the kernel among the others, members and flood included.

// promiseKeepers are the keepalive-only sessions and the holders, with
// what they counted.
type promiseKeepers struct {
	sessT   *sessionTally
	sessSt  *roleStats
	holdT   *holderTally
	holdSt  *roleStats
	toClose []*wsSession
}

// startPromiseKeepers opens o.sessions keepalive-only sessions and o.holders
// holders (each acquires its lock) and starts their loops under actx
// in bg. The sessions it opened are in toClose even when it fails.
func startPromiseKeepers(ctx, actx context.Context, ref *leaderRef, o overloadOpts, bg *sync.WaitGroup) (*promiseKeepers, error) {
	kaEvery := o.sessionTTL / 3
	ttlMs := o.sessionTTL.Milliseconds()
	k := &promiseKeepers{sessT: newSessionTally(), sessSt: newRoleStats(), holdT: newHolderTally(), holdSt: newRoleStats()}
	sessT := k.sessT
	kas := make([]*wsSession, o.sessions)
	for i := range kas {
		kas[i] = &wsSession{ref: ref, clientID: fmt.Sprintf("ov-ka-%d", i), ttlMs: ttlMs, st: k.sessSt,
			onExpired: func() { sessT.mu.Lock(); sessT.lost++; sessT.mu.Unlock() },
			onPush: func(f wsFrame) {
				if f.Type == api.TypeLost {
					sessT.mu.Lock()
					sessT.lost++
					sessT.mu.Unlock()
				}
			}}
	}
	k.toClose = append(k.toClose, kas...)
	if err := openSessions(ctx, kas, o.openParallel); err != nil {
		return k, fmt.Errorf("opening the keepalive sessions: %w", err)
	}
	for i, s := range kas {
		bg.Go(func() {
			s.keepalives(actx, time.Now().Add(spread(i, len(kas), kaEvery)), kaEvery, func(_ time.Time, lat time.Duration, err error) {
				sessT.mu.Lock()
				defer sessT.mu.Unlock()
				if err != nil {
					sessT.failed[errCode(err)]++
					return
				}
				sessT.acked++
				sessT.lat.record(lat)
			})
		})
	}

	holders := make([]*lockdHolder, o.holders)
	for i := range holders {
		h := &lockdHolder{holder: holder{ttl: o.holderTTL, t: k.holdT}, lock: fmt.Sprintf("ov-h-%d", i)}
		h.s = &wsSession{ref: ref, clientID: fmt.Sprintf("ov-h-%d", i), ttlMs: ttlMs, st: k.holdSt, onPush: h.push}
		holders[i] = h
		k.toClose = append(k.toClose, h.s)
	}
	if err := parallel(ctx, len(holders), o.openParallel, func(i int) error { return holders[i].acquire(ctx) }); err != nil {
		return k, fmt.Errorf("holders: %w", err)
	}
	for i, h := range holders {
		bg.Go(func() {
			h.s.keepalives(actx, time.Now().Add(spread(i, len(holders), kaEvery)), kaEvery, ignoreKeepalive)
		})
		bg.Go(func() { h.renewals(actx, time.Now().Add(spread(i, len(holders), o.renewEvery)), o.renewEvery) })
	}
	return k, nil
}

// probeReport is what a promise keepers' process reports when it ends.
type probeReport struct {
	Sessions     sessionsResult `json:"sessions"`
	Holders      holdersResult  `json:"holders"`
	SessionStats roleStatsWire  `json:"session_stats"`
	HolderStats  roleStatsWire  `json:"holder_stats"`
}

func (k *promiseKeepers) report(o overloadOpts) probeReport {
	return probeReport{Sessions: k.sessT.result(o.sessions, o.sessionTTL, o.sessionTTL/3),
		Holders:      k.holdT.result(o.holders, o.holderTTL, o.renewEvery),
		SessionStats: k.sessSt.wire(), HolderStats: k.holdSt.wire()}
}

// roleStatsWire is roleStats as it crosses from the probes' process.
type roleStatsWire struct {
	Codes      map[string]int64  `json:"codes"`
	RetryAfter map[int64]int64   `json:"retry_after_ms"`
	NoRetry    int64             `json:"no_retry_after"`
	Retries    int64             `json:"retries"`
	Cuts       map[string]int64  `json:"cuts"`
	Reconnects int64             `json:"reconnects"`
	Messages   map[string]string `json:"messages"`
}

func (s *roleStats) wire() roleStatsWire {
	s.mu.Lock()
	defer s.mu.Unlock()
	return roleStatsWire{Codes: s.codes, RetryAfter: s.retryAfter, NoRetry: s.noRetry, Retries: s.retries,
		Cuts: s.cuts, Reconnects: s.reconnects, Messages: s.messages}
}

func (w roleStatsWire) stats() *roleStats {
	s := newRoleStats()
	for k, v := range w.Codes {
		s.codes[k] = v
	}
	for k, v := range w.RetryAfter {
		s.retryAfter[k] = v
	}
	for k, v := range w.Cuts {
		s.cuts[k] = v
	}
	for k, v := range w.Messages {
		s.messages[k] = v
	}
	s.noRetry, s.retries, s.reconnects = w.NoRetry, w.Retries, w.Reconnects
	return s
}

// probesProcess is a running promise keepers' process.
type probesProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	done   chan error
}

// startProbesProcess starts `lockbench overload-probes` on the members
// and returns once its sessions are open and its holders hold their locks.
func startProbesProcess(ctx context.Context, members []*lockdMember, o overloadOpts) (*probesProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var ms []string
	for _, m := range members {
		ms = append(ms, m.id+"="+m.httpURL)
	}
	cmd := exec.Command(self, "overload-probes", "--members", strings.Join(ms, ","),
		"--keepalive-sessions", fmt.Sprint(o.sessions), "--session-ttl", o.sessionTTL.String(),
		"--holders", fmt.Sprint(o.holders), "--holder-ttl", o.holderTTL.String(),
		"--renew-every", o.renewEvery.String(), "--open-parallel", fmt.Sprint(o.openParallel))
	cmd.Stderr = os.Stderr
	p := &probesProcess{cmd: cmd, done: make(chan error, 1)}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.stdout = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan error, 1)
	go func() {
		line, err := p.stdout.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("the probes' process said %q", strings.TrimSpace(line))
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("starting the promise keepers' process: %w", err)
	}
	return p, nil
}

// finish ends the probes' loops (closing their stdin) and returns their
// report.
func (p *probesProcess) finish() (probeReport, error) {
	var rep probeReport
	_ = p.stdin.Close()
	dec := json.NewDecoder(p.stdout)
	derr := dec.Decode(&rep)
	werr := p.cmd.Wait()
	if derr != nil {
		return rep, fmt.Errorf("the probes' process report: %w (exit: %v)", derr, werr)
	}
	return rep, werr
}

// kill stops the process without a report (the run failed).
func (p *probesProcess) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// overloadProbesMain is `lockbench overload-probes`: the promise keepers of
// an overload run, in a process of their own. It prints "ready" once its
// sessions are open and its holders hold, keeps every promise until its
// stdin closes (or SIGTERM), then prints its report as JSON.
func overloadProbesMain(args []string) int {
	fs := flag.NewFlagSet("overload-probes", flag.ContinueOnError)
	var o overloadOpts
	members := fs.String("members", "", "id=url,... of the lockd members")
	fs.IntVar(&o.sessions, "keepalive-sessions", 200, "sessions that only keep alive")
	fs.DurationVar(&o.sessionTTL, "session-ttl", 15*time.Second, "session TTL (a keepalive every third)")
	fs.IntVar(&o.holders, "holders", 50, "holders of a short-TTL lock that renew it")
	fs.DurationVar(&o.holderTTL, "holder-ttl", 5*time.Second, "the holders' lock TTL")
	fs.DurationVar(&o.renewEvery, "renew-every", time.Second, "how often a holder renews")
	fs.IntVar(&o.openParallel, "open-parallel", 32, "sessions opened at once")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	lc := &lockdCluster{}
	for _, kv := range strings.Split(*members, ",") {
		id, url, ok := strings.Cut(kv, "=")
		if !ok || id == "" || url == "" {
			fmt.Fprintf(os.Stderr, "lockbench overload-probes: --members wants id=url,..., got %q\n", *members)
			return 2
		}
		lc.members = append(lc.members, &lockdMember{id: id, httpURL: url})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runProbes(ctx, lc, o, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench overload-probes:", err)
		return 1
	}
	return 0
}

// runProbes keeps the promises until in ends or ctx does, then writes the
// report to out.
func runProbes(ctx context.Context, lc *lockdCluster, o overloadOpts, in io.Reader, out io.Writer) error {
	leader, err := lc.leader(ctx)
	if err != nil {
		return err
	}
	ref := &leaderRef{lc: lc, m: leader, at: time.Now()}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	var bg sync.WaitGroup
	k, err := startPromiseKeepers(ctx, actx, ref, o, &bg)
	defer closeSessions(k.toClose)
	if err != nil {
		acancel()
		bg.Wait()
		return err
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, in); close(ended) }()
	select {
	case <-ended:
	case <-ctx.Done():
	}
	acancel()
	bg.Wait()
	if err := json.NewEncoder(out).Encode(k.report(o)); err != nil {
		return err
	}
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return nil
}
