package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
)

// Sessions are capabilities (SPEC semantics 11). A session records the
// identity that created it (the auth token's name; with auth off every
// caller is the one anonymous identity "", so everyone may use every
// session, as before). Its id is shown only in the reply that creates it:
// lock status never carries it. Keepalive, delete, WebSocket resume and an
// acquire through the session need that identity or an admin token.
//
// A stranger must not learn whether a session exists, yet its owner must
// still hear session_expired once it is gone. So each id ends in a tag of
// its owner ("<random>.<tag>"): a session that does not exist answers 404
// session_expired to an identity whose tag matches (and to admins), and 403
// permission_denied to everyone else, exactly as a session that exists and
// belongs to someone else does. The tag is a hash of the owner's name, not
// a secret: it tells a holder of the id (the owner, or whoever it leaked
// to) no more than whose session it is.
//
// Sessions without an owner — created while auth was off, or before owners
// were recorded — belong to no token once auth is on: only admins may use
// them; anyone else is told session_expired, so a client starts a new
// session (the old one expires when its keepalives stop).

// ownerTagLen is the length of an owner tag: 64 bits of a SHA-256, so two
// identities share one only by accident of 1 in 2^64.
const ownerTagLen = 16

// ownerTag is the tag of an owner identity, as it ends its session ids.
func ownerTag(owner string) string {
	sum := sha256.Sum256([]byte("lockd session owner\x00" + owner))
	return hex.EncodeToString(sum[:ownerTagLen/2])
}

// newSessionID returns a fresh session id for owner: the backend's random
// id, a dot, and the owner's tag.
func (h *Handler) newSessionID(owner string) string {
	return h.b.NewSessionID() + "." + ownerTag(owner)
}

// sessionTag returns the owner tag a session id ends in, if it has one.
func sessionTag(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 {
		return "", false
	}
	return id[i+1:], true
}

// sessionAccess decides whether who may use session id (keepalive, delete,
// resume, acquire through it). It returns nil when who may — the session
// then exists or is answered session_expired by the caller's next step —
// and the error to answer otherwise. With auth off everyone may.
func (h *Handler) sessionAccess(who auth.Identity, id string) error {
	if h.auth == nil || who.IsAdmin() {
		return nil
	}
	var s locktable.Session
	var ok bool
	h.b.View(func(t *locktable.Table) { s, ok = t.Session(id) })
	switch {
	case ok && s.Owner == who.Name:
		return nil
	case ok && s.Owner == "":
		return &apiError{code: api.CodeSessionExpired, msg: "session " + id +
			" was created without a token and belongs to none now that tokens are required; start a new session"}
	case ok:
		return sessionDenied(who, id)
	}
	if tag, tagged := sessionTag(id); tagged && tag != ownerTag(who.Name) {
		return sessionDenied(who, id)
	}
	return nil // gone (or never issued): the caller answers session_expired
}

func sessionDenied(who auth.Identity, id string) error {
	return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
		"token %q may not use session %s: a session is usable only by the token that created it, or an admin token", who.Name, id)}
}

// resultError is the error for a refused command's result: stateError, or
// resource_exhausted naming the quota and its value.
func resultError(res locktable.Result, lock string) error {
	if res.Code != locktable.CodeResourceExhausted {
		return stateError(res.Code, lock, res.Holder)
	}
	var what string
	switch res.Quota {
	case locktable.QuotaSessions:
		what = "the cluster holds that many sessions"
	case locktable.QuotaSessionsPerOwner:
		what = "this token holds that many sessions"
	case locktable.QuotaLocks:
		what = "the lock table holds that many locks; lock " + lock + " would be one more"
	case locktable.QuotaWaitersPerLock:
		what = "lock " + lock + " has that many waiters"
	case locktable.QuotaLocksPerSession:
		what = "the session holds or waits on that many locks"
	case locktable.QuotaLocksPerOwner:
		what = "this token holds or waits on that many locks"
	case locktable.QuotaGrants:
		what = "the cluster holds that many grants and waits (a semaphore's holders each count)"
	case locktable.QuotaValueBytes:
		what = "the values of every grant and wait in the cluster would take more bytes"
	}
	return &apiError{code: api.CodeResourceExhausted, msg: fmt.Sprintf(
		"quota %s (%d) reached: %s; retry once some are released", res.Quota, res.QuotaLimit, what)}
}
