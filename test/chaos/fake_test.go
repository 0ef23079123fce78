package chaos

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// fakeLockServer speaks the lock part of lockd's HTTP API from one
// in-memory table: TTLs, FIFO waiters, idempotent acquire and release. With
// doubleGrant > 0 it has the bug a lock service must never have: that
// fraction of acquires of a held lock is granted anyway. It lets the tests
// show that the same workload and checkers that pass lockd flag a server
// that breaks mutual exclusion.
type fakeLockServer struct {
	doubleGrant float64

	mu       sync.Mutex
	rng      *rand.Rand
	locks    map[string]*fakeLock
	last     uint64
	released map[string]bool
	stop     chan struct{}
	done     chan struct{}
}

type fakeLock struct {
	holder  string
	token   uint64
	ttl     time.Duration
	expires time.Time
	waiters []*fakeWaiter
}

type fakeWaiter struct {
	client   string
	ttl      time.Duration
	deadline time.Time
	result   chan uint64 // token, or 0 for a timeout
}

func newFakeLockServer(doubleGrant float64, seed uint64) *fakeLockServer {
	f := &fakeLockServer{doubleGrant: doubleGrant, rng: rand.New(rand.NewPCG(seed, 1)), locks: map[string]*fakeLock{},
		released: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go f.sweep()
	return f
}

func (f *fakeLockServer) Close() {
	close(f.stop)
	<-f.done
}

// sweep expires locks and times out waiters, as lockd's leader timers do.
func (f *fakeLockServer) sweep() {
	defer close(f.done)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		f.mu.Lock()
		now := time.Now()
		for name, l := range f.locks {
			kept := l.waiters[:0]
			for _, w := range l.waiters {
				if !now.Before(w.deadline) {
					w.result <- 0
					continue
				}
				kept = append(kept, w)
			}
			l.waiters = kept
			if l.holder != "" && !now.Before(l.expires) {
				l.holder = ""
				f.handOffLocked(l, now)
			}
			if l.holder == "" && len(l.waiters) == 0 {
				delete(f.locks, name)
			}
		}
		f.mu.Unlock()
	}
}

func (f *fakeLockServer) grantLocked(l *fakeLock, client string, ttl time.Duration, now time.Time) uint64 {
	f.last++
	l.holder, l.token, l.ttl, l.expires = client, f.last, ttl, now.Add(ttl)
	return l.token
}

func (f *fakeLockServer) handOffLocked(l *fakeLock, now time.Time) {
	for l.holder == "" && len(l.waiters) > 0 {
		w := l.waiters[0]
		l.waiters = l.waiters[1:]
		if !now.Before(w.deadline) {
			w.result <- 0
			continue
		}
		w.result <- f.grantLocked(l, w.client, w.ttl, now)
	}
}

func (f *fakeLockServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/locks/{name}/acquire", f.acquire)
	mux.HandleFunc("POST /api/v1/locks/{name}/release", f.release)
	mux.HandleFunc("POST /api/v1/locks/{name}/renew", f.renew)
	mux.HandleFunc("GET /api/v1/locks/{name}", f.get)
	return mux
}

func writeFake(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fakeError(w http.ResponseWriter, code string) {
	writeFake(w, api.Status(code), api.ErrorReply{Error: api.Error{Code: code, Message: code}})
}

func (f *fakeLockServer) lock(name string) *fakeLock {
	l, ok := f.locks[name]
	if !ok {
		l = &fakeLock{}
		f.locks[name] = l
	}
	return l
}

func (f *fakeLockServer) acquire(w http.ResponseWriter, r *http.Request) {
	var req api.AcquireRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ClientID == "" || req.TTLms == nil {
		fakeError(w, api.CodeInvalidArgument)
		return
	}
	name := r.PathValue("name")
	ttl := time.Duration(*req.TTLms) * time.Millisecond
	var wait time.Duration
	if req.WaitTimeoutMs != nil {
		wait = time.Duration(*req.WaitTimeoutMs) * time.Millisecond
	}
	grant := func(tok uint64, exp time.Time) {
		writeFake(w, 200, api.AcquireReply{Acquired: true, Lock: name, ClientID: req.ClientID, FencingToken: tok,
			ExpiresAt: api.FormatTime(exp.UnixMilli())})
	}
	f.mu.Lock()
	now := time.Now()
	l := f.lock(name)
	switch {
	case l.holder == req.ClientID:
		l.expires = now.Add(ttl)
		tok, exp := l.token, l.expires
		f.mu.Unlock()
		grant(tok, exp)
		return
	case l.holder == "" || f.rng.Float64() < f.doubleGrant:
		tok := f.grantLocked(l, req.ClientID, ttl, now)
		exp := l.expires
		f.mu.Unlock()
		grant(tok, exp)
		return
	case wait == 0:
		holder := l.holder
		f.mu.Unlock()
		writeFake(w, 409, api.AcquireReply{Holder: holder, Error: &api.Error{Code: api.CodeLockHeld, Message: "held"}})
		return
	}
	var me *fakeWaiter
	for _, x := range l.waiters {
		if x.client == req.ClientID {
			me = x // a retry keeps its place
			me.deadline = now.Add(wait)
		}
	}
	if me == nil {
		me = &fakeWaiter{client: req.ClientID, ttl: ttl, deadline: now.Add(wait), result: make(chan uint64, 1)}
		l.waiters = append(l.waiters, me)
	}
	f.mu.Unlock()
	select {
	case tok := <-me.result:
		if tok == 0 {
			writeFake(w, 409, api.AcquireReply{Error: &api.Error{Code: api.CodeWaitTimeout, Message: "timeout"}})
			return
		}
		f.mu.Lock()
		exp := f.lock(name).expires
		f.mu.Unlock()
		grant(tok, exp)
	case <-r.Context().Done():
	}
}

func (f *fakeLockServer) release(w http.ResponseWriter, r *http.Request) {
	var req api.ReleaseRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, api.CodeInvalidArgument)
		return
	}
	name := r.PathValue("name")
	key := name + "/" + req.ClientID + "/" + strconv.FormatUint(req.FencingToken, 10)
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.lock(name)
	switch {
	case l.holder == req.ClientID && l.token == req.FencingToken:
		l.holder = ""
		f.released[key] = true
		f.handOffLocked(l, time.Now())
	case f.released[key]:
	default:
		fakeError(w, api.CodeNotHolder)
		return
	}
	writeFake(w, 200, api.ReleaseReply{Released: true})
}

func (f *fakeLockServer) renew(w http.ResponseWriter, r *http.Request) {
	var req api.RenewRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, api.CodeInvalidArgument)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.lock(r.PathValue("name"))
	if l.holder != req.ClientID || l.token != req.FencingToken {
		fakeError(w, api.CodeNotHolder)
		return
	}
	if req.TTLms != nil {
		l.ttl = time.Duration(*req.TTLms) * time.Millisecond
	}
	l.expires = time.Now().Add(l.ttl)
	writeFake(w, 200, api.RenewReply{Renewed: true, ExpiresAt: api.FormatTime(l.expires.UnixMilli())})
}

func (f *fakeLockServer) get(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	f.mu.Lock()
	defer f.mu.Unlock()
	st := api.LockStatus{Lock: name}
	if l, ok := f.locks[name]; ok {
		st.Waiters = len(l.waiters)
		if l.holder != "" {
			st.Held, st.ClientID, st.FencingToken, st.ExpiresAt = true, l.holder, l.token, api.FormatTime(l.expires.UnixMilli())
		}
	}
	writeFake(w, 200, st)
}

// runAgainstFake runs the HTTP workload against a fake server for d and
// checks the history.
func runAgainstFake(t *testing.T, srv *httptest.Server, seed uint64, d time.Duration) (*Report, History) {
	t.Helper()
	rec := NewRecorder()
	w := NewWorkload(rec, WorkloadOptions{Endpoints: []string{srv.URL}, Seed: seed, HTTPWorkers: 4, Readers: 2,
		FIFO: true, Keeper: true, Epoch: 2 * time.Second, LocksPerEpoch: 2})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	w.Run(ctx)
	h := rec.History()
	return Check(h, CheckOptions{LinTimeout: time.Minute}), h
}

// TestFakeCorrectServerPasses is the control: the workload and checkers
// find nothing wrong with a correct (fake) lock server.
func TestFakeCorrectServerPasses(t *testing.T) {
	fake := newFakeLockServer(0, 1)
	srv := httptest.NewServer(fake.Handler())
	defer fake.Close()
	defer srv.Close()
	rep, h := runAgainstFake(t, srv, 1, 4*time.Second)
	if rep.Grants < 20 || rep.FIFOPairs == 0 {
		t.Fatalf("the workload did too little to prove anything: %d grants, %d FIFO pairs", rep.Grants, rep.FIFOPairs)
	}
	for _, v := range rep.Violations {
		t.Errorf("VIOLATION [%s] %s", v.Checker, v.Msg)
		for _, id := range v.Ops {
			t.Errorf("    %s", h.Ops[id])
		}
	}
	t.Logf("%d ops, %d grants, %d FIFO pairs: no violation", len(h.Ops), rep.Grants, rep.FIFOPairs)
}

// TestFakeDoubleGrantIsCaught: a server that grants a held lock to a
// second client 5% of the time is flagged within a minute.
func TestFakeDoubleGrantIsCaught(t *testing.T) {
	fake := newFakeLockServer(0.05, 2)
	srv := httptest.NewServer(fake.Handler())
	defer fake.Close()
	defer srv.Close()
	start := time.Now()
	for round := uint64(1); time.Since(start) < time.Minute; round++ {
		rep, h := runAgainstFake(t, srv, round, 3*time.Second)
		for _, v := range rep.Violations {
			if v.Checker == "mutual-exclusion" {
				t.Logf("double grant caught after %s: %s", time.Since(start).Round(time.Millisecond), v.Msg)
				for _, id := range v.Ops {
					t.Logf("    %s", h.Ops[id])
				}
				return
			}
		}
	}
	t.Fatal("a server that double-grants was not flagged within a minute")
}
