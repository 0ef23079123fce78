package server

import (
	"net"
	"net/netip"
	"os"
)

// ownHostNames lists the names a request's Host may carry as this
// member's own (httpapi.HostCheck): the listen address as configured and
// as bound, and the advertised URL. A member listening on every interface
// (0.0.0.0, ::, or no host) is also its machine's: the machine's host name
// is one of its own then.
func ownHostNames(listen, bound, advertised string) []string {
	names := []string{listen, bound, advertised}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return names
	}
	if a, perr := netip.ParseAddr(host); host == "" || (perr == nil && a.IsUnspecified()) {
		if hn, herr := os.Hostname(); herr == nil && hn != "" {
			names = append(names, hn)
		}
	}
	return names
}
