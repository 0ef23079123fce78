// Package raftnode is the only package that imports hashicorp/raft. It runs
// one member: durable log and stable store (raft-wal or raft-boltdb, checked
// online by raft-wal's verifier), file snapshots, the TCP transport, the FSM
// adapter around the pure lock table, proposals with a clear "unknown
// outcome", linearizable reads, membership changes and leadership transfer.
package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"go.etcd.io/bbolt"

	"github.com/lockd/lockd/internal/locktable"
)

// Sentinel errors. ErrNotLeader means nothing was proposed: retrying on the
// leader is safe. ErrUnknownOutcome means the command may or may not commit
// (hashicorp/raft's ErrLeadershipLost: a new leader often commits it), so a
// retry must be idempotent.
var (
	ErrNotLeader      = errors.New("raftnode: not the leader")
	ErrUnknownOutcome = errors.New("raftnode: outcome unknown (leadership lost before commit)")
	ErrShutdown       = errors.New("raftnode: shut down")
	ErrNotCaughtUp    = errors.New("raftnode: new member did not catch up")
)

// Peer is a member of a static bootstrap.
type Peer struct {
	ID       string
	RaftAddr string
}

// Config configures one member.
type Config struct {
	ID        string
	DataDir   string
	RaftAddr  string // listen address
	Advertise string // address other members dial; defaults to the listen address
	// InitialCluster bootstraps a new cluster of these members (this one
	// included). Empty and Join false: bootstrap a one-member cluster.
	// Ignored when the data dir already holds state.
	InitialCluster []Peer
	Join           bool

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	SnapshotRetain     int
	// LogStore selects the log backend: "wal" (hashicorp/raft-wal), "bolt"
	// (raft-boltdb/v2), "memory" (tests only: nothing survives a restart),
	// or "" for the one the data dir holds, and wal for a new data dir. A
	// data dir keeps the store it was created with: a choice it contradicts
	// is refused. Both durable stores are checked by the log verifier.
	LogStore string
	// CheckpointEntries and CheckpointInterval set how often the leader
	// writes a log verifier checkpoint (DefaultCheckpointEntries).
	CheckpointEntries  uint64
	CheckpointInterval time.Duration

	// Listener and Dial replace the TCP listener and dialer of the Raft
	// transport; tests use them to cut and delay links. The node owns
	// Listener: it is closed with the node, or by New when New fails.
	Listener net.Listener
	Dial     func(addr string, timeout time.Duration) (net.Conn, error)

	// BatchSizes observes how many commands each log entry carries.
	BatchSizes Observer

	// Effects receives what every committed entry sets in motion, in log
	// order, on the goroutine that applies the log. It must not block: it
	// hands the effect on (the server queues it for its consumers).
	Effects func(Effect)

	// Logger receives the node's lines and hashicorp/raft's own, which
	// RaftLogLevel (trace, debug, info, warn, error or off) filters first.
	Logger       *slog.Logger
	RaftLogLevel string
}

func (c *Config) setDefaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 300 * time.Millisecond
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = 300 * time.Millisecond
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = c.HeartbeatTimeout / 2
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = 50 * time.Millisecond
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 120 * time.Second
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = 3
	}
	if c.CheckpointEntries == 0 {
		c.CheckpointEntries = DefaultCheckpointEntries
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RaftLogLevel == "" {
		c.RaftLogLevel = "warn"
	}
}

// Observer takes samples (a Prometheus histogram fits).
type Observer interface{ Observe(float64) }

type nopObserver struct{}

func (nopObserver) Observe(float64) {}

// Node is one running member.
type Node struct {
	cfg       Config
	raft      *raft.Raft
	fsm       *fsm
	transport *raft.NetworkTransport
	logs      raft.LogStore
	logStore  string       // the store in use: "wal", "bolt" or "memory"
	verified  *verifiedLog // nil for the memory store
	closers   []io.Closer
	log       *slog.Logger

	notifyCh chan bool
	changed  chan struct{} // coalesced leadership-change signal
	hadState bool

	proposals chan proposal
	// gate is held for reading by the batcher while it hands a batch to
	// Raft, and for writing by a restore, which so stops every new entry.
	gate       sync.RWMutex
	confirm    confirmer
	batchSizes Observer
	// snapFailures counts snapshots that could not be written.
	snapFailures atomic.Uint64
	done         chan struct{}
	wg           sync.WaitGroup
	stopOnce     sync.Once
}

// New opens the stores, starts Raft and, for a new data dir, bootstraps.
func New(cfg Config) (*Node, error) {
	cfg.setDefaults()
	if cfg.ID == "" {
		return nil, errors.New("raftnode: empty member id")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("raftnode: data dir: %w", err)
	}
	if err := checkMemberID(cfg.DataDir, cfg.ID); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, fsm: newFSM(cfg.Logger, cfg.Effects), log: cfg.Logger,
		notifyCh: make(chan bool, 64), changed: make(chan struct{}, 1), done: make(chan struct{}),
		proposals: make(chan proposal, 4096), batchSizes: cfg.BatchSizes}
	if n.batchSizes == nil {
		n.batchSizes = nopObserver{}
	}
	ok := false
	defer func() {
		if !ok {
			n.closeStores()
			if n.transport == nil && cfg.Listener != nil {
				cfg.Listener.Close() // New owns it; the transport would have closed it
			}
		}
	}()

	raftLevel, err := ParseRaftLogLevel(cfg.RaftLogLevel)
	if err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	hlog := newSlogHCLog(cfg.Logger, "raft", raftLevel)

	store, found, err := chooseLogStore(cfg.DataDir, cfg.LogStore)
	if err != nil {
		return nil, err
	}
	n.logStore = store
	n.log.Info("opening the log store", "store", store, "data_dir", cfg.DataDir, "found_in_data_dir", found)
	var logs raft.LogStore
	var stable raft.StableStore
	switch store {
	case "bolt":
		// No freelist sync: bolt rebuilds its freelist when it opens, so a
		// commit writes fewer pages (Consul's no_freelist_sync). The map
		// freelist keeps that rebuild and page allocation cheap.
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db"),
			BoltOptions: &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}})
		if errors.Is(err, bbolt.ErrTimeout) {
			return nil, fmt.Errorf("raftnode: %s is locked: is another lockd running on data dir %s?", filepath.Join(cfg.DataDir, "raft.db"), cfg.DataDir)
		}
		if err != nil {
			return nil, fmt.Errorf("raftnode: open log store: %w", err)
		}
		n.closers = append(n.closers, bolt)
		logs, stable = bolt, bolt
	case "wal":
		// raft-wal: segment files, one fsync per append (bolt does two);
		// measured here at about half bolt's commit latency. Its README
		// still calls it experimental: the log verifier below is why it is
		// the default all the same (docs/OPERATIONS.md, "Storage").
		dir := filepath.Join(cfg.DataDir, "wal")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("raftnode: wal dir: %w", err)
		}
		if err := walInUse(dir); err != nil {
			return nil, fmt.Errorf("raftnode: %w: is another lockd running on data dir %s?", err, cfg.DataDir)
		}
		// WAL.Close leaves its meta store open (and its file locked), so the
		// node owns the meta store and closes it after the WAL.
		meta := &metadb.BoltMetaDB{}
		n.closers = append(n.closers, meta)
		// Its counters (appends, bytes, segment rotations, truncations) go
		// to the same process-wide go-metrics sink as raft's own metrics.
		w, err := raftwal.Open(dir, raftwal.WithLogger(hlog.Named("wal")), raftwal.WithMetaStore(meta),
			raftwal.WithMetricsCollector(walmetrics.NewGoMetricsCollector([]string{"raft", "wal"}, nil, nil)))
		if err != nil {
			return nil, fmt.Errorf("raftnode: open wal: %w", err)
		}
		n.closers = append(n.closers, w)
		logs, stable = w, w
	case "memory":
		mem := raft.NewInmemStore()
		logs, stable = mem, mem
	default:
		return nil, fmt.Errorf("raftnode: unknown log store %q", cfg.LogStore)
	}
	if store != "memory" {
		// Below the cache, so the check reads what the disk returns.
		n.verified = newVerifiedLog(logs, cfg.Logger)
		n.closers = append(n.closers, n.verified)
		logs = n.verified
		// Replication reads back the entries it just appended: serve them
		// from memory instead of the store.
		cache, err := raft.NewLogCache(512, logs)
		if err != nil {
			return nil, err
		}
		logs = cache
	}
	files, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, hlog)
	if err != nil {
		return nil, fmt.Errorf("raftnode: snapshot store: %w", err)
	}
	snaps := countingSnapshots{SnapshotStore: files, failures: &n.snapFailures}

	ln := cfg.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftnode: listen %s: %w", cfg.RaftAddr, err)
		}
	}
	adv := cfg.Advertise
	if adv == "" {
		adv = ln.Addr().String()
	}
	advAddr, err := net.ResolveTCPAddr("tcp", adv)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("raftnode: advertise address %q: %w", adv, err)
	}
	if advAddr.IP == nil || advAddr.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raftnode: advertise address %q is not a dialable address", adv)
	}
	n.cfg.Advertise = adv
	stream := &streamLayer{Listener: ln, advertise: advAddr, dial: cfg.Dial}
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 5, Timeout: 10 * time.Second, Logger: hlog,
	})
	n.closers = append(n.closers, n.transport)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.NotifyCh = n.notifyCh
	rc.Logger = hlog
	rc.NoLegacyTelemetry = true
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}

	// Closed first, before the stores: hashicorp/raft answers a heartbeat
	// on the transport's goroutine, which checks for shutdown and then
	// writes the term; one arriving during a shutdown wrote to a closed
	// store, and raft panics on that ("failed to save current term").
	guard := &stableGuard{StableStore: stable}
	stable = guard
	n.closers = append(n.closers, guard)
	hasState, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return nil, fmt.Errorf("raftnode: inspect data dir: %w", err)
	}
	r, err := raft.NewRaft(rc, n.fsm, logs, stable, snaps, n.transport)
	if err != nil {
		return nil, fmt.Errorf("raftnode: start raft: %w", err)
	}
	n.raft = r
	n.logs = logs
	n.hadState = hasState

	switch {
	case hasState:
		if err := n.checkInConfiguration(); err != nil {
			r.Shutdown()
			return nil, err
		}
		n.log.Info("restarting on existing state", "data_dir", cfg.DataDir)
	case len(cfg.InitialCluster) > 0:
		var servers []raft.Server
		for _, p := range cfg.InitialCluster {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
		}
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			r.Shutdown()
			return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
		}
		n.log.Info("bootstrapped a new cluster", "members", len(servers))
	case !cfg.Join:
		err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter,
			ID: raft.ServerID(cfg.ID), Address: raft.ServerAddress(adv)}}}).Error()
		if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			r.Shutdown()
			return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
		}
		n.log.Info("bootstrapped a one-member cluster")
	default:
		n.log.Info("waiting to be added to an existing cluster")
	}

	n.wg.Add(2)
	go n.watchLeadership()
	go n.runBatcher()
	if n.verified != nil {
		n.wg.Add(1)
		go n.runCheckpoints()
	}
	if err := writeMemberID(cfg.DataDir, cfg.ID); err != nil {
		r.Shutdown()
		return nil, err
	}
	ok = true
	return n, nil
}

// watchLeadership drains raft's NotifyCh at once (a full channel blocks
// Raft: Consul #6852) and turns it into a coalesced signal. It never calls
// into Raft.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.notifyCh:
			select {
			case n.changed <- struct{}{}:
			default:
			}
		case <-n.done:
			return
		}
	}
}

// LeadershipChanged signals (coalesced) that leadership may have changed;
// read IsLeader and Term after it fires.
func (n *Node) LeadershipChanged() <-chan struct{} { return n.changed }

// IsLeader reports what Raft last told: a hint, not a lease.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// HadState reports whether the data dir held Raft state at start (a
// restart rather than a new member).
func (n *Node) HadState() bool { return n.hadState }

// ID is this member's id.
func (n *Node) ID() string { return n.cfg.ID }

// LogStore names the log store in use: "wal", "bolt" or "memory".
func (n *Node) LogStore() string { return n.logStore }

// RaftAddr is the address other members dial.
func (n *Node) RaftAddr() string { return n.cfg.Advertise }

// Leader returns the id and Raft address of the leader this member knows.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// Term is the current Raft term.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// State is "Leader", "Follower", "Candidate" or "Shutdown".
func (n *Node) State() string { return n.raft.State().String() }

// CommitIndex is the highest log index known committed.
func (n *Node) CommitIndex() uint64 { return n.raft.CommitIndex() }

// AppliedIndex is the highest log index Raft has handed to the state
// machine (entries of every type; the FSM may still be applying the last
// few commands).
func (n *Node) AppliedIndex() uint64 { return n.raft.AppliedIndex() }

// Undecodable reports how many committed entries this member could not
// decode, and the index of one that a newer lockd wrote, at which this
// member halted (0: none; a halted member applies nothing more).
func (n *Node) Undecodable() (count, haltedAt uint64) {
	return n.fsm.undecodable.Load(), n.fsm.halted.Load()
}

// Stats returns hashicorp/raft's own counters.
func (n *Node) Stats() map[string]string { return n.raft.Stats() }

// View runs fn with the table under a read lock: a local (possibly stale)
// read. Pair it with ReadIndex for a linearizable one.
func (n *Node) View(fn func(t *locktable.Table)) {
	n.fsm.mu.RLock()
	defer n.fsm.mu.RUnlock()
	fn(n.fsm.table)
}

// SetWatching turns on (or off) recording the status of every lock an
// entry changes in its Effect, for watchers of lock statuses.
func (n *Node) SetWatching(on bool) { n.fsm.watching.Store(on) }

// ViewAt is View that also names the last log index the table reflects (0
// when unknown: right after a snapshot was installed). Effects of entries
// at or below it are already in what fn sees.
func (n *Node) ViewAt(fn func(t *locktable.Table, index uint64)) {
	n.fsm.mu.RLock()
	defer n.fsm.mu.RUnlock()
	fn(n.fsm.table, n.fsm.index)
}

func mapApplyErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress),
		errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	default: // ErrLeadershipLost and anything else after enqueue
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	}
}

// Barrier waits until everything committed before it is applied here. A new
// leader calls it before serving or starting timers.
func (n *Node) Barrier(ctx context.Context) error {
	timeout := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	// Every entry up to the last one appended before the barrier is applied
	// to the FSM once it returns, whatever its type.
	last := n.raft.LastIndex()
	if err := n.raft.Barrier(timeout).Error(); err != nil {
		return mapApplyErr(err)
	}
	n.fsm.raise(last)
	return nil
}

// ReadIndex makes the next View linearizable: it confirms leadership with a
// quorum and waits until everything committed at the time of the call is
// applied here (hashicorp/raft has no ReadIndex; this is rqlite's recipe).
// It must only be used after the leader's post-election Barrier.
func (n *Node) ReadIndex(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	term := n.raft.CurrentTerm()
	idx := n.raft.CommitIndex()
	if err := n.verifyLeader(term); err != nil {
		return err
	}
	return n.WaitApplied(ctx, idx)
}

// verifyLeader confirms with a quorum that this member still leads in
// term. hashicorp/raft counts any heartbeat acknowledgement that arrives
// after a verification began, including one for a heartbeat sent before
// the leader was paused: a leader that wakes up deposed can get a stale
// yes from the first round. A second round's acknowledgements come from
// heartbeats sent after the first round ended, so two rounds in a row
// cannot both be stale.
func (n *Node) verifyLeader(term uint64) error {
	for range 2 {
		if err := n.raft.VerifyLeader().Error(); err != nil {
			return fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
	}
	if n.raft.CurrentTerm() != term {
		return ErrNotLeader
	}
	return nil
}

// WaitApplied blocks until the state machine reflects every entry up to
// idx. The FSM sees only command entries, so when the entries after the last
// applied command are no-ops, barriers or configuration changes, it is enough
// that Raft has dispatched them. When that cannot be told from the log (the
// entries were compacted into a snapshot, or there are too many to scan)
// a Barrier settles it — but only once the state machine has stopped
// moving, so reads behind a busy state machine do not each add a write.
func (n *Node) WaitApplied(ctx context.Context, idx uint64) error {
	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	seen := uint64(0) // the applied index at the previous undecided look
	for {
		cur, ch := n.fsm.appliedWait()
		if cur >= idx {
			return nil
		}
		if n.raft.AppliedIndex() >= idx {
			switch n.commandIn(cur+1, idx) {
			case noCommand:
				return nil
			case unknown:
				if cur == seen {
					if err := n.Barrier(ctx); err != nil {
						return err
					}
					continue
				}
				seen = cur
			}
		}
		select {
		case <-ch:
		case <-poll.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.done:
			return ErrShutdown
		}
	}
}

type scan int

const (
	noCommand scan = iota
	hasCommand
	unknown
)

// commandIn tells whether any log entry in [from, to] is a command the FSM
// must still apply.
func (n *Node) commandIn(from, to uint64) scan {
	if to < from {
		return noCommand
	}
	if to-from > 64 {
		return unknown
	}
	var l raft.Log
	for i := from; i <= to; i++ {
		if err := n.logs.GetLog(i, &l); err != nil {
			return unknown
		}
		if l.Type == raft.LogCommand {
			return hasCommand
		}
	}
	return noCommand
}

// Server is one entry of the Raft configuration.
type Server struct {
	ID       string
	RaftAddr string
	Voter    bool
}

// Servers returns the current Raft configuration.
func (n *Node) Servers() ([]Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), RaftAddr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// AddMember adds a member as a non-voter, waits for caughtUp (which should
// return once the new member has the log), then promotes it to voter. So a
// lagging newcomer never counts toward the quorum it cannot yet serve; one
// that never catches up is removed again and the call fails.
func (n *Node) AddMember(ctx context.Context, id, addr string, caughtUp func(context.Context) error) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == id && s.RaftAddr == addr && s.Voter {
			return nil // already a voter: an idempotent retry
		}
		if s.ID != id && s.RaftAddr == addr {
			return fmt.Errorf("raftnode: address %s already used by member %s", addr, s.ID)
		}
	}
	if err := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return mapApplyErr(err)
	}
	if caughtUp != nil {
		if err := caughtUp(ctx); err != nil {
			// A member that cannot catch up (unreachable, wrong certificate,
			// not started) must not become a voter: it would count toward a
			// quorum it cannot serve. Take it out again.
			n.log.Warn("new member did not catch up; removing it", "id", id, "err", err)
			if rerr := n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); rerr != nil {
				n.log.Warn("removing the member that did not catch up failed", "id", id, "err", rerr)
			}
			return fmt.Errorf("%w: member %s did not catch up with the log: %v", ErrNotCaughtUp, id, err)
		}
	}
	if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return mapApplyErr(err)
	}
	return nil
}

// RemoveMember removes a member from the configuration.
func (n *Node) RemoveMember(id string) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); err != nil {
		return mapApplyErr(err)
	}
	return nil
}

// TransferLeadership hands leadership to the named member, or to the most
// up-to-date one when to is empty.
func (n *Node) TransferLeadership(to string) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	var f raft.Future
	if to == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		servers, err := n.Servers()
		if err != nil {
			return err
		}
		addr := ""
		for _, s := range servers {
			if s.ID == to {
				addr = s.RaftAddr
			}
		}
		if addr == "" {
			return fmt.Errorf("raftnode: no member %q", to)
		}
		f = n.raft.LeadershipTransferToServer(raft.ServerID(to), raft.ServerAddress(addr))
	}
	return f.Error()
}

// RestoreSnapshot replaces the whole replicated state with what build
// makes of the current one (a backup adapted to it). It runs on the leader,
// keeps the current Raft configuration, and reaches the followers as an
// installed snapshot.
//
// No entry is proposed from the moment build reads the current state until
// the restore is installed: the batcher is stopped and a barrier applies
// everything already handed to Raft first. So build sees every fencing
// token ever acknowledged, and nothing issued meanwhile can be forgotten by
// the restore (SPEC semantics 13). Proposals queue meanwhile.
func (n *Node) RestoreSnapshot(ctx context.Context, build func(current *locktable.Table) ([]byte, error)) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	n.gate.Lock()
	defer n.gate.Unlock()
	if err := n.Barrier(ctx); err != nil {
		return err
	}
	var data []byte
	var err error
	n.View(func(t *locktable.Table) { data, err = build(t) })
	if err != nil {
		return err
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Size: int64(len(data))}
	if err := n.raft.Restore(meta, bytes.NewReader(data), 60*time.Second); err != nil {
		return mapApplyErr(err)
	}
	// The restored state stands for every index up to the restore's.
	n.fsm.raise(n.raft.AppliedIndex())
	return nil
}

// Shutdown stops the member: leadership is handed over first when this
// member leads (a few ms instead of an election timeout of unavailability),
// then Raft stops and the stores are flushed and closed.
func (n *Node) Shutdown() error {
	var err error
	n.stopOnce.Do(func() {
		if n.raft.State() == raft.Leader {
			tf := n.raft.LeadershipTransfer()
			ch := make(chan error, 1)
			go func() { ch <- tf.Error() }()
			select {
			case e := <-ch:
				if e != nil {
					n.log.Info("leadership transfer before shutdown failed", "err", e)
				}
			case <-time.After(3 * time.Second):
			}
		}
		err = n.raft.Shutdown().Error()
		n.confirm.stop()
		close(n.done)
		n.wg.Wait()
		n.closeStores()
	})
	return err
}

// Kill stops the member without handing over leadership (tests use it as
// a crash that keeps the process).
func (n *Node) Kill() error {
	var err error
	n.stopOnce.Do(func() {
		err = n.raft.Shutdown().Error()
		n.confirm.stop()
		close(n.done)
		n.wg.Wait()
		n.closeStores()
	})
	return err
}

// chooseLogStore picks the log store for a data dir: the one it holds
// (raft.db: bolt, wal/: wal), or for a new data dir the one asked for, wal
// by default. Opening the other store than the one a data dir holds would
// find no state and bootstrap a second, empty history, so an explicit
// choice the data dir contradicts is refused, and a data dir is never
// converted.
func chooseLogStore(dir, want string) (store string, found bool, err error) {
	if want == "memory" {
		return want, false, nil
	}
	var held []string
	for _, s := range [...]struct{ store, file string }{{"bolt", "raft.db"}, {"wal", "wal"}} {
		if _, err := os.Stat(filepath.Join(dir, s.file)); err == nil {
			held = append(held, s.store)
		}
	}
	switch {
	case len(held) > 1:
		return "", false, fmt.Errorf("raftnode: data dir %s holds both a bolt log (raft.db) and a wal log (wal/); "+
			"move the one not in use out of it", dir)
	case len(held) == 1 && want != "" && want != held[0]:
		return "", false, fmt.Errorf("raftnode: data dir %s holds a %s log, not %s: a data dir keeps the log store it was created with; "+
			"start with --log-store %s or without --log-store", dir, held[0], want, held[0])
	case len(held) == 1:
		return held[0], true, nil
	case want != "":
		return want, false, nil
	}
	return "wal", false, nil
}

// walInUse fails when another process has the wal open. raft-wal opens its
// meta store (bolt) with no lock timeout, so a second lockd on the same data
// dir would wait for the lock forever: look first, with a timeout.
func walInUse(dir string) error {
	path := filepath.Join(dir, metadb.FileName)
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if errors.Is(err, bbolt.ErrTimeout) {
		return fmt.Errorf("%s is locked", path)
	}
	if err != nil {
		return nil // absent (a new log), or unreadable: raftwal.Open says why
	}
	return db.Close()
}

func (n *Node) closeStores() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		_ = n.closers[i].Close()
	}
	n.closers = nil
}

// streamLayer is raft's TCP stream layer with a pluggable dialer.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	dial      func(string, time.Duration) (net.Conn, error)
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.dial != nil {
		return s.dial(string(addr), timeout)
	}
	return net.DialTimeout("tcp", string(addr), timeout)
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }
