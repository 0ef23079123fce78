package fence

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		{"padding replaced by data", pub, "res", 42, good[:ProofLen-1] + "A"},
		{"padding removed", pub, "res", 42, strings.TrimRight(good, "=")},
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

// TestProofCoversMode: a proof states its grant's mode; a shared grant's
// proof verifies as shared but never passes Verify (the check for a
// write), and changing its mode byte to exclusive breaks the signature.
func TestProofCoversMode(t *testing.T) {
	pub, priv := testKey()
	const exp = int64(1_750_000_000_123)
	shared := SignGrant(priv, Grant{Lock: "res", Token: 42, Mode: ModeShared, ExpiresAt: exp})
	g, err := VerifyGrant(pub, "res", 42, shared)
	if err != nil || g != (Grant{Lock: "res", Token: 42, Mode: ModeShared, ExpiresAt: exp}) {
		t.Fatalf("VerifyGrant(shared) = %+v, %v", g, err)
	}
	if _, err := Verify(pub, "res", 42, shared); !errors.Is(err, ErrSharedProof) {
		t.Fatalf("Verify(shared) = %v, want ErrSharedProof", err)
	}
	raw, err := base64.StdEncoding.DecodeString(shared)
	if err != nil {
		t.Fatal(err)
	}
	raw[1] = modeByteExclusive // the reader claims to be a writer
	if _, err := VerifyGrant(pub, "res", 42, base64.StdEncoding.EncodeToString(raw)); !errors.Is(err, ErrBadProof) {
		t.Fatalf("a shared proof relabelled exclusive: %v, want ErrBadProof", err)
	}
	exclusive := Sign(priv, "res", 42, exp)
	if g, err := VerifyGrant(pub, "res", 42, exclusive); err != nil || g.Mode != ModeExclusive {
		t.Fatalf("VerifyGrant(Sign(...)) = %+v, %v; want exclusive", g, err)
	}
	if exclusive == shared {
		t.Fatal("the two modes' proofs are equal")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("SignGrant signed an unknown mode")
		}
	}()
	SignGrant(priv, Grant{Lock: "res", Token: 42, Mode: "writer"})
}

// TestProofFormatVersion2 pins the signed message: a format change that
// does not bump the version (and this test) shows up here. A version 1
// proof, which covered no mode, is refused with a message saying so.
func TestProofFormatVersion2(t *testing.T) {
	pub, priv := testKey()
	const v2 = "AgEAAAGXdCDcAN8efxpV+H7WsKtGi5cYphENDYBXkZoKrKcw4tCws0SYy459G0FXchLX8rsBJEYQLE1Y9ldelVXCt6Q8zKZkww0="
	if got := Sign(priv, "res", 42, 1_750_000_000_000); got != v2 {
		t.Fatalf("Sign = %q, want the pinned %q", got, v2)
	}
	if len(v2) != ProofLen || ProofLen != 100 {
		t.Fatalf("ProofLen = %d", ProofLen)
	}
	// The same grant signed by the previous release (domain lockd-fence-v1).
	const v1 = "AAABl3Qg3AD693+XW7EmjZvq8sH74OpIUdVSjbmgDO1pBm62XoholsHFBO3pTaf2W2VWp+2SzhfXzSt0gBml9+7wIJ2tEGEE"
	_, err := Verify(pub, "res", 42, v1)
	if !errors.Is(err, ErrBadProof) || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("Verify(v1 proof) = %v, want ErrBadProof naming version 1", err)
	}
	raw, _ := base64.StdEncoding.DecodeString(v2)
	raw[0] = 3
	if _, err := Verify(pub, "res", 42, base64.StdEncoding.EncodeToString(raw)); !errors.Is(err, ErrBadProof) || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("Verify(version 3) = %v", err)
	}
}

func TestGrantExpired(t *testing.T) {
	now := time.UnixMilli(1_000)
	for _, tc := range []struct {
		exp  int64
		want bool
	}{{999, true}, {1_000, true}, {1_001, false}, {0, false}, {-1, true}} {
		if got := (Grant{ExpiresAt: tc.exp}).Expired(now); got != tc.want {
			t.Errorf("Grant{ExpiresAt: %d}.Expired(1000) = %v, want %v", tc.exp, got, tc.want)
		}
	}
}
