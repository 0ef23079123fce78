// Package server is lockd's composition root: it builds a member's parts
// (Raft node, leader timers, event hub, HTTP API) from a Config, runs the
// leadership loop that starts and stops the leader-only work, and shuts
// everything down in order. cmd/lockd and the tests both use it.
package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/admission"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/httpapi"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/raftnode"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// Config configures one member. Zero durations take the LAN defaults.
type Config struct {
	ID       string
	DataDir  string
	HTTPAddr string // client API listen address
	RaftAddr string // Raft transport listen address
	// HTTPAdvertise is the URL other members and redirected clients use;
	// default "http://" + the HTTP listen address.
	HTTPAdvertise string
	// RaftAdvertise is the address other members dial; default the Raft
	// listen address.
	RaftAdvertise string
	// InitialCluster is "id=raftaddr,id=raftaddr,...": static bootstrap.
	InitialCluster string
	// Join is the HTTP URL of any member of an existing cluster.
	Join string

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	// LogStore is "" (the store the data dir holds; wal for a new one),
	// "wal", "bolt", or "memory" (tests). A data dir keeps the store it was
	// created with: a choice it contradicts is refused at start.
	LogStore string

	Logger       *slog.Logger
	RaftLogLevel string
	Registry     *prometheus.Registry
	// Version is the build's version, reported by /api/v1/status.
	Version string
	// Signer makes the fencing proof sent with every grant; nil sends none.
	// Its proof covers the grant's mode: a shared grant's proof cannot
	// write through a fence.
	Signer func(g fence.Grant) string
	Now    func() time.Time
	// Pprof serves Go's profiler under /debug/pprof/ on the client API
	// (admin access when Auth is on).
	Pprof bool

	// TLS serves the client API over HTTPS; with TLS.CA, clients must
	// present a certificate signed by it (mTLS).
	TLS *tlsfiles.Files
	// PeerTLS secures the Raft transport with mutual TLS (CA required).
	// Both sides of every Raft connection must present a certificate signed
	// by PeerTLS.CA that names a member of ClusterID (URI SAN
	// spiffe://lockd/<cluster-id>/member/<id>, see tlsfiles.MemberURI); the
	// dialing side must be in the Raft configuration, the dialed side must
	// be the member configured at the dialed address. This member's own
	// certificate must name its ID. Client certificates are refused whatever
	// CA signed them. Members also use it for the HTTP calls they make to
	// each other (joining, publishing addresses).
	PeerTLS *tlsfiles.Files
	// ClusterID names this cluster in the member certificates, so a member
	// certificate of another cluster signed by the same CA is refused;
	// default tlsfiles.DefaultCluster.
	ClusterID string
	// Auth turns on bearer-token authentication of the client API.
	Auth *auth.Store
	// PeerToken is the (admin) token members send on their calls to each
	// other when Auth is on.
	PeerToken string
	// AllowedHosts are the names, beyond the member's own listen and
	// advertised names, localhost and IP literals, that a request's Host
	// may carry ("*": any); others get 403 (SPEC 19, httpapi.HostCheck).
	AllowedHosts []string

	// MaxRestoreBytes bounds an uploaded backup (0: httpapi's default,
	// 256 MiB); it must stay below raftnode.MaxSnapshotBytes.
	MaxRestoreBytes int64

	// Conns bounds client API connections, idle keep-alives and slow
	// requests (zero fields: the defaults).
	Conns ConnLimits

	// CatchUpTimeout bounds how long a joining member may take to apply the
	// leader's log before it is removed again instead of promoted.
	CatchUpTimeout time.Duration

	// Quotas bound sessions, locks and waits (0 fields: no limit; lockd's
	// flags default to DefaultQuotas). While this member leads, it stamps
	// them into every acquire and create-session command, and the state
	// machine refuses what would go past them (429 resource_exhausted).
	Quotas locktable.Quotas

	// Admission bounds the work this member admits by what the cluster
	// commits (SPEC 15); zero fields take admission's defaults.
	Admission admission.Config

	// MaxWatches bounds the WebSocket watches and parked blocking queries
	// of every client of this member together (0: no limit; lockd's flag
	// defaults to DefaultMaxWatches).
	MaxWatches int

	// RaftDialOverrides maps a peer's Raft address (as in the configuration)
	// to the address this member actually dials: address translation, and
	// the hook fault-injection tests use to put a proxy on each link.
	RaftDialOverrides map[string]string

	// Test hooks: pre-opened listeners and a Raft dialer that can be cut.
	HTTPListener net.Listener
	RaftListener net.Listener
	RaftDial     func(addr string, timeout time.Duration) (net.Conn, error)
}

// Defaults for the timing flags: measured failover p50 ≈ 0.6 s on loopback
// with pre-vote (library defaults: ≈ 1.9 s). The leader lease is only a
// step-down timer (a leader that heard from no quorum for this long steps
// down); at half the heartbeat timeout, loaded 2-core machines saw leaders
// step down spuriously, so it equals the heartbeat timeout.
const (
	DefaultHeartbeatTimeout   = 300 * time.Millisecond
	DefaultElectionTimeout    = 300 * time.Millisecond
	DefaultLeaderLeaseTimeout = 300 * time.Millisecond
)

func (c *Config) setDefaults() {
	if c.ID == "" {
		c.ID = "node1"
	}
	if c.DataDir == "" {
		c.DataDir = "./lockd-data"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:7070"
	}
	if c.RaftAddr == "" {
		c.RaftAddr = "127.0.0.1:7071"
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = min(DefaultLeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.CatchUpTimeout == 0 {
		c.CatchUpTimeout = 15 * time.Second
	}
	if c.ClusterID == "" {
		c.ClusterID = tlsfiles.DefaultCluster
	}
	c.Conns.setDefaults()
}

// Validate checks the configuration after defaults are applied.
func (c *Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.MaxRestoreBytes < 0 || c.MaxRestoreBytes >= raftnode.MaxSnapshotBytes {
		errs = append(errs, fmt.Errorf("--max-restore-bytes %d: want 1 to %d (0: 256 MiB)", c.MaxRestoreBytes, int64(raftnode.MaxSnapshotBytes)-1))
	}
	if strings.ContainsAny(c.ID, " ,=/") || len(c.ID) > 128 {
		errs = append(errs, fmt.Errorf("--id %q: use up to 128 characters without spaces, ',', '=' or '/'", c.ID))
	}
	if c.InitialCluster != "" && c.Join != "" {
		errs = append(errs, errors.New("--initial-cluster and --join are exclusive: bootstrap a new cluster or join an existing one"))
	}
	if c.InitialCluster != "" {
		peers, err := ParseInitialCluster(c.InitialCluster)
		if err != nil {
			errs = append(errs, err)
		} else {
			found := false
			for _, p := range peers {
				found = found || p.ID == c.ID
			}
			if !found {
				errs = append(errs, fmt.Errorf("--initial-cluster does not list this member's --id %q", c.ID))
			}
		}
	}
	if c.Join != "" {
		if u, err := url.Parse(c.Join); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--join %q: want an HTTP URL such as http://127.0.0.1:7070", c.Join))
		}
	}
	if c.RaftLogLevel != "" {
		if _, err := raftnode.ParseRaftLogLevel(c.RaftLogLevel); err != nil {
			errs = append(errs, err)
		}
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		errs = append(errs, fmt.Errorf("--leader-lease-timeout (%s) must not exceed --heartbeat-timeout (%s)", c.LeaderLeaseTimeout, c.HeartbeatTimeout))
	}
	for name, d := range map[string]time.Duration{"--heartbeat-timeout": c.HeartbeatTimeout,
		"--election-timeout": c.ElectionTimeout, "--leader-lease-timeout": c.LeaderLeaseTimeout} {
		if d < 5*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s %s is too short (minimum 5ms)", name, d))
		}
	}
	if c.TLS != nil && (c.TLS.Cert == "") != (c.TLS.Key == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.TLS != nil && c.TLS.CA != "" && c.TLS.Cert == "" {
		errs = append(errs, errors.New("--client-ca needs --tls-cert and --tls-key"))
	}
	if c.PeerTLS != nil && (c.PeerTLS.Cert != "" || c.PeerTLS.Key != "" || c.PeerTLS.CA != "") &&
		(c.PeerTLS.Cert == "" || c.PeerTLS.Key == "" || c.PeerTLS.CA == "") {
		errs = append(errs, errors.New("Raft mutual TLS needs all of --peer-cert, --peer-key and --peer-ca"))
	}
	if err := tlsfiles.ValidateCluster(c.ClusterID); err != nil {
		errs = append(errs, fmt.Errorf("--cluster-id: %w", err))
	}
	if c.LogStore != "" && c.LogStore != "bolt" && c.LogStore != "wal" && c.LogStore != "memory" {
		errs = append(errs, fmt.Errorf("--log-store %q: want wal or bolt, or leave it unset", c.LogStore))
	}
	for _, a := range c.AllowedHosts {
		if err := httpapi.ValidAllowedHost(a); err != nil {
			errs = append(errs, err)
		}
	}
	if err := validateQuotas(c.Quotas); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ParseInitialCluster parses "id=raftaddr,id=raftaddr,...".
func ParseInitialCluster(s string) ([]raftnode.Peer, error) {
	var peers []raftnode.Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--initial-cluster entry %q: want id=host:port", part)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--initial-cluster entry %q: %v", part, err)
		}
		if seen[id] {
			return nil, fmt.Errorf("--initial-cluster lists id %q twice", id)
		}
		seen[id] = true
		peers = append(peers, raftnode.Peer{ID: id, RaftAddr: addr})
	}
	if len(peers) == 0 {
		return nil, errors.New("--initial-cluster is empty")
	}
	return peers, nil
}

// ParseDialOverrides parses "addr=addr,addr=addr".
func ParseDialOverrides(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		from, to, ok := strings.Cut(part, "=")
		if _, _, err := net.SplitHostPort(from); !ok || err != nil {
			return nil, fmt.Errorf("--raft-dial-override entry %q: want host:port=host:port", part)
		}
		if _, _, err := net.SplitHostPort(to); err != nil {
			return nil, fmt.Errorf("--raft-dial-override entry %q: want host:port=host:port", part)
		}
		out[from] = to
	}
	return out, nil
}

// normalizeURL turns "host:port" into "http://host:port".
func normalizeURL(s string) string {
	if s == "" || strings.Contains(s, "://") {
		return strings.TrimRight(s, "/")
	}
	return "http://" + s
}
