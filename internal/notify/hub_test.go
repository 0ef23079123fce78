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
	h.Publish([]locktable.Event{{Kind: locktable.EvGranted, ClientID: "a", Lock: "x"}, {Kind: locktable.EvLost, ClientID: "b", Lock: "y"}})
	if ev := <-a.Events(); ev.Lock != "x" {
		t.Fatalf("a got %+v", ev)
	}
	if ev := <-b.Events(); ev.Lock != "y" {
		t.Fatalf("b got %+v", ev)
	}
	if len(a.Events()) != 0 || len(b.Events()) != 0 {
		t.Fatal("events leaked to the wrong subscriber")
	}
}

func TestSlowSubscriberIsCutOff(t *testing.T) {
	h := NewHub()
	s := h.Subscribe("a")
	evs := make([]locktable.Event, subBuffer+1)
	for i := range evs {
		evs[i] = locktable.Event{Kind: locktable.EvGranted, ClientID: "a"}
	}
	h.Publish(evs)
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
