package fence

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/lockd/lockd/api"
)

// Header names of a fenced write.
const (
	// HeaderToken carries the fencing token as a decimal uint64. Required.
	HeaderToken = "Fencing-Token"
	// HeaderLock names the lock the token was granted on. Required when
	// proofs are checked, since the proof covers it.
	HeaderLock = "Fencing-Lock"
	// HeaderProof carries the lock service's signature over lock and token
	// (see Sign).
	HeaderProof = "Fencing-Proof"
)

// maxTokenHeaderLen bounds a Fencing-Token value: 20 digits hold any
// uint64; the slack admits leading zeros.
const maxTokenHeaderLen = 64

// Headers are the fencing headers of one request.
type Headers struct {
	Token uint64
	Lock  string // "" when absent
	Proof string // "" when absent
}

// ParseToken parses a Fencing-Token value: decimal digits only (no sign,
// no spaces, no base prefix) of a value that fits in a uint64. Leading
// zeros are allowed. Errors are *HeaderError.
func ParseToken(v string) (uint64, error) {
	if v == "" {
		return 0, &HeaderError{Header: HeaderToken, Reason: "is empty"}
	}
	if len(v) > maxTokenHeaderLen {
		return 0, &HeaderError{Header: HeaderToken, Reason: fmt.Sprintf("is too long (%d bytes)", len(v))}
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, &HeaderError{Header: HeaderToken, Reason: fmt.Sprintf("%s is not a decimal unsigned integer", quote(v))}
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, &HeaderError{Header: HeaderToken, Reason: fmt.Sprintf("%s is out of range for a uint64", quote(v))}
	}
	return n, nil
}

// ParseHeaders reads the fencing headers of h. Fencing-Token is required;
// Fencing-Lock, when present, must be a valid lock name (1–256 bytes of
// [A-Za-z0-9._:/-]). A header given more than once is refused: which of the
// values counts would be a guess. Errors are *HeaderError.
func ParseHeaders(h http.Header) (Headers, error) {
	var out Headers
	tok, err := single(h, HeaderToken)
	if err != nil {
		return out, err
	}
	if tok == nil {
		return out, &HeaderError{Header: HeaderToken, Reason: "is missing"}
	}
	if out.Token, err = ParseToken(*tok); err != nil {
		return out, err
	}
	lock, err := single(h, HeaderLock)
	if err != nil {
		return out, err
	}
	if lock != nil {
		if reason := checkLockName(*lock); reason != "" {
			return out, &HeaderError{Header: HeaderLock, Reason: reason}
		}
		out.Lock = *lock
	}
	proof, err := single(h, HeaderProof)
	if err != nil {
		return out, err
	}
	if proof != nil {
		out.Proof = *proof
	}
	return out, nil
}

// single returns the one value of header name, nil if absent.
func single(h http.Header, name string) (*string, error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return nil, nil
	case 1:
		return &vs[0], nil
	default:
		return nil, &HeaderError{Header: name, Reason: fmt.Sprintf("is given %d times, want once", len(vs))}
	}
}

// checkLockName applies the SPEC's lock-name limits; "" means valid.
func checkLockName(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > api.MaxLockName {
		return fmt.Sprintf("is %d bytes, at most %d allowed", len(s), api.MaxLockName)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
		if !ok {
			return fmt.Sprintf("%s has a byte outside [A-Za-z0-9._:/-]", quote(s))
		}
	}
	return ""
}

// quote renders a client-supplied value for an error message, cut short so
// a huge header cannot blow up replies and logs.
func quote(s string) string {
	const max = 40
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
