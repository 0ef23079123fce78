package tlsfiles_test

import (
	"crypto/x509"
	"errors"
	"net/url"
	"testing"

	"github.com/lockd/lockd/internal/tlsfiles"
)

func TestMemberID(t *testing.T) {
	u := func(s string) *url.URL {
		p, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name string
		uris []*url.URL
		id   string
		err  error
	}{
		{"member", []*url.URL{tlsfiles.MemberURI("prod", "n1")}, "n1", nil},
		{"member among foreign URIs", []*url.URL{u("https://example.com/x"), u("spiffe://example.org/member/n9"),
			u("spiffe://lockd/prod/member/n2")}, "n2", nil},
		{"escaped id", []*url.URL{tlsfiles.MemberURI("prod", "n:1%")}, "n:1%", nil},
		{"no URI", nil, "", tlsfiles.ErrNotMember},
		{"client marker", []*url.URL{tlsfiles.ClientURI("prod", "alice")}, "", tlsfiles.ErrNotMember},
		{"client marker beside a member URI", []*url.URL{tlsfiles.MemberURI("prod", "n1"), tlsfiles.ClientURI("prod", "alice")}, "", tlsfiles.ErrNotMember},
		{"two members", []*url.URL{tlsfiles.MemberURI("prod", "n1"), tlsfiles.MemberURI("prod", "n2")}, "", tlsfiles.ErrNotMember},
		{"other cluster", []*url.URL{tlsfiles.MemberURI("staging", "n1")}, "", tlsfiles.ErrOtherCluster},
		{"slash smuggled in the id", []*url.URL{u("spiffe://lockd/prod/member/n1%2Fx")}, "", tlsfiles.ErrNotMember},
		{"cluster smuggled by an escaped slash", []*url.URL{u("spiffe://lockd/prod%2Fmember/x/n1")}, "", tlsfiles.ErrNotMember},
		{"extra segment", []*url.URL{u("spiffe://lockd/prod/member/n1/x")}, "", tlsfiles.ErrNotMember},
		{"empty id", []*url.URL{u("spiffe://lockd/prod/member/")}, "", tlsfiles.ErrNotMember},
		{"query", []*url.URL{u("spiffe://lockd/prod/member/n1?x=1")}, "", tlsfiles.ErrNotMember},
		{"unknown kind", []*url.URL{u("spiffe://lockd/prod/admin/n1")}, "", tlsfiles.ErrNotMember},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := tlsfiles.MemberID(&x509.Certificate{URIs: c.uris}, "prod")
			if id != c.id || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
				t.Fatalf("MemberID = %q, %v; want %q, %v", id, err, c.id, c.err)
			}
		})
	}
	if got := tlsfiles.MemberURI("prod", "n1").String(); got != "spiffe://lockd/prod/member/n1" {
		t.Fatalf("MemberURI = %s", got)
	}
}

func TestValidateCluster(t *testing.T) {
	for _, ok := range []string{"default", "prod-eu.1", "A_b"} {
		if err := tlsfiles.ValidateCluster(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "..", "a/b", "a b", "é", string(make([]byte, 65))} {
		if err := tlsfiles.ValidateCluster(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
