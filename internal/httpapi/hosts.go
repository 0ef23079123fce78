package httpapi

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/lockd/lockd/api"
)

// HostCheck is the Host check (SPEC 19). A web page can make a browser
// send requests to a member on the operator's machine or network by
// pointing a name of its own at the member's address (DNS rebinding): the
// page and the member then share an origin, so neither the CSRF check nor
// the WebSocket origin check sees anything foreign, and the page may read
// the replies. What the page cannot choose is the Host header: it is the
// page's own name. So a member serves a request only when its Host names
// the member: one of its own listen or advertised names, localhost, an IP
// literal, or a name the operator listed (--allowed-hosts; "*" allows any
// name). Anything else is 403 permission_denied, on every path — the API,
// the WebSocket upgrade, the dashboard, health checks and metrics alike
// (etcd's --host-whitelist, after CVE-2018-1098, guards every path too).
//
// Ports are not compared: a rebinding page can use the member's port, and
// a proxy or a published container port may change it.
type HostCheck struct {
	names map[string]bool // lower case, no trailing dot
	any   bool
}

// NewHostCheck builds the check from the member's own names (listen and
// advertised addresses, as host, host:port or URL; IP literals and empty
// entries are skipped) and the operator's allowed names (validated by
// ValidAllowedHost).
func NewHostCheck(own, allowed []string) (*HostCheck, error) {
	hc := &HostCheck{names: map[string]bool{"localhost": true}}
	for _, a := range allowed {
		if err := ValidAllowedHost(a); err != nil {
			return nil, err
		}
		if a == "*" {
			hc.any = true
			continue
		}
		hc.names[canonicalHost(a)] = true
	}
	for _, o := range own {
		if i := strings.Index(o, "://"); i >= 0 {
			o = o[i+3:]
			if j := strings.IndexAny(o, "/?#"); j >= 0 {
				o = o[:j]
			}
		}
		if name := hostName(o); name != "" && !isIPLiteral(name) {
			hc.names[name] = true
		}
	}
	return hc, nil
}

// ValidAllowedHost checks one --allowed-hosts entry: "*", or a DNS name
// (letters, digits, '-', '_' and dots; no port, no scheme).
func ValidAllowedHost(a string) error {
	if a == "*" {
		return nil
	}
	if a == "" || len(a) > 253 {
		return fmt.Errorf("--allowed-hosts entry %q: want a host name of 1 to 253 characters, or *", a)
	}
	for _, r := range a {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		case r == ':' || r == '/':
			return fmt.Errorf("--allowed-hosts entry %q: give the host name alone, without scheme or port", a)
		default:
			return fmt.Errorf("--allowed-hosts entry %q: %q is not allowed in a host name (letters, digits, '-', '_' and '.'; or * for any)", a, r)
		}
	}
	return nil
}

// ParseAllowedHosts splits a comma-separated --allowed-hosts value,
// skipping empty entries, and validates each.
func ParseAllowedHosts(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if err := ValidAllowedHost(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// check returns the error for a request whose Host does not name this
// member, nil for one that does. An empty Host (HTTP/1.0 without one) is
// served: browsers always send one.
func (hc *HostCheck) check(host string) error {
	if hc == nil || hc.any || host == "" {
		return nil
	}
	name := hostName(host)
	if name != "" && (hc.names[name] || isIPLiteral(name)) {
		return nil
	}
	return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
		"Host %q is not a name of this member: requests must name it by one of its listen or advertised addresses, localhost or an IP address; "+
			"add the name to the member's --allowed-hosts to serve it (a guard against DNS rebinding)", host)}
}

// hostName is the host of a Host header value (host, host:port, [v6] or
// [v6]:port), lower case and without a trailing dot; "" when malformed.
func hostName(host string) string {
	h := host
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return ""
		}
		rest := h[end+1:]
		if rest != "" && (rest[0] != ':' || strings.Contains(rest[1:], ":")) {
			return ""
		}
		return strings.ToLower(h[1:end])
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		if strings.IndexByte(h[:i], ':') >= 0 {
			// Several colons without brackets: a bare IPv6 literal.
			if isIPLiteral(h) {
				return strings.ToLower(h)
			}
			return ""
		}
		h = h[:i]
	}
	return canonicalHost(h)
}

func canonicalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// isIPLiteral reports an IPv4 or IPv6 address (with an optional zone): a
// name a rebinding page cannot have.
func isIPLiteral(h string) bool {
	if h == "" {
		return false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	return net.ParseIP(h) != nil
}
