package client

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/lockd/lockd/api"
)

// Where the client goes, token and all, when a member sends it elsewhere
// (a 307 on HTTP or on the WebSocket upgrade, a not_leader reply on the
// WebSocket): only to a member of the cluster, which is one of the
// configured endpoints or a leader that one of those endpoints named (in
// X-Lockd-Leader or a not_leader reply's leader field) — never to a host a
// bare Location names, nor to one that only a member reached through a
// redirect named, and never from https to http. The http.Client's own
// redirect following is off (noRedirect) so that this is the one place
// that decides.

// hopError is a refused redirect. It matches ErrUntrustedRedirect.
type hopError struct {
	from, to, why string
	// fatal: asking again cannot help (a configured endpoint sent it, or
	// it leaves https). A refusal of what a member reached through a
	// redirect named is not: after a leader change the old leader names
	// the new one, which a configured endpoint then names too.
	fatal bool
}

func (e *hopError) Error() string {
	return fmt.Sprintf("%s: not following %s to %s: %s", ErrUntrustedRedirect, e.from, e.to, e.why)
}

// Is matches ErrUntrustedRedirect.
func (e *hopError) Is(target error) bool { return target == ErrUntrustedRedirect }

// isFatalHop reports a refused redirect that a retry would only meet again.
func isFatalHop(err error) bool {
	var he *hopError
	return errors.As(err, &he) && he.fatal
}

// origin is u's scheme and host, lower-cased, with the port spelled out
// ("https://a.example:443"); "" when u is not an absolute http(s) URL.
func origin(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return ""
	}
	scheme := strings.ToLower(p.Scheme)
	port := p.Port()
	switch {
	case scheme != "http" && scheme != "https":
		return ""
	case port == "" && scheme == "http":
		port = "80"
	case port == "":
		port = "443"
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(p.Hostname()), port)
}

// leaderHop decides whether the client may follow member from (a URL it
// sent a request to) to URL to. named says that the member named to as the
// leader (X-Lockd-Leader, or a not_leader reply's leader); a leader a
// configured endpoint names is remembered as a member from then on.
func (a *API) leaderHop(from, to string, named bool) error {
	fo, o := origin(from), origin(to)
	a.mu.Lock()
	defer a.mu.Unlock()
	fromConfigured := a.configured[fo]
	switch {
	case o == "":
		return &hopError{from: from, to: to, why: "not an http(s) URL", fatal: fromConfigured}
	case strings.HasPrefix(fo, "https:") && strings.HasPrefix(o, "http:"):
		return &hopError{from: from, to: to, fatal: true,
			why: "it leaves https for http, which would send the token and the request in the clear (advertise the members' https:// URLs)"}
	case a.configured[o] || a.named[o]:
		return nil
	case named && fromConfigured:
		a.named[o] = true
		return nil
	case !named:
		return &hopError{from: from, to: to, fatal: fromConfigured,
			why: "the redirect names no leader (no " + api.HeaderLeader + " header), and its Location is neither a configured endpoint nor a leader one of them named"}
	}
	// Named, by a member that is not a configured endpoint.
	return &hopError{from: from, to: to,
		why: "neither a configured endpoint nor a leader one of them named (a member reached through a redirect named it)"}
}

// redirectTarget reads a redirect that member reqURL answered: next is the
// URL to send the request to, leader the leader's base URL to remember. A
// Location on another host than the X-Lockd-Leader it comes with is
// refused: lockd sends the same path on the leader it names.
func (a *API) redirectTarget(reqURL *url.URL, h http.Header) (next, leader string, err error) {
	from := reqURL.String()
	leader = h.Get(api.HeaderLeader)
	var loc *url.URL
	if l := h.Get("Location"); l != "" {
		if loc, err = reqURL.Parse(l); err != nil {
			return "", "", fmt.Errorf("bad Location %q: %w", l, err)
		}
	}
	switch {
	case leader == "" && loc == nil:
		return "", "", fmt.Errorf("redirect without Location or %s", api.HeaderLeader)
	case leader == "":
		next, leader = loc.String(), loc.Scheme+"://"+loc.Host
	case loc == nil:
		next = normalizeEndpoint(leader) + reqURL.RequestURI()
	case origin(loc.String()) != origin(leader):
		a.mu.Lock()
		fatal := a.configured[origin(from)]
		a.mu.Unlock()
		return "", "", &hopError{from: from, to: loc.String(), fatal: fatal,
			why: "the Location is not on the leader it names (" + leader + ")"}
	default:
		next = loc.String()
	}
	if err := a.leaderHop(from, next, h.Get(api.HeaderLeader) != ""); err != nil {
		return "", "", err
	}
	return next, normalizeEndpoint(leader), nil
}
