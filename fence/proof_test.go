package fence

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testKey is a fixed key, so fuzz seeds stay valid across runs.
func testKey() (ed25519.PublicKey, ed25519.PrivateKey) {
	priv := ed25519.NewKeyFromSeed([]byte("lockd-fence-test-seed-0123456789"))
	return priv.Public().(ed25519.PublicKey), priv
}

func TestSignVerify(t *testing.T) {
	pub, priv := testKey()
	otherPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	const exp = int64(1_750_000_000_123)
	good := Sign(priv, "res", 42, exp)
	if len(good) != ProofLen {
		t.Fatalf("len(proof) = %d, want %d", len(good), ProofLen)
	}
	// flip changes one character of the proof to another base64 character.
	flip := func(i int) string {
		b := []byte(good)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}

	got, err := Verify(pub, "res", 42, good)
	if err != nil || got != exp {
		t.Fatalf("Verify(good) = %d, %v; want %d", got, err, exp)
	}

	tests := []struct {
		name  string
		pub   ed25519.PublicKey
		lock  string
		token uint64
		proof string
	}{
		{"other lock", pub, "res2", 42, good},
		{"other token", pub, "res", 43, good},
		{"other key", otherPub, "res", 42, good},
		{"nil key", nil, "res", 42, good},
		{"short key", pub[:31], "res", 42, good},
		{"empty proof", pub, "res", 42, ""},
		{"truncated", pub, "res", 42, good[:len(good)-4]},
		{"extended", pub, "res", 42, good + "AAAA"},
		{"not base64", pub, "res", 42, strings.Repeat("!", ProofLen)},
		{"url-safe alphabet char", pub, "res", 42, good[:5] + "-" + good[6:]},
		{"newline inside", pub, "res", 42, good[:10] + "\n" + good[11:]},
		{"expiry changed", pub, "res", 42, flip(2)},
		{"signature changed", pub, "res", 42, flip(50)},
		{"last char changed", pub, "res", 42, flip(ProofLen - 1)},
		{"lock NUL splice", pub, "res\x00", 42, good},
		{"huge", pub, "res", 42, strings.Repeat("A", 1<<20)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Verify(tc.pub, tc.lock, tc.token, tc.proof); !errors.Is(err, ErrBadProof) {
				t.Fatalf("Verify = %v, want ErrBadProof", err)
			}
		})
	}
}

func TestSignDeterministicAndNegativeExpiry(t *testing.T) {
	pub, priv := testKey()
	if Sign(priv, "a", 1, -5) != Sign(priv, "a", 1, -5) {
		t.Fatal("Sign is not deterministic")
	}
	if exp, err := Verify(pub, "a", 1, Sign(priv, "a", 1, -5)); err != nil || exp != -5 {
		t.Fatalf("Verify = %d, %v; want -5", exp, err)
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	privPath, pubPath := filepath.Join(dir, "fence.key"), filepath.Join(dir, "fence.pub")
	if err := GenerateKeyFiles(privPath, pubPath); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(privPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode = %v, want 0600", st.Mode().Perm())
	}
	priv, err := LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(pub, "l", 3, Sign(priv, "l", 3, 99)); err != nil {
		t.Fatalf("loaded keys do not match: %v", err)
	}
	pemText, _ := os.ReadFile(pubPath)
	if !strings.HasPrefix(string(pemText), "-----BEGIN PUBLIC KEY-----") {
		t.Fatalf("public key file:\n%s", pemText)
	}

	t.Run("refuses to overwrite", func(t *testing.T) {
		if err := GenerateKeyFiles(privPath, filepath.Join(dir, "new.pub")); err == nil {
			t.Fatal("overwrote an existing private key")
		}
		if again, _ := LoadPrivateKey(privPath); !again.Equal(priv) {
			t.Fatal("private key changed")
		}
	})
	t.Run("wrong block types", func(t *testing.T) {
		if _, err := LoadPublicKey(privPath); err == nil {
			t.Fatal("LoadPublicKey accepted a private key file")
		}
		if _, err := LoadPrivateKey(pubPath); err == nil {
			t.Fatal("LoadPrivateKey accepted a public key file")
		}
	})
	t.Run("garbage", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.pem")
		if err := os.WriteFile(bad, []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadPublicKey(bad); err == nil {
			t.Fatal("LoadPublicKey accepted garbage")
		}
		if _, err := LoadPublicKey(filepath.Join(dir, "missing")); err == nil {
			t.Fatal("LoadPublicKey accepted a missing file")
		}
	})
}
