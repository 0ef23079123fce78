package locktable_test

import (
	"fmt"
	"runtime"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// bigTable holds n locks taken by 256 HTTP clients and n/10 waiters queued
// by 100 sessions: the shape of lockbench's scale run.
func bigTable(b testing.TB, n int) *lt.Table {
	b.Helper()
	t := lt.New()
	for s := 0; s < 100; s++ {
		t.Apply(mkSess(fmt.Sprintf("s%03d", s), fmt.Sprintf("waiter-%d", s), 3_600_000, t0))
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("scale/%08d", i)
		if r := t.Apply(acq(name, fmt.Sprintf("holder-%d", i%256), 86_400_000, 0, t0)); r.Code != lt.OK {
			b.Fatalf("acquire %s: %v", name, r.Code)
		}
		if i%10 == 0 {
			s := (i / 10) % 100
			t.Apply(acqS(name, fmt.Sprintf("waiter-%d", s), fmt.Sprintf("s%03d", s), 30_000, 3_600_000, t0))
		}
	}
	return t
}

// BenchmarkRestore1M measures a member's restore of a snapshot of 1M held
// locks and 100k waiters (go test -run - -bench Restore1M -benchtime 3x).
func BenchmarkRestore1M(b *testing.B) {
	snap := bigTable(b, 1_000_000).Snapshot()
	runtime.GC()
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := lt.Restore(snap); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var ms runtime.MemStats
	t, _ := lt.Restore(snap)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heapMiB")
	runtime.KeepAlive(t)
}

// BenchmarkSnapshot1M measures encoding the same table.
func BenchmarkSnapshot1M(b *testing.B) {
	t := bigTable(b, 1_000_000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = t.Snapshot()
	}
}
