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

// TestSyncAtMarksWhatWasPublished: a Synced mark comes after every change
// of the entries up to its index — at once when they were published
// already, else with the Advance that reaches it (also one past it) — and
// never for a closed watch; a mark that does not fit flags a resync.
func TestSyncAtMarksWhatWasPublished(t *testing.T) {
	ws := NewWatches(nil)
	p := ws.WatchPrefix("", 8)
	ws.Publish([]Change{change("a", 3)})
	ws.Advance(3)
	p.SyncAt(3)
	if c := <-p.C(); c.Synced || c.Index != 3 {
		t.Fatalf("first %+v, want the change at 3", c)
	}
	if c := <-p.C(); !c.Synced || c.Index != 3 {
		t.Fatalf("want the mark at 3 at once, got %+v", c)
	}
	// A mark ahead of what was published waits for it.
	p.SyncAt(5)
	ws.Publish([]Change{change("b", 4)})
	ws.Advance(4)
	if c := <-p.C(); c.Synced || c.Index != 4 {
		t.Fatalf("got %+v, want the change at 4", c)
	}
	if n := len(p.C()); n != 0 {
		t.Fatalf("the mark came before index 5 was published (%d queued)", n)
	}
	ws.Publish([]Change{change("c", 6)})
	ws.Advance(6) // an index past the mark's (5 changed no watched lock) also reaches it
	if c := <-p.C(); c.Synced || c.Index != 6 {
		t.Fatalf("got %+v, want the change at 6", c)
	}
	if c := <-p.C(); !c.Synced || c.Index != 5 {
		t.Fatalf("got %+v, want the mark at 5", c)
	}
	ws.Advance(7)
	if n := len(p.C()); n != 0 {
		t.Fatalf("a mark came twice (%d queued)", n)
	}
	// A closed watch gets no mark; a full buffer flags a resync instead.
	q := ws.WatchLock("a", 1)
	q.SyncAt(9)
	q.Close()
	ws.Advance(9)
	if n := len(q.C()); n != 0 {
		t.Fatal("a closed watch got its mark")
	}
	r := ws.WatchLock("a", 1)
	ws.Publish([]Change{change("a", 10)})
	ws.Advance(10)
	r.SyncAt(10)
	select {
	case <-r.Resync():
	default:
		t.Fatal("a mark that did not fit flagged no resync")
	}
	p.Close()
	r.Close()
}
