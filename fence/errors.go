package fence

import (
	"errors"
	"fmt"
)

// Sentinel errors of this package. Match them with errors.Is.
var (
	// ErrStaleToken: the token is lower than the highest already accepted
	// for the key. The error is a *StaleTokenError carrying that highest.
	ErrStaleToken = errors.New("fence: stale fencing token")
	// ErrBadProof: a Fencing-Proof that is malformed or whose signature does
	// not verify for the lock and token it came with.
	ErrBadProof = errors.New("fence: bad fencing proof")
	// ErrMissingProof: a write without Fencing-Proof where one is required.
	ErrMissingProof = errors.New("fence: missing fencing proof")
	// ErrMissingLock: a write that names no lock (Fencing-Lock) where
	// proofs are checked: a proof covers the lock name, so it cannot be
	// checked without it.
	ErrMissingLock = errors.New("fence: the write names no lock")
	// ErrInvalidLock: a write naming a lock that is not a valid lock name
	// (1-256 bytes of [A-Za-z0-9._:/-]).
	ErrInvalidLock = errors.New("fence: invalid lock name")
	// ErrExpiredProof: a proof whose signed expiry has passed (see
	// Grant.Expired; the Middleware accepts such proofs only with
	// WithoutProofExpiry).
	ErrExpiredProof = errors.New("fence: expired fencing proof")
	// ErrSharedProof: a valid proof of a shared grant offered for a write.
	// A shared holder is a reader; only an exclusive grant may write.
	ErrSharedProof = errors.New("fence: proof of a shared grant cannot write")
	// ErrLockMismatch: a write made under another lock than the one the key
	// is bound to. The error is a *LockMismatchError.
	ErrLockMismatch = errors.New("fence: key is bound to another lock")
	// ErrInvalidHeader: a fencing header is missing or malformed. The error
	// is a *HeaderError naming the header.
	ErrInvalidHeader = errors.New("fence: invalid fencing header")
	// ErrCorrupt: a stored record that cannot be decoded.
	ErrCorrupt = errors.New("fence: corrupt record")
)

// StaleTokenError is returned when a token is lower than the highest token
// already accepted for a key. errors.Is(err, ErrStaleToken) holds for it.
type StaleTokenError struct {
	Key     string // the resource key
	Token   uint64 // the refused token
	Highest uint64 // the highest token accepted for Key
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("fence: stale fencing token %d for %q: highest accepted is %d", e.Token, e.Key, e.Highest)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// HeaderError names a fencing header that is missing or malformed.
// errors.Is(err, ErrInvalidHeader) holds for it.
type HeaderError struct {
	Header string // e.g. HeaderToken
	Reason string // e.g. "is missing"
}

func (e *HeaderError) Error() string { return "header " + e.Header + " " + e.Reason }

// Is makes errors.Is(err, ErrInvalidHeader) true.
func (e *HeaderError) Is(target error) bool { return target == ErrInvalidHeader }

// LockMismatchError is returned when a write names another lock than the
// one that guards its key (by configuration, or bound by the key's first
// accepted write). errors.Is(err, ErrLockMismatch) holds for it.
type LockMismatchError struct {
	Key   string // the resource key
	Lock  string // the lock the write named; "" when it named none
	Bound string // the key's lock
}

func (e *LockMismatchError) Error() string {
	if e.Lock == "" {
		return fmt.Sprintf("fence: key %q is bound to lock %q, and the write names no lock", e.Key, e.Bound)
	}
	return fmt.Sprintf("fence: key %q is bound to lock %q, not %q", e.Key, e.Bound, e.Lock)
}

// Is makes errors.Is(err, ErrLockMismatch) true.
func (e *LockMismatchError) Is(target error) bool { return target == ErrLockMismatch }
