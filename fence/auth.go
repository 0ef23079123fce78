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
	Lock  string // Fencing-Lock, "" when absent
	// ProofExpiresAt is the expiry carried by a verified proof (Unix ms),
	// 0 when no proof was checked.
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
// part Middleware and Server share. A nil pub checks no proofs; a nil now
// checks no expiry.
type authenticator struct {
	pub ed25519.PublicKey
	now func() time.Time
}

// authenticate returns the write's token, lock and proof expiry, or the
// reply to refuse it with: 400 for a missing or malformed header, 403 for a
// missing, bad or expired proof. The order matters: a request without a
// usable token is malformed whatever else it carries.
func (a authenticator) authenticate(h http.Header) (Admission, *httpError) {
	hs, err := ParseHeaders(h)
	if err != nil {
		return Admission{}, newHTTPError(api.CodeInvalidArgument, err.Error())
	}
	adm := Admission{Token: hs.Token, Lock: hs.Lock}
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
	if a.now != nil && a.now().UnixMilli() >= exp {
		return Admission{}, newHTTPError(api.CodePermissionDenied,
			"header "+HeaderProof+": "+ErrExpiredProof.Error()+" (expired at "+api.FormatTime(exp)+")")
	}
	adm.ProofExpiresAt = exp
	return adm, nil
}

// admitError turns an error of Store.Admit or Store.Put into its reply:
// 409 for a stale token, 500 otherwise.
func admitError(w http.ResponseWriter, err error) {
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		writeStale(w, stale)
		return
	}
	newHTTPError(api.CodeInternal, "fencing store: "+err.Error()).write(w)
}

func uitoa(n uint64) string { return strconv.FormatUint(n, 10) }
