package server

import (
	"sync"

	"github.com/lockd/lockd/internal/notify"
	"github.com/lockd/lockd/internal/raftnode"
)

// Effects follow the log. The apply loop hands every committed entry's
// events to push (it must never block: Raft's apply goroutine runs it), and
// one goroutine, runEffects, hands them to their consumers in log order:
// the leader's timers, the notify hub (waiting requests, WebSocket pushes)
// and the metrics. No request goroutine is on this path, so a request
// that gives up while its entry is in flight, or two requests that return
// in the other order than they committed, cannot lose or reorder an effect.
//
// The queue is unbounded: it grows only while a consumer is slow (a new
// leader rebuilding its timers holds the timers' lock for a moment), and
// the apply loop must not wait for that.
type effectQueue struct {
	mu     sync.Mutex
	q      []raftnode.Effect
	signal chan struct{}
}

func newEffectQueue() *effectQueue { return &effectQueue{signal: make(chan struct{}, 1)} }

func (e *effectQueue) push(ef raftnode.Effect) {
	e.mu.Lock()
	e.q = append(e.q, ef)
	e.mu.Unlock()
	select {
	case e.signal <- struct{}{}:
	default:
	}
}

func (e *effectQueue) take() []raftnode.Effect {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.q
	e.q = nil
	return q
}

// runEffects delivers queued effects in order until the member stops.
func (s *Server) runEffects() {
	defer s.wg.Done()
	for {
		select {
		case <-s.effects.signal:
		case <-s.done:
			return
		}
		for _, ef := range s.effects.take() {
			s.applyEffect(ef)
		}
	}
}

func (s *Server) applyEffect(ef raftnode.Effect) {
	if ef.Restored {
		// The whole state was replaced: timers re-read it, and every
		// waiting client re-reads where it stands.
		s.timers.Rebuild()
		s.hub.Reset(notify.ErrResync)
		s.watches.Reset()
		return
	}
	s.timers.Observe(ef.Index, ef.Events)
	s.hub.Publish(ef.Events)
	s.publishChanges(ef)
	s.metrics.observeEvents(ef.Events)
}

// publishChanges hands watchers the status of every lock the entry
// changed, as the apply loop recorded it right after the entry. An entry
// applied while nobody watched has none recorded, and nothing to hand on:
// every watcher there is now registered after it applied, and reads its
// first picture after registering, so the picture shows it. (Reading the
// status now instead would show a later state, at the index of a later
// entry, whose own change then came a second time.)
func (s *Server) publishChanges(ef raftnode.Effect) {
	defer s.watches.Advance(ef.Index)
	if ef.Changed == nil || !s.watches.Watching() {
		return
	}
	changes := make([]notify.Change, 0, len(ef.Changed))
	for _, li := range ef.Changed {
		changes = append(changes, notify.Change{Index: ef.Index, Status: li})
	}
	s.watches.Publish(changes)
}
