package fence

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/lockd/lockd/api"
)

// Admission describes a fenced write whose credentials were checked
// (Verifier.Authenticate). Middleware puts it in the request's context for
// the wrapped handler (FromContext) once its token was admitted.
type Admission struct {
	Key   string // the resource key the token is checked against
	Token uint64 // the write's token; once admitted, the highest for Key
	Lock  string // the lock the write names, "" when none; the key's lock when Key is bound
	// Guarded says Lock is the key's lock by configuration (a guard), not
	// only by the write's word (see Write.Guarded).
	Guarded bool
	// Mode is the grant's mode stated by a verified proof (always
	// ModeExclusive: a shared grant's proof is refused), "" when no proof
	// was checked.
	Mode Mode
	// ProofExpiresAt is the expiry carried by a verified proof (Unix ms),
	// 0 when no proof was checked or the grant has no expiry of its own.
	ProofExpiresAt int64
}

// Write is the write a Store checks for a: see Write.Apply.
func (a Admission) Write() Write {
	return Write{Token: a.Token, Lock: a.Lock, Guarded: a.Guarded}
}

type admissionKey struct{}

// FromContext returns the Admission Middleware stored in ctx, if any.
func FromContext(ctx context.Context) (Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(Admission)
	return a, ok
}

func withAdmission(ctx context.Context, a Admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

// authenticator reads a write's fencing headers and checks them with its
// Verifier: the HTTP part Middleware and Server share.
type authenticator struct{ Verifier }

// authenticate returns the write's token, lock, mode and proof expiry, or
// the reply to refuse it with: 400 for a missing or malformed header, 403
// for a write under another lock than guard (the key's lock by
// configuration; "" for none) and for a missing or bad proof, or one of a
// shared grant. The order matters: a request without a usable token is
// malformed whatever else it carries. The proof's expiry is not judged here
// (see expired): a stale token is answered as stale first.
func (a authenticator) authenticate(h http.Header, key, guard string) (Admission, *httpError) {
	hs, err := ParseHeaders(h)
	if err != nil {
		return Admission{}, newHTTPError(api.CodeInvalidArgument, err.Error())
	}
	adm, err := a.Authenticate(key, guard, Credentials{Token: hs.Token, Lock: hs.Lock, Proof: hs.Proof})
	if err == nil {
		return adm, nil
	}
	var mismatch *LockMismatchError
	switch {
	case errors.As(err, &mismatch):
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			mismatch.Error()+": a write to it must name that lock in "+HeaderLock)
	case errors.Is(err, ErrInvalidLock): // ParseHeaders checked it already
		return Admission{}, newHTTPError(api.CodeInvalidArgument, "header "+HeaderLock+": "+err.Error())
	case errors.Is(err, ErrMissingProof):
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			"header "+HeaderProof+" is missing: this server accepts only writes with a proof signed by the lock service")
	case errors.Is(err, ErrMissingLock):
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			"header "+HeaderLock+" is missing: the "+HeaderProof+" covers the lock name, so it cannot be checked without it")
	}
	return Admission{}, newHTTPError(api.CodePermissionDenied, "header "+HeaderProof+": "+err.Error())
}

// expired returns the 403 for an admitted write whose proof has expired,
// nil when it has not, when no proof was checked, or when expired proofs
// are accepted.
func (a authenticator) expired(adm Admission) *httpError {
	if err := a.Expired(adm); err != nil {
		return newHTTPError(api.CodePermissionDenied, "header "+HeaderProof+": "+err.Error())
	}
	return nil
}

// admitError turns an error of Store.Admit or Store.Put into its reply:
// 409 for a stale token, 403 for a write under another lock than the
// key's, 500 otherwise.
func admitError(w http.ResponseWriter, err error) {
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		writeStale(w, stale)
		return
	}
	var mismatch *LockMismatchError
	if errors.As(err, &mismatch) {
		newHTTPError(api.CodePermissionDenied, mismatch.Error()).write(w)
		return
	}
	newHTTPError(api.CodeInternal, "fencing store: "+err.Error()).write(w)
}

func uitoa(n uint64) string { return strconv.FormatUint(n, 10) }
