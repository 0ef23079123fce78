package locktable

import (
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
type nameIndex = sorted[string]

const maxChunk = 512

func newNameIndex() nameIndex { return newSorted(maxChunk, strings.Compare) }

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
