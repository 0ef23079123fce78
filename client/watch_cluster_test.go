package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/testutil"
)

// Watches and elections against lockd itself.

// checkFinal fails unless the last event of each lock shows its current
// status (read from the leader).
func checkFinal(t *testing.T, a *client.API, r *watchRecorder, names ...string) {
	t.Helper()
	for _, n := range names {
		st, err := a.Status(t.Context(), n, false)
		if err != nil {
			t.Fatal(err)
		}
		ev, ok := r.lastOf(n)
		if !ok || ev.Status.Held != st.Held || ev.Status.ClientID != st.ClientID || ev.Status.FencingToken != st.FencingToken ||
			ev.Status.Value != st.Value || (st.Held && ev.Index != st.Index) {
			t.Fatalf("lock %s: last event %+v (found %v), but the status is %+v", n, ev, ok, st)
		}
	}
}

// The watcher's connection is cut (a proxy between it and the one member)
// while locks change: one is freed (and so gone from the prefix), one
// changes value twice, one is taken. After the cut heals, the client
// resumes and watches again: the freed lock comes as free, the others
// with their latest state, nothing twice, and changes go on.
func TestWatchAcrossACutConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	px, err := testutil.NewProxy("127.0.0.1:0", strings.TrimPrefix(url, "http://"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	w := newClient(t, nil, client.Config{Endpoints: []string{"http://" + px.Addr()}, ClientID: "watcher",
		SessionTTL: 20 * time.Second, MaxBackoff: 200 * time.Millisecond, AttemptTimeout: time.Second})
	a := newAPI(t, url)
	ctx := t.Context()
	tokens := map[string]uint64{}
	acquire := func(name, value string) {
		t.Helper()
		rep, err := a.AcquireRequest(ctx, name, api.AcquireRequest{ClientID: "h", TTLms: ms(time.Minute), Value: &value})
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = rep.FencingToken
	}
	setValue := func(name, value string) {
		t.Helper()
		if err := a.SetValue(ctx, name, "h", tokens[name], value); err != nil {
			t.Fatal(err)
		}
	}
	acquire("p/a", "a1")
	acquire("p/b", "b1")
	pch, err := w.WatchPrefix(ctx, "p/")
	if err != nil {
		t.Fatal(err)
	}
	lch, err := w.Watch(ctx, "p/a")
	if err != nil {
		t.Fatal(err)
	}
	pr, lr := record(t, pch), record(t, lch)
	pr.waitLast(t, "p/a", "held", valueIs("a1"))
	lr.waitLast(t, "p/a", "held", valueIs("a1"))
	setValue("p/b", "b2")
	pr.waitLast(t, "p/b", "value b2", valueIs("b2"))

	px.Cut()
	if err := a.Release(ctx, "p/a", "h", tokens["p/a"]); err != nil {
		t.Fatal(err)
	}
	setValue("p/b", "b3")
	setValue("p/b", "b4")
	acquire("p/c", "c1")
	time.Sleep(300 * time.Millisecond) // a few failed reconnects
	px.Heal()

	for _, r := range []*watchRecorder{pr, lr} {
		if ev := r.waitLast(t, "p/a", "free after the cut", free); !ev.Resync {
			t.Fatalf("p/a's state read after the reconnect is not marked Resync: %+v", ev)
		}
	}
	pr.waitLast(t, "p/b", "value b4", valueIs("b4"))
	pr.waitLast(t, "p/c", "held", valueIs("c1"))
	if err := a.Release(ctx, "p/c", "h", tokens["p/c"]); err != nil {
		t.Fatal(err)
	}
	if ev := pr.waitLast(t, "p/c", "free", free); ev.Resync {
		t.Fatalf("a change after the reconnect is marked Resync: %+v", ev)
	}
	checkOrder(t, pr.events())
	checkOrder(t, lr.events())
	var bs []string
	for _, ev := range pr.of("p/b") {
		bs = append(bs, ev.Status.Value)
	}
	if got := strings.Join(bs, ","); got != "b1,b2,b4" {
		t.Fatalf("p/b's values %s, want b1,b2,b4 (b3 folded into b4 while cut off, nothing twice)", got)
	}
	if n := len(lr.events()); n != 2 {
		t.Fatalf("the watch of p/a got %d events, want 2 (held, free)", n)
	}
	checkFinal(t, a, pr, "p/a", "p/b", "p/c")
}

func ms(d time.Duration) *int64 {
	v := d.Milliseconds()
	return &v
}

// A prefix watch across a leader transfer: every change is delivered,
// with its index, in order, once — when each change is waited for before
// the next change of the same lock, even the ones that committed while the
// client was moving to the new leader come (as the state read again).
func TestWatchAcrossALeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 3, testutil.Options{})
	urls := cl.URLsFollowersFirst()
	w := newClient(t, nil, client.Config{Endpoints: urls, ClientID: "watcher", SessionTTL: 20 * time.Second,
		MaxBackoff: 200 * time.Millisecond, AttemptTimeout: time.Second})
	a := newAPI(t, urls...)
	ctx := t.Context()
	ch, err := w.WatchPrefix(ctx, "t/")
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, ch)
	tokens := map[string]uint64{}
	// step makes one change and waits until the watch delivered the
	// lock's status at that change's index.
	step := func(i int) {
		t.Helper()
		name := fmt.Sprintf("t/%d", i%3)
		opCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		switch tok := tokens[name]; {
		case tok == 0:
			var rep *api.AcquireReply
			rep, err = a.Acquire(opCtx, name, "h", time.Minute, 0)
			if err == nil {
				tokens[name] = rep.FencingToken
			}
		case i%2 == 0:
			err = a.SetValue(opCtx, name, "h", tok, fmt.Sprint("v", i))
		default:
			err = a.Release(opCtx, name, "h", tok)
			tokens[name] = 0
		}
		if err != nil {
			t.Fatalf("step %d on %s: %v", i, name, err)
		}
		st, err := a.Status(opCtx, name, false)
		if err != nil {
			t.Fatal(err)
		}
		r.waitFor(t, 20*time.Second, fmt.Sprintf("step %d: %s at index %d", i, name, st.Index), func() bool {
			for _, ev := range r.of(name) {
				if ev.Index == st.Index {
					return true
				}
			}
			return false
		})
	}
	for i := range 8 {
		step(i)
	}
	old := cl.WaitLeader(10 * time.Second)
	if err := a.TransferLeadership(ctx, ""); err != nil {
		t.Fatal(err)
	}
	for i := 8; i < 20; i++ {
		step(i)
	}
	if now := cl.WaitLeader(10 * time.Second); now.ID == old.ID {
		t.Fatalf("the leadership stayed on %s", old.ID)
	}
	evs := r.events()
	checkOrder(t, evs)
	resynced := 0
	for _, ev := range evs {
		if ev.Resync {
			resynced++
		}
	}
	t.Logf("%d events, %d of them read again after the reconnect", len(evs), resynced)
	checkFinal(t, a, r, "t/0", "t/1", "t/2")
}

// Elections against lockd: hand-over on Resign, Observe in token order,
// Done when the leadership is revoked.
func TestElectionOnARealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cl := testutil.NewCluster(t, 1, testutil.Options{})
	url := cl.WaitLeader(10 * time.Second).URL()
	cfg := func(id string) client.Config {
		return client.Config{Endpoints: []string{url}, ClientID: id, SessionTTL: 10 * time.Second}
	}
	ca, cb, co := newClient(t, nil, cfg("a")), newClient(t, nil, cfg("b")), newClient(t, nil, cfg("o"))
	ctx := t.Context()
	ea, eb, eo := client.NewElection(ca, "el"), client.NewElection(cb, "el"), client.NewElection(co, "el")
	obs, err := eo.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ea.Campaign(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	if li := nextLeader(t, obs); li.Value != "alpha" || li.Token != ea.Token() {
		t.Fatalf("observed %+v", li)
	}
	bres := campaignAsync(t, eb, "beta")
	testutil.WaitFor(t, 10*time.Second, "b to queue", func() bool {
		st, err := co.API().Status(ctx, "el", false)
		return err == nil && st.Waiters == 1
	})
	if li, err := eo.Leader(ctx); err != nil || li.Value != "alpha" || li.ClientID != "a" {
		t.Fatalf("Leader %+v, %v", li, err)
	}
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bres:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b not elected after a resigned")
	}
	if li := nextLeader(t, obs); li.Value != "beta" || li.ClientID != "b" || li.Token <= ea.Token() || li.Token != eb.Token() {
		t.Fatalf("observed %+v, want beta with token %d > %d", li, eb.Token(), ea.Token())
	}
	done := eb.Done()
	if _, err := co.Revoke(ctx, "el", 0); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, done, 10*time.Second, "Done after the leadership was revoked")
	if !errors.Is(eb.Err(), client.ErrRevoked) {
		t.Fatalf("Err %v, want ErrRevoked", eb.Err())
	}
	if _, err := eo.Leader(ctx); !errors.Is(err, client.ErrElectionNoLeader) {
		t.Fatalf("Leader after the revocation: %v", err)
	}
}
