package main

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// dueAt is the start time of the seq-th cycle of a schedule of rate cycles
// per second beginning at start.
func dueAt(start time.Time, rate float64, seq int64) time.Time {
	return start.Add(time.Duration(float64(seq) / rate * float64(time.Second)))
}

// openLoop runs an open-loop schedule: cycle seq is due at dueAt(start,
// rate, seq), for every due time before end, and starts on time in a
// goroutine of its own whatever the earlier cycles are doing (a late
// scheduler catches up at once rather than shifting the schedule). Only the
// client's own bound holds a cycle back: when maxInFlight cycles are
// running, a due cycle is skipped, not delayed, and counted. openLoop
// returns once every started cycle has returned, or at once when ctx ends
// (started cycles are then waited for as well).
func openLoop(ctx context.Context, rate float64, start, end time.Time, maxInFlight int64, fire func(seq int64, due time.Time)) (started, skipped int64) {
	if rate <= 0 {
		return 0, 0
	}
	var inflight atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	for seq := int64(0); ; seq++ {
		due := dueAt(start, rate, seq)
		if !due.Before(end) {
			return started, skipped
		}
		// Sleep only when the next start is worth a timer; behind
		// schedule, start at once.
		if d := time.Until(due); d > 200*time.Microsecond {
			if !sleepCtx(ctx, d) {
				return started, skipped
			}
		} else if ctx.Err() != nil {
			return started, skipped
		}
		if inflight.Load() >= maxInFlight {
			skipped++
			continue
		}
		inflight.Add(1)
		wg.Add(1)
		started++
		go func(seq int64, due time.Time) {
			defer wg.Done()
			defer inflight.Add(-1)
			// Through the back of the scheduler's global queue, where the
			// goroutines the network poller wakes wait while the flood keeps
			// every processor busy: the other clients of this process (the
			// keepalive sessions' readers) must not wait behind the flood it
			// makes, or their latency measures the bench (lockd does the
			// same for its own clients; docs/DESIGN.md, Load).
			runtime.Gosched()
			fire(seq, due)
		}(seq, due)
	}
}

// scheduled is how many cycles a schedule of rate per second has due in
// [start, end).
func scheduled(rate float64, d time.Duration) int64 {
	if rate <= 0 || d <= 0 {
		return 0
	}
	n := int64(rate * d.Seconds())
	// dueAt(n) may fall just before end by rounding; count exactly.
	start := time.Unix(0, 0)
	end := start.Add(d)
	for dueAt(start, rate, n).Before(end) {
		n++
	}
	for n > 0 && !dueAt(start, rate, n-1).Before(end) {
		n--
	}
	return n
}

// cycleLog records the outcome of every cycle of a flood: completions per
// second of the window (by completion time), failures by code, and the
// latency from each cycle's due time to its completion. Safe for
// concurrent use.
type cycleLog struct {
	start time.Time
	end   time.Time

	mu        sync.Mutex
	perSecond []int64
	inWindow  int64
	late      int64 // completed after end
	failed    map[string]int64
	lat       *syncHist
}

func newCycleLog(start, end time.Time) *cycleLog {
	n := int((end.Sub(start) + time.Second - 1) / time.Second)
	return &cycleLog{start: start, end: end, perSecond: make([]int64, max(n, 0)), failed: map[string]int64{}, lat: newSyncHist()}
}

// done records a cycle that was due at due and completed at at.
func (l *cycleLog) done(due, at time.Time) {
	l.lat.record(at.Sub(due))
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.Before(l.start) || !at.Before(l.end) {
		if !at.Before(l.end) {
			l.late++
		}
		return
	}
	l.inWindow++
	if i := int(at.Sub(l.start) / time.Second); i < len(l.perSecond) {
		l.perSecond[i]++
	}
}

// fail records a cycle that ended without completing.
func (l *cycleLog) fail(code string) {
	l.mu.Lock()
	l.failed[code]++
	l.mu.Unlock()
}

// completedBetween counts the completions in whole seconds [from, to) of
// the window.
func (l *cycleLog) completedBetween(from, to int) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for i := max(from, 0); i < min(to, len(l.perSecond)); i++ {
		n += l.perSecond[i]
	}
	return n
}

// syncHist is an HdrHistogram of durations (µs) behind a mutex.
type syncHist struct {
	mu sync.Mutex
	h  *hdr.Histogram
}

func newSyncHist() *syncHist { return &syncHist{h: newHist()} }

func (s *syncHist) record(d time.Duration) {
	s.mu.Lock()
	_ = s.h.RecordValue(min(max(d.Microseconds(), 1), s.h.HighestTrackableValue()))
	s.mu.Unlock()
}

func (s *syncHist) summary() latency {
	s.mu.Lock()
	defer s.mu.Unlock()
	return summarize(s.h)
}
