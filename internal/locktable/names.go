package locktable

import (
	"slices"
	"sort"
	"strings"
)

// nameIndex keeps the names of the table's locks in sorted order beside the
// map, so that a page of a list costs O(log n + page) rather than a sort of
// every name (a million-lock table took a sort of a million strings, under
// the read lock that Apply waits on, for every page and every dashboard
// poll).
//
// Why an index rather than a scan with a bounded heap: a scan is O(n) per
// page with no cost to Apply, but paging through n locks is then O(n²/page)
// and every page holds the read lock for a walk of the whole map. The index
// costs Apply a binary search and a move of at most maxChunk string headers
// when a lock is created or dropped, and 16 bytes per lock.
//
// The names live in sorted chunks of at most maxChunk names; every name of
// a chunk sorts before every name of the next. A chunk that grows past
// maxChunk splits in two; an emptied chunk goes, and neighbours that fit in
// half a chunk merge, so chunks stay dense. It is derived state: never
// encoded, rebuilt by Restore, and its shape (which depends on the order of
// inserts) never reaches the replicated state.
type nameIndex struct {
	chunks [][]string
	n      int
}

const maxChunk = 512

// chunkFor returns the index of the first chunk whose last name is >= name
// (len(chunks) when name sorts after every name).
func (x *nameIndex) chunkFor(name string) int {
	return sort.Search(len(x.chunks), func(i int) bool {
		c := x.chunks[i]
		return c[len(c)-1] >= name
	})
}

// newChunk returns a chunk holding names, with room for maxChunk: every
// chunk gets one array of that size, so an insert never reallocates.
func newChunk(names ...string) []string {
	return append(make([]string, 0, maxChunk), names...)
}

func (x *nameIndex) insert(name string) {
	if len(x.chunks) == 0 {
		x.chunks = [][]string{newChunk(name)}
		x.n = 1
		return
	}
	ci := x.chunkFor(name)
	if ci == len(x.chunks) {
		ci-- // after every name: the last chunk takes it
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearch(c, name)
	if found {
		return
	}
	x.n++
	if len(c) < maxChunk {
		x.chunks[ci] = slices.Insert(c, i, name)
		return
	}
	if ci == len(x.chunks)-1 && i == len(c) {
		// After every name, with the last chunk full (a restore, which
		// inserts in order, or names that keep growing): a new chunk, and
		// the full one stays full.
		x.chunks = append(x.chunks, newChunk(name))
		return
	}
	half := len(c) / 2
	right := newChunk(c[half:]...)
	clear(c[half:]) // let the moved names go from the left half's array
	left := c[:half]
	if i <= half {
		left = slices.Insert(left, i, name)
	} else {
		right = slices.Insert(right, i-half, name)
	}
	x.chunks[ci] = left
	x.chunks = slices.Insert(x.chunks, ci+1, right)
}

func (x *nameIndex) remove(name string) {
	ci := x.chunkFor(name)
	if ci == len(x.chunks) {
		return
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearch(c, name)
	if !found {
		return
	}
	c = slices.Delete(c, i, i+1)
	x.n--
	if len(c) == 0 {
		x.chunks = slices.Delete(x.chunks, ci, ci+1)
		return
	}
	x.chunks[ci] = c
	if ci+1 < len(x.chunks) && len(c)+len(x.chunks[ci+1]) <= maxChunk/2 {
		x.chunks[ci] = append(c, x.chunks[ci+1]...)
		x.chunks = slices.Delete(x.chunks, ci+1, ci+2)
	} else if ci > 0 && len(c)+len(x.chunks[ci-1]) <= maxChunk/2 {
		x.chunks[ci-1] = append(x.chunks[ci-1], c...)
		x.chunks = slices.Delete(x.chunks, ci, ci+1)
	}
}

// seek returns the position of the first name > key (strict) or >= key.
func (x *nameIndex) seek(key string, strict bool) (ci, i int) {
	ci = x.chunkFor(key)
	if ci == len(x.chunks) {
		return ci, 0
	}
	c := x.chunks[ci]
	i, found := slices.BinarySearch(c, key)
	if found && strict {
		i++
		if i == len(c) {
			return ci + 1, 0
		}
	}
	return ci, i
}

// ListPage returns up to limit locks whose names start with prefix and sort
// after after (all of them from the first when after is ""), in name order,
// and the name to pass as after for the next page: "" when this page holds
// the last such lock. limit <= 0 means no limit.
func (t *Table) ListPage(prefix, after string, limit int) ([]LockInfo, string) {
	out := []LockInfo{}
	x := &t.names
	var ci, i int
	if after >= prefix {
		ci, i = x.seek(after, true)
	} else {
		ci, i = x.seek(prefix, false)
	}
	for ; ci < len(x.chunks); ci, i = ci+1, 0 {
		for _, name := range x.chunks[ci][i:] {
			if !strings.HasPrefix(name, prefix) {
				return out, ""
			}
			if limit > 0 && len(out) == limit {
				return out, out[len(out)-1].Name
			}
			out = append(out, t.locks[name].info())
		}
	}
	return out, ""
}
