package locktable

import (
	"slices"
	"sort"
	"strings"
)

// lockIndex holds the table's locks in name order. One ordered structure
// answers both a lookup by name (a binary search over the chunks, then one
// within a chunk) and a page of a list (see ListPage). A hash map beside a
// sorted index of the names took 61 + 17 MiB of a follower's heap at a
// million locks; this takes one pointer per lock in chunks at least half
// full (8–16 MiB), for a lookup of about twenty string comparisons instead
// of one hash — small beside what Apply does with the lock it finds.
//
// The order is never encoded: a snapshot lists the locks by name because
// that is the canonical order, whatever holds them.
type lockIndex struct {
	s sorted[*Lock]
}

func byName(a, b *Lock) int { return strings.Compare(a.Name, b.Name) }

func newLockIndex() lockIndex { return lockIndex{newSorted(maxChunk, byName)} }

// Len is the number of locks.
func (x *lockIndex) Len() int { return x.s.n }

// seek returns the position of the first lock whose name sorts after name
// (strict) or at or after it.
func (x *lockIndex) seek(name string, strict bool) (ci, i int) {
	chunks := x.s.chunks
	ci = sort.Search(len(chunks), func(k int) bool {
		c := chunks[k]
		return c[len(c)-1].Name >= name
	})
	if ci == len(chunks) {
		return ci, 0
	}
	c := chunks[ci]
	i, found := slices.BinarySearchFunc(c, name, func(l *Lock, n string) int { return strings.Compare(l.Name, n) })
	if found && strict {
		i++
		if i == len(c) {
			return ci + 1, 0
		}
	}
	return ci, i
}

// get returns the lock named name.
func (x *lockIndex) get(name string) (*Lock, bool) {
	ci, i := x.seek(name, false)
	// seek stops inside chunk ci: its last name is >= name.
	if ci < len(x.s.chunks) {
		if l := x.s.chunks[ci][i]; l.Name == name {
			return l, true
		}
	}
	return nil, false
}

// put adds l, replacing a lock of the same name.
func (x *lockIndex) put(l *Lock) { x.s.insert(l) }

// del removes the lock of l's name.
func (x *lockIndex) del(l *Lock) { x.s.remove(l) }

// all yields every lock in name order. The table must not gain or lose a
// lock while it runs.
func (x *lockIndex) all(yield func(*Lock) bool) {
	for _, c := range x.s.chunks {
		for _, l := range c {
			if !yield(l) {
				return
			}
		}
	}
}

// load replaces the contents with locks, sorted by name and distinct.
func (x *lockIndex) load(locks []*Lock) { x.s.load(locks) }
