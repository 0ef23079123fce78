package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// ---- ZooKeeper through go-zookeeper's lock recipe (zk.NewLock) ----
//
// An uncontended cycle is a create of an ephemeral sequential node under the
// lock's node, a getChildren (a local read on the member the client talks
// to) and a delete: two writes through ZooKeeper's atomic broadcast, like
// lockd's acquire and release and etcd's Txn and Delete. A waiter watches
// the node just before its own, so a hand-off is the holder's delete, the
// watch event and the waiter's getChildren.

type zkSystem struct {
	c          *zkCluster
	sessionTTL time.Duration
}

func (s *zkSystem) name() string      { return "zookeeper" }
func (s *zkSystem) serverPIDs() []int { return s.c.pids() }
func (s *zkSystem) leaderPID(ctx context.Context) int {
	if l, err := s.c.leader(ctx); err == nil && l.p != nil {
		return l.p.pid()
	}
	return 0
}

// zkQuiet drops go-zookeeper's connection log lines (one per connect and
// disconnect, thousands in a run).
type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

// dialZK connects to servers and waits until the session is established.
// A zk.Conn is one session: ZooKeeper binds the session (its ephemeral
// nodes, its watches, its pings every third of the timeout) to the client.
func dialZK(ctx context.Context, servers []string, ttl time.Duration) (*zk.Conn, error) {
	c, events, err := zk.Connect(servers, ttl, zk.WithLogger(zkQuiet{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for c.State() != zk.StateHasSession {
		select {
		case <-events: // the channel drops events nobody reads; State is the truth
		case <-tick.C:
		case <-ctx.Done():
			c.Close()
			return nil, fmt.Errorf("zookeeper %v: no session: %w", servers, ctx.Err())
		}
	}
	return c, nil
}

func (s *zkSystem) serversFor(ctx context.Context, setup string, i int) ([]string, error) {
	if setup == setupLeader {
		l, err := s.c.leader(ctx)
		if err != nil {
			return nil, err
		}
		return []string{l.clientAddr}, nil
	}
	return rotate(s.c.endpoints(), i), nil
}

func (s *zkSystem) workers(ctx context.Context, n int, setup string, shared bool, runID string) ([]worker, func(), error) {
	pfx := "/lockbench/" + runID + "/"
	if shared {
		// One session for every worker: the recipe gives each Lock its
		// own sequential node, so workers of one session wait for each
		// other in ZooKeeper's queue.
		servers, err := s.serversFor(ctx, setup, 0)
		if err != nil {
			return nil, nil, err
		}
		c, err := dialZK(ctx, servers, s.sessionTTL)
		if err != nil {
			return nil, nil, err
		}
		ws := make([]worker, n)
		for i := range ws {
			ws[i] = &zkWorker{c: c, pfx: pfx}
		}
		return ws, c.Close, nil
	}
	ws, err := openParallel(ctx, n, func(i int) (worker, error) {
		servers, err := s.serversFor(ctx, setup, i)
		if err != nil {
			return nil, err
		}
		if setup == setupSpread {
			servers = servers[:1] // like an etcd client: stay on member i mod N
		}
		c, err := dialZK(ctx, servers, s.sessionTTL)
		if err != nil {
			return nil, err
		}
		return &zkWorker{c: c, pfx: pfx, own: true}, nil
	})
	return ws, func() {}, err
}

// prepare makes each lock's node — the persistent parent the recipe puts its
// sequential nodes under — before the run, as a service does once for the
// locks it uses. Left to the recipe, the first acquire of every lock would
// pay for an exists per level and a create (and the race between the
// workers that try it at once) inside the run's warm-up.
func (s *zkSystem) prepare(ctx context.Context, runID string, names []string) error {
	servers, err := s.serversFor(ctx, setupLeader, 0)
	if err != nil {
		return err
	}
	c, err := dialZK(ctx, servers, s.sessionTTL)
	if err != nil {
		return err
	}
	defer c.Close()
	create := func(path string) error {
		if _, err := c.Create(path, nil, 0, zkACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", path, err)
		}
		return nil
	}
	if err := create("/lockbench"); err != nil {
		return err
	}
	if err := create("/lockbench/" + runID); err != nil {
		return err
	}
	// Pipelined: go-zookeeper sends requests of concurrent callers on one
	// connection without waiting for each answer.
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = create("/lockbench/" + runID + "/" + n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

type zkWorker struct {
	c   *zk.Conn
	own bool
	pfx string
	l   *zk.Lock
}

var zkACL = zk.WorldACL(zk.PermAll)

// lock takes the recipe's lock. zk.Lock has no context, so it runs in a
// goroutine; a caller that gives up leaves it to finish and release.
func (w *zkWorker) lock(ctx context.Context, name string) error {
	l := zk.NewLock(w.c, w.pfx+name, zkACL)
	done := make(chan error, 1)
	go func() { done <- l.Lock() }()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		w.l = l
		return nil
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				_ = l.Unlock()
			}
		}()
		return ctx.Err()
	}
}

func (w *zkWorker) unlock(context.Context) error {
	if w.l == nil {
		return errors.New("not held")
	}
	err := w.l.Unlock()
	w.l = nil
	return err
}

// close ends the session (its ephemeral nodes go with it); a shared
// session is closed by the run.
func (w *zkWorker) close() error {
	if w.own {
		w.c.Close()
	}
	return nil
}

// warmZooKeeper drives lock cycles through every member for d before any
// measured run, so the JVMs have compiled the request path (HotSpot compiles
// a method to native code only after thousands of calls and interprets it
// until then) — what a long-running ZooKeeper has done long before anyone
// measures it. Three quarters of the workers cycle on locks of their own
// (many cycles per second, so many calls), a quarter hand one lock around,
// and every session is shared by several workers, so every path a run takes
// is warm.
//
// It returns the cycles per second of each fifth of the warm-up, so the
// record shows whether the rate had levelled off when measuring began.
func warmZooKeeper(ctx context.Context, c *zkCluster, d, ttl time.Duration) ([]float64, error) {
	eps := c.endpoints()
	const connsPerMember, workersPerConn = 4, 4
	var conns []*zk.Conn
	defer func() {
		for _, cn := range conns {
			cn.Close()
		}
	}()
	for i := 0; i < connsPerMember*len(eps); i++ {
		cn, err := dialZK(ctx, []string{eps[i%len(eps)]}, ttl)
		if err != nil {
			return nil, err
		}
		conns = append(conns, cn)
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var cycles atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < workersPerConn*len(conns); i++ {
		w := &zkWorker{c: conns[i%len(conns)], pfx: "/lockbench/warmup/"}
		name := fmt.Sprintf("own-%d", i)
		if i%4 == 3 {
			name = "hot"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				err := w.lock(wctx, name)
				if err == nil {
					err = w.unlock(wctx)
				}
				if err != nil {
					if wctx.Err() == nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				cycles.Add(1)
			}
		}()
	}
	var rates []float64
	step := d / 5
	last, lastAt := int64(0), time.Now()
	for i := 0; i < 5 && wctx.Err() == nil; i++ {
		sleepUntil(wctx, lastAt.Add(step))
		now, n := time.Now(), cycles.Load()
		rates = append(rates, float64(n-last)/now.Sub(lastAt).Seconds())
		last, lastAt = n, now
	}
	wg.Wait()
	if ctx.Err() != nil {
		return rates, ctx.Err()
	}
	if cycles.Load() == 0 && firstErr != nil {
		return nil, fmt.Errorf("zookeeper warm-up: %w", firstErr)
	}
	return rates, nil
}
