package httpapi

import (
	"net/http"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
)

// cancel is POST /api/v1/locks/{name}/cancel: the client withdraws its
// queued wait on the lock (SPEC 18). The waiting acquire, wherever it
// waits, is answered 409 cancelled from the committed withdrawal; this
// reply says whether there was one to withdraw. A grant that already
// committed is not undone (release it).
func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	name, err := lockName(r)
	if err != nil {
		writeError(w, err)
		return
	}
	who, ok := h.allow(w, r, auth.Lock, name, false)
	if !ok {
		return
	}
	var req api.CancelRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	h.proposeCancel(w, r, who, req.ClientID, name, nil)
}

// cancelMany is POST /api/v1/cancel {"client_id", "locks"}: the client
// withdraws its queued multi-acquire of exactly those locks.
func (h *Handler) cancelMany(w http.ResponseWriter, r *http.Request) {
	var req api.CancelManyRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	names, err := validLockSet(req.Locks)
	if err != nil {
		writeError(w, err)
		return
	}
	var who auth.Identity
	for _, name := range names {
		var ok bool
		if who, ok = h.allow(w, r, auth.Lock, name, false); !ok {
			return
		}
	}
	h.proposeCancel(w, r, who, req.ClientID, "", names)
}

func (h *Handler) proposeCancel(w http.ResponseWriter, r *http.Request, who auth.Identity, client, lock string, locks []string) {
	if err := validClientID("client_id", client); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	res, err := h.propose(r.Context(), locktable.Command{Op: locktable.OpCancel, Lock: lock, Locks: locks,
		ClientID: client, Owner: who.Name})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, stateError(res.Code, lock, ""))
		return
	}
	writeJSON(w, 200, api.CancelReply{Cancelled: res.Cancelled})
}
