package tlsfiles

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Who a certificate speaks for is a URI SAN in lockd's SPIFFE-shaped
// namespace:
//
//	spiffe://lockd/<cluster-id>/member/<member-id>   a member: may speak Raft
//	spiffe://lockd/<cluster-id>/client/<name>        a client: never speaks Raft
//
// A certificate without either is an ordinary client certificate. Chaining
// to the peer CA is not enough on the Raft port: operators commonly use one
// CA for clients and members, and any certificate that reached the Raft
// state machine could append entries.
const (
	uriScheme = "spiffe"
	uriHost   = "lockd"
	kindMemb  = "member"
	kindCli   = "client"
)

// DefaultCluster is the cluster id lockd uses when none is configured.
const DefaultCluster = "default"

// Sentinel errors of the peer identity checks.
var (
	// ErrNotMember: the certificate names no member (an ordinary or an
	// explicit client certificate).
	ErrNotMember = errors.New("not a lockd member certificate")
	// ErrOtherCluster: a member certificate of another cluster.
	ErrOtherCluster = errors.New("member certificate of another cluster")
	// ErrUnknownMember: a member certificate of this cluster whose id is not
	// in the Raft configuration.
	ErrUnknownMember = errors.New("member is not in the Raft configuration")
	// ErrWrongMember: the member reached at an address is not the one the
	// Raft configuration has there.
	ErrWrongMember = errors.New("dialed address answered as another member")
)

// MemberURI is the URI SAN of member id of cluster.
func MemberURI(cluster, id string) *url.URL { return identityURI(cluster, kindMemb, id) }

// ClientURI is the URI SAN that marks a client certificate explicitly.
func ClientURI(cluster, name string) *url.URL { return identityURI(cluster, kindCli, name) }

func identityURI(cluster, kind, name string) *url.URL {
	return &url.URL{Scheme: uriScheme, Host: uriHost,
		Path:    "/" + cluster + "/" + kind + "/" + name,
		RawPath: "/" + url.PathEscape(cluster) + "/" + kind + "/" + url.PathEscape(name)}
}

// ValidateCluster checks a cluster id: 1 to 64 letters, digits, '.', '-'
// or '_' (so the URI SAN is a valid SPIFFE ID path segment).
func ValidateCluster(id string) error {
	if id == "" || len(id) > 64 || id == "." || id == ".." {
		return fmt.Errorf("cluster id %q: want 1 to 64 characters", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return fmt.Errorf("cluster id %q: use only letters, digits, '.', '-' and '_'", id)
		}
	}
	return nil
}

// MemberID returns the member id a certificate names in cluster. It fails
// for a certificate naming no member, any client (explicit marker), more
// than one identity, or a member of another cluster.
func MemberID(cert *x509.Certificate, cluster string) (string, error) {
	var ids []string
	for _, u := range cert.URIs {
		c, kind, name, ok := parseIdentity(u)
		if !ok {
			continue
		}
		switch {
		case kind == kindCli:
			return "", fmt.Errorf("%w: %s is a client identity", ErrNotMember, u)
		case kind != kindMemb:
			return "", fmt.Errorf("%w: %s is no identity lockd knows", ErrNotMember, u)
		case c != cluster:
			return "", fmt.Errorf("%w: %s, this is cluster %q", ErrOtherCluster, u, cluster)
		}
		ids = append(ids, name)
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("%w: %q has no URI SAN %s://%s/%s/%s/<id>", ErrNotMember,
			cert.Subject.CommonName, uriScheme, uriHost, cluster, kindMemb)
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%w: %q names %d members", ErrNotMember, cert.Subject.CommonName, len(ids))
}

// parseIdentity splits spiffe://lockd/<cluster>/<kind>/<name>; ok is
// false for URIs outside lockd's namespace. A lockd URI of any other shape
// comes back with an empty kind, so it is refused rather than ignored.
func parseIdentity(u *url.URL) (cluster, kind, name string, ok bool) {
	if !strings.EqualFold(u.Scheme, uriScheme) || !strings.EqualFold(u.Host, uriHost) {
		return "", "", "", false
	}
	// Split the escaped path: an id never holds '/', so a %2F must not
	// move the segment boundaries.
	parts := strings.Split(u.EscapedPath(), "/")
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || len(parts) != 4 || parts[0] != "" {
		return "", "", "", true
	}
	var err error
	var seg [3]string
	for i, p := range parts[1:] {
		if seg[i], err = url.PathUnescape(p); err != nil || seg[i] == "" || strings.Contains(seg[i], "/") {
			return "", "", "", true
		}
	}
	return seg[0], seg[1], seg[2], true
}
