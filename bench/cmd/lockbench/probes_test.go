package main

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// TestMain lets the test binary be the promise keepers' process, as the
// lockbench binary is for a run: startProbesProcess runs os.Executable().
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "overload-probes" {
		os.Exit(overloadProbesMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestProbesProcessReportsWhatItKept: the promise keepers run in their own
// process against a scripted member, say ready once every session is open
// and every holder holds, keep their promises until told to stop, and
// report what they counted — keepalives answered, renews acknowledged, and
// a refusal's code and Retry-After — to the run.
func TestProbesProcessReportsWhatItKept(t *testing.T) {
	var keepalives, renews, refused atomic.Int64
	f := newFakeLockd(t, func(fc *fakeConn, req api.WSRequest) {
		switch req.Op {
		case api.OpKeepalive:
			if keepalives.Add(1) == 1 {
				refused.Add(1)
				fc.refuse(req.ID, api.CodeOverloaded, 120*time.Millisecond)
				return
			}
			fc.reply(req.ID, api.WSMessage{Type: api.TypeOK})
		case api.OpAcquire:
			fc.reply(req.ID, api.WSMessage{Type: api.TypeGranted, Lock: req.Lock, FencingToken: 7,
				ExpiresAt: api.FormatTime(time.Now().Add(2 * time.Second).UnixMilli())})
		case api.OpRenew:
			renews.Add(1)
			fc.reply(req.ID, api.WSMessage{Type: api.TypeOK, Lock: req.Lock, FencingToken: req.FencingToken,
				ExpiresAt: api.FormatTime(time.Now().Add(2 * time.Second).UnixMilli())})
		default:
			t.Errorf("unexpected op %s", req.Op)
		}
	})
	o := overloadOpts{sessions: 3, sessionTTL: 900 * time.Millisecond, holders: 2, holderTTL: 2 * time.Second,
		renewEvery: 200 * time.Millisecond, openParallel: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := startProbesProcess(ctx, []*lockdMember{{id: "n1", httpURL: f.srv.URL}}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.kill()
	time.Sleep(1500 * time.Millisecond)
	rep, err := p.finish()
	if err != nil {
		t.Fatal(err)
	}
	// 3 sessions keep alive every 300 ms for 1.5 s; 2 holders renew every
	// 200 ms.
	if rep.Sessions.Sessions != 3 || rep.Sessions.Acked < 6 || rep.Sessions.Lost != 0 || len(rep.Sessions.Failed) != 0 {
		t.Fatalf("sessions %+v", rep.Sessions)
	}
	if rep.Holders.Holders != 2 || rep.Holders.Grants != 2 || rep.Holders.Acked < 8 || rep.Holders.Lost != 0 || rep.Holders.LateAcks != 0 {
		t.Fatalf("holders %+v", rep.Holders)
	}
	if rep.Holders.Acked > renews.Load() {
		t.Fatalf("%d renews acknowledged, the member answered %d", rep.Holders.Acked, renews.Load())
	}
	// The refused keepalive was retried after its Retry-After, and the
	// refusal reaches the run's counts by role.
	all := mergeRoles("all", rep.SessionStats.stats(), rep.HolderStats.stats())
	if refused.Load() != 1 || codeOf(all.Codes, api.CodeOverloaded) != 1 || all.RetryAfter.Count != 1 || all.RetryAfter.P50Ms != 120 || all.Retries != 1 {
		t.Fatalf("refusals %+v", all)
	}
	if p.cmd.ProcessState == nil || !p.cmd.ProcessState.Success() {
		t.Fatalf("the probes' process ended %v", p.cmd.ProcessState)
	}
}

// TestProbesProcessFailsWithoutALeader: a process that cannot open its
// sessions never says ready, and the run gets an error (here when its own
// patience ends) instead of a report of nothing.
func TestProbesProcessFailsWithoutALeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	o := overloadOpts{sessions: 1, sessionTTL: time.Second, holders: 1, holderTTL: time.Second, renewEvery: time.Second, openParallel: 1}
	_, err := startProbesProcess(ctx, []*lockdMember{{id: "n1", httpURL: "http://127.0.0.1:1"}}, o)
	if err == nil {
		t.Fatal("started against no member")
	}
}
