// Command lockd runs one member of a lockd cluster: a Raft-replicated lock
// service with fencing tokens. With no flags it serves a one-member cluster
// on 127.0.0.1:7070 with its data in ./lockd-data.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/raftmetrics"
	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/tlsfiles"
	"github.com/lockd/lockd/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg server.Config
	fs.StringVar(&cfg.ID, "id", "node1", "member id, unique in the cluster")
	fs.StringVar(&cfg.DataDir, "data-dir", "./lockd-data", "Raft log, stable store and snapshots")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:7070", "client API listen address")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:7071", "Raft transport listen address")
	fs.StringVar(&cfg.HTTPAdvertise, "http-advertise", "", "client API URL other members and clients use (default http://<http-addr>)")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address other members dial (default <raft-addr>)")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "id=raftaddr,id=raftaddr,...: static bootstrap of a new cluster; every listed member gets the same value")
	fs.StringVar(&cfg.Join, "join", "", "HTTP URL of any member of an existing cluster; this member asks the leader to add it")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", server.DefaultHeartbeatTimeout, "Raft heartbeat timeout (a follower without contact this long starts an election)")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", server.DefaultElectionTimeout, "Raft election timeout; also the grace a new leader gives locks already due")
	fs.DurationVar(&cfg.LeaderLeaseTimeout, "leader-lease-timeout", server.DefaultLeaderLeaseTimeout, "a leader without quorum contact this long steps down (<= heartbeat timeout)")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", 8192, "log entries between snapshots")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", 2*time.Minute, "how often to check whether a snapshot is due")
	fs.StringVar(&cfg.LogStore, "log-store", "", "Raft log backend: wal (raft-wal) or bolt (raft-boltdb); unset: the one the data dir holds, wal for a new data dir. Fixed for a data dir's life; a contradicting value is refused. Either is checked online by the log verifier")
	fs.Uint64Var(&cfg.TrailingLogs, "trailing-logs", 10240, "log entries kept after a snapshot so slow followers catch up without one")
	dialOverride := fs.String("raft-dial-override", "", "peeraddr=dialaddr,...: dial these peers' Raft addresses through other addresses (NAT, proxies)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.RaftLogLevel, "raft-log-level", "warn", "level of hashicorp/raft's own log lines: trace, debug, info, warn, error or off (they go to the same log, in --log-format, and --log-level applies to them too)")
	apiTLS, peerTLS := &tlsfiles.Files{}, &tlsfiles.Files{}
	fs.StringVar(&apiTLS.Cert, "tls-cert", "", "certificate (PEM) for the client API: serve HTTPS")
	fs.StringVar(&apiTLS.Key, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&apiTLS.CA, "client-ca", "", "CA bundle (PEM): client API callers must present a certificate it signed (mTLS)")
	fs.StringVar(&peerTLS.Cert, "peer-cert", "", "member certificate (PEM) for mutual TLS between members (Raft and member-to-member calls); must carry the URI SAN spiffe://lockd/<cluster-id>/member/<id>")
	fs.StringVar(&peerTLS.Key, "peer-key", "", "private key (PEM) of --peer-cert")
	fs.StringVar(&peerTLS.CA, "peer-ca", "", "CA bundle (PEM) that signed every member's --peer-cert")
	fs.StringVar(&cfg.ClusterID, "cluster-id", tlsfiles.DefaultCluster, "cluster name in the member certificates: with --peer-cert, Raft peers must present the URI SAN spiffe://lockd/<cluster-id>/member/<their --id>; client certificates are refused")
	authFile := fs.String("auth-file", "", "bearer tokens with per-lock-prefix permissions (JSON, see docs/OPERATIONS.md); reloaded on SIGHUP")
	allowedHosts := fs.String("allowed-hosts", "", "comma-separated host names a request's Host header may carry besides this member's own listen and advertised names, localhost and IP addresses (* allows any); other requests get 403: a guard against DNS rebinding. List the names clients, load balancers and Prometheus use to reach the member")
	fs.StringVar(&cfg.PeerToken, "peer-token", "", "admin token members send each other when --auth-file is set (prefer LOCKD_PEER_TOKEN)")
	signingKey := fs.String("signing-key", "", "Ed25519 private key (PEM, PKCS#8) shared by all members: every grant then carries a fencing_proof that resource servers verify (see lockctl keygen)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler under /debug/pprof/ on the client API (admin token when --auth-file is set)")
	q, dq := &cfg.Quotas, server.DefaultQuotas
	fs.Int64Var(&q.Sessions, "max-sessions", dq.Sessions, "quota: sessions in the cluster (0: no limit); over it a create is 429 resource_exhausted")
	fs.Int64Var(&q.SessionsPerOwner, "max-sessions-per-token", dq.SessionsPerOwner, "quota: sessions one auth token (by name) may hold (default 0: no limit; without --auth-file every caller is one identity)")
	fs.Int64Var(&q.Locks, "max-locks", dq.Locks, "quota: locks in the table, held or awaited (0: no limit)")
	fs.Int64Var(&q.WaitersPerLock, "max-waiters-per-lock", dq.WaitersPerLock, "quota: waiters queued on one lock (0: no limit)")
	fs.Int64Var(&q.LocksPerSession, "max-locks-per-session", dq.LocksPerSession, "quota: locks held plus waits queued through one session (0: no limit)")
	fs.Int64Var(&q.LocksPerOwner, "max-locks-per-token", dq.LocksPerOwner, "quota: locks held plus waits queued by one auth token, by name (default 0: no limit; without --auth-file every caller is one identity)")
	fs.Int64Var(&q.Grants, "max-grants", dq.Grants, "quota: grants held plus waits queued in the cluster, a semaphore's holders each counted (0: no limit)")
	fs.Int64Var(&q.ValueBytes, "max-value-bytes", dq.ValueBytes, "quota: bytes of the values of every grant and wait in the cluster (0: no limit)")
	fs.IntVar(&cfg.MaxWatches, "max-watches", server.DefaultMaxWatches, "WebSocket watches and parked blocking queries this member serves at once, every client together (0: no limit); over it a watch is 429 resource_exhausted")
	fs.IntVar(&cfg.Conns.MaxConns, "max-conns", server.DefaultMaxConns, "client API connections open at once; over it a new connection is closed at once")
	fs.IntVar(&cfg.Conns.MaxConnsPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "client API connections open at once from one remote IP")
	fs.DurationVar(&cfg.Conns.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close a client API keep-alive connection idle this long")
	fs.DurationVar(&cfg.Conns.BodyTimeout, "body-timeout", server.DefaultBodyTimeout, "a request body must arrive within this (headers: 10 s)")
	fs.DurationVar(&cfg.Admission.Target, "admission-target", 200*time.Millisecond, "admission control: new work (acquires, sessions) is admitted while what is outstanding commits within this at the measured commit rate; above it, 503 overloaded with Retry-After")
	fs.IntVar(&cfg.Admission.MinLimit, "admission-min", 256, "admission control: proposals that may always be outstanding, whatever the measured rate")
	fs.IntVar(&cfg.Admission.MaxLimit, "admission-max", 8192, "admission control: proposals that may never be exceeded by new work, whatever the measured rate (releases and renewals may use 4 times the limit)")
	fs.Int64Var(&cfg.MaxRestoreBytes, "max-restore-bytes", 256<<20, "largest backup a restore accepts (413 beyond); below 2 GiB, the largest snapshot a member reads")
	memoryLimit := fs.String("memory-limit", "", "soft limit of the Go heap (GOMEMLIMIT), e.g. 512MiB or 2GiB: the garbage collector works harder as the heap nears it, so resident memory follows the live state instead of twice it (empty: the GOMEMLIMIT environment variable, else none)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lockd [flags]\n\nRuns one lockd member. Every flag can also be set in the environment as\nLOCKD_<FLAG> (upper case, '-' as '_'), e.g. LOCKD_DATA_DIR. With neither\n--initial-cluster nor --join, a new data dir bootstraps a one-member cluster.\nA restart on an existing data dir ignores both and rejoins with its state.\nSIGTERM stops gracefully (leadership is handed over first).\nQuotas (--max-*) are checked by the leader's values at the time of each\nrequest; over one, a request gets 429 resource_exhausted naming it.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, "lockd", version.String())
		return 0
	}
	logger, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return 2
	}
	cfg.Logger = logger
	if *memoryLimit != "" {
		n, err := parseBytes(*memoryLimit)
		if err != nil {
			fmt.Fprintln(stderr, "lockd: --memory-limit:", err)
			return 2
		}
		debug.SetMemoryLimit(n)
	}
	if apiTLS.Cert != "" || apiTLS.Key != "" || apiTLS.CA != "" {
		cfg.TLS = apiTLS
	}
	if peerTLS.Cert != "" || peerTLS.Key != "" || peerTLS.CA != "" {
		cfg.PeerTLS = peerTLS
	}
	if *authFile != "" {
		store, err := auth.Load(*authFile)
		if err != nil {
			fmt.Fprintln(stderr, "lockd: --auth-file:", err)
			return 2
		}
		cfg.Auth = store
	}
	for _, h := range strings.Split(*allowedHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.AllowedHosts = append(cfg.AllowedHosts, h)
		}
	}
	if *dialOverride != "" {
		m, err := server.ParseDialOverrides(*dialOverride)
		if err != nil {
			fmt.Fprintln(stderr, "lockd:", err)
			return 2
		}
		cfg.RaftDialOverrides = m
	}
	if *signingKey != "" {
		priv, err := fence.LoadPrivateKey(*signingKey)
		if err != nil {
			fmt.Fprintln(stderr, "lockd: --signing-key:", err)
			return 2
		}
		cfg.Signer = func(g fence.Grant) string { return fence.SignGrant(priv, g) }
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "lockd: invalid configuration:", err)
		return 2
	}

	cfg.Version = version.String()
	cfg.Registry = prometheus.NewRegistry()
	// hashicorp/raft reports through go-metrics' process-wide sink, so it
	// is installed once per process, here, not in the server package
	// (several members share one test process).
	if _, err := raftmetrics.Install(cfg.Registry); err != nil {
		logger.Warn("raft metrics will not be exported", "err", err)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	srv, err := server.New(cfg)
	if err != nil {
		logger.Error("cannot start", "err", err)
		return 1
	}
wait:
	for {
		select {
		case <-srv.Removed():
			break wait // logged by the server
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				if err := srv.Reload(); err != nil {
					logger.Error("reload failed; keeping the previous certificates and tokens", "err", err)
				}
				continue
			}
			logger.Info("stopping", "signal", sig.String())
			break wait
		}
	}
	if err := srv.Close(); err != nil {
		logger.Error("shutdown", "err", err)
		return 1
	}
	return 0
}

// applyEnv sets every flag not given on the command line from
// LOCKD_<FLAG>, as the SPEC asks.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		key := "LOCKD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := lookup(key); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// parseBytes reads a size in bytes, with an optional unit: B, KiB, MiB,
// GiB (or KB, MB, GB as powers of 1000).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size: want a positive number of bytes, e.g. 512MiB or 2GiB", s)
	}
	return n * mult, nil
}
