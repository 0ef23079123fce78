package fence

import (
	"strconv"
	"testing"
)

// FuzzParseToken: ParseToken never panics, accepts exactly the strings of
// ASCII digits (at most maxTokenHeaderLen) that fit a uint64, and agrees
// with strconv on them.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"0", "42", "18446744073709551615", "18446744073709551616", "", "-1", "+1", "0x1f", "1_0", " 1", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseToken(s)
		digits := s != "" && len(s) <= maxTokenHeaderLen
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				digits = false
			}
		}
		want, werr := strconv.ParseUint(s, 10, 64)
		if digits && werr == nil {
			if err != nil || n != want {
				t.Fatalf("ParseToken(%q) = %d, %v; want %d", s, n, err, want)
			}
			return
		}
		if err == nil {
			t.Fatalf("ParseToken(%q) = %d, want an error", s, n)
		}
	})
}

// FuzzVerifyProof: VerifyGrant and Verify never panic on any input;
// whatever verifies is exactly the proof SignGrant makes for that lock,
// token, mode and expiry (so no other string verifies); Verify accepts only
// an exclusive grant's proof; and a valid proof of either mode changed in
// one byte never verifies. The seeds in testdata include version 1 proofs
// (refused) and version 2 ones.
func FuzzVerifyProof(f *testing.F) {
	pub, priv := testKey()
	f.Add("res", uint64(42), int64(1_750_000_000_000), Sign(priv, "res", 42, 1_750_000_000_000), 0, byte(1))
	f.Add("jobs/nightly", uint64(1), int64(-1), Sign(priv, "jobs/nightly", 1, -1), 95, byte('A'^'B'))
	f.Add("res", uint64(7), int64(0), SignGrant(priv, Grant{Lock: "res", Token: 7, Mode: ModeShared}), 2, byte(3))
	f.Add("", uint64(0), int64(0), "", 10, byte(0))
	f.Fuzz(func(t *testing.T, lock string, token uint64, exp int64, proof string, pos int, delta byte) {
		// Arbitrary input.
		got, err := VerifyGrant(pub, lock, token, proof)
		if err == nil {
			if got.Lock != lock || got.Token != token {
				t.Fatalf("VerifyGrant(%q, %d) = %+v", lock, token, got)
			}
			if want := SignGrant(priv, got); proof != want {
				t.Fatalf("VerifyGrant accepted %q for %+v, but SignGrant gives %q", proof, got, want)
			}
		}
		if gotExp, verr := Verify(pub, lock, token, proof); (verr == nil) != (err == nil && got.Mode == ModeExclusive) ||
			verr == nil && gotExp != got.ExpiresAt {
			t.Fatalf("Verify = %d, %v; VerifyGrant = %+v, %v", gotExp, verr, got, err)
		}
		// A valid proof of each mode, mutated in one byte.
		if pos < 0 {
			pos = -(pos + 1)
		}
		for _, mode := range []Mode{ModeExclusive, ModeShared} {
			g := Grant{Lock: lock, Token: token, Mode: mode, ExpiresAt: exp}
			valid := SignGrant(priv, g)
			if len(valid) != ProofLen {
				t.Fatalf("SignGrant made %d characters, want %d", len(valid), ProofLen)
			}
			if back, err := VerifyGrant(pub, lock, token, valid); err != nil || back != g {
				t.Fatalf("VerifyGrant(SignGrant(%+v)) = %+v, %v", g, back, err)
			}
			if delta == 0 {
				continue
			}
			b := []byte(valid)
			b[pos%len(b)] ^= delta
			if _, err := VerifyGrant(pub, lock, token, string(b)); err == nil {
				t.Fatalf("VerifyGrant accepted %q, a mutation of %q", b, valid)
			}
		}
	})
}
