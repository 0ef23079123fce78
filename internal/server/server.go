package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/admission"
	"github.com/lockd/lockd/internal/dashboard"
	"github.com/lockd/lockd/internal/httpapi"
	"github.com/lockd/lockd/internal/leader"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/netlimit"
	"github.com/lockd/lockd/internal/notify"
	"github.com/lockd/lockd/internal/raftnode"
)

// Server is one running member.
type Server struct {
	cfg     Config
	log     *slog.Logger
	node    *raftnode.Node
	timers  *leader.Timers
	hub     *notify.Hub
	watches *notify.Watches
	removed chan struct{} // closed when this member learned it was removed
	effects *effectQueue
	metrics *metrics
	// admission refuses work this member cannot commit soon (SPEC 15).
	admission *admission.Controller

	httpSrv    *http.Server
	httpLn     net.Listener
	url        string
	baseCtx    context.Context
	baseCancel context.CancelFunc
	client     *http.Client
	named      sync.Map // hosts a member redirected to (see checkRedirect)

	ready     atomic.Bool
	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New starts a member: Raft, the leadership loop and the HTTP API.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, hub: notify.NewHub(), effects: newEffectQueue(), done: make(chan struct{}),
		removed: make(chan struct{})}
	s.baseCtx, s.baseCancel = context.WithCancel(context.Background())

	ln := cfg.HTTPListener
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return nil, fmt.Errorf("listen on --http-addr %s: %w", cfg.HTTPAddr, err)
		}
	}
	// Capped before TLS, so a handshake in progress holds its slot too.
	ln = netlimit.Wrap(ln, netlimit.Limits{Total: cfg.Conns.MaxConns, PerIP: cfg.Conns.MaxConnsPerIP})
	scheme := "http://"
	if cfg.TLS.Enabled() {
		if err := cfg.TLS.Reload(); err != nil {
			ln.Close()
			return nil, fmt.Errorf("client API TLS: %w", err)
		}
		ln = tls.NewListener(ln, cfg.TLS.ServerConfig())
		scheme = "https://"
	}
	s.httpLn = ln
	s.url = normalizeURL(cfg.HTTPAdvertise)
	if s.url == "" {
		s.url = scheme + ln.Addr().String()
	}
	hosts, err := httpapi.NewHostCheck(ownHostNames(cfg.HTTPAddr, ln.Addr().String(), s.url), cfg.AllowedHosts)
	if err != nil {
		ln.Close()
		return nil, err
	}

	raftLn, raftDial := cfg.RaftListener, dialer(cfg.RaftDial, cfg.RaftDialOverrides)
	transport := &http.Transport{MaxIdleConnsPerHost: 4}
	members := &raftMembers{}
	if cfg.PeerTLS.Enabled() {
		peers := peerPolicy(cfg, members)
		cfg.PeerTLS.Check = peers.Check // also on every Reload
		if err := cfg.PeerTLS.Reload(); err != nil {
			ln.Close()
			return nil, fmt.Errorf("Raft TLS: %w", err)
		}
		if raftLn == nil {
			var err error
			if raftLn, err = net.Listen("tcp", cfg.RaftAddr); err != nil {
				ln.Close()
				return nil, fmt.Errorf("listen on --raft-addr %s: %w", cfg.RaftAddr, err)
			}
		}
		raftLn = tls.NewListener(raftLn, cfg.PeerTLS.PeerServerConfig(peers))
		raftDial = cfg.PeerTLS.PeerDialer(peers, raftDial)
		transport.DialTLSContext = cfg.PeerTLS.DialTLS
	}
	s.client = &http.Client{Timeout: 10 * time.Second, CheckRedirect: s.checkRedirect,
		Transport: &tokenTransport{base: transport, token: cfg.PeerToken, trusted: s.memberHost}}

	var peers []raftnode.Peer
	if cfg.InitialCluster != "" {
		peers, _ = ParseInitialCluster(cfg.InitialCluster) // validated
	}
	batchSizes := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockd_raft_entry_commands",
		Help:    "Commands carried per Raft log entry (group commit).",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
	})
	node, err := raftnode.New(raftnode.Config{BatchSizes: batchSizes, Effects: s.effects.push,
		ID: cfg.ID, DataDir: cfg.DataDir, RaftAddr: cfg.RaftAddr, Advertise: cfg.RaftAdvertise,
		InitialCluster: peers, Join: cfg.Join != "",
		HeartbeatTimeout: cfg.HeartbeatTimeout, ElectionTimeout: cfg.ElectionTimeout,
		LeaderLeaseTimeout: cfg.LeaderLeaseTimeout, SnapshotThreshold: cfg.SnapshotThreshold,
		SnapshotInterval: cfg.SnapshotInterval, TrailingLogs: cfg.TrailingLogs, LogStore: cfg.LogStore,
		Listener: raftLn, Dial: raftDial, Logger: cfg.Logger, RaftLogLevel: cfg.RaftLogLevel,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.node = node
	s.watches = notify.NewWatches(node.SetWatching)
	members.node.Store(node)
	s.timers = leader.New(leader.Config{Proposer: s, Viewer: node, Grace: cfg.ElectionTimeout,
		Now: cfg.Now, Logger: cfg.Logger})
	s.admission = admission.New(cfg.Admission)
	s.metrics = newMetrics(cfg.Registry, s, batchSizes)

	h := httpapi.New(httpapi.Config{Backend: s, Observer: s.metrics, Auth: cfg.Auth, Logger: cfg.Logger,
		Admission: s.admission, MaxWatches: cfg.MaxWatches,
		MaxRestoreBytes: cfg.MaxRestoreBytes,
		Metrics:         promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry, EnableOpenMetrics: true}),
		Extra:           map[string]http.Handler{"/ui/": dashboard.New(s, cfg.Logger, dashboard.WithAuth(cfg.Auth)), "GET /ui": http.RedirectHandler("/ui/", http.StatusMovedPermanently)},
		Pprof:           cfg.Pprof,
		Hosts:           hosts})
	s.httpSrv = &http.Server{Handler: limitRequests(h, cfg.Conns), ReadHeaderTimeout: headerTimeout,
		IdleTimeout: cfg.Conns.IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:    slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}

	s.wg.Add(5)
	go s.runEffects()
	go s.watchRemoval()
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", "err", err)
		}
	}()
	go s.leaderLoop()
	go s.publishLoop()
	if cfg.Join != "" && !node.HadState() {
		s.wg.Add(1)
		go s.joinLoop()
	}
	s.log.Info("member started", "id", cfg.ID, "http", s.url, "raft", node.RaftAddr(), "data_dir", cfg.DataDir)
	return s, nil
}

// URL is this member's client API URL.
func (s *Server) URL() string { return s.url }

// ID is this member's id.
func (s *Server) ID() string { return s.cfg.ID }

// Node exposes the Raft node to tests in this module.
func (s *Server) Node() *raftnode.Node { return s.node }

// Close stops the member gracefully: leadership is handed over first when
// this member leads, then the listeners close, then Raft stops and the
// stores are flushed.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.node.IsLeader() {
			if terr := s.node.TransferLeadership(""); terr != nil {
				s.log.Info("leadership transfer before shutdown failed", "err", terr)
			} else {
				s.log.Info("leadership transferred before shutdown")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.baseCancel() // ends WebSocket connections and waits in progress
		_ = s.httpSrv.Shutdown(ctx)
		close(s.done)
		err = s.node.Shutdown()
		s.wg.Wait()
		s.metrics.unregister()
		s.log.Info("member stopped", "id", s.cfg.ID)
	})
	return err
}

// Kill stops the member abruptly, as a crash would (no leadership transfer,
// connections dropped). Tests use it; the process keeps running.
func (s *Server) Kill() {
	s.closeOnce.Do(func() {
		s.baseCancel()
		_ = s.httpSrv.Close()
		close(s.done)
		_ = s.node.Kill()
		s.wg.Wait()
		s.metrics.unregister()
	})
}

// leaderLoop starts the leader-only work when this member gains leadership
// and stops it when it loses it. It reads a coalesced signal and never
// blocks Raft's notification channel.
func (s *Server) leaderLoop() {
	defer s.wg.Done()
	var cancel context.CancelFunc
	var estDone chan struct{}
	var estTerm uint64
	stop := func() {
		if cancel != nil {
			cancel()
			<-estDone
			cancel = nil
		}
		wasReady := s.ready.Swap(false)
		s.timers.Stop()
		s.hub.Reset(notify.ErrLeadershipLost)
		s.watches.Reset() // blocking queries answer early after a leader change
		if wasReady {
			s.log.Info("leadership lost", "id", s.cfg.ID)
		}
	}
	for {
		select {
		case <-s.node.LeadershipChanged():
		case <-s.done:
			stop()
			return
		}
		if s.node.IsLeader() {
			term := s.node.Term()
			if cancel != nil && estTerm == term {
				continue
			}
			stop()
			estDone, estTerm = make(chan struct{}), term
			cancel = s.startEstablish(estDone, term)
		} else if cancel != nil || s.ready.Load() {
			stop()
		}
	}
}

func (s *Server) startEstablish(done chan struct{}, term uint64) context.CancelFunc {
	ctx, cancel := context.WithCancel(s.baseCtx)
	go s.establish(ctx, done, term)
	return cancel
}

// establish makes a new leader ready: a Barrier first, so every entry of
// earlier terms is applied before anything is served or any timer is built
// from the state; then the timers; then this member's address is published.
func (s *Server) establish(ctx context.Context, done chan struct{}, term uint64) {
	defer close(done)
	start := time.Now()
	for {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.node.Barrier(bctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !s.node.IsLeader() {
			return
		}
		s.log.Warn("barrier after election failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return
	}
	s.timers.Start(term)
	s.ready.Store(true)
	s.log.Info("became leader", "id", s.cfg.ID, "term", term, "ready_after", time.Since(start).Round(time.Millisecond))
	s.publishSelf(ctx)
}

// publishSelf records this member's addresses in the replicated state, so
// followers can name the leader's HTTP URL.
func (s *Server) publishSelf(ctx context.Context) {
	if s.published() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.Propose(pctx, locktable.Command{Op: locktable.OpSetMember, MemberID: s.cfg.ID,
		RaftAddr: s.node.RaftAddr(), HTTPAddr: s.url}); err != nil {
		s.log.Debug("publishing own address failed", "err", err)
	}
}

func (s *Server) published() bool {
	ok := false
	s.node.View(func(t *locktable.Table) {
		for _, m := range t.Members() {
			if m.ID == s.cfg.ID && m.HTTPAddr == s.url && m.RaftAddr == s.node.RaftAddr() {
				ok = true
			}
		}
	})
	return ok
}

// publishLoop makes sure this member's addresses are in the replicated
// state: a follower asks the leader (add-member is idempotent and only
// publishes when the member is already configured).
func (s *Server) publishLoop() {
	defer s.wg.Done()
	delay := 200 * time.Millisecond
	for {
		select {
		case <-s.done:
			return
		case <-time.After(delay):
		}
		if s.published() {
			delay = 5 * time.Second
			continue
		}
		// Until it is published, no page or client can reach this member
		// by name (a dashboard that loses the leader has nowhere else to
		// go): try again soon.
		delay = 200 * time.Millisecond
		if s.ready.Load() {
			s.publishSelf(s.baseCtx)
			continue
		}
		leaderURL := s.LeaderURL()
		if leaderURL == "" || leaderURL == s.url || !s.inConfiguration() {
			continue
		}
		if err := s.postMember(leaderURL); err != nil {
			s.log.Debug("publishing own address to the leader failed", "err", err)
		}
	}
}

func (s *Server) inConfiguration() bool {
	servers, err := s.node.Servers()
	if err != nil {
		return false
	}
	for _, sv := range servers {
		if sv.ID == s.cfg.ID {
			return true
		}
	}
	return false
}

func (s *Server) postMember(base string) error {
	body, _ := json.Marshal(api.AddMemberRequest{ID: s.cfg.ID, RaftAddr: s.node.RaftAddr(), HTTPAddr: s.url})
	ctx, cancel := context.WithTimeout(s.baseCtx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/cluster/members", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var er api.ErrorReply
		_ = json.NewDecoder(resp.Body).Decode(&er)
		return fmt.Errorf("add member: HTTP %d %s: %s", resp.StatusCode, er.Error.Code, er.Error.Message)
	}
	return nil
}

// joinLoop asks the existing cluster (through any member; 307 leads to the
// leader) to add this member, until it is added.
func (s *Server) joinLoop() {
	defer s.wg.Done()
	base := normalizeURL(s.cfg.Join)
	for attempt := 0; ; attempt++ {
		if s.inConfiguration() {
			s.log.Info("joined the cluster", "via", base)
			return
		}
		err := s.postMember(base)
		if err == nil {
			s.log.Info("joined the cluster", "via", base)
			return
		}
		s.log.Warn("join failed; retrying", "via", base, "err", err, "attempt", attempt+1)
		select {
		case <-s.done:
			return
		case <-time.After(time.Second):
		}
	}
}

// Reload re-reads the certificates and the token file (SIGHUP). A file
// that fails to load leaves the previous one in force.
func (s *Server) Reload() error {
	var errs []error
	if s.cfg.TLS.Enabled() {
		errs = append(errs, s.cfg.TLS.Reload())
	}
	if s.cfg.PeerTLS.Enabled() {
		errs = append(errs, s.cfg.PeerTLS.Reload())
	}
	if s.cfg.Auth != nil {
		errs = append(errs, s.cfg.Auth.Reload())
	}
	err := errors.Join(errs...)
	if err == nil {
		s.log.Info("reloaded certificates and tokens")
	}
	return err
}

// tokenTransport adds the member token to member-to-member calls, and
// only to them: a request (or a redirect followed) to any host that is not
// a published member or the --join URL goes without it.
type tokenTransport struct {
	base    http.RoundTripper
	token   string
	trusted func(host string) bool
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token != "" && t.trusted(r.URL.Host) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(r)
}

// memberHost reports whether host (host:port) is this member's, a published
// member's, the --join URL's, or one a member redirected to.
func (s *Server) memberHost(host string) bool {
	hostOf := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			return ""
		}
		return u.Host
	}
	if host == "" {
		return false
	}
	if host == hostOf(s.url) || (s.cfg.Join != "" && host == hostOf(normalizeURL(s.cfg.Join))) {
		return true
	}
	if _, ok := s.named.Load(host); ok {
		return true
	}
	found := false
	s.node.View(func(t *locktable.Table) {
		for _, m := range t.Members() {
			found = found || hostOf(m.HTTPAddr) == host
		}
	})
	return found
}

// checkRedirect follows a member's 307 to the leader only to another
// member, and never from https to plain http.
func (s *Server) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 5 {
		return errors.New("stopped after 5 redirects")
	}
	if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return fmt.Errorf("refusing a redirect from https to %s", req.URL.Redacted())
	}
	prev := via[len(via)-1].URL.Host
	if !s.memberHost(prev) {
		return fmt.Errorf("refusing a redirect by %s to %s: %s is not a member of this cluster", prev, req.URL.Redacted(), prev)
	}
	// A member names the leader: a joining member does not know the
	// members yet, so it trusts whom the member it was told to join names.
	s.named.Store(req.URL.Host, true)
	return nil
}

// dialer applies address overrides in front of the Raft dialer.
func dialer(base func(string, time.Duration) (net.Conn, error), overrides map[string]string) func(string, time.Duration) (net.Conn, error) {
	if len(overrides) == 0 {
		return base
	}
	if base == nil {
		base = func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, timeout)
		}
	}
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		if to, ok := overrides[addr]; ok {
			addr = to
		}
		return base(addr, timeout)
	}
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
