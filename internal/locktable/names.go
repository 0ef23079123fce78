package locktable

import (
	"strings"
)

// The locks are kept in name order (lockIndex), so that a page of a list
// costs O(log n + page) rather than a sort of every name (a million-lock
// table took a sort of a million strings, under the read lock that Apply
// waits on, for every page and every dashboard poll).
//
// Why an ordered index rather than a scan with a bounded heap: a scan is
// O(n) per page, but paging through n locks is then O(n²/page) and every
// page holds the read lock for a walk of the whole table.

// maxChunk bounds a chunk of the ordered indexes: an insert or delete moves
// at most this many items.
const maxChunk = 512

// ListPage returns up to limit locks whose names start with prefix and sort
// after after (all of them from the first when after is ""), in name order,
// and the name to pass as after for the next page: "" when this page holds
// the last such lock. limit <= 0 means no limit.
func (t *Table) ListPage(prefix, after string, limit int) ([]LockInfo, string) {
	out := []LockInfo{}
	x := &t.locks
	var ci, i int
	if after >= prefix {
		ci, i = x.seek(after, true)
	} else {
		ci, i = x.seek(prefix, false)
	}
	for ; ci < len(x.s.chunks); ci, i = ci+1, 0 {
		for _, l := range x.s.chunks[ci][i:] {
			if !strings.HasPrefix(l.Name, prefix) {
				return out, ""
			}
			if limit > 0 && len(out) == limit {
				return out, out[len(out)-1].Name
			}
			out = append(out, l.info())
		}
	}
	return out, ""
}
