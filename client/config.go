package client

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lockd/lockd/api"
)

// Config configures a Client. The zero value of every field but Endpoints
// takes a default; Validate reports what is wrong.
type Config struct {
	// Endpoints are base HTTP URLs of cluster members, e.g.
	// "http://127.0.0.1:7070" or "https://10.0.0.1:7070". Any member will
	// do: followers point to the leader.
	Endpoints []string
	// TLSConfig is used for https:// endpoints and the wss:// session
	// connection: RootCAs to trust the members' certificates (nil: the
	// system roots), Certificates to present a client certificate when the
	// members require one (mTLS). It is cloned; the server name is taken
	// from each endpoint. Set it or HTTPClient, not both: with your own
	// HTTPClient, configure TLS on its transport.
	TLSConfig *tls.Config
	// Token is the bearer token sent as "Authorization: Bearer <token>" on
	// every HTTP request and on the WebSocket upgrade, when the cluster runs
	// with --auth-file. A refused token gives errors matching
	// ErrUnauthenticated (401) or ErrPermissionDenied (403), never retried.
	Token string
	// ClientID identifies this client to lockd: acquire is idempotent per
	// client ID, so two Clients with one ID are one client to the server (the
	// second's acquire of a lock the first holds is a re-grant of the
	// first's lock, not a wait). Default: "<hostname>:<pid>:<random>"
	// (DefaultClientID plus a random suffix), different for every Client,
	// also for several in one process. Set it only to an ID no other
	// running Client uses.
	ClientID string
	// SessionTTL is the session's TTL: the session (and every lock bound to
	// it) ends when no keepalive reached the leader for this long.
	// Default 15s; SPEC range 1s–1h.
	SessionTTL time.Duration
	// HTTPClient carries the WebSocket handshake and HTTP calls. Its
	// CheckRedirect is not used: the client follows the leader redirects
	// itself. Default: a client with its own transport (using TLSConfig).
	HTTPClient *http.Client
	// Logger receives connection events. Default: discard.
	Logger *slog.Logger
	// DialTimeout bounds New: when no member led to a leader that
	// established the session within it, New gives up with an error
	// matching ErrNoLeader that wraps the last attempt's error (a refused
	// connection, a TLS failure, ...). Default 10s; negative: no bound of
	// its own, New then waits as long as its ctx allows. (The shorter of
	// ctx and DialTimeout applies.) It bounds only the first connect:
	// later reconnects go on until Close, and the session's lease decides
	// meanwhile.
	DialTimeout time.Duration
	// AttemptTimeout bounds one connect attempt to one member (TCP, TLS,
	// WebSocket handshake and hello), and one write on the connection.
	// Default 2s.
	AttemptTimeout time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered wait between
	// rounds of connect attempts. Defaults 50ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// CloseTimeout bounds the clean-up Close does on the server (deleting
	// the session). Default 5s.
	CloseTimeout time.Duration
	// OnRetry, if set, is called before each pause between rounds of New's
	// connect attempts (not of later reconnects), with the last attempt's
	// error: for telling a person what New waits for. It runs on New's
	// goroutine; keep it short.
	OnRetry func(err error)
	// LeaseMargin is how much earlier than "send time + TTL" the client
	// counts a lease (of the session, or of a lock's TTL) as run out, to
	// absorb timer lateness and the drift of the client's clock rate against
	// the leader's. Default: a twentieth of that TTL, at most 100ms, plus a
	// thousandth of it (twice the 500 ppm an NTP-disciplined clock may be
	// slewed by): 130ms of a 30s TTL, 3.7s of an hour. Negative: no margin.
	LeaseMargin time.Duration
}

// DefaultDialTimeout is Config.DialTimeout's default: how long New looks
// for a leader before it gives up with ErrNoLeader.
const DefaultDialTimeout = 10 * time.Second

// DefaultClientID is "<hostname>:<pid>", the same on every call in one
// process. A Client's default ID adds a random suffix to it (see
// Config.ClientID), so that Clients of one process never share an ID.
func DefaultClientID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	return h + ":" + strconv.Itoa(os.Getpid())
}

// uniqueClientID is DefaultClientID plus ":" and 12 random hex digits, cut
// to the longest ID lockd accepts (the hostname gives way).
func uniqueClientID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	suffix := ":" + hex.EncodeToString(b[:])
	id := DefaultClientID()
	if len(id)+len(suffix) > api.MaxClientID {
		id = strings.ToValidUTF8(id[len(id)+len(suffix)-api.MaxClientID:], "")
	}
	return id + suffix
}

func (c Config) withDefaults() Config {
	if c.ClientID == "" {
		c.ClientID = uniqueClientID()
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = api.DefaultSessionTTL * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = 2 * time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = time.Second
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 5 * time.Second
	}
	return c
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := validateEndpoints(c.Endpoints); err != nil {
		return err
	}
	if err := validateClientID(c.ClientID); err != nil {
		return err
	}
	if err := validateTransport(c.HTTPClient, c.TLSConfig, c.Token); err != nil {
		return err
	}
	if c.SessionTTL < api.MinSessionTTLms*time.Millisecond || c.SessionTTL > api.MaxSessionTTLms*time.Millisecond {
		return fmt.Errorf("lockd: SessionTTL %v out of range 1s–1h", c.SessionTTL)
	}
	if c.LeaseMargin > 0 && c.LeaseMargin >= c.SessionTTL {
		return fmt.Errorf("lockd: LeaseMargin %v not below SessionTTL %v", c.LeaseMargin, c.SessionTTL)
	}
	if c.AttemptTimeout < 0 || c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff || c.CloseTimeout < 0 {
		return errors.New("lockd: AttemptTimeout, CloseTimeout and backoffs must be positive, MaxBackoff ≥ MinBackoff")
	}
	return nil
}

func validateEndpoints(eps []string) error {
	if len(eps) == 0 {
		return errors.New("lockd: no endpoints")
	}
	for _, e := range eps {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("lockd: endpoint %q is not an http(s) URL", e)
		}
	}
	return nil
}

// validateTransport checks the TLS and token settings shared by Config and
// APIConfig.
func validateTransport(hc *http.Client, tc *tls.Config, token string) error {
	if hc != nil && tc != nil {
		return errors.New("lockd: set TLSConfig or HTTPClient, not both (configure TLS on the HTTPClient's transport)")
	}
	if token != strings.TrimSpace(token) || strings.ContainsAny(token, "\r\n\x00") {
		return errors.New("lockd: Token has surrounding spaces or control characters")
	}
	return nil
}

func validateClientID(id string) error {
	if id == "" || len(id) > api.MaxClientID {
		return fmt.Errorf("lockd: client ID must be 1–%d bytes", api.MaxClientID)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("lockd: client ID %q is not printable", id)
		}
	}
	return nil
}

// normalizeEndpoint trims a trailing slash so paths can be appended.
func normalizeEndpoint(e string) string { return strings.TrimRight(e, "/") }

// noRedirect returns a shallow copy of hc that hands redirects back to the
// caller, so leader redirects are followed (and remembered) here, with the
// request body re-sent.
func noRedirect(hc *http.Client) *http.Client {
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// defaultHTTPClient is a client with its own transport, using tc (cloned)
// for TLS when not nil.
func defaultHTTPClient(tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		t.TLSClientConfig = tc.Clone()
	}
	return &http.Client{Transport: t}
}

// setAuth adds the bearer token, if any, to h.
func setAuth(h http.Header, token string) {
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
}
