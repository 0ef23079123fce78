package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPermissions(t *testing.T) {
	sum := sha256.Sum256([]byte("hashed-token-000001"))
	p := write(t, `{"tokens": [
	  {"name": "a", "token": "token-for-prefix-a", "permissions": [{"prefix": "a/", "access": "lock"}]},
	  {"name": "r", "token": "token-read-only-01", "permissions": [{"prefix": "", "access": "read"}]},
	  {"name": "ops", "token": "sha256:`+hex.EncodeToString(sum[:])+`", "permissions": [{"prefix": "", "access": "admin"}]}
	]}`)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		token  string
		access Access
		name   string
		want   error
	}{
		{"", Read, "x", ErrUnauthenticated},
		{"nope", Read, "x", ErrUnauthenticated},
		{"token-for-prefix-a", Lock, "a/x", nil},
		{"token-for-prefix-a", Read, "a/x", nil},
		{"token-for-prefix-a", Lock, "b/x", ErrPermissionDenied},
		{"token-for-prefix-a", Lock, "a", ErrPermissionDenied},
		{"token-for-prefix-a", Admin, "", ErrPermissionDenied},
		{"token-read-only-01", Read, "anything", nil},
		{"token-read-only-01", Lock, "anything", ErrPermissionDenied},
		{"hashed-token-000001", Admin, "", nil},
		{"hashed-token-000001", Lock, "z", nil},
		{"sha256:" + hex.EncodeToString(sum[:]), Read, "x", ErrUnauthenticated}, // the hash is not the token
	}
	for _, c := range cases {
		_, err := s.Check(c.token, c.access, c.name)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Check(%q, %s, %q) = %v, want %v", c.token, c.access, c.name, err, c.want)
		}
	}
}

func TestReloadKeepsRulesOnError(t *testing.T) {
	p := write(t, `{"tokens": [{"name": "a", "token": "first-token-000001", "permissions": [{"prefix": "", "access": "lock"}]}]}`)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`{"tokens": [`,
		`{"tokens": [{"name": "a", "token": "short", "permissions": []}]}`,
		`{"tokens": [{"name": "a", "token": "first-token-000001", "permissions": [{"prefix": "", "access": "root"}]}]}`,
		`{"tokens": [{"token": "first-token-000001"}]}`,
		`{"tokens": [], "extra": 1}`,
		`{"tokens": [{"name": "` + strings.Repeat("n", MaxName+1) + `", "token": "first-token-000001"}]}`,
		`{"tokens": [{"name": "a\u0007b", "token": "first-token-000001"}]}`,
	} {
		os.WriteFile(p, []byte(bad), 0o600)
		if err := s.Reload(); err == nil {
			t.Fatalf("accepted %s", bad)
		}
		if _, err := s.Check("first-token-000001", Lock, "x"); err != nil {
			t.Fatalf("rules lost after a failed reload: %v", err)
		}
	}
	os.WriteFile(p, []byte(`{"tokens": [{"name": "b", "token": "second-token-00001", "permissions": [{"prefix": "", "access": "lock"}]}]}`), 0o600)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check("first-token-000001", Lock, "x"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("rotated-out token still works: %v", err)
	}
}

// TestIdentity: a token's name is its identity (what owns its sessions and
// what per-token quotas count), at most MaxName printable bytes; IsAdmin is
// admin access on the empty prefix.
func TestIdentity(t *testing.T) {
	long := strings.Repeat("n", MaxName)
	p := write(t, `{"tokens": [
	  {"name": "`+long+`", "token": "token-with-long-name", "permissions": [{"prefix": "", "access": "admin"}]},
	  {"name": "billing", "token": "token-for-billing-1", "permissions": [{"prefix": "billing/", "access": "admin"}]},
	  {"name": "billing", "token": "token-for-billing-2", "permissions": [{"prefix": "billing/", "access": "lock"}]}
	]}`)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token, name string
		admin       bool
	}{
		{"token-with-long-name", long, true},
		{"token-for-billing-1", "billing", false}, // admin on a prefix is not cluster admin
		{"token-for-billing-2", "billing", false}, // the same name: the same identity
	} {
		id, err := s.Authenticate(c.token)
		if err != nil {
			t.Fatal(err)
		}
		if id.Name != c.name || id.IsAdmin() != c.admin {
			t.Errorf("%s: name %q admin %v, want %q %v", c.token, id.Name, id.IsAdmin(), c.name, c.admin)
		}
	}
	if (Identity{}).IsAdmin() {
		t.Error("the zero identity is admin")
	}
}

// TestRefresh: an identity authenticated before a Reload is checked again
// against the new rules (removed token: unauthenticated; changed access:
// the new access); without a Reload it is returned as it is; a refused file
// changes nothing; Changed fires on every Reload that installs rules.
func TestRefresh(t *testing.T) {
	p := write(t, `{"tokens": [
	  {"name": "a", "token": "token-for-a-000001", "permissions": [{"prefix": "a/", "access": "lock"}]},
	  {"name": "b", "token": "token-for-b-000001", "permissions": [{"prefix": "", "access": "lock"}]}
	]}`)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Authenticate("token-for-a-000001")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Authenticate("token-for-b-000001")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Refresh(a); err != nil || got.Name != "a" || !got.Allows(Lock, "a/x") {
		t.Fatalf("Refresh without a reload: %+v %v", got, err)
	}
	changed, gen := s.Changed(), s.Generation()
	os.WriteFile(p, []byte(`{"tokens": [`), 0o600)
	if s.Reload() == nil {
		t.Fatal("a broken file was accepted")
	}
	select {
	case <-changed:
		t.Fatal("Changed fired for a refused file")
	default:
	}
	if got, err := s.Refresh(b); err != nil || !got.Allows(Lock, "x") || s.Generation() != gen {
		t.Fatalf("a refused reload changed the rules: %+v %v", got, err)
	}
	// b removed; a narrowed to read on a/ and given lock on c/.
	os.WriteFile(p, []byte(`{"tokens": [
	  {"name": "a", "token": "token-for-a-000001", "permissions": [{"prefix": "a/", "access": "read"}, {"prefix": "c/", "access": "lock"}]}
	]}`), 0o600)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed did not fire on a reload")
	}
	if s.Generation() == gen {
		t.Fatal("Generation did not move on a reload")
	}
	if _, err := s.Refresh(b); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("removed token refreshed: %v", err)
	}
	got, err := s.Refresh(a)
	if err != nil {
		t.Fatal(err)
	}
	if got.Allows(Lock, "a/x") || !got.Allows(Read, "a/x") || !got.Allows(Lock, "c/x") {
		t.Fatalf("refreshed identity has the old access: %+v", got)
	}
	if again, err := s.Refresh(got); err != nil || again.gen != got.gen {
		t.Fatalf("a current identity was looked up again: %+v %v", again, err)
	}
	if _, err := s.Refresh(Identity{}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("the zero identity refreshed: %v", err)
	}
}
