package locktable

import (
	"slices"
	"sort"
)

// sorted keeps items in order in chunks of at most max items; every item
// of a chunk sorts before every item of the next. It is what the lock names
// (lists) and the deadlines (the leader's timers) are kept in.
//
// Why chunks rather than a B-tree or one slice: an insert or delete costs a
// binary search and a move of at most max items within one chunk; ordered
// ranges are slices; and an index of a million items is built from a
// sorted slice by cutting it into full chunks (load) — a member restoring
// a snapshot built a B-tree of a million grants one insert at a time, 3 s
// of its restart, with nodes half empty. A chunk that grows past max splits
// in two; an emptied chunk goes, and neighbours that fit in half a chunk
// merge, so chunks stay dense. The shape (which depends on the order of
// inserts) is never encoded and never reaches the replicated state.
type sorted[T any] struct {
	chunks [][]T
	n      int
	max    int
	cmp    func(a, b T) int
}

func newSorted[T any](max int, cmp func(a, b T) int) sorted[T] {
	return sorted[T]{max: max, cmp: cmp}
}

// Len is the number of items.
func (x *sorted[T]) Len() int { return x.n }

// chunkFor returns the index of the first chunk whose last item is >= v
// (len(chunks) when v sorts after every item).
func (x *sorted[T]) chunkFor(v T) int {
	return sort.Search(len(x.chunks), func(i int) bool {
		c := x.chunks[i]
		return x.cmp(c[len(c)-1], v) >= 0
	})
}

// newChunk returns a chunk holding items, with room for max: every chunk
// gets one array of that size, so an insert never reallocates.
func (x *sorted[T]) newChunk(items ...T) []T {
	return append(make([]T, 0, x.max), items...)
}

// insert adds v; an item comparing equal is replaced.
func (x *sorted[T]) insert(v T) {
	if len(x.chunks) == 0 {
		x.chunks = [][]T{x.newChunk(v)}
		x.n = 1
		return
	}
	ci := x.chunkFor(v)
	if ci == len(x.chunks) {
		ci-- // after every item: the last chunk takes it
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearchFunc(c, v, x.cmp)
	if found {
		c[i] = v
		return
	}
	x.n++
	if len(c) < x.max {
		x.chunks[ci] = slices.Insert(c, i, v)
		return
	}
	if ci == len(x.chunks)-1 && i == len(c) {
		// After every item, with the last chunk full (items that keep
		// growing, as deadlines do): a new chunk, and the full one stays
		// full.
		x.chunks = append(x.chunks, x.newChunk(v))
		return
	}
	half := len(c) / 2
	right := x.newChunk(c[half:]...)
	clear(c[half:]) // let the moved items go from the left half's array
	left := c[:half]
	if i <= half {
		left = slices.Insert(left, i, v)
	} else {
		right = slices.Insert(right, i-half, v)
	}
	x.chunks[ci] = left
	x.chunks = slices.Insert(x.chunks, ci+1, right)
}

// remove deletes the item comparing equal to v, if any.
func (x *sorted[T]) remove(v T) bool {
	ci := x.chunkFor(v)
	if ci == len(x.chunks) {
		return false
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearchFunc(c, v, x.cmp)
	if !found {
		return false
	}
	c = slices.Delete(c, i, i+1)
	x.n--
	if len(c) == 0 {
		x.chunks = slices.Delete(x.chunks, ci, ci+1)
		return true
	}
	x.chunks[ci] = c
	if ci+1 < len(x.chunks) && len(c)+len(x.chunks[ci+1]) <= x.max/2 {
		x.chunks[ci] = append(c, x.chunks[ci+1]...)
		x.chunks = slices.Delete(x.chunks, ci+1, ci+2)
	} else if ci > 0 && len(c)+len(x.chunks[ci-1]) <= x.max/2 {
		x.chunks[ci-1] = append(x.chunks[ci-1], c...)
		x.chunks = slices.Delete(x.chunks, ci, ci+1)
	}
	return true
}

// get returns the item comparing equal to v.
func (x *sorted[T]) get(v T) (T, bool) {
	ci := x.chunkFor(v)
	if ci < len(x.chunks) {
		c := x.chunks[ci]
		if i, found := slices.BinarySearchFunc(c, v, x.cmp); found {
			return c[i], true
		}
	}
	var zero T
	return zero, false
}

// seek returns the position of the first item > key (strict) or >= key.
func (x *sorted[T]) seek(key T, strict bool) (ci, i int) {
	ci = x.chunkFor(key)
	if ci == len(x.chunks) {
		return ci, 0
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearchFunc(c, key, x.cmp)
	if found && strict {
		i++
		if i == len(c) {
			return ci + 1, 0
		}
	}
	return ci, i
}

// ascend calls fn for the items from position (ci, i) on, until fn
// returns false.
func (x *sorted[T]) ascend(ci, i int, fn func(T) bool) {
	for ; ci < len(x.chunks); ci, i = ci+1, 0 {
		for _, v := range x.chunks[ci][i:] {
			if !fn(v) {
				return
			}
		}
	}
}

// load replaces the contents with items, which must be sorted and
// distinct, cut into full chunks.
func (x *sorted[T]) load(items []T) {
	x.chunks, x.n = nil, len(items)
	for len(items) > 0 {
		n := min(len(items), x.max)
		x.chunks = append(x.chunks, x.newChunk(items[:n]...))
		items = items[n:]
	}
}
