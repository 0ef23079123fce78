// Package notify carries committed state-machine events from the leader to
// the clients waiting on them (a blocked HTTP acquire, a WebSocket session).
//
// Events enter in log order from the server's apply loop consumer after
// their entry committed and was applied (on every member; only a leader has
// subscribers), never from the goroutine of the request that proposed them.
package notify

import (
	"errors"
	"sync"

	"github.com/lockd/lockd/internal/locktable"
)

// Errors a subscription ends with.
var (
	ErrLeadershipLost = errors.New("notify: leadership lost")
	ErrOverflow       = errors.New("notify: subscriber too slow, events dropped")
	ErrClosed         = errors.New("notify: subscription closed")
	// ErrResync: the state was replaced (a restore); re-read it.
	ErrResync = errors.New("notify: state replaced, re-read it")
)

// subBuffer is how many events a subscriber may lag behind before it is cut
// off (and must re-read state).
const subBuffer = 256

// Hub fans events out to subscribers by client id.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[*Sub]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{subs: map[string]map[*Sub]struct{}{}}
}

// Sub is one subscription.
type Sub struct {
	hub  *Hub
	key  string
	ch   chan locktable.Event
	done chan struct{}
	err  error
}

// Subscribe returns a subscription to every event about clientID.
func (h *Hub) Subscribe(clientID string) *Sub {
	s := &Sub{hub: h, key: clientID, ch: make(chan locktable.Event, subBuffer), done: make(chan struct{})}
	h.mu.Lock()
	m := h.subs[clientID]
	if m == nil {
		m = map[*Sub]struct{}{}
		h.subs[clientID] = m
	}
	m[s] = struct{}{}
	h.mu.Unlock()
	return s
}

// Events delivers the subscription's events.
func (s *Sub) Events() <-chan locktable.Event { return s.ch }

// Done is closed when the subscription ends; Err says why.
func (s *Sub) Done() <-chan struct{} { return s.done }

// Err is the reason the subscription ended (nil while it runs).
func (s *Sub) Err() error {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Close ends the subscription.
func (s *Sub) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.endLocked(s, ErrClosed)
}

func (h *Hub) endLocked(s *Sub, err error) {
	select {
	case <-s.done:
		return
	default:
	}
	s.err = err
	close(s.done)
	if m := h.subs[s.key]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(h.subs, s.key)
		}
	}
}

// Publish hands events to their subscribers without blocking; a subscriber
// whose buffer is full is cut off with ErrOverflow.
func (h *Hub) Publish(events []locktable.Event) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range events {
		for s := range h.subs[ev.ClientID] {
			h.deliverLocked(s, ev)
		}
	}
}

func (h *Hub) deliverLocked(s *Sub, ev locktable.Event) {
	select {
	case s.ch <- ev:
	default:
		h.endLocked(s, ErrOverflow)
	}
}

// Reset ends every subscription with err (leadership lost: waiting clients
// must retry on the new leader).
func (h *Hub) Reset(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.subs {
		for s := range m {
			h.endLocked(s, err)
		}
	}
}
