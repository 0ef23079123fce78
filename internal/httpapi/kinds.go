package httpapi

import (
	"net/http"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
)

// The multi-lock and value endpoints check their requests at the door as
// every endpoint does (exact field names, SPEC limits, access on every
// name). The state machine does not keep several holders per request or
// values yet, so a valid request is answered 404 not_found: nothing is
// proposed, and a client can tell "not served" from "refused".

func (h *Handler) acquireMany(w http.ResponseWriter, r *http.Request) {
	var req api.MultiAcquireRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := validMultiAcquire(&req); err != nil {
		writeError(w, err)
		return
	}
	for _, name := range req.Locks {
		if _, ok := h.allow(w, r, auth.Lock, name, false); !ok {
			return
		}
	}
	notServed(w, r)
}

func validMultiAcquire(req *api.MultiAcquireRequest) error {
	if err := validClientID("client_id", req.ClientID); err != nil {
		return err
	}
	if n := len(req.Locks); n < api.MinMultiLocks || n > api.MaxMultiLocks {
		return invalid("locks names %d locks; a multi-acquire takes %d to %d distinct names", n, api.MinMultiLocks, api.MaxMultiLocks)
	}
	seen := make(map[string]bool, len(req.Locks))
	for i, name := range req.Locks {
		if why := ValidLockName(name); why != "" {
			return invalid("locks[%d]: %s", i, why)
		}
		if seen[name] {
			return invalid("locks names %q twice", name)
		}
		seen[name] = true
	}
	switch req.Mode {
	case "", "exclusive", "shared":
	default:
		return invalid("mode must be exclusive or shared, got %q", req.Mode)
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		return err
	}
	if err := checkRange("wait_timeout_ms", req.WaitTimeoutMs, 0, api.MaxWaitTimeoutMs); err != nil {
		return err
	}
	return validSessionID(req.SessionID)
}

func (h *Handler) setValue(w http.ResponseWriter, r *http.Request) {
	var req api.ValueRequest
	if _, _, ok := h.holderRequest(w, r, &req, func() (string, uint64) { return req.ClientID, req.FencingToken }); !ok {
		return
	}
	if len(req.Value) > api.MaxValueBytes || !utf8.ValidString(req.Value) {
		writeError(w, invalid("value must be valid UTF-8 of at most %d bytes (got %d bytes)", api.MaxValueBytes, len(req.Value)))
		return
	}
	notServed(w, r)
}
