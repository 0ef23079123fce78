package main

import (
	"math"
	"testing"
)

func TestWindowLatency(t *testing.T) {
	inf := math.Inf(1)
	before := map[string]wsHistogram{"keepalive": {0.01: 10, 0.1: 10, 1: 10, inf: 10}}
	// 100 more in the window: 50 under 10 ms, 49 in (10, 100] ms, 1 in (0.1, 1] s.
	after := map[string]wsHistogram{"keepalive": {0.01: 60, 0.1: 109, 1: 110, inf: 110}}
	got := windowLatency(before, after)["keepalive"]
	if got.Count != 100 || math.Abs(got.P50Ms-10) > 0.01 || got.MaxBucketMs != 1000 {
		t.Fatalf("%+v", got)
	}
	if got.P99Ms < 10 || got.P99Ms > 100 {
		t.Fatalf("p99 %v, want within (10, 100] ms", got.P99Ms)
	}
	if _, ok := windowLatency(after, after)["keepalive"]; ok {
		t.Fatal("an op with nothing in the window is reported")
	}
}
