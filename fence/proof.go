package fence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"time"
)

// Mode is the mode of a lock grant, as a proof states it.
type Mode string

// The modes of lockd's grants. Only an exclusive grant authorizes a write.
const (
	ModeExclusive Mode = "exclusive"
	ModeShared    Mode = "shared" // a reader: its proof never admits a write
)

// Grant is what a fencing proof states: the lock service granted Token on
// Lock in Mode, with a lease that ends at ExpiresAt (Unix ms).
type Grant struct {
	Lock  string
	Token uint64
	Mode  Mode
	// ExpiresAt is the grant's expiry when it was signed, in Unix
	// milliseconds; 0 means the grant had no expiry of its own (a session
	// lock without a TTL), and its proof never expires.
	ExpiresAt int64
}

// Expired reports whether the grant's signed expiry is at or before now. A
// grant with ExpiresAt 0 never expires.
func (g Grant) Expired(now time.Time) bool {
	return g.ExpiresAt != 0 && now.UnixMilli() >= g.ExpiresAt
}

// Proof format, version 2.
//
// The signed message is
//
//	"lockd-fence-v2\x00" || lock || 0x00 || token (8 bytes BE) || mode (1 byte) || expiry (8 bytes BE)
//
// and the proof sent in Fencing-Proof is standard padded base64 of
//
//	version (1 byte, 2) || mode (1 byte) || expiry (8 bytes BE) || Ed25519 signature (64 bytes)
//
// The fixed-size fields after the lock make the lock unambiguous even if it
// held a NUL byte. Version 1 (no mode; domain "lockd-fence-v1\x00"; 72 raw
// bytes, 96 characters) is no longer accepted: a v1 proof never verifies,
// and its distinct length and domain mean it cannot be taken for a v2 one.
// lockd members and the resource servers that check their proofs are
// upgraded together.
const (
	proofVersion = 2
	// proofDomain separates fencing proofs from anything else the same key
	// might ever sign; its version changes with the signed message.
	proofDomain = "lockd-fence-v2\x00"

	proofRawLen = 1 + 1 + 8 + ed25519.SignatureSize // version || mode || expiry || signature
	// ProofLen is the length of a proof as sent in Fencing-Proof: standard
	// padded base64 of 74 bytes.
	ProofLen = (proofRawLen + 2) / 3 * 4

	// proofLenV1 is the length of a version 1 proof, recognized only to
	// say why it is refused.
	proofLenV1 = 96
)

// Mode bytes of the proof.
const (
	modeByteExclusive = 1
	modeByteShared    = 2
)

func modeByte(m Mode) (byte, bool) {
	switch m {
	case ModeExclusive:
		return modeByteExclusive, true
	case ModeShared:
		return modeByteShared, true
	}
	return 0, false
}

func modeOf(b byte) (Mode, bool) {
	switch b {
	case modeByteExclusive:
		return ModeExclusive, true
	case modeByteShared:
		return ModeShared, true
	}
	return "", false
}

// proofMessage is what the signature covers (see the format above).
func proofMessage(lock string, token uint64, mode byte, expiresAtUnixMs int64) []byte {
	msg := make([]byte, 0, len(proofDomain)+len(lock)+1+8+1+8)
	msg = append(msg, proofDomain...)
	msg = append(msg, lock...)
	msg = append(msg, 0)
	msg = binary.BigEndian.AppendUint64(msg, token)
	msg = append(msg, mode)
	msg = binary.BigEndian.AppendUint64(msg, uint64(expiresAtUnixMs))
	return msg
}

// SignGrant makes the Fencing-Proof of g (format version 2, see ProofLen).
// It panics, like ed25519.Sign, if priv is not a valid key, and if g.Mode is
// neither ModeExclusive nor ModeShared: the lock service signs its own
// grants, so either is a programming error, and signing a mode a verifier
// cannot read would hand out a proof that means nothing.
func SignGrant(priv ed25519.PrivateKey, g Grant) string {
	mb, ok := modeByte(g.Mode)
	if !ok {
		panic(fmt.Sprintf("fence: SignGrant: unknown mode %q", g.Mode))
	}
	var raw [proofRawLen]byte
	raw[0] = proofVersion
	raw[1] = mb
	binary.BigEndian.PutUint64(raw[2:10], uint64(g.ExpiresAt))
	copy(raw[10:], ed25519.Sign(priv, proofMessage(g.Lock, g.Token, mb, g.ExpiresAt)))
	return base64.StdEncoding.EncodeToString(raw[:])
}

// Sign makes the Fencing-Proof of an exclusive grant of token on lock that
// expires at expiresAtUnixMs (Unix milliseconds; 0 for none): SignGrant with
// ModeExclusive. It panics, like ed25519.Sign, if priv is not a valid key.
func Sign(priv ed25519.PrivateKey, lock string, token uint64, expiresAtUnixMs int64) string {
	return SignGrant(priv, Grant{Lock: lock, Token: token, Mode: ModeExclusive, ExpiresAt: expiresAtUnixMs})
}

// VerifyGrant checks that proof is pub's signature over a grant of token on
// lock, and returns that grant with the mode and expiry the proof carries.
// It judges neither: a shared grant's proof verifies, and the expiry is not
// compared with any clock (see Grant.Expired). Every failure wraps
// ErrBadProof. VerifyGrant never decodes more than a proof's fixed size,
// whatever it is given.
func VerifyGrant(pub ed25519.PublicKey, lock string, token uint64, proof string) (Grant, error) {
	if len(pub) != ed25519.PublicKeySize {
		return Grant{}, fmt.Errorf("%w: public key is %d bytes, want %d", ErrBadProof, len(pub), ed25519.PublicKeySize)
	}
	if len(proof) == proofLenV1 {
		return Grant{}, fmt.Errorf("%w: a version 1 proof (%d characters, no grant mode), no longer accepted: "+
			"the lock service must be upgraded to sign version %d proofs", ErrBadProof, proofLenV1, proofVersion)
	}
	if len(proof) != ProofLen {
		return Grant{}, fmt.Errorf("%w: %d characters, want %d", ErrBadProof, len(proof), ProofLen)
	}
	// Decode may write up to DecodedLen bytes (75: a last quantum without
	// its padding decodes to one byte more), so the buffer has room for
	// them; n below then rejects them.
	var buf [(ProofLen / 4) * 3]byte
	// Strict: no alternative encodings of the same bytes. The length check
	// above and n below also rule out the CR/LF that base64 would skip.
	n, err := base64.StdEncoding.Strict().Decode(buf[:], []byte(proof))
	raw := buf[:proofRawLen]
	if err != nil || n != proofRawLen {
		return Grant{}, fmt.Errorf("%w: not base64 of %d bytes", ErrBadProof, proofRawLen)
	}
	if raw[0] != proofVersion {
		return Grant{}, fmt.Errorf("%w: format version %d, want %d", ErrBadProof, raw[0], proofVersion)
	}
	mode, ok := modeOf(raw[1])
	if !ok {
		return Grant{}, fmt.Errorf("%w: unknown grant mode %d", ErrBadProof, raw[1])
	}
	exp := int64(binary.BigEndian.Uint64(raw[2:10]))
	if !ed25519.Verify(pub, proofMessage(lock, token, raw[1], exp), raw[10:]) {
		return Grant{}, fmt.Errorf("%w: signature does not match lock %s and token %d", ErrBadProof, quote(lock), token)
	}
	return Grant{Lock: lock, Token: token, Mode: mode, ExpiresAt: exp}, nil
}

// Verify checks that proof is pub's signature over an exclusive grant of
// token on lock, and returns the expiry it carries (Unix milliseconds, 0 for
// none). It is the check for a write: a valid proof of a shared grant gets
// an error wrapping ErrSharedProof (readers cannot write); use VerifyGrant
// to read any proof. It does not compare the expiry with any clock (see
// Grant.Expired). A bad proof gets an error wrapping ErrBadProof.
func Verify(pub ed25519.PublicKey, lock string, token uint64, proof string) (expiresAtUnixMs int64, err error) {
	g, err := VerifyGrant(pub, lock, token, proof)
	if err != nil {
		return 0, err
	}
	if g.Mode != ModeExclusive {
		return 0, fmt.Errorf("%w: lock %s, token %d", ErrSharedProof, quote(lock), token)
	}
	return g.ExpiresAt, nil
}
