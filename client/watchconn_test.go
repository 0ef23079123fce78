package client_test

import (
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/internal/testutil"
)

// TestWatchTellsItsConnectionState (issue 23, item 4): a watch opened
// WithConnEvents says when its connection is lost — once per outage,
// however many reconnect attempts fail — and when it is established again,
// after the statuses it re-read (how many: CaughtUp); a consumer can tell
// "no change" from "not connected". Without the option, no such event.
func TestWatchTellsItsConnectionState(t *testing.T) {
	f := newFake(t, lockdtest.Options{})
	a := newClient(t, f, client.Config{ClientID: "a", SessionTTL: 10 * time.Second})
	w := newClient(t, f, client.Config{ClientID: "w", SessionTTL: 10 * time.Second, MaxBackoff: 50 * time.Millisecond})
	ctx := t.Context()
	for _, n := range []string{"p/1", "p/2", "p/3"} {
		if _, err := a.Acquire(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := w.WatchPrefix(ctx, "p/", client.WithConnEvents())
	if err != nil {
		t.Fatal(err)
	}
	plain, err := w.Watch(ctx, "p/1")
	if err != nil {
		t.Fatal(err)
	}
	rp := record(t, plain)
	r := record(t, ch)
	testutil.WaitFor(t, 2*time.Second, "the first picture", func() bool { return len(r.events()) == 3 })

	f.Partition(true)
	f.DropConnections()
	testutil.WaitFor(t, 2*time.Second, "the disconnect event", func() bool {
		evs := r.events()
		return len(evs) == 4 && evs[3].Conn != nil
	})
	lost := r.events()[3]
	if lost.Lock != "" || lost.Conn.Connected || lost.Conn.Err == nil {
		t.Fatalf("disconnect event %+v %+v", lost, lost.Conn)
	}
	// Changes while it is away (the fake's own timers would do the same).
	f.ExpireLock("p/1")
	f.ExpireLock("p/2")
	time.Sleep(300 * time.Millisecond) // several reconnect attempts fail meanwhile
	f.Partition(false)

	testutil.WaitFor(t, 5*time.Second, "the reconnect event", func() bool {
		evs := r.events()
		return len(evs) > 0 && evs[len(evs)-1].Conn != nil && evs[len(evs)-1].Conn.Connected
	})
	evs := r.events()
	conns := 0
	for _, ev := range evs {
		if ev.Conn != nil {
			conns++
		}
	}
	back := evs[len(evs)-1].Conn
	if conns != 2 {
		t.Fatalf("%d connection events, want one lost and one back", conns)
	}
	caught := evs[4 : len(evs)-1]
	if back.CaughtUp != 2 || len(caught) != 2 || back.Leader != f.URL(0) {
		t.Fatalf("back %+v after %d events: want 2 locks caught up (p/1 and p/2 freed) on %s", back, len(caught), f.URL(0))
	}
	for _, ev := range caught {
		if !ev.Resync || ev.Status.Held {
			t.Fatalf("caught-up event %+v: want a re-read of a freed lock", ev)
		}
	}
	for _, ev := range rp.events() {
		if ev.Conn != nil {
			t.Fatalf("a watch without WithConnEvents got %+v", ev.Conn)
		}
	}

	// A single lock's watch says so too, after its one re-read status.
	one, err := w.Watch(ctx, "p/3", client.WithConnEvents())
	if err != nil {
		t.Fatal(err)
	}
	r1 := record(t, one)
	testutil.WaitFor(t, 2*time.Second, "p/3's state", func() bool { return len(r1.events()) == 1 })
	f.DropConnections()
	testutil.WaitFor(t, 5*time.Second, "lost and back", func() bool {
		evs := r1.events()
		return len(evs) == 3 && evs[1].Conn != nil && !evs[1].Conn.Connected && evs[2].Conn != nil && evs[2].Conn.Connected
	})
	if n := r1.events()[2].Conn.CaughtUp; n != 0 {
		t.Fatalf("caught up %d, want 0: p/3 did not change", n)
	}
}
