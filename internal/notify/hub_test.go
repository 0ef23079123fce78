package notify

import (
	"errors"
	"testing"

	"github.com/lockd/lockd/internal/locktable"
)

func TestPublishRoutesByClient(t *testing.T) {
	h := NewHub()
	a, b := h.Subscribe("a"), h.Subscribe("b")
	defer a.Close()
	defer b.Close()
	h.Publish([]locktable.Event{{Kind: locktable.EvGranted, ClientID: "a", Lock: "x"}, {Kind: locktable.EvLost, ClientID: "b", Lock: "y"},
		{Kind: locktable.EvQueued, ClientID: "a", Lock: "z"}})
	<-a.Ready()
	if evs := a.Take(); len(evs) != 1 || evs[0].Lock != "x" {
		t.Fatalf("a got %+v", evs)
	}
	<-b.Ready()
	if evs := b.Take(); len(evs) != 1 || evs[0].Lock != "y" {
		t.Fatalf("b got %+v", evs)
	}
	if len(a.Take()) != 0 || len(b.Take()) != 0 {
		t.Fatal("events leaked to the wrong subscriber")
	}
}

// A burst far beyond any channel buffer reaches a subscriber whole and in
// order (a hundred thousand waits through one connection cut it off once);
// only a subscriber that stopped taking is cut off, at maxQueued.
func TestBurstReachesSubscriberInOrder(t *testing.T) {
	h := NewHub()
	s := h.Subscribe("a")
	const n = 10_000
	evs := make([]locktable.Event, n)
	for i := range evs {
		evs[i] = locktable.Event{Kind: locktable.EvWaitEnded, ClientID: "a", Deadline: int64(i)}
	}
	h.Publish(evs)
	<-s.Ready()
	got := s.Take()
	if len(got) != n {
		t.Fatalf("got %d events, want %d", len(got), n)
	}
	for i, ev := range got {
		if ev.Deadline != int64(i) {
			t.Fatalf("event %d out of order: %+v", i, ev)
		}
	}
	select {
	case <-s.Done():
		t.Fatalf("a burst ended the subscription: %v", s.Err())
	default:
	}
	stuck := make([]locktable.Event, maxQueued+1)
	for i := range stuck {
		stuck[i] = locktable.Event{Kind: locktable.EvGranted, ClientID: "a"}
	}
	h.Publish(stuck)
	<-s.Done()
	if !errors.Is(s.Err(), ErrOverflow) {
		t.Fatalf("err %v, want overflow", s.Err())
	}
}

func TestResetEndsEverySubscription(t *testing.T) {
	h := NewHub()
	a, b := h.Subscribe("a"), h.Subscribe("b")
	h.Reset(ErrLeadershipLost)
	for _, s := range []*Sub{a, b} {
		<-s.Done()
		if !errors.Is(s.Err(), ErrLeadershipLost) {
			t.Fatalf("err %v", s.Err())
		}
	}
	a.Close() // closing an ended subscription is harmless
	h.Publish([]locktable.Event{{ClientID: "a"}})
}

// TellQueued: a subscription that asks for its session's queued acquires
// gets them, in log order with the rest; other subscriptions of the client
// and other sessions' queued acquires do not reach it.
func TestTellQueuedIsOneSessions(t *testing.T) {
	h := NewHub()
	ws, other := h.Subscribe("a"), h.Subscribe("a")
	defer ws.Close()
	defer other.Close()
	ws.TellQueued("s1")
	h.Publish([]locktable.Event{
		{Kind: locktable.EvQueued, ClientID: "a", SessionID: "s1", Lock: "x", Deadline: 1},
		{Kind: locktable.EvQueued, ClientID: "a", SessionID: "s2", Lock: "x", Deadline: 2},
		{Kind: locktable.EvQueued, ClientID: "a", Lock: "x", Deadline: 3},
		{Kind: locktable.EvWaitEnded, ClientID: "a", SessionID: "s1", Lock: "x", Deadline: 1},
	})
	<-ws.Ready()
	if evs := ws.Take(); len(evs) != 2 || evs[0].Kind != locktable.EvQueued || evs[0].Deadline != 1 || evs[1].Kind != locktable.EvWaitEnded {
		t.Fatalf("the session's subscription got %+v", evs)
	}
	<-other.Ready()
	if evs := other.Take(); len(evs) != 1 || evs[0].Kind != locktable.EvWaitEnded {
		t.Fatalf("another subscription of the client got %+v", evs)
	}
}
