package fence

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/lockd/lockd/api"
)

// ResetReply is fencestore's 200 reply to DELETE /v1/objects/{key}/fence.
type ResetReply struct {
	OK bool `json:"ok"`
	// FencingToken is the key's highest token now: the floor the reset set.
	FencingToken uint64 `json:"fencing_token"`
	// PreviousToken and PreviousLock are what the key had before.
	PreviousToken uint64 `json:"previous_token"`
	PreviousLock  string `json:"previous_lock,omitempty"`
}

// resetFence serves DELETE /v1/objects/{key}/fence: the operator's reset of a
// key that no holder can write any more. Without proof checking any client
// can send Fencing-Token 18446744073709551615 and no token is ever higher,
// and a first write can bind a key to the wrong lock; this is the way out.
// The value stays: the next accepted write replaces it.
func (s *server) resetFence(w http.ResponseWriter, r *http.Request) {
	key, ok := objectKey(w, r)
	if !ok {
		return
	}
	if r.Method != http.MethodDelete {
		methodNotAllowed(w, r, "DELETE")
		return
	}
	if !s.adminOn {
		newHTTPError(api.CodePermissionDenied,
			"resetting a key's fence is turned off on this server (fencestore: start it with --admin-token-file)").write(w)
		return
	}
	if !s.isAdmin(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fencestore"`)
		newHTTPError(api.CodeUnauthenticated, "the admin token is required (Authorization: Bearer <token>)").write(w)
		return
	}
	var floor uint64
	if v, given := r.URL.Query()["fencing_token"]; given {
		if len(v) != 1 {
			newHTTPError(api.CodeInvalidArgument, "fencing_token is given more than once").write(w)
			return
		}
		n, err := ParseToken(v[0])
		if err != nil {
			newHTTPError(api.CodeInvalidArgument, "fencing_token "+quote(v[0])+" is not a decimal unsigned integer").write(w)
			return
		}
		floor = n
	}
	prev, err := s.store.Reset(key, floor)
	if err != nil {
		s.log.Error("fence reset failed", "key", key, "err", err)
		newHTTPError(api.CodeInternal, "fencing store: "+err.Error()).write(w)
		return
	}
	s.log.Warn("fence reset by admin", "key", key, "previous_token", prev.Token, "previous_lock", prev.Lock,
		"fencing_token", floor, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, ResetReply{OK: true, FencingToken: floor, PreviousToken: prev.Token, PreviousLock: prev.Lock})
}

// isAdmin compares the bearer token with the admin token in constant time
// (hashes, so not even the length leaks).
func (s *server) isAdmin(r *http.Request) bool {
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(bearer)))
	return subtle.ConstantTimeCompare(got[:], s.admin[:]) == 1
}
