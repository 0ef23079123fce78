package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"syscall"
)

// ErrUnreachable: every endpoint failed in a way no retry can fix — the
// connection was refused, or the TLS handshake failed for a reason of the
// configuration (a certificate from an unknown CA, a name the certificate
// does not cover, no client certificate where the members require one, an
// https:// endpoint that speaks plain HTTP). New (and an API that has not
// reached any member yet) returns it as soon as every endpoint failed so
// once, instead of retrying until its deadline; it also matches
// ErrNoLeader, and wraps each endpoint's error.
var ErrUnreachable = errors.New("lockd: no endpoint can be reached")

// permanent reports a failed attempt on one member that retrying will not
// fix while nothing changes on the member's side or in the configuration.
// Timeouts, resets, EOFs, DNS failures, 503s are transient: a member
// restarting, a leader election, a slow network.
func permanent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, ErrHTTPSRequired) {
		return true
	}
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	var rh tls.RecordHeaderError
	if errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) || errors.As(err, &rh) {
		return true
	}
	// The member refused the handshake with an alert: a certificate it
	// requires and did not get, or one it does not trust.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		return true
	}
	// The alert reaches the WebSocket dial only as text.
	msg := err.Error()
	return strings.Contains(msg, "remote error: tls:")
}

// unreachableError is ErrUnreachable with each endpoint's error.
type unreachableError struct {
	errs []error
}

func (e *unreachableError) Error() string {
	var b strings.Builder
	b.WriteString(ErrUnreachable.Error())
	b.WriteString(": ")
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *unreachableError) Is(target error) bool {
	return target == ErrUnreachable || target == ErrNoLeader
}

func (e *unreachableError) Unwrap() []error { return e.errs }

// roundErrors collects the errors of one round over the endpoints: the
// round is unreachable when every endpoint tried failed permanently.
type roundErrors struct {
	errs      []error
	transient bool
}

func (r *roundErrors) add(err error) {
	if permanent(err) {
		r.errs = append(r.errs, err)
	} else {
		r.transient = true
	}
}

// unreachable returns the round's ErrUnreachable, or nil when some
// endpoint may still answer.
func (r *roundErrors) unreachable() error {
	if r.transient || len(r.errs) == 0 {
		return nil
	}
	return &unreachableError{errs: r.errs}
}
