package fence

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestVerifierAuthenticate: every refusal a fenced resource makes before it
// reads the key's record, with the sentinel a caller matches it by.
func TestVerifierAuthenticate(t *testing.T) {
	pub, priv := testKey()
	_, forger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).UnixMilli()
	good := Sign(priv, "res", 7, exp)
	shared := SignGrant(priv, Grant{Lock: "res", Token: 7, Mode: ModeShared, ExpiresAt: exp})
	signed := Verifier{Key: pub}
	tests := []struct {
		name  string
		v     Verifier
		guard string
		c     Credentials
		want  error // nil: authenticated
	}{
		{"no key: a bare token", Verifier{}, "", Credentials{Token: 7}, nil},
		{"no key: a proof is not looked at", Verifier{}, "", Credentials{Token: 7, Lock: "res", Proof: "garbage"}, nil},
		{"invalid lock name", Verifier{}, "", Credentials{Token: 7, Lock: "bad lock"}, ErrInvalidLock},
		{"too long lock name", Verifier{}, "", Credentials{Token: 7, Lock: strings.Repeat("a", 257)}, ErrInvalidLock},
		{"guard: the right lock", Verifier{}, "res", Credentials{Token: 7, Lock: "res"}, nil},
		{"guard: another lock", Verifier{}, "res", Credentials{Token: 7, Lock: "other"}, ErrLockMismatch},
		{"guard: no lock", Verifier{}, "res", Credentials{Token: 7}, ErrLockMismatch},
		{"valid proof", signed, "", Credentials{Token: 7, Lock: "res", Proof: good}, nil},
		{"valid proof, guarded", signed, "res", Credentials{Token: 7, Lock: "res", Proof: good}, nil},
		{"guard checked before the proof", signed, "other", Credentials{Token: 7, Lock: "res", Proof: good}, ErrLockMismatch},
		{"missing proof", signed, "", Credentials{Token: 7, Lock: "res"}, ErrMissingProof},
		{"missing lock", signed, "", Credentials{Token: 7, Proof: good}, ErrMissingLock},
		{"proof for another token", signed, "", Credentials{Token: 8, Lock: "res", Proof: good}, ErrBadProof},
		{"proof for another lock", signed, "", Credentials{Token: 7, Lock: "other", Proof: good}, ErrBadProof},
		{"forged", signed, "", Credentials{Token: 7, Lock: "res", Proof: Sign(forger, "res", 7, exp)}, ErrBadProof},
		{"a reader's proof", signed, "", Credentials{Token: 7, Lock: "res", Proof: shared}, ErrSharedProof},
		{"wrong-sized key fails closed", Verifier{Key: pub[:16]}, "", Credentials{Token: 7, Lock: "res", Proof: good}, ErrBadProof},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			adm, err := tc.v.Authenticate("k", tc.guard, tc.c)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Authenticate = %v, want nil", err)
				}
				w := adm.Write()
				if adm.Key != "k" || w.Token != tc.c.Token || w.Lock != tc.c.Lock || w.Guarded != (tc.guard != "") {
					t.Fatalf("admission %+v, write %+v", adm, w)
				}
				if tc.v.Key != nil && (adm.Mode != ModeExclusive || adm.ProofExpiresAt != exp) {
					t.Fatalf("a verified proof's mode and expiry not carried: %+v", adm)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Authenticate = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifierExpired(t *testing.T) {
	pub, priv := testKey()
	exp := time.Now().Add(time.Hour).UnixMilli()
	clock := func(ms int64) func() time.Time { return func() time.Time { return time.UnixMilli(ms) } }
	v := Verifier{Key: pub, Now: clock(exp - 1)}
	adm, err := v.Authenticate("k", "", Credentials{Token: 7, Lock: "res", Proof: Sign(priv, "res", 7, exp)})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Expired(adm); err != nil {
		t.Fatalf("a millisecond before its expiry: %v", err)
	}
	v.Now = clock(exp)
	if err := v.Expired(adm); !errors.Is(err, ErrExpiredProof) || !strings.Contains(err.Error(), "acquiring again") {
		t.Fatalf("at its expiry: %v, want ErrExpiredProof", err)
	}
	v.AcceptExpired = true
	if err := v.Expired(adm); err != nil {
		t.Fatalf("with AcceptExpired: %v", err)
	}
	never, err := (Verifier{Key: pub}).Authenticate("k", "", Credentials{Token: 8, Lock: "res", Proof: Sign(priv, "res", 8, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := (Verifier{Key: pub, Now: clock(1 << 62)}).Expired(never); err != nil {
		t.Fatalf("a grant without expiry: %v", err)
	}
	if err := (Verifier{}).Expired(Admission{Token: 1}); err != nil {
		t.Fatalf("no proof checked: %v", err)
	}
}
