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
	// ErrExpiredProof: a proof whose expiry has passed (only checked with
	// WithProofExpiry).
	ErrExpiredProof = errors.New("fence: expired fencing proof")
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
