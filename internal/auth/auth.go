// Package auth checks bearer tokens against per-lock-prefix permissions
// loaded from a file. The file is re-read on demand (lockd does it on
// SIGHUP); a bad file is refused and the previous rules stay in force.
//
// File format (JSON):
//
//	{"tokens": [
//	  {"name": "billing", "token": "s3cr3t", "permissions": [{"prefix": "billing/", "access": "lock"}]},
//	  {"name": "ops", "token": "sha256:9f86d0...", "permissions": [{"prefix": "", "access": "admin"}]}
//	]}
//
// Access levels nest: read < lock < admin. read: lock status, lists and
// watches (also over a WebSocket, which then carries no session). lock:
// acquire, release, renew, values, sessions. admin: cluster membership,
// leadership transfer and snapshots (an admin permission must have the
// empty prefix to reach these, since they are not about one lock). A token
// written "sha256:<hex>" is stored hashed.
//
// Rules apply to every request, also to those of a WebSocket opened before
// a Reload: connections keep the Identity they authenticated and Refresh it
// per request, which costs one atomic load until the rules change.
//
// A token's name is its identity: lockd records it as the owner of the
// sessions the token creates (only that identity, or an admin, may use a
// session) and counts the per-token quotas by it. Two entries with the same
// name are one identity, which is how a token is rotated without losing
// its sessions; give different tenants different names.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// Access is a permission level.
type Access int

// Levels, each including the ones below.
const (
	Read Access = iota + 1
	Lock
	Admin
)

func (a Access) String() string {
	switch a {
	case Read:
		return "read"
	case Lock:
		return "lock"
	case Admin:
		return "admin"
	}
	return "none"
}

func parseAccess(s string) (Access, error) {
	switch s {
	case "read":
		return Read, nil
	case "lock":
		return Lock, nil
	case "admin":
		return Admin, nil
	}
	return 0, fmt.Errorf("access %q: want read, lock or admin", s)
}

// Errors of Check, matched with errors.Is.
var (
	ErrUnauthenticated  = errors.New("auth: missing or unknown token")
	ErrPermissionDenied = errors.New("auth: permission denied")
)

type permission struct {
	prefix string
	access Access
}

type token struct {
	name  string
	hash  [32]byte
	perms []permission
}

// Store holds the rules; safe for concurrent use.
type Store struct {
	path   string
	mu     sync.RWMutex
	tokens []token
	// gen counts the rule sets installed (written under mu, read without
	// it): an Identity authenticated under one generation is current until
	// the next Reload, which is what makes Refresh cheap.
	gen atomic.Uint64
	// changed is closed (and replaced) by every Reload that installs rules.
	changed chan struct{}
}

type fileFormat struct {
	Tokens []struct {
		Name        string `json:"name"`
		Token       string `json:"token"`
		Permissions []struct {
			Prefix string `json:"prefix"`
			Access string `json:"access"`
		} `json:"permissions"`
	} `json:"tokens"`
}

// Load reads the rules from path.
func Load(path string) (*Store, error) {
	s := &Store{path: path, changed: make(chan struct{})}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the file. On error the previous rules stay.
func (s *Store) Reload() error {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	var f fileFormat
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return fmt.Errorf("auth: %s: %w", s.path, err)
	}
	var toks []token
	seen := map[[32]byte]bool{}
	for i, t := range f.Tokens {
		if t.Name == "" {
			return fmt.Errorf("auth: token %d has no name", i)
		}
		if err := validName(t.Name); err != nil {
			return fmt.Errorf("auth: token %d: %w", i, err)
		}
		var h [32]byte
		if hexed, ok := strings.CutPrefix(t.Token, "sha256:"); ok {
			raw, err := hex.DecodeString(hexed)
			if err != nil || len(raw) != 32 {
				return fmt.Errorf("auth: token %q: sha256: needs 64 hex digits", t.Name)
			}
			copy(h[:], raw)
		} else {
			if len(t.Token) < 16 {
				return fmt.Errorf("auth: token %q is shorter than 16 characters", t.Name)
			}
			h = sha256.Sum256([]byte(t.Token))
		}
		if seen[h] {
			return fmt.Errorf("auth: token %q is a duplicate", t.Name)
		}
		seen[h] = true
		tok := token{name: t.Name, hash: h}
		for _, p := range t.Permissions {
			a, err := parseAccess(p.Access)
			if err != nil {
				return fmt.Errorf("auth: token %q: %w", t.Name, err)
			}
			tok.perms = append(tok.perms, permission{prefix: p.Prefix, access: a})
		}
		toks = append(toks, tok)
	}
	s.mu.Lock()
	s.tokens = toks
	s.gen.Add(1)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// Generation counts the rule sets installed so far: it changes exactly
// when a Reload installs new rules, so a check made at one generation holds
// while Generation still returns it.
func (s *Store) Generation() uint64 { return s.gen.Load() }

// Changed returns a channel closed by the next Reload that installs new
// rules (a refused file installs none). Holders of long-lived identities
// (WebSocket connections) wait on it to check them again.
func (s *Store) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

// Identity is an authenticated token.
type Identity struct {
	Name  string
	perms []permission
	// hash is the token's digest and gen the Store generation it was
	// checked at: Refresh looks the token up again after a Reload.
	hash [32]byte
	gen  uint64
}

// Authenticate finds the token. Tokens are compared as SHA-256 digests in
// constant time.
func (s *Store) Authenticate(bearer string) (Identity, error) {
	if bearer == "" {
		return Identity{}, ErrUnauthenticated
	}
	return s.lookup(sha256.Sum256([]byte(bearer)))
}

// lookup finds the token with digest h in the rules in force.
func (s *Store) lookup(h [32]byte) (Identity, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found *token
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(h[:], s.tokens[i].hash[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	if found == nil {
		return Identity{}, ErrUnauthenticated
	}
	return Identity{Name: found.name, perms: found.perms, hash: h, gen: s.gen.Load()}, nil
}

// Refresh checks an identity authenticated earlier against the rules in
// force now: while no Reload happened since, it returns id as it is (one
// atomic load, no hashing: cheap enough for every frame of a WebSocket);
// after one, it looks the token up again and returns what it is now —
// ErrUnauthenticated when the token was removed, else its current name and
// permissions (which may have shrunk or grown).
func (s *Store) Refresh(id Identity) (Identity, error) {
	if id.gen == s.gen.Load() {
		return id, nil
	}
	return s.lookup(id.hash)
}

// MaxName bounds a token's name: it is stored in the replicated state as
// the owner of sessions, locks and waits.
const MaxName = 128

func validName(name string) error {
	if len(name) > MaxName {
		return fmt.Errorf("name is %d bytes, the limit is %d", len(name), MaxName)
	}
	if !utf8.ValidString(name) {
		return errors.New("name is not valid UTF-8")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("name %q has a non-printable character", name)
		}
	}
	return nil
}

// IsAdmin reports whether the identity has admin access to the whole
// cluster (an admin permission on the empty prefix).
func (id Identity) IsAdmin() bool { return id.Allows(Admin, "") }

// Allows reports whether the identity has at least access on lock name (a
// lock name, a list prefix, or "" for cluster-wide operations).
func (id Identity) Allows(access Access, name string) bool {
	for _, p := range id.perms {
		if p.access >= access && strings.HasPrefix(name, p.prefix) {
			return true
		}
	}
	return false
}

// AllowsAny reports whether the identity has at least access on some
// prefix (sessions and WebSocket connections are not about one lock; each
// lock they touch is checked on its own).
func (id Identity) AllowsAny(access Access) bool {
	for _, p := range id.perms {
		if p.access >= access {
			return true
		}
	}
	return false
}

// Check authenticates and authorizes in one step.
func (s *Store) Check(bearer string, access Access, name string) (Identity, error) {
	id, err := s.Authenticate(bearer)
	if err != nil {
		return id, err
	}
	if !id.Allows(access, name) {
		return id, fmt.Errorf("%w: token %q lacks %s access to %q", ErrPermissionDenied, id.Name, access, name)
	}
	return id, nil
}
