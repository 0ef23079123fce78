package fence

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd/lockd/api"
)

// Admission describes a fenced write whose token was admitted. Middleware
// puts it in the request's context for the wrapped handler (FromContext).
type Admission struct {
	Key   string // the resource key the token was checked against
	Token uint64 // the admitted token, now the highest for Key
	Lock  string // Fencing-Lock, "" when absent; the key's lock when Key is bound
	// Mode is the grant's mode stated by a verified proof (always
	// ModeExclusive: a shared grant's proof is refused), "" when no proof
	// was checked.
	Mode Mode
	// ProofExpiresAt is the expiry carried by a verified proof (Unix ms),
	// 0 when no proof was checked or the grant has no expiry of its own.
	ProofExpiresAt int64
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

// authenticator reads a write's fencing headers and checks its proof: the
// part Middleware and Server share. A nil pub checks no proofs.
type authenticator struct {
	pub ed25519.PublicKey
	// now is the clock a proof's expiry is compared with; acceptExpired
	// turns that comparison off (WithoutProofExpiry).
	now           func() time.Time
	acceptExpired bool
}

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
	adm := Admission{Key: key, Token: hs.Token, Lock: hs.Lock}
	if guard != "" && hs.Lock != guard {
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			(&LockMismatchError{Key: key, Lock: hs.Lock, Bound: guard}).Error()+
				": a write to it must name that lock in "+HeaderLock)
	}
	if a.pub == nil {
		return adm, nil
	}
	if hs.Proof == "" {
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			"header "+HeaderProof+" is missing: this server accepts only writes with a proof signed by the lock service")
	}
	if hs.Lock == "" {
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			"header "+HeaderLock+" is missing: the "+HeaderProof+" covers the lock name, so it cannot be checked without it")
	}
	exp, err := Verify(a.pub, hs.Lock, hs.Token, hs.Proof)
	if err != nil {
		return Admission{}, newHTTPError(api.CodePermissionDenied, "header "+HeaderProof+": "+err.Error())
	}
	adm.Mode, adm.ProofExpiresAt = ModeExclusive, exp
	return adm, nil
}

// expired returns the 403 for an admitted write whose proof has expired,
// nil when it has not, when no proof was checked, or when expired proofs
// are accepted.
func (a authenticator) expired(adm Admission) *httpError {
	if a.pub == nil || a.acceptExpired || adm.Mode == "" {
		return nil
	}
	if !(Grant{ExpiresAt: adm.ProofExpiresAt}).Expired(a.now()) {
		return nil
	}
	return newHTTPError(api.CodePermissionDenied, "header "+HeaderProof+": "+ErrExpiredProof.Error()+
		" (the grant expired at "+api.FormatTime(adm.ProofExpiresAt)+"; a holder that renews gets a fresh proof by acquiring again)")
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
