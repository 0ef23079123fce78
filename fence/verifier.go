package fence

import (
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/lockd/lockd/api"
)

// Credentials are what a fenced write presents, wherever it arrives: the
// fencing headers of an HTTP request (ParseHeaders), or the arguments of a
// call (package fence/sqlfence).
type Credentials struct {
	// Token is the grant's fencing token.
	Token uint64
	// Lock is the lock the token was granted on; "" when the write names
	// none, which only an unguarded, unbound key without proofs accepts.
	Lock string
	// Proof is the lock service's proof of the grant (SignGrant; the Go
	// client's Lock.Proof); "" when there is none.
	Proof string
}

// Verifier checks the credentials of fenced writes by the rules every
// fenced resource of this module follows, so that they all refuse the same
// writes: Middleware, the fencestore server (NewServer) and
// fence/sqlfence. The zero Verifier checks no proofs.
//
// A write is judged in two steps, because the second needs the key's
// record and the record must be read where the write is made atomic:
// Authenticate, before anything is read; then, against the key's record,
// Admission.Write's Apply and, only if that admits it, Expired. So a stale
// token is answered as stale even when its proof has also expired: "the
// lock was lost" is the more useful answer.
type Verifier struct {
	// Key is the lock service's Ed25519 public key: when set, every write
	// must carry a proof signed with the matching private key, of an
	// exclusive grant of the lock it names. Nil checks no proofs. A key of
	// the wrong size fails closed: every write is refused.
	Key ed25519.PublicKey
	// Now is the clock a proof's expiry is compared with; nil is time.Now.
	Now func() time.Time
	// AcceptExpired accepts proofs whose expiry has passed (see
	// WithoutProofExpiry for what that costs).
	AcceptExpired bool
}

// Authenticate checks c for a write to key whose lock by configuration is
// guard ("" when no guard binds it), in this order:
//
//   - c.Lock, when given, must be a valid lock name: ErrInvalidLock;
//   - with a guard, c.Lock must be it: a *LockMismatchError;
//   - with a Key, the write must carry a proof (ErrMissingProof) and name
//     its lock (ErrMissingLock), and the proof must be the Key's signature
//     over an exclusive grant of c.Lock and c.Token: ErrBadProof, or
//     ErrSharedProof for a reader's.
//
// It returns the Admission to check against the key's record next
// (Admission.Write, then Expired). It does not judge the proof's expiry.
func (v Verifier) Authenticate(key, guard string, c Credentials) (Admission, error) {
	if c.Lock != "" {
		if reason := checkLockName(c.Lock); reason != "" {
			return Admission{}, fmt.Errorf("%w: lock %s", ErrInvalidLock, reason)
		}
	}
	if guard != "" && c.Lock != guard {
		return Admission{}, &LockMismatchError{Key: key, Lock: c.Lock, Bound: guard}
	}
	adm := Admission{Key: key, Token: c.Token, Lock: c.Lock, Guarded: guard != ""}
	if v.Key == nil {
		return adm, nil
	}
	if c.Proof == "" {
		return Admission{}, fmt.Errorf("%w: this resource accepts only writes with a proof signed by the lock service", ErrMissingProof)
	}
	if c.Lock == "" {
		return Admission{}, fmt.Errorf("%w: a proof covers the lock name, so it cannot be checked without it", ErrMissingLock)
	}
	exp, err := Verify(v.Key, c.Lock, c.Token, c.Proof)
	if err != nil {
		return Admission{}, err
	}
	adm.Mode, adm.ProofExpiresAt = ModeExclusive, exp
	return adm, nil
}

// Expired returns an error wrapping ErrExpiredProof when adm carries a
// verified proof whose expiry is not after v.Now() and expired proofs are
// not accepted; nil otherwise (also when no proof was checked).
func (v Verifier) Expired(adm Admission) error {
	if v.Key == nil || v.AcceptExpired || adm.Mode == "" {
		return nil
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	if !(Grant{ExpiresAt: adm.ProofExpiresAt}).Expired(now()) {
		return nil
	}
	return fmt.Errorf("%w (the grant expired at %s; a holder that renews gets a fresh proof by acquiring again)",
		ErrExpiredProof, api.FormatTime(adm.ProofExpiresAt))
}
