package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// holders is GET /api/v1/locks/{name}/holders?after=TOKEN&limit=N: every
// grant of a lock, a page at a time in token order (SPEC 16). A status
// shows at most 64 holders: a semaphore's 10 000 are read here, so no
// reply, list item or watch frame grows with a lock's size. Read access;
// linearizable, or any member's own state with stale=true.
func (h *Handler) holders(w http.ResponseWriter, r *http.Request) {
	name, err := lockName(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, ok := h.allow(w, r, auth.Read, name, false); !ok {
		return
	}
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeError(w, invalid("after must be a fencing token (an unsigned integer), got %q", v))
			return
		}
	}
	limit := api.DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > api.MaxListLimit {
			writeError(w, invalid("limit must be a number from 1 to %d, got %q", api.MaxListLimit, v))
			return
		}
		limit = n
	}
	if !h.readable(w, r) {
		return
	}
	var page []locktable.Holder
	var next uint64
	var total int
	h.b.View(func(t *locktable.Table) {
		page, next = t.HoldersPage(name, after, limit)
		total = t.Get(name).HoldersTotal
	})
	out := api.HoldersPage{Lock: name, Holders: make([]api.HolderStatus, len(page)), HoldersTotal: total,
		Stale: q.Get("stale") == "true"}
	for i, g := range page {
		out.Holders[i] = holderStatus(g)
	}
	if next != 0 {
		out.Next = strconv.FormatUint(next, 10)
	}
	h.writeRead(w, r, cutHolders(&out), out)
}

func holderStatus(g locktable.Holder) api.HolderStatus {
	return api.HolderStatus{ClientID: g.ClientID, FencingToken: g.Token, ExpiresAt: api.FormatTime(g.ExpiresAt),
		Mode: g.Mode.String(), Value: g.Value}
}

// startWatch opens a client's watch (a WebSocket watch or a parked
// blocking query) if the member has room for one more: watches are bounded
// per member (--max-watches), not only per connection, since sixteen
// connections of 1024 watches each cost what one connection may not.
func (h *Handler) startWatch(open func() *notify.Watch) (*notify.Watch, error) {
	if n := h.watches.Add(1); h.maxWatches > 0 && n > h.maxWatches {
		h.watches.Add(-1)
		return nil, h.refusal("watch", &apiError{code: api.CodeResourceExhausted, retryAfter: time.Second,
			msg: fmt.Sprintf("quota max-watches (%d) reached: this member serves that many watches and blocking queries; retry once some end", h.maxWatches)})
	}
	return open(), nil
}

// endWatch closes a watch startWatch opened.
func (h *Handler) endWatch(w *notify.Watch) {
	w.Close()
	h.watches.Add(-1)
}
