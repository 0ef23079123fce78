package locktable

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// checkNames reports the first way the lock index breaks its own shape,
// or a lookup by name misses a lock it holds or finds one of another name.
// model, when not nil, is the set of names it must hold.
func checkNames(t *Table, model map[string]bool) error {
	x := &t.locks
	var all []string
	for ci, c := range x.s.chunks {
		if len(c) == 0 || len(c) > maxChunk {
			return fmt.Errorf("chunk %d holds %d locks (1-%d allowed)", ci, len(c), maxChunk)
		}
		for _, l := range c {
			all = append(all, l.Name)
		}
	}
	if !sort.StringsAreSorted(all) {
		return fmt.Errorf("names out of order: %v", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			return fmt.Errorf("name %q twice", all[i])
		}
	}
	if len(all) != x.Len() {
		return fmt.Errorf("index holds %d locks, counts %d", len(all), x.Len())
	}
	for _, n := range all {
		if l, ok := x.get(n); !ok || l.Name != n {
			return fmt.Errorf("the index holds %q, a lookup finds %v %v", n, l, ok)
		}
		if model != nil && !model[n] {
			return fmt.Errorf("the index holds %q, which the model does not", n)
		}
		// Names just before and after it are found only when held.
		for _, near := range []string{n + "\x00", n[:len(n)-1]} {
			if l, ok := x.get(near); ok != slices.Contains(all, near) || (ok && l.Name != near) {
				return fmt.Errorf("a lookup of %q finds %v %v", near, l, ok)
			}
		}
	}
	if model != nil && len(model) != len(all) {
		return fmt.Errorf("the index holds %d locks, the model %d", len(all), len(model))
	}
	return nil
}

// modelPage is ListPage by brute force: every name sorted, filtered.
func modelPage(t *Table, prefix, after string, limit int) ([]string, string) {
	var names []string
	for l := range t.locks.all {
		if n := l.Name; strings.HasPrefix(n, prefix) && n > after {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if limit > 0 && len(names) > limit {
		return names[:limit], names[limit-1]
	}
	return names, ""
}

func pageNames(li []LockInfo) []string {
	out := []string{}
	for _, l := range li {
		out = append(out, l.Name)
	}
	return out
}

// TestNameIndexProperty drives the index directly with random inserts and
// removes over a universe large enough to split and merge chunks, and checks
// its shape and every kind of page against brute force.
func TestNameIndexProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tb := New()
		model := map[string]bool{}
		universe := rapid.IntRange(1, 3000).Draw(rt, "universe")
		name := func(i int) string { return fmt.Sprintf("%c/%04d", 'a'+i%3, i) }
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for s := 0; s < steps; s++ {
			// Runs of inserts or removes, so the index grows past a chunk and
			// shrinks back.
			n := rapid.IntRange(1, 400).Draw(rt, "run")
			insert := rapid.Bool().Draw(rt, "insert")
			start := rapid.IntRange(0, universe-1).Draw(rt, "start")
			stride := rapid.SampledFrom([]int{1, 2, 7, 97, -1, -3}).Draw(rt, "stride")
			for k := 0; k < n; k++ {
				nm := name(((start+k*stride)%universe + universe) % universe)
				if insert {
					tb.locks.put(&Lock{Name: nm})
					model[nm] = true
				} else {
					tb.locks.del(&Lock{Name: nm})
					delete(model, nm)
				}
			}
			if err := checkNames(tb, model); err != nil {
				rt.Fatalf("after step %d: %v", s, err)
			}
			prefix := rapid.SampledFrom([]string{"", "a", "a/", "b/0", "c/1", "c/2999", "d", "a/00"}).Draw(rt, "prefix")
			after := ""
			if rapid.Bool().Draw(rt, "hasAfter") {
				after = rapid.SampledFrom([]string{"a", "a/", "b", "b/0500", name(start), name(start) + "x", "z"}).Draw(rt, "after")
			}
			limit := rapid.IntRange(0, 600).Draw(rt, "limit")
			got, next := tb.ListPage(prefix, after, limit)
			want, wantNext := modelPage(tb, prefix, after, limit)
			if g := pageNames(got); !slices.Equal(g, append([]string{}, want...)) || next != wantNext {
				rt.Fatalf("ListPage(%q, %q, %d) = %d names (next %q), want %d (next %q)", prefix, after, limit, len(g), next, len(want), wantNext)
			}
		}
	})
}

// TestListPageWalk pages through a table by next and after and meets every
// lock with the prefix once, in order; the last page's next is empty.
func TestListPageWalk(t *testing.T) {
	tb := New()
	for i := 0; i < 2500; i++ {
		for _, p := range []string{"o/", "p/", "pq/"} {
			nm := fmt.Sprintf("%s%05d", p, (i*7919)%2500)
			tb.locks.put(&Lock{Name: nm})
		}
	}
	tb.locks.put(&Lock{Name: "p"})
	for _, limit := range []int{1, 10, 999, 1000, 2500, 10000} {
		var got []string
		after, pages := "", 0
		for {
			page, next := tb.ListPage("p/", after, limit)
			pages++
			got = append(got, pageNames(page)...)
			if next == "" {
				break
			}
			if len(page) != limit || next != page[len(page)-1].Name {
				t.Fatalf("limit %d: a page of %d with next %q", limit, len(page), next)
			}
			after = next
		}
		if len(got) != 2500 || !sort.StringsAreSorted(got) || got[0] != "p/00000" || got[2499] != "p/02499" {
			t.Fatalf("limit %d: %d names over %d pages, sorted %v", limit, len(got), pages, sort.StringsAreSorted(got))
		}
		if want := (2500 + limit - 1) / limit; pages != want {
			t.Fatalf("limit %d: %d pages, want %d (no empty last page)", limit, pages, want)
		}
	}
}

// TestNameIndexFollowsApplyAndRestore: locks made and dropped by commands
// (grants, queues, releases, expiries, session ends) and a restore from a
// snapshot keep the lock index ordered, and every lock it holds found by
// name.
func TestNameIndexFollowsApplyAndRestore(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tb := New()
		now := int64(1_700_000_000_000)
		locks := []string{"a", "b", "c", "d/1", "d/2"}
		clients := []string{"c1", "c2", "c3"}
		tb.Apply(Command{Op: OpCreateSession, Now: now, SessionID: "s1", ClientID: "c1", TTLms: 5000})
		for i, n := 0, rapid.IntRange(1, 200).Draw(rt, "n"); i < n; i++ {
			now += rapid.Int64Range(0, 300).Draw(rt, "dt")
			lock := rapid.SampledFrom(locks).Draw(rt, "lock")
			client := rapid.SampledFrom(clients).Draw(rt, "client")
			var c Command
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0:
				c = Command{Op: OpAcquire, Now: now, Lock: lock, ClientID: client, TTLms: 1000,
					WaitMs: rapid.SampledFrom([]int64{0, 500}).Draw(rt, "wait")}
				if rapid.Bool().Draw(rt, "session") {
					c.SessionID = "s1"
				}
			case 1:
				c = Command{Op: OpRelease, Now: now, Lock: lock, ClientID: tb.Get(lock).ClientID, Token: tb.Get(lock).Token}
			case 2:
				c = Command{Op: OpExpireLock, Now: now + 2000, Lock: lock, Token: tb.Get(lock).Token}
			case 3:
				c = Command{Op: OpTimeoutWaiter, Now: now + 1000, Lock: lock, ClientID: client}
			case 4:
				c = Command{Op: OpExpireSession, Now: now, SessionID: "s1"}
			}
			tb.Apply(c)
			if err := checkNames(tb, nil); err != nil {
				rt.Fatalf("after %s: %v", c.Op, err)
			}
		}
		restored, err := Restore(tb.Snapshot())
		if err != nil {
			rt.Fatal(err)
		}
		if err := checkNames(restored, nil); err != nil {
			rt.Fatalf("after restore: %v", err)
		}
	})
}

// BenchmarkListPage pages through a million-lock table, 1000 locks a page,
// from the middle: the cost of one page, which must not grow with the table.
func BenchmarkListPage(b *testing.B) {
	tb := New()
	for i := 0; i < 1_000_000; i++ {
		nm := fmt.Sprintf("jobs/%07d", (i*7919)%1_000_000)
		tb.locks.put(&Lock{Name: nm})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		page, next := tb.ListPage("jobs/", "jobs/0500000", 1000)
		if len(page) != 1000 || next == "" {
			b.Fatal(len(page), next)
		}
	}
}

// TestNameIndexSplitsAndMerges walks every path of the index on purpose:
// appends past the end (full chunks), inserts into the left and the right
// half of a full chunk, removes that merge a chunk into its right and into
// its left neighbour, and removes that empty a chunk.
func TestNameIndexSplitsAndMerges(t *testing.T) {
	tb := New()
	add := func(i int) {
		nm := fmt.Sprintf("k%06d", i)
		tb.locks.put(&Lock{Name: nm})
	}
	del := func(i int) {
		nm := fmt.Sprintf("k%06d", i)
		tb.locks.del(&Lock{Name: nm})
	}
	check := func(step string) {
		t.Helper()
		if err := checkNames(tb, nil); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	for i := 0; i < 4*maxChunk; i++ {
		add(i * 10)
	}
	check("appends")
	if len(tb.locks.s.chunks) != 4 {
		t.Fatalf("in-order inserts made %d chunks, want 4 full ones", len(tb.locks.s.chunks))
	}
	add(5)                  // left half of the full first chunk
	add(3*maxChunk*10 - 15) // right half of the full third chunk
	check("splits")
	for i := 3 * maxChunk; i >= 0; i-- { // descending: a chunk shrinks into its right neighbour
		if i%4 != 0 {
			del(i * 10)
		}
	}
	check("descending removes")
	for i := 0; i < 4*maxChunk; i++ { // ascending: into the left neighbour, then empties
		del(i * 10)
	}
	del(5)
	del(3*maxChunk*10 - 15)
	check("ascending removes")
	if len(tb.locks.s.chunks) != 0 || tb.locks.Len() != 0 {
		t.Fatalf("empty index keeps %d chunks, count %d", len(tb.locks.s.chunks), tb.locks.Len())
	}
}
