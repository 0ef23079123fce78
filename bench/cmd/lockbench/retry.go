package main

import (
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// The bench's clients are the "well-behaved client" of SPEC 15: on
// overloaded, resource_exhausted and no_leader they wait at least the
// Retry-After the server gave (plus a little jitter, so clients refused
// together do not come back together) before they try again; without one,
// they back off exponentially. Every refusal and every retry is counted.

// parseRetryAfterHeader reads an HTTP Retry-After: delay-seconds (an
// integer; a decimal is accepted too) or an HTTP-date.
func parseRetryAfterHeader(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// retryAfterOfFrame finds the Retry-After a WebSocket error frame carries.
// The field is looked for on the frame and inside its error object, under
// the names a JSON API gives it: retry_after_ms (milliseconds),
// retry_after_seconds, retry_after (seconds as a number, or a string that
// is seconds or a Go duration such as "250ms").
func retryAfterOfFrame(raw []byte) (time.Duration, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return 0, false
	}
	if d, ok := retryAfterIn(top); ok {
		return d, true
	}
	if e, ok := top["error"]; ok {
		var inner map[string]json.RawMessage
		if json.Unmarshal(e, &inner) == nil {
			return retryAfterIn(inner)
		}
	}
	return 0, false
}

func retryAfterIn(m map[string]json.RawMessage) (time.Duration, bool) {
	num := func(r json.RawMessage) (float64, bool) {
		var f float64
		if json.Unmarshal(r, &f) == nil && f >= 0 {
			return f, true
		}
		var s string
		if json.Unmarshal(r, &s) == nil {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil && f >= 0 {
				return f, true
			}
		}
		return 0, false
	}
	if r, ok := m["retry_after_ms"]; ok {
		if f, ok := num(r); ok {
			return time.Duration(f * float64(time.Millisecond)), true
		}
	}
	if r, ok := m["retry_after_seconds"]; ok {
		if f, ok := num(r); ok {
			return time.Duration(f * float64(time.Second)), true
		}
	}
	if r, ok := m["retry_after"]; ok {
		if f, ok := num(r); ok {
			return time.Duration(f * float64(time.Second)), true
		}
		var s string
		if json.Unmarshal(r, &s) == nil {
			if d, err := time.ParseDuration(strings.TrimSpace(s)); err == nil && d >= 0 {
				return d, true
			}
		}
	}
	return 0, false
}

// retryable reports whether a well-behaved client retries after this code:
// the request was refused before it took effect, or there was no leader to
// take it.
func retryable(code string) bool {
	switch code {
	case api.CodeOverloaded, api.CodeResourceExhausted, api.CodeNoLeader, api.CodeNotLeader:
		return true
	}
	return strings.HasPrefix(code, "http_5") || code == "http_429"
}

// backoffFor is the wait before retry number attempt (0 for the first
// retry) after e: its Retry-After plus up to 10 % jitter when it has one,
// else exponential from 50 ms, doubling up to 2 s, drawn from [d/2, d].
func backoffFor(e *apiErr, attempt int) time.Duration {
	if e != nil && e.HasRetryAfter {
		return e.RetryAfter + time.Duration(rand.Int64N(int64(e.RetryAfter/10)+1))
	}
	d := 50 * time.Millisecond
	for i := 0; i < attempt && d < 2*time.Second; i++ {
		d *= 2
	}
	d = min(d, 2*time.Second)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// sleepCtx waits d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// roleStats counts what the server answered the clients of one role
// (flood, burst, keepalive sessions, holders, ...). Safe for concurrent use.
type roleStats struct {
	mu         sync.Mutex
	codes      map[string]int64 // error answers by code
	retryAfter msCounts         // of refusals that carried one
	noRetry    int64            // overloaded/resource_exhausted/no_leader refusals without Retry-After
	retries    int64            // requests sent again after a refusal or a cut
	cuts       map[string]int64 // connections the server ended, by how
	reconnects int64
	messages   map[string]string // the first message of each code
}

func newRoleStats() *roleStats {
	return &roleStats{codes: map[string]int64{}, cuts: map[string]int64{}, retryAfter: msCounts{}, messages: map[string]string{}}
}

// refused records an error answer.
func (s *roleStats) refused(e *apiErr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[e.Code]++
	if _, ok := s.messages[e.Code]; !ok {
		s.messages[e.Code] = truncate(e.Msg, 200)
	}
	if e.HasRetryAfter {
		s.retryAfter[e.RetryAfter.Milliseconds()]++
	} else if e.Code == api.CodeOverloaded || e.Code == api.CodeResourceExhausted || e.Code == api.CodeNoLeader {
		s.noRetry++
	}
}

func (s *roleStats) retried() {
	s.mu.Lock()
	s.retries++
	s.mu.Unlock()
}

// connEnded records a connection the server ended (cut "" is ignored).
func (s *roleStats) connEnded(cut string) {
	if cut == "" {
		return
	}
	s.mu.Lock()
	s.cuts[cut]++
	s.mu.Unlock()
}

func (s *roleStats) reconnected() {
	s.mu.Lock()
	s.reconnects++
	s.mu.Unlock()
}

// codeCount is one row of a count by code or kind.
type codeCount struct {
	Code  string `json:"code"`
	Count int64  `json:"count"`
}

// retryAfterSummary is min/p50/max of the Retry-After values seen, in ms.
type retryAfterSummary struct {
	Count   int64   `json:"count"`
	Missing int64   `json:"refusals_without_retry_after"`
	MinMs   float64 `json:"min_ms"`
	P50Ms   float64 `json:"p50_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// roleSummary is roleStats for the report.
type roleSummary struct {
	Role       string            `json:"role"`
	Codes      []codeCount       `json:"error_codes"`
	Retries    int64             `json:"retries"`
	RetryAfter retryAfterSummary `json:"retry_after"`
	Cuts       []codeCount       `json:"connections_cut"`
	Reconnects int64             `json:"reconnects"`
	// Messages: the first message the server gave with each code.
	Messages map[string]string `json:"first_message_by_code,omitempty"`
}

func sortedCounts(m map[string]int64) []codeCount {
	out := make([]codeCount, 0, len(m))
	for k, v := range m {
		out = append(out, codeCount{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Code < out[j].Code
	})
	return out
}

func (s *roleStats) summary(role string) roleSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := roleSummary{Role: role, Codes: sortedCounts(s.codes), Retries: s.retries, Cuts: sortedCounts(s.cuts), Reconnects: s.reconnects,
		Messages: maps.Clone(s.messages)}
	r.RetryAfter = summarizeRetryAfter(s.retryAfter, s.noRetry)
	return r
}

// msCounts counts values in milliseconds exactly (a server gives few
// distinct Retry-After values).
type msCounts map[int64]int64

func summarizeRetryAfter(c msCounts, missing int64) retryAfterSummary {
	r := retryAfterSummary{Missing: missing}
	vs := make([]int64, 0, len(c))
	for v, n := range c {
		vs = append(vs, v)
		r.Count += n
	}
	if r.Count == 0 {
		return r
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i] < vs[j] })
	r.MinMs, r.MaxMs = float64(vs[0]), float64(vs[len(vs)-1])
	// The median: the value below which half the refusals lie.
	var seen int64
	for _, v := range vs {
		seen += c[v]
		if 2*seen >= r.Count {
			r.P50Ms = float64(v)
			break
		}
	}
	return r
}

// mergeRoles adds up the summaries of several roles (Retry-After merged
// from their histograms).
func mergeRoles(role string, ss ...*roleStats) roleSummary {
	codes, cuts, msgs := map[string]int64{}, map[string]int64{}, map[string]string{}
	h := msCounts{}
	var out roleSummary
	var missing int64
	for _, s := range ss {
		s.mu.Lock()
		for k, v := range s.codes {
			codes[k] += v
		}
		for k, v := range s.cuts {
			cuts[k] += v
		}
		for k, v := range s.messages {
			if _, ok := msgs[k]; !ok {
				msgs[k] = v
			}
		}
		for v, n := range s.retryAfter {
			h[v] += n
		}
		missing += s.noRetry
		out.Retries += s.retries
		out.Reconnects += s.reconnects
		s.mu.Unlock()
	}
	out.Role, out.Codes, out.Cuts, out.Messages = role, sortedCounts(codes), sortedCounts(cuts), msgs
	out.RetryAfter = summarizeRetryAfter(h, missing)
	return out
}
