package fence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"fmt"
)

// proofDomain separates fencing proofs from anything else the same key might
// ever sign; the version lets the format change without ambiguity.
const proofDomain = "lockd-fence-v1\x00"

const (
	proofRawLen = 8 + ed25519.SignatureSize // expiry || signature
	// ProofLen is the length of a proof as sent in Fencing-Proof: standard
	// base64 of 72 bytes (no padding is needed for 72 bytes).
	ProofLen = (proofRawLen + 2) / 3 * 4
)

// proofMessage is what the signature covers:
// domain || lock || 0x00 || token (8 bytes BE) || expiry (8 bytes BE).
// The two fixed-size fields at the end make the lock unambiguous even if it
// held a NUL byte.
func proofMessage(lock string, token uint64, expiresAtUnixMs int64) []byte {
	msg := make([]byte, 0, len(proofDomain)+len(lock)+1+16)
	msg = append(msg, proofDomain...)
	msg = append(msg, lock...)
	msg = append(msg, 0)
	msg = binary.BigEndian.AppendUint64(msg, token)
	msg = binary.BigEndian.AppendUint64(msg, uint64(expiresAtUnixMs))
	return msg
}

// Sign makes the Fencing-Proof for a grant of token on lock that expires at
// expiresAtUnixMs (Unix milliseconds): standard padded base64 of the 8-byte
// big-endian expiry followed by the 64-byte Ed25519 signature over
// "lockd-fence-v1\x00" + lock + "\x00" + token (8 bytes BE) + expiry
// (8 bytes BE). It panics, like ed25519.Sign, if priv is not a valid key.
func Sign(priv ed25519.PrivateKey, lock string, token uint64, expiresAtUnixMs int64) string {
	var raw [proofRawLen]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(expiresAtUnixMs))
	copy(raw[8:], ed25519.Sign(priv, proofMessage(lock, token, expiresAtUnixMs)))
	return base64.StdEncoding.EncodeToString(raw[:])
}

// Verify checks that proof is pub's signature over lock and token, and
// returns the expiry it carries (Unix milliseconds). It does not compare the
// expiry with any clock: that is the caller's choice (see WithProofExpiry).
// Every failure wraps ErrBadProof. Verify never decodes more than a proof's
// fixed size, whatever it is given.
func Verify(pub ed25519.PublicKey, lock string, token uint64, proof string) (expiresAtUnixMs int64, err error) {
	if len(pub) != ed25519.PublicKeySize {
		return 0, fmt.Errorf("%w: public key is %d bytes, want %d", ErrBadProof, len(pub), ed25519.PublicKeySize)
	}
	if len(proof) != ProofLen {
		return 0, fmt.Errorf("%w: %d characters, want %d", ErrBadProof, len(proof), ProofLen)
	}
	var raw [proofRawLen]byte
	// Strict: no alternative encodings of the same bytes. The length check
	// above and n below also rule out the CR/LF that base64 would skip.
	n, err := base64.StdEncoding.Strict().Decode(raw[:], []byte(proof))
	if err != nil || n != proofRawLen {
		return 0, fmt.Errorf("%w: not base64 of %d bytes", ErrBadProof, proofRawLen)
	}
	exp := int64(binary.BigEndian.Uint64(raw[:8]))
	if !ed25519.Verify(pub, proofMessage(lock, token, exp), raw[8:]) {
		return 0, fmt.Errorf("%w: signature does not match lock %s and token %d", ErrBadProof, quote(lock), token)
	}
	return exp, nil
}
