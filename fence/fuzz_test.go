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

// FuzzVerifyProof: Verify never panics on any input; whatever verifies is
// exactly the proof Sign makes for that lock, token and expiry (so no
// other string verifies); and a valid proof changed in one byte never
// verifies.
func FuzzVerifyProof(f *testing.F) {
	pub, priv := testKey()
	f.Add("res", uint64(42), int64(1_750_000_000_000), Sign(priv, "res", 42, 1_750_000_000_000), 0, byte(1))
	f.Add("jobs/nightly", uint64(1), int64(-1), Sign(priv, "jobs/nightly", 1, -1), 95, byte('A'^'B'))
	f.Add("", uint64(0), int64(0), "", 10, byte(0))
	f.Fuzz(func(t *testing.T, lock string, token uint64, exp int64, proof string, pos int, delta byte) {
		// Arbitrary input.
		if got, err := Verify(pub, lock, token, proof); err == nil {
			if want := Sign(priv, lock, token, got); proof != want {
				t.Fatalf("Verify accepted %q for (%q, %d), but Sign gives %q", proof, lock, token, want)
			}
		}
		// A valid proof, mutated in one byte.
		valid := Sign(priv, lock, token, exp)
		if got, err := Verify(pub, lock, token, valid); err != nil || got != exp {
			t.Fatalf("Verify(Sign(...)) = %d, %v; want %d", got, err, exp)
		}
		if delta == 0 {
			return
		}
		b := []byte(valid)
		if pos < 0 {
			pos = -(pos + 1)
		}
		b[pos%len(b)] ^= delta
		if _, err := Verify(pub, lock, token, string(b)); err == nil {
			t.Fatalf("Verify accepted %q, a mutation of %q", b, valid)
		}
	})
}
