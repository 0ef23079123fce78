package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"time"
)

// Member is one server of the Raft configuration, as the peer checks see it.
type Member struct {
	ID   string
	Addr string // Raft address, as dialed
}

// Peers says who may speak Raft with a member: on both sides of every Raft
// connection the other side must present a member certificate of Cluster
// (MemberURI) signed by the peer CA. Client certificates — no member URI,
// or the client marker — are refused whatever CA signed them.
type Peers struct {
	// Cluster is the cluster id every member certificate must name.
	Cluster string
	// Self is this member's id; with it, Check refuses a certificate of
	// this member that does not name it.
	Self string
	// Members returns the current Raft configuration. When it is known (not
	// empty), an accepted connection must come from a member in it, and a
	// dialed address must answer as the member configured at it. Until
	// then — a member started to join has no configuration before the
	// leader replicates one to it, and the leader dials it first — any
	// member of Cluster is accepted. Nil: never known.
	Members func() []Member
}

func (p Peers) members() []Member {
	if p.Members == nil {
		return nil
	}
	return p.Members()
}

// Check is a Files.Check for this member's own peer certificate: it must
// name Self in Cluster, or the other members would refuse it.
func (p Peers) Check(leaf *x509.Certificate) error {
	id, err := MemberID(leaf, p.Cluster)
	if err != nil {
		return err
	}
	if id != p.Self {
		return fmt.Errorf("names member %q, this member is %q (want URI SAN %s)", id, p.Self, MemberURI(p.Cluster, p.Self))
	}
	return nil
}

// accept checks the certificate of a member that dialed this one.
func (p Peers) accept(leaf *x509.Certificate) error {
	id, err := MemberID(leaf, p.Cluster)
	if err != nil {
		return err
	}
	members := p.members()
	if len(members) == 0 || slices.ContainsFunc(members, func(m Member) bool { return m.ID == id }) {
		return nil
	}
	return fmt.Errorf("%w: %q", ErrUnknownMember, id)
}

// dialed checks the certificate of the member answering at addr.
func (p Peers) dialed(addr string, leaf *x509.Certificate) error {
	id, err := MemberID(leaf, p.Cluster)
	if err != nil {
		return err
	}
	members := p.members()
	var here []string
	known := false
	for _, m := range members {
		known = known || m.ID == id
		if m.Addr == addr {
			here = append(here, m.ID)
		}
	}
	switch {
	case len(here) > 0 && !slices.Contains(here, id):
		return fmt.Errorf("%w: %s answered as %q, the configuration has %q there", ErrWrongMember, addr, id, here)
	case len(members) > 0 && !known:
		return fmt.Errorf("%w: %q at %s", ErrUnknownMember, id, addr)
	}
	return nil
}

// PeerServerConfig is the Raft listener's TLS configuration: it requires a
// client certificate that chains to the CA (loaded at the time of each
// handshake) and names a member p accepts. Session tickets are off: Raft
// connections are long-lived, so resumption saves nothing, and every
// connection then proves its certificate afresh.
func (f *Files) PeerServerConfig(p Peers) *tls.Config {
	cfg := f.serverConfig(p.accept)
	cfg.SessionTicketsDisabled = true
	return cfg
}

// PeerDialer wraps a dial function (nil: plain TCP) with the Raft
// transport's mutual-TLS handshake: the dialed member's certificate must
// chain to the CA, carry the dialed host, and name the member p expects at
// that address.
func (f *Files) PeerDialer(p Peers, base func(string, time.Duration) (net.Conn, error)) func(string, time.Duration) (net.Conn, error) {
	return f.dialer(base, func(addr string) *tls.Config {
		host, _, _ := net.SplitHostPort(addr)
		return f.clientConfig(host, func(leaf *x509.Certificate) error { return p.dialed(addr, leaf) })
	})
}
