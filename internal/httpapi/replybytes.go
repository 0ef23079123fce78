package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/lockd/lockd/api"
)

// What big reads make a member hold is bounded in bytes, not in requests
// (SPEC "Memory follows bytes"): fifty readers each asking for a page of
// 10 000 holders with 4 KiB values made a leader encode 2 GiB at once and
// grow by 6.5 GiB. Two bounds:
//
//   - A page (a list, a holders page) ends when its estimated encoding
//     reaches maxPageBytes, whatever its limit; its "next" says where the
//     next page starts, as it does when the limit ends it.
//   - Read replies being encoded share a member-wide budget of
//     maxReplyBytes: a reply waits for its estimated size (a client that
//     gives up stops waiting), so concurrent readers take turns instead of
//     each holding its own copy at once.

const (
	maxPageBytes  = 1 << 20
	maxReplyBytes = 8 << 20
	// smallReplyBytes: replies up to this size (almost every status) skip
	// the budget: they cost little, and a parked query answered as the
	// member stops must still get its answer.
	smallReplyBytes = 64 << 10
)

// newReplyBudget is the member's budget of reply bytes being encoded.
func newReplyBudget() *semaphore.Weighted { return semaphore.NewWeighted(maxReplyBytes) }

// holderBytes estimates a holder's share of a reply: its strings and its
// fixed fields with their names.
func holderBytes(h api.HolderStatus) int {
	return 128 + len(h.ClientID) + len(h.ExpiresAt) + len(h.Mode) + len(h.Value)
}

// statusBytes estimates a status's encoding.
func statusBytes(st api.LockStatus) int {
	n := 256 + len(st.Lock) + len(st.ClientID) + len(st.ExpiresAt) + len(st.Value) + len(st.DelayedUntil)
	for _, h := range st.Holders {
		n += holderBytes(h)
	}
	return n
}

// writeRead writes a read's reply v of estimated size; a big one once the
// member's reply budget has room for it.
func (h *Handler) writeRead(w http.ResponseWriter, r *http.Request, size int, v any) {
	if size <= smallReplyBytes {
		writeJSON(w, 200, v)
		return
	}
	n := int64(min(size, maxReplyBytes))
	if err := h.replyBudget.Acquire(r.Context(), n); err != nil {
		// The request ended while it waited (its client went away, or the
		// member is stopping): say so rather than leave an empty 200.
		writeError(w, &apiError{code: api.CodeOverloaded, retryAfter: time.Second,
			msg: "the reply waited for room among this member's big replies until the request ended"})
		return
	}
	defer h.replyBudget.Release(n)
	writeJSON(w, 200, v)
}

// cutList ends a list page at maxPageBytes (at least one lock), and
// returns its estimated size.
func cutList(out *api.LockList) int {
	size := 64
	for i, st := range out.Locks {
		n := statusBytes(st)
		if i > 0 && size+n > maxPageBytes {
			out.Locks = out.Locks[:i]
			out.Next = out.Locks[i-1].Lock
			return size
		}
		size += n
	}
	return size
}

// cutHolders ends a holders page at maxPageBytes (at least one holder),
// and returns its estimated size.
func cutHolders(out *api.HoldersPage) int {
	size := 128 + len(out.Lock)
	for i, hs := range out.Holders {
		n := holderBytes(hs)
		if i > 0 && size+n > maxPageBytes {
			out.Holders = out.Holders[:i]
			out.Next = strconv.FormatUint(out.Holders[i-1].FencingToken, 10)
			return size
		}
		size += n
	}
	return size
}
