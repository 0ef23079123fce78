package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/lockd/lockd/client"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Setups: where the clients of a system connect.
const (
	// setupLeader: every client is given the leader's address only.
	setupLeader = "leader"
	// setupSpread: client i is given member i mod N first. An etcd client
	// then stays on that member (followers forward to the leader); a lockd
	// client (given all endpoints, rotated) finds the leader itself.
	setupSpread = "spread"
)

// Client setups: whether the workers of one run share one client.
const (
	// clientsPerWorker: every worker has its own client and session (lockd:
	// its own client.Client; etcd: its own concurrency.Session, over
	// --etcd-clients shared clientv3 clients; ZooKeeper: its own zk.Conn).
	clientsPerWorker = "per-worker"
	// clientsShared: the workers of a run share one client and one session
	// (lockd: one client.Client; etcd: one clientv3.Client and one
	// concurrency.Session; ZooKeeper: one zk.Conn) — the setup of a service
	// whose goroutines take locks through one client.
	clientsShared = "shared"
)

// worker is one locker: it loops acquire → release, in a session of its
// own or in one it shares with the other workers of the run.
type worker interface {
	lock(ctx context.Context, name string) error
	unlock(ctx context.Context) error
	close() error
}

// system is one lock service under test.
type system interface {
	name() string
	// workers opens n workers for setup: n clients (sessions), or, when
	// shared, n workers over one client. runID keeps client IDs and keys of
	// different runs apart. The func closes what the workers share; it runs
	// after every worker's close.
	workers(ctx context.Context, n int, setup string, shared bool, runID string) ([]worker, func(), error)
	serverPIDs() []int
	leaderPID(ctx context.Context) int
}

// openParallel runs open(i) for i in [0,n) with bounded parallelism and
// closes what was opened if any fails.
func openParallel(ctx context.Context, n int, open func(i int) (worker, error)) ([]worker, error) {
	ws := make([]worker, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			ws[i], errs[i] = open(i)
		}(i)
	}
	wg.Wait()
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		closeParallel(ws)
		if failed > 1 {
			return nil, fmt.Errorf("%w (and %d more of %d)", first, failed-1, n)
		}
		return nil, first
	}
	return ws, nil
}

func closeParallel(ws []worker) {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, w := range ws {
		if w == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(w worker) {
			defer wg.Done()
			defer func() { <-sem }()
			_ = w.close()
		}(w)
	}
	wg.Wait()
}

// rotate returns eps starting at index i mod len(eps).
func rotate(eps []string, i int) []string {
	out := make([]string, 0, len(eps))
	for j := range eps {
		out = append(out, eps[(i+j)%len(eps)])
	}
	return out
}

// ---- lockd through the client package (WebSocket sessions) ----

type lockdSystem struct {
	c          *lockdCluster
	sessionTTL time.Duration
	label      string // "lockd", or "lockd-bolt" for the cluster on raft-boltdb
}

func (s *lockdSystem) name() string {
	if s.label != "" {
		return s.label
	}
	return "lockd"
}
func (s *lockdSystem) serverPIDs() []int { return s.c.pids() }
func (s *lockdSystem) leaderPID(ctx context.Context) int {
	if l, err := s.c.leader(ctx); err == nil && l.p != nil {
		return l.p.pid()
	}
	return 0
}

func (s *lockdSystem) endpointsFor(ctx context.Context, setup string, i int) ([]string, error) {
	if setup == setupLeader {
		l, err := s.c.leader(ctx)
		if err != nil {
			return nil, err
		}
		return []string{l.httpURL}, nil
	}
	return rotate(s.c.endpoints(), i), nil
}

func (s *lockdSystem) open(ctx context.Context, setup string, i int, id string) (*client.Client, error) {
	eps, err := s.endpointsFor(ctx, setup, i)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return client.New(cctx, client.Config{Endpoints: eps, ClientID: id, SessionTTL: s.sessionTTL})
}

func (s *lockdSystem) workers(ctx context.Context, n int, setup string, shared bool, runID string) ([]worker, func(), error) {
	if shared {
		// One session; the client serializes its own goroutines on one
		// name (the server knows the client by its ID, not by goroutine).
		c, err := s.open(ctx, setup, 0, fmt.Sprintf("lb-%s-shared", runID))
		if err != nil {
			return nil, nil, err
		}
		ws := make([]worker, n)
		for i := range ws {
			ws[i] = &lockdWorker{c: c}
		}
		return ws, func() { _ = c.Close() }, nil
	}
	ws, err := openParallel(ctx, n, func(i int) (worker, error) {
		c, err := s.open(ctx, setup, i, fmt.Sprintf("lb-%s-%d", runID, i))
		if err != nil {
			return nil, err
		}
		return &lockdWorker{c: c, own: true}, nil
	})
	return ws, func() {}, err
}

type lockdWorker struct {
	c   *client.Client
	own bool // c is this worker's alone (closed with it)
	l   *client.Lock
}

func (w *lockdWorker) lock(ctx context.Context, name string) error {
	l, err := w.c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	w.l = l
	return nil
}

func (w *lockdWorker) unlock(ctx context.Context) error {
	if w.l == nil {
		return errors.New("not held")
	}
	err := w.l.Release(ctx)
	w.l = nil
	return err
}

func (w *lockdWorker) close() error {
	if !w.own {
		return nil
	}
	return w.c.Close()
}

// ---- lockd through its plain HTTP API (no session, a TTL per lock) ----

type lockdHTTPSystem struct {
	lockdSystem
}

func (s *lockdHTTPSystem) name() string { return "lockd-http" }

// workers: there is no session on the plain API, so every worker keeps its
// own client ID (one ID would make the hot lock a re-grant, not a wait);
// shared or not is whether the workers share one http.Client (a pool of
// keep-alive connections) or each has its own.
func (s *lockdHTTPSystem) workers(ctx context.Context, n int, setup string, shared bool, runID string) ([]worker, func(), error) {
	newHC := func() (*http.Client, *http.Transport) {
		tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 90 * time.Second}
		return &http.Client{
			Transport:     tr,
			Timeout:       60 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}, tr
	}
	var trs []*http.Transport
	closeAll := func() {
		for _, tr := range trs {
			tr.CloseIdleConnections()
		}
	}
	hc, tr := newHC()
	trs = append(trs, tr)
	ws := make([]worker, n)
	for i := range ws {
		eps, err := s.endpointsFor(ctx, setup, i)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		if !shared && i > 0 {
			hc, tr = newHC()
			trs = append(trs, tr)
		}
		ws[i] = &lockdHTTPWorker{hc: hc, base: eps[0], id: fmt.Sprintf("lbh-%s-%d", runID, i)}
	}
	return ws, closeAll, nil
}

type lockdHTTPWorker struct {
	hc    *http.Client
	base  string // the member this worker talks to; moves to the leader on a redirect
	id    string
	name  string
	token uint64
}

type httpErr struct {
	Acquired     *bool  `json:"acquired"`
	FencingToken uint64 `json:"fencing_token"`
	Error        *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	// retryAfter is the answer's Retry-After header (overloaded,
	// no_leader, a budget's resource_exhausted).
	retryAfter    time.Duration
	hasRetryAfter bool
}

// refusal is the answer as an apiErr when a well-behaved client retries
// it (SPEC 15), else nil.
func (r *httpErr) refusal() *apiErr {
	if r == nil || r.Error == nil || !retryable(r.Error.Code) {
		return nil
	}
	return &apiErr{Code: r.Error.Code, Msg: r.Error.Message, RetryAfter: r.retryAfter, HasRetryAfter: r.hasRetryAfter}
}

// post sends body to the lock operation op and follows leader redirects.
func (w *lockdHTTPWorker) post(ctx context.Context, name, op string, body []byte) (*httpErr, int, error) {
	for hops := 0; hops < 5; hops++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			w.base+"/api/v1/locks/"+url.PathEscape(name)+"/"+op, bytes.NewReader(body))
		if err != nil {
			return nil, 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := w.hc.Do(req)
		if err != nil {
			return nil, 0, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, 0, err
		}
		if resp.StatusCode == http.StatusTemporaryRedirect {
			if l := resp.Header.Get("X-Lockd-Leader"); l != "" {
				w.base = l
				continue
			}
			return nil, resp.StatusCode, errors.New("redirect without X-Lockd-Leader")
		}
		var r httpErr
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		r.retryAfter, r.hasRetryAfter = parseRetryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
		return &r, resp.StatusCode, nil
	}
	return nil, 0, errors.New("too many redirects")
}

func (w *lockdHTTPWorker) lock(ctx context.Context, name string) error {
	body := []byte(`{"client_id":"` + w.id + `","ttl_ms":30000,"wait_timeout_ms":30000}`)
	for try := 0; ctx.Err() == nil; try++ {
		r, st, err := w.post(ctx, name, "acquire", body)
		if err != nil {
			return err
		}
		if st == http.StatusOK {
			w.name, w.token = name, r.FencingToken
			return nil
		}
		if r.Error != nil && r.Error.Code == "wait_timeout" {
			continue
		}
		if e := r.refusal(); e != nil {
			// Refused before it took effect: wait as the server asked.
			sleepCtx(ctx, backoffFor(e, try))
			continue
		}
		if r.Error != nil {
			return fmt.Errorf("acquire: %d %s: %s", st, r.Error.Code, r.Error.Message)
		}
		return fmt.Errorf("acquire: status %d", st)
	}
	return ctx.Err()
}

func (w *lockdHTTPWorker) unlock(ctx context.Context) error {
	body := []byte(`{"client_id":"` + w.id + `","fencing_token":` + strconv.FormatUint(w.token, 10) + `}`)
	r, st, err := w.post(ctx, w.name, "release", body)
	for try := 0; err == nil && r.refusal() != nil && ctx.Err() == nil; try++ {
		sleepCtx(ctx, backoffFor(r.refusal(), try))
		r, st, err = w.post(ctx, w.name, "release", body)
	}
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		if r.Error != nil {
			return fmt.Errorf("release: %d %s: %s", st, r.Error.Code, r.Error.Message)
		}
		return fmt.Errorf("release: status %d", st)
	}
	return nil
}

func (w *lockdHTTPWorker) close() error { return nil }

// ---- etcd through clientv3/concurrency.Mutex ----

type etcdSystem struct {
	c          *etcdCluster
	sessionTTL time.Duration
	conns      int // clientv3 clients per run; 0: auto
}

func (s *etcdSystem) name() string      { return "etcd" }
func (s *etcdSystem) serverPIDs() []int { return s.c.pids() }
func (s *etcdSystem) leaderPID(ctx context.Context) int {
	if l, err := s.c.leader(ctx); err == nil && l.p != nil {
		return l.p.pid()
	}
	return 0
}

// poolSize is how many clientv3 clients (gRPC connections) n workers share.
// clientv3 is made to be shared; every worker still has its own session
// (lease + keepalive) and mutex.
func (s *etcdSystem) poolSize(n int) int {
	k := s.conns
	if k <= 0 {
		k = 1
	}
	k = min(k, n)
	return max(k, 1)
}

func (s *etcdSystem) workers(ctx context.Context, n int, setup string, shared bool, runID string) ([]worker, func(), error) {
	var leaderURL string
	if setup == setupLeader {
		l, err := s.c.leader(ctx)
		if err != nil {
			return nil, nil, err
		}
		leaderURL = l.clientURL
	}
	eps := s.c.endpoints()
	ttl := max(int(s.sessionTTL/time.Second), 1)
	pfx := "/lockbench/" + runID + "/"
	if shared {
		// One clientv3.Client (given every member when spread: its
		// balancer spreads the requests) and one session.
		ceps := eps
		if setup == setupLeader {
			ceps = []string{leaderURL}
		}
		cli, err := newEtcdClient(ceps)
		if err != nil {
			return nil, nil, err
		}
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		g := &localGates{}
		ws := make([]worker, n)
		for i := range ws {
			ws[i] = &etcdWorker{s: sess, pfx: pfx, gates: g}
		}
		return ws, func() { _ = sess.Close(); cli.Close() }, nil
	}
	k := s.poolSize(n)
	if setup == setupSpread {
		k = max(k, len(eps))
	}
	pool := make([]*clientv3.Client, k)
	closePool := func() {
		for _, c := range pool {
			if c != nil {
				c.Close()
			}
		}
	}
	for j := range pool {
		ep := leaderURL
		if setup == setupSpread {
			ep = eps[j%len(eps)]
		}
		c, err := newEtcdClient([]string{ep})
		if err != nil {
			closePool()
			return nil, nil, err
		}
		pool[j] = c
	}
	ws, err := openParallel(ctx, n, func(i int) (worker, error) {
		// The session's context outlives this call: it carries the keepalives.
		sess, err := concurrency.NewSession(pool[i%k], concurrency.WithTTL(ttl))
		if err != nil {
			return nil, err
		}
		return &etcdWorker{s: sess, pfx: pfx, own: true}, nil
	})
	if err != nil {
		closePool()
		return nil, nil, err
	}
	return ws, closePool, nil
}

// localGates lets one worker of the process at a time at a lock name. One
// etcd session cannot hold one Mutex twice: both Mutexes write the same key
// (prefix + lease ID), and both think they hold the lock. Goroutines sharing
// a session must therefore take turns in the process first — what lockd's
// client does inside for its own session.
type localGates struct{ m sync.Map } // name → chan struct{} (capacity 1)

func (g *localGates) enter(ctx context.Context, name string) error {
	v, ok := g.m.Load(name)
	if !ok {
		v, _ = g.m.LoadOrStore(name, make(chan struct{}, 1))
	}
	select {
	case v.(chan struct{}) <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *localGates) leave(name string) {
	if v, ok := g.m.Load(name); ok {
		<-v.(chan struct{})
	}
}

type etcdWorker struct {
	s     *concurrency.Session
	own   bool        // s is this worker's alone (closed with it)
	gates *localGates // when the session is shared
	pfx   string
	name  string
	m     *concurrency.Mutex
}

func (w *etcdWorker) lock(ctx context.Context, name string) error {
	if w.gates != nil {
		if err := w.gates.enter(ctx, name); err != nil {
			return err
		}
	}
	m := concurrency.NewMutex(w.s, w.pfx+name)
	if err := m.Lock(ctx); err != nil {
		if w.gates != nil {
			w.gates.leave(name)
		}
		return err
	}
	w.m, w.name = m, name
	return nil
}

func (w *etcdWorker) unlock(ctx context.Context) error {
	if w.m == nil {
		return errors.New("not held")
	}
	err := w.m.Unlock(ctx)
	w.m = nil
	if w.gates != nil {
		w.gates.leave(w.name)
	}
	return err
}

// close revokes the session's lease (bounded by the session TTL inside
// Close); a shared session is closed by the run.
func (w *etcdWorker) close() error {
	if !w.own {
		return nil
	}
	return w.s.Close()
}
