package fence

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
)

// PEM block types of the key files.
const (
	pemPrivate = "PRIVATE KEY" // PKCS #8
	pemPublic  = "PUBLIC KEY"  // PKIX
)

// maxKeyFile bounds what the loaders read: a PEM Ed25519 key is ~120 bytes.
const maxKeyFile = 64 << 10

// GenerateKeyFiles makes a new Ed25519 key pair and writes the private key
// (PEM, PKCS #8, mode 0600) to privPath and the public key (PEM, PKIX, mode
// 0644) to pubPath. It refuses to overwrite an existing file, so a key in use
// is never replaced by accident.
func GenerateKeyFiles(privPath, pubPath string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("fence: generate key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("fence: marshal private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("fence: marshal public key: %w", err)
	}
	if err := writeNewFile(privPath, pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: privDER}), 0o600); err != nil {
		return err
	}
	if err := writeNewFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: pubDER}), 0o644); err != nil {
		_ = os.Remove(privPath) // no half-made pair left behind
		return err
	}
	return nil
}

func writeNewFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("fence: create key file: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("fence: write key file %s: %w", path, err)
	}
	return nil
}

// LoadPrivateKey reads an Ed25519 private key from a PEM "PRIVATE KEY"
// (PKCS #8) file, as written by GenerateKeyFiles.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	der, err := readPEM(path, pemPrivate)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("fence: %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("fence: %s: a %T, want an Ed25519 key", path, k)
	}
	return priv, nil
}

// LoadPublicKey reads an Ed25519 public key from a PEM "PUBLIC KEY" (PKIX)
// file, as written by GenerateKeyFiles.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	der, err := readPEM(path, pemPublic)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("fence: %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("fence: %s: a %T, want an Ed25519 key", path, k)
	}
	return pub, nil
}

// readPEM returns the DER bytes of the first PEM block of path, which must
// have type typ.
func readPEM(path, typ string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("fence: read %s: %w", path, err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("fence: %s: larger than %d bytes, not a key file", path, maxKeyFile)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("fence: %s: no PEM block", path)
	}
	if block.Type != typ {
		return nil, fmt.Errorf("fence: %s: PEM block %q, want %q", path, block.Type, typ)
	}
	return block.Bytes, nil
}
