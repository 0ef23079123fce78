package notify

import (
	"testing"

	"github.com/lockd/lockd/internal/locktable"
)

func change(name string, index uint64) Change {
	return Change{Index: index, Status: locktable.LockInfo{Name: name, Index: index}}
}

// TestWatchesDeliverFilterAndResync: a lock watch sees only its lock, a
// prefix watch only names under its prefix; a full buffer drops changes and
// flags a resync instead of blocking the publisher; Reset flags every
// watcher; onCount follows the first and the last watcher.
func TestWatchesDeliverFilterAndResync(t *testing.T) {
	var counts []bool
	ws := NewWatches(func(on bool) { counts = append(counts, on) })
	a := ws.WatchLock("a", 2)
	p := ws.WatchPrefix("jobs/", 8)
	ws.Publish([]Change{change("a", 1), change("b", 1), change("jobs/x", 1)})
	ws.Publish([]Change{change("jobs/y", 2), change("a", 2)})
	if got := (<-a.C()).Index; got != 1 {
		t.Fatalf("a first change at %d", got)
	}
	if got := (<-a.C()).Index; got != 2 {
		t.Fatalf("a second change at %d", got)
	}
	if n := len(p.C()); n != 2 {
		t.Fatalf("prefix watch got %d changes, want 2 (jobs/x, jobs/y)", n)
	}
	select {
	case <-a.Resync():
		t.Fatal("resync without overflow")
	default:
	}
	// Overflow: the third change does not fit a buffer of 2.
	ws.Publish([]Change{change("a", 3), change("a", 4), change("a", 5)})
	select {
	case <-a.Resync():
	default:
		t.Fatal("no resync after an overflow")
	}
	ws.Reset()
	select {
	case <-p.Resync():
	default:
		t.Fatal("Reset did not flag the prefix watch")
	}
	if !ws.Interested("jobs/z") || ws.Interested("other") {
		t.Fatal("Interested")
	}
	a.Close()
	a.Close() // twice is harmless
	p.Close()
	if ws.Watching() || len(counts) != 2 || !counts[0] || counts[1] {
		t.Fatalf("watching %v, onCount calls %v", ws.Watching(), counts)
	}
	ws.Publish([]Change{change("a", 6)}) // nobody watches: nothing to do
}
