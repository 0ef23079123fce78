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

// maxQueued bounds the events waiting for one subscriber. What reaches a
// subscriber is bounded by what it has asked for (its client's grants,
// losses and ends of waits: at most the locks it holds and the waits it
// queued, both under quotas), so this is a last resort against a consumer
// that stopped: past it, the subscription ends with ErrOverflow and the
// client re-reads where it stands.
const maxQueued = 1 << 16

// Hub fans events out to subscribers by client id.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[*Sub]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{subs: map[string]map[*Sub]struct{}{}}
}

// Sub is one subscription. Its events queue without bound but maxQueued:
// a burst (a hundred thousand waits queued through one connection) never
// cuts off a subscriber that keeps up on average.
type Sub struct {
	hub   *Hub
	key   string
	q     []locktable.Event // under hub.mu
	ready chan struct{}     // signalled when q becomes non-empty
	done  chan struct{}
	err   error
	// queuedOf: also told the acquires queued through this session
	// (TellQueued); under hub.mu.
	queuedOf string
}

// Subscribe returns a subscription to the events about clientID that a
// waiting client is told of: grants, losses, ends of waits and of
// sessions.
func (h *Hub) Subscribe(clientID string) *Sub {
	s := &Sub{hub: h, key: clientID, ready: make(chan struct{}, 1), done: make(chan struct{})}
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

// Ready is signalled when events are waiting; Take them.
func (s *Sub) Ready() <-chan struct{} { return s.ready }

// Take returns the events waiting, in log order, and empties the queue.
func (s *Sub) Take() []locktable.Event {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	q := s.q
	s.q = nil
	return q
}

// TellQueued makes the subscription also told of the acquires queued
// through session (EvQueued: a new wait, or a retry that joined one and
// gave it its deadline), in log order with the rest. A WebSocket
// connection, which carries the session, learns from them which of its
// requests are one wait. Only that session's: each such event comes of a
// request of the session's own, so a burst costs what the burst of
// requests did.
func (s *Sub) TellQueued(session string) {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.queuedOf = session
}

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

// told reports whether a waiting client is told of events of this kind:
// the others (queued, renewed, released, values, delays, session starts)
// answer nobody's wait, and a burst of queued acquires would only fill
// every subscriber's queue (a subscription asks for its own session's
// queued acquires with TellQueued).
func told(k locktable.EventKind) bool {
	switch k {
	case locktable.EvGranted, locktable.EvLost, locktable.EvWaitEnded, locktable.EvSessionEnded:
		return true
	}
	return false
}

// Publish hands events to their subscribers without blocking; a subscriber
// with maxQueued events waiting is cut off with ErrOverflow.
func (h *Hub) Publish(events []locktable.Event) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range events {
		switch {
		case told(ev.Kind):
			for s := range h.subs[ev.ClientID] {
				h.deliverLocked(s, ev)
			}
		case ev.Kind == locktable.EvQueued && ev.SessionID != "":
			for s := range h.subs[ev.ClientID] {
				if s.queuedOf == ev.SessionID {
					h.deliverLocked(s, ev)
				}
			}
		}
	}
}

func (h *Hub) deliverLocked(s *Sub, ev locktable.Event) {
	if len(s.q) >= maxQueued {
		h.endLocked(s, ErrOverflow)
		return
	}
	s.q = append(s.q, ev)
	if len(s.q) == 1 {
		select {
		case s.ready <- struct{}{}:
		default:
		}
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
