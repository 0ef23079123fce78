package locktable_test

import (
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
)

// TestTableDensity measures the heap a table of n held locks and n/10
// waiters takes (the scale run's shape), per held lock, and fails when it
// grows past maxBytesPerLock: a follower's memory at a million locks is
// this table. With DENSITY_LOCKS=1000000 and DENSITY_HEAPPROFILE=file it
// measures the full-size table and writes its heap profile.
//
// 384 B per held lock with a hash map beside a sorted index of the names
// and a copy of its ids per holder; 302 B with the locks in one ordered
// index and the ids shared.
func TestTableDensity(t *testing.T) {
	n := 100_000
	if v := os.Getenv("DENSITY_LOCKS"); v == "1000000" {
		n = 1_000_000
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := bigTable(t, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if f := os.Getenv("DENSITY_HEAPPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		_ = pprof.Lookup("heap").WriteTo(out, 0)
		out.Close()
	}
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	t.Logf("%d held locks, %d waiters: heap %.1f MiB, %.0f bytes per held lock", n, n/10,
		float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), per)
	if per > maxBytesPerLock {
		t.Errorf("%.0f bytes per held lock, above %d", per, maxBytesPerLock)
	}
	runtime.KeepAlive(tb)
}

const maxBytesPerLock = 330
