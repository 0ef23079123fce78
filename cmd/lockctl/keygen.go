package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/fence"
)

// keygenReply is keygen's -o json output.
type keygenReply struct {
	Private string `json:"private"`
	Public  string `json:"public"`
}

// keygen writes a new Ed25519 key pair for signed fencing tokens: the
// private key for every lockd member (--signing-key), the public key for the
// resource servers (fencestore --verify-key, fence.WithVerifyKey). It needs
// no cluster.
func (e *env) keygenCmd() *cobra.Command {
	var priv, pub string
	var force bool
	c := &cobra.Command{
		Use:   "keygen [--private F] [--public F] [--force]",
		Short: "write a new Ed25519 key pair for signed fencing tokens (needs no cluster)",
		Long: `Write a new Ed25519 key pair for signed fencing tokens (needs no cluster):
the private key (default lockd-signing.pem, mode 0600) for every lockd
member's --signing-key, the public key (default lockd-verify.pem) for
fencestore --verify-key. Refuses to replace existing files unless --force.`,
		Args: positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if priv == "" || pub == "" {
				return errors.New("keygen: --private and --public must not be empty")
			}
			if samePath(priv, pub) {
				return fmt.Errorf("keygen: --private and --public are the same file %q", priv)
			}
			return status(e.keygen(priv, pub, force))
		},
	}
	c.Flags().StringVar(&priv, "private", "lockd-signing.pem", "where to write the private key `F` (PEM, PKCS #8, mode 0600): lockd --signing-key")
	c.Flags().StringVar(&pub, "public", "lockd-verify.pem", "where to write the public key `F` (PEM, PKIX, mode 0644): fencestore --verify-key")
	c.Flags().BoolVar(&force, "force", false, "replace existing key files")
	return c
}

// keygen writes a new Ed25519 key pair for signed fencing tokens: the
// private key for every lockd member (--signing-key), the public key for
// the resource servers (fencestore --verify-key, fence.WithVerifyKey). It
// needs no cluster.
func (e *env) keygen(priv, pub string, force bool) int {
	var err error
	if force {
		err = replaceKeyFiles(priv, pub)
	} else {
		for _, p := range []string{priv, pub} {
			if _, serr := os.Lstat(p); serr == nil {
				fmt.Fprintf(e.stderr, "lockctl: keygen: %s exists; not replacing a key that may be in use (pass --force to replace it)\n", safe(p))
				return exitError
			}
		}
		err = fence.GenerateKeyFiles(priv, pub)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl: keygen: %s\n", safe(err.Error()))
		return exitError
	}
	e.print(keygenReply{Private: priv, Public: pub}, fmt.Sprintf(
		"wrote private key %s (keep it secret; give the same file to every lockd member: lockd --signing-key %s)\n"+
			"wrote public key  %s (for resource servers: fencestore --verify-key %s)",
		priv, priv, pub, pub))
	return exitOK
}

// samePath reports whether a and b name the same file, as far as can be
// told without either existing.
func samePath(a, b string) bool {
	if fa, err := os.Stat(a); err == nil {
		if fb, err := os.Stat(b); err == nil {
			return os.SameFile(fa, fb)
		}
	}
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == bb
}

// replaceKeyFiles writes a new pair next to the targets under temporary
// names, then renames them over the targets, so a reader never sees a
// half-written key. Should the second rename fail, the first file is
// already new: the error says so.
func replaceKeyFiles(priv, pub string) error {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	suffix := ".tmp-" + hex.EncodeToString(rnd[:])
	tmpPriv, tmpPub := priv+suffix, pub+suffix
	if err := fence.GenerateKeyFiles(tmpPriv, tmpPub); err != nil {
		return err
	}
	for _, p := range []string{priv, pub} {
		if fi, err := os.Lstat(p); err == nil && !fi.Mode().IsRegular() {
			_ = os.Remove(tmpPriv)
			_ = os.Remove(tmpPub)
			return fmt.Errorf("%s is not a regular file; not replacing it", p)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(tmpPriv)
			_ = os.Remove(tmpPub)
			return err
		}
	}
	if err := os.Rename(tmpPriv, priv); err != nil {
		_ = os.Remove(tmpPriv)
		_ = os.Remove(tmpPub)
		return err
	}
	if err := os.Rename(tmpPub, pub); err != nil {
		_ = os.Remove(tmpPub)
		return fmt.Errorf("%s was replaced but %s was not (%w): run keygen --force again", priv, pub, err)
	}
	syncDir(filepath.Dir(priv))
	syncDir(filepath.Dir(pub))
	return nil
}

// syncDir makes a rename in dir durable, where the platform allows.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
