package main

import (
	"bufio"
	"context"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// The leader's own share of a request's latency, from its histogram
// lockd_websocket_request_duration_seconds (frame read → reply queued),
// read at the start and the end of the window: what the bench measures
// includes its own scheduling on the machine it shares with the members,
// this does not.

// wsHistogram is the cumulative bucket counts of one op: upper bound →
// count (+Inf as math.Inf(1)).
type wsHistogram map[float64]float64

// readWSHistograms reads every op's buckets from base's /metrics.
func readWSHistograms(ctx context.Context, base string) map[string]wsHistogram {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]wsHistogram{}
	const prefix = "lockd_websocket_request_duration_seconds_bucket{"
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(l, "} ")
		if !ok {
			continue
		}
		var op, le string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "op":
				op = v
			case "le":
				le = v
			}
		}
		bound := math.Inf(1)
		if le != "+Inf" {
			if bound, err = strconv.ParseFloat(le, 64); err != nil {
				continue
			}
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		if out[op] == nil {
			out[op] = wsHistogram{}
		}
		out[op][bound] = n
	}
	return out
}

// serverLatency is one op's quantiles over the window, in ms, estimated
// as Prometheus' histogram_quantile does (linear within a bucket); a
// quantile in the last (+Inf) bucket is reported as its lower bound.
type serverLatency struct {
	Count int64   `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// MaxBucketMs is the upper bound of the highest bucket any request
	// fell in (the slowest request took at most this long).
	MaxBucketMs float64 `json:"max_bucket_ms"`
}

// windowLatency returns the quantiles of what happened between before and
// after, per op.
func windowLatency(before, after map[string]wsHistogram) map[string]serverLatency {
	out := map[string]serverLatency{}
	for op, a := range after {
		var bounds []float64
		for b := range a {
			bounds = append(bounds, b)
		}
		sort.Float64s(bounds)
		cum := make([]float64, len(bounds))
		for i, b := range bounds {
			cum[i] = a[b] - before[op][b]
		}
		total := cum[len(cum)-1]
		if total <= 0 {
			continue
		}
		q := func(p float64) float64 {
			rank := p * total
			lower, prev := 0.0, 0.0
			for i, b := range bounds {
				if cum[i] >= rank {
					if math.IsInf(b, 1) {
						return lower * 1000
					}
					frac := 0.0
					if cum[i] > prev {
						frac = (rank - prev) / (cum[i] - prev)
					}
					return (lower + (b-lower)*frac) * 1000
				}
				lower, prev = b, cum[i]
			}
			return lower * 1000
		}
		maxB := 0.0
		for i, b := range bounds {
			if (i == 0 && cum[i] > 0) || (i > 0 && cum[i] > cum[i-1]) {
				maxB = b
			}
		}
		if math.IsInf(maxB, 1) {
			maxB = bounds[len(bounds)-2]
		}
		out[op] = serverLatency{Count: int64(total), P50Ms: q(0.5), P99Ms: q(0.99), MaxBucketMs: maxB * 1000}
	}
	return out
}
