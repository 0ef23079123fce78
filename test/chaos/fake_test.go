package chaos

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// fakeLockServer speaks the lock part of lockd's HTTP API from one
// in-memory table: TTLs, FIFO waiters, idempotent acquire and release, the
// lock list. With doubleGrant > 0 it has the bug a lock service must never
// have: that fraction of acquires of a held lock is granted anyway. Its
// liveness bugs (fakeBugs) are the ones the chaos runs look for. It lets
// the tests show that the same workload and checkers that pass lockd flag
// a server with those bugs.
type fakeLockServer struct {
	doubleGrant float64
	bugs        fakeBugs

	mu       sync.Mutex
	rng      *rand.Rand
	locks    map[string]*fakeLock
	last     uint64
	released map[string]bool
	stop     chan struct{}
	done     chan struct{}
}

// fakeBugs are liveness bugs the fake can have.
type fakeBugs struct {
	// loseTimer: an acquire or renew whose client gave up before the
	// reply (mid-commit) leaves the grant without an expiry timer — the
	// lock's expires_at passes and it stays held.
	loseTimer bool
	// untold is the fraction of hand-offs to a waiter whose grant is
	// made but never sent to the waiting request.
	untold float64
}

// fakeCommit is how long the fake takes to "commit" a grant or renew
// before it answers, so a client timeout of a few milliseconds can end a
// request mid-commit.
const fakeCommit = 8 * time.Millisecond

type fakeLock struct {
	holder  string
	token   uint64
	ttl     time.Duration
	expires time.Time
	noTimer bool // the bug: nothing will expire this grant
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
			if l.holder != "" && !l.noTimer && !now.Before(l.expires) {
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
	l.holder, l.token, l.ttl, l.expires, l.noTimer = client, f.last, ttl, now.Add(ttl), false
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
		tok := f.grantLocked(l, w.client, w.ttl, now)
		if f.rng.Float64() < f.bugs.untold {
			continue // granted, and the waiting request is never told
		}
		w.result <- tok
	}
}

func (f *fakeLockServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/locks/{name}/acquire", f.acquire)
	mux.HandleFunc("POST /api/v1/locks/{name}/release", f.release)
	mux.HandleFunc("POST /api/v1/locks/{name}/renew", f.renew)
	mux.HandleFunc("GET /api/v1/locks/{name}", f.get)
	mux.HandleFunc("GET /api/v1/locks", f.list)
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
		f.commit(r, name, tok)
		grant(tok, exp)
		return
	case l.holder == "" || f.rng.Float64() < f.doubleGrant:
		tok := f.grantLocked(l, req.ClientID, ttl, now)
		exp := l.expires
		f.mu.Unlock()
		f.commit(r, name, tok)
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

// commit waits while the change to grant tok "commits". With the
// loseTimer bug, a client that gave up meanwhile leaves the grant without
// an expiry.
func (f *fakeLockServer) commit(r *http.Request, name string, tok uint64) {
	time.Sleep(fakeCommit)
	if !f.bugs.loseTimer || r.Context().Err() == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.locks[name]; ok && l.token == tok {
		l.noTimer = true
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
	name := r.PathValue("name")
	f.mu.Lock()
	l := f.lock(name)
	if l.holder != req.ClientID || l.token != req.FencingToken {
		f.mu.Unlock()
		fakeError(w, api.CodeNotHolder)
		return
	}
	if req.TTLms != nil {
		l.ttl = time.Duration(*req.TTLms) * time.Millisecond
	}
	l.expires = time.Now().Add(l.ttl)
	exp := l.expires
	f.mu.Unlock()
	f.commit(r, name, req.FencingToken)
	writeFake(w, 200, api.RenewReply{Renewed: true, ExpiresAt: api.FormatTime(exp.UnixMilli())})
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

func (f *fakeLockServer) list(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.locks))
	for name, l := range f.locks {
		if strings.HasPrefix(name, prefix) && (l.holder != "" || len(l.waiters) > 0) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	out := api.LockList{Locks: []api.LockStatus{}}
	for _, name := range names {
		l := f.locks[name]
		st := api.LockStatus{Lock: name, Waiters: len(l.waiters)}
		if l.holder != "" {
			st.Held, st.ClientID, st.FencingToken, st.ExpiresAt = true, l.holder, l.token, api.FormatTime(l.expires.UnixMilli())
		}
		out.Locks = append(out.Locks, st)
	}
	writeFake(w, 200, out)
}

// fakeWorkload is the workload the fake server can serve: raw HTTP only.
func fakeWorkload(url string, seed uint64) WorkloadOptions {
	return WorkloadOptions{Endpoints: []string{url}, Seed: seed, HTTPWorkers: 4, Readers: 2,
		FIFO: true, Keeper: true, Hasty: 1, Scenarios: true, Probe: true, Epoch: 2 * time.Second, LocksPerEpoch: 2}
}

// runAgainstFake runs the HTTP workload against a fake server for d,
// reads every lock once more after its expiry, and checks the history.
func runAgainstFake(t *testing.T, srv *httptest.Server, seed uint64, d time.Duration) (*Report, History) {
	t.Helper()
	return runWorkloadAgainstFake(t, fakeWorkload(srv.URL, seed), d)
}

func runWorkloadAgainstFake(t *testing.T, opts WorkloadOptions, d time.Duration) (*Report, History) {
	t.Helper()
	rec := NewRecorder()
	w := NewWorkload(rec, opts)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	w.Run(ctx)
	w.settle(context.Background(), "", "", 5*time.Second)
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

// runFakeUntil runs rounds of the workload against a fake server with the
// given bugs until a round's history is flagged by checker, or a minute
// passes.
func runFakeUntil(t *testing.T, bugs fakeBugs, checker string) {
	t.Helper()
	fake := newFakeLockServer(0, 3)
	fake.bugs = bugs
	srv := httptest.NewServer(fake.Handler())
	defer fake.Close()
	defer srv.Close()
	start := time.Now()
	for round := uint64(1); time.Since(start) < time.Minute; round++ {
		opts := fakeWorkload(srv.URL, round)
		opts.Hasty = 3
		rep, h := runWorkloadAgainstFake(t, opts, 6*time.Second)
		for _, v := range rep.Violations {
			if v.Checker == checker {
				t.Logf("caught after %s: [%s] %s", time.Since(start).Round(time.Millisecond), v.Checker, v.Msg)
				for _, id := range v.Ops {
					t.Logf("    %s", h.Ops[id])
				}
				return
			}
		}
	}
	t.Fatalf("a server with %+v was not flagged by %q within a minute", bugs, checker)
}

// TestFakeLostTimerIsCaught: a server that leaves a grant without an
// expiry when the request that made or renewed it was given up mid-commit
// (its lock stays held past expires_at forever) is flagged by the expiry
// checker.
func TestFakeLostTimerIsCaught(t *testing.T) {
	runFakeUntil(t, fakeBugs{loseTimer: true}, "expiry")
}

// TestFakeUntoldGrantIsCaught: a server that hands a lock to a waiter and,
// one time in three, never answers the waiting request is flagged by the
// waiter-told checker.
func TestFakeUntoldGrantIsCaught(t *testing.T) {
	runFakeUntil(t, fakeBugs{untold: 0.3}, "waiter-told")
}
