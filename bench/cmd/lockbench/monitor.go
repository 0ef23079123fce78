package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

// memberSample is one member's reading at one moment: resident memory from
// /proc/<pid>/status (VmRSS), and what the member says of itself (term,
// commit index, Go heap, whether it leads); OK is false when it did not
// answer in time (RSS is read anyway).
type memberSample struct {
	Member string  `json:"member"`
	Leader bool    `json:"leader"`
	RSSMiB float64 `json:"rss_mib"`
	// HWMMiB is VmHWM: the highest RSS since it was last reset (at the
	// start of the overload window), spikes between samples included.
	HWMMiB  float64 `json:"peak_rss_mib"`
	HeapMiB float64 `json:"heap_inuse_mib,omitempty"`
	Term    uint64  `json:"term"`
	Commit  uint64  `json:"commit_index"`
	OK      bool    `json:"ok"`
}

// monitorSample is every member at one moment; T is seconds from the
// start of the overload window (negative before it).
type monitorSample struct {
	T       float64        `json:"t"`
	Members []memberSample `json:"members"`
}

// prober reads every member of a cluster once.
type prober func(ctx context.Context) []memberSample

// monitor samples a cluster every interval until stopped.
type monitor struct {
	mu      sync.Mutex
	zero    time.Time
	samples []monitorSample
	stop    context.CancelFunc
	done    chan struct{}
}

// startMonitor samples with p every interval; times are relative to zero
// (which may be set later with setZero).
func startMonitor(ctx context.Context, p prober, interval time.Duration) *monitor {
	ctx, cancel := context.WithCancel(ctx)
	m := &monitor{zero: time.Now(), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			pctx, pcancel := context.WithTimeout(ctx, max(interval, 2*time.Second))
			at := time.Now()
			ms := p(pctx)
			pcancel()
			if ctx.Err() != nil {
				return
			}
			m.mu.Lock()
			m.samples = append(m.samples, monitorSample{T: at.Sub(m.zero).Seconds(), Members: ms})
			m.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return m
}

// setZero makes t the origin of the sample times (earlier samples shift).
func (m *monitor) setZero(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	shift := t.Sub(m.zero).Seconds()
	for i := range m.samples {
		m.samples[i].T -= shift
	}
	m.zero = t
}

// finish stops sampling and returns the samples.
func (m *monitor) finish() []monitorSample {
	m.stop()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.samples
}

// leaderOf returns the sample's leader, or nil.
func (s monitorSample) leaderOf() *memberSample {
	for i := range s.Members {
		if s.Members[i].Leader {
			return &s.Members[i]
		}
	}
	return nil
}

func (s monitorSample) maxTerm() uint64 {
	var t uint64
	for _, m := range s.Members {
		if m.OK {
			t = max(t, m.Term)
		}
	}
	return t
}

// monitorSummary is what the report says of the samples.
type monitorSummary struct {
	// TermsStarted: the highest term at the end minus the highest at the
	// start of the window: elections begun, won or not.
	TermsStarted   int64   `json:"terms_started"`
	LeaderChanges  int     `json:"leader_changes"` // samples whose leader differs from the previous one's
	LeaderRSSStart float64 `json:"leader_rss_start_mib"`
	LeaderRSSMax   float64 `json:"leader_rss_max_mib"`
	LeaderRSSMaxAt float64 `json:"leader_rss_max_at_seconds"`
	LeaderRSSEnd   float64 `json:"leader_rss_end_mib"`
	// LeaderHWM: the highest VmHWM a leader reported in the window.
	LeaderHWM float64 `json:"leader_peak_rss_mib"`
	// Leader commits per second (Δ commit index ÷ Δ time between two
	// samples of the same leader): before the window (the baseline),
	// over the window, and the lowest interval of the window.
	CommitsBefore float64 `json:"leader_commits_per_sec_before"`
	CommitsWindow float64 `json:"leader_commits_per_sec_window"`
	CommitsMin    float64 `json:"leader_commits_per_sec_min"`
	CommitsMinAt  float64 `json:"leader_commits_per_sec_min_at_seconds"`
	// MaxRSS is every member's highest RSS over the run.
	MaxRSS map[string]float64 `json:"max_rss_mib_by_member"`
}

// summarizeMonitor reads the samples against the window [0, window]
// seconds.
func summarizeMonitor(ss []monitorSample, window float64) monitorSummary {
	out := monitorSummary{MaxRSS: map[string]float64{}, CommitsMin: -1}
	var first, last *monitorSample
	var prevLeader string
	var winCommits, winSecs, befCommits, befSecs float64
	for i := range ss {
		s := &ss[i]
		for _, m := range s.Members {
			out.MaxRSS[m.Member] = max(out.MaxRSS[m.Member], m.RSSMiB)
		}
		l := s.leaderOf()
		if l != nil && prevLeader != "" && l.Member != prevLeader {
			out.LeaderChanges++
		}
		if l != nil {
			prevLeader = l.Member
		}
		if s.T >= 0 && s.T <= window {
			if first == nil {
				first = s
				if l != nil {
					out.LeaderRSSStart = l.RSSMiB
				}
			}
			last = s
			if l != nil && l.RSSMiB > out.LeaderRSSMax {
				out.LeaderRSSMax, out.LeaderRSSMaxAt = l.RSSMiB, s.T
			}
			if l != nil {
				out.LeaderHWM = max(out.LeaderHWM, l.HWMMiB)
			}
		}
		if i == 0 {
			continue
		}
		p := &ss[i-1]
		pl := p.leaderOf()
		if l == nil || pl == nil || l.Member != pl.Member || !l.OK || !pl.OK || l.Commit < pl.Commit {
			continue
		}
		dt := s.T - p.T
		if dt <= 0 {
			continue
		}
		dc := float64(l.Commit - pl.Commit)
		switch {
		case p.T >= 0 && s.T <= window+0.001:
			winCommits += dc
			winSecs += dt
			if r := dc / dt; out.CommitsMin < 0 || r < out.CommitsMin {
				out.CommitsMin, out.CommitsMinAt = r, s.T
			}
		case s.T <= 0:
			befCommits += dc
			befSecs += dt
		}
	}
	if out.CommitsMin < 0 {
		out.CommitsMin = 0
	}
	if winSecs > 0 {
		out.CommitsWindow = winCommits / winSecs
	}
	if befSecs > 0 {
		out.CommitsBefore = befCommits / befSecs
	}
	if first != nil && last != nil {
		out.TermsStarted = int64(last.maxTerm()) - int64(first.maxTerm())
		if l := last.leaderOf(); l != nil {
			out.LeaderRSSEnd = l.RSSMiB
		}
	}
	return out
}

// resetPeaks resets VmHWM of the processes (Linux ≥ 4.0: write 5 to
// /proc/<pid>/clear_refs), so it then holds the peak from now on.
func resetPeaks(pids []int) {
	for _, pid := range pids {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}
