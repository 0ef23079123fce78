package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/httpapi"
	"github.com/lockd/lockd/internal/leader"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
	"github.com/lockd/lockd/internal/raftnode"
)

// The Server is the httpapi.Backend and the leader.Proposer.
var (
	_ httpapi.Backend = (*Server)(nil)
	_ leader.Proposer = (*Server)(nil)
)

// Ready reports whether this member is a leader that has finished its
// post-election barrier.
func (s *Server) Ready() bool { return s.ready.Load() && s.node.IsLeader() }

// LeaderURL is the leader's HTTP URL as published in the replicated state.
func (s *Server) LeaderURL() string {
	id, _ := s.node.Leader()
	if id == "" {
		return ""
	}
	if id == s.cfg.ID {
		return s.url
	}
	u := ""
	s.node.View(func(t *locktable.Table) {
		for _, m := range t.Members() {
			if m.ID == id {
				u = m.HTTPAddr
			}
		}
	})
	return u
}

// Propose stamps the leader's time into the command, replicates it and
// returns its result. What the command sets in motion (timers, pushes,
// metrics) is not handled here: the apply loop hands every committed
// entry's events on in log order (see effects.go), so a caller that gives
// up early, or two callers that return in the other order, change nothing.
func (s *Server) Propose(ctx context.Context, cmd locktable.Command) (locktable.Result, error) {
	cmd.Now = s.cfg.Now().UnixMilli()
	s.stampQuotas(&cmd)
	start := time.Now()
	res, err := s.node.Propose(ctx, cmd)
	s.metrics.observePropose(cmd.Op, res, err, time.Since(start))
	if err != nil {
		return res, mapErr(err)
	}
	return res, nil
}

func mapErr(err error) error {
	switch {
	case errors.Is(err, raftnode.ErrNotLeader), errors.Is(err, raftnode.ErrShutdown):
		return fmt.Errorf("%w: %w", httpapi.ErrNotLeader, err)
	case errors.Is(err, raftnode.ErrUnknownOutcome):
		return fmt.Errorf("%w: %w", httpapi.ErrUnknownOutcome, err)
	}
	return err
}

// ReadIndex makes the next View linearizable.
func (s *Server) ReadIndex(ctx context.Context) error {
	if !s.Ready() {
		return httpapi.ErrNotLeader
	}
	return mapErr(s.node.ReadIndex(ctx))
}

// View reads the local state.
func (s *Server) View(fn func(t *locktable.Table)) { s.node.View(fn) }

// Keepalive resets a session's TTL on this leader. It answers only after
// this member has confirmed its leadership with a quorum in a round that
// began after the keepalive arrived: a paused leader that wakes up deposed
// never extends a client's lease (SPEC semantics 10). The new deadline
// counts from the keepalive's arrival.
func (s *Server) Keepalive(ctx context.Context, id string) (int64, bool, error) {
	received := s.cfg.Now()
	if !s.Ready() {
		return 0, false, httpapi.ErrNotLeader
	}
	if err := s.node.ConfirmLeadership(ctx); err != nil {
		return 0, false, mapErr(err)
	}
	ttl, err := s.timers.Keepalive(id, received)
	if errors.Is(err, leader.ErrNotRunning) {
		return 0, false, fmt.Errorf("%w: %w", httpapi.ErrNotLeader, err)
	}
	if err != nil {
		return 0, false, err
	}
	return ttl, ttl > 0, nil
}

// WatchLock watches the committed changes of one lock's status.
func (s *Server) WatchLock(name string, buf int) *notify.Watch { return s.watches.WatchLock(name, buf) }

// WatchPrefix watches the committed changes of every lock under a prefix.
func (s *Server) WatchPrefix(prefix string, buf int) *notify.Watch {
	return s.watches.WatchPrefix(prefix, buf)
}

// Subscribe delivers committed events about a client.
func (s *Server) Subscribe(clientID string) *notify.Sub { return s.hub.Subscribe(clientID) }

// NewSessionID returns a random session id.
func (s *Server) NewSessionID() string { return newSessionID() }

// Sign returns the fencing proof for a grant, or "".
func (s *Server) Sign(lock string, token uint64, mode locktable.Mode, expiresAt int64) string {
	if s.cfg.Signer == nil {
		return ""
	}
	m := fence.ModeExclusive
	if mode == locktable.Shared {
		m = fence.ModeShared
	}
	return s.cfg.Signer(fence.Grant{Lock: lock, Token: token, Mode: m, ExpiresAt: expiresAt})
}

// Cluster describes the configuration as this member sees it.
func (s *Server) Cluster(ctx context.Context) (api.ClusterStatus, error) {
	servers, err := s.node.Servers()
	if err != nil {
		return api.ClusterStatus{}, err
	}
	addrs := map[string]string{}
	s.node.View(func(t *locktable.Table) {
		for _, m := range t.Members() {
			addrs[m.ID] = m.HTTPAddr
		}
	})
	addrs[s.cfg.ID] = s.url
	id, _ := s.node.Leader()
	cs := api.ClusterStatus{LeaderID: id, LeaderHTTP: s.LeaderURL(), Term: s.node.Term(), Members: []api.Member{}}
	for _, sv := range servers {
		cs.Members = append(cs.Members, api.Member{ID: sv.ID, RaftAddr: sv.RaftAddr, HTTPAddr: addrs[sv.ID], Voter: sv.Voter})
	}
	return cs, nil
}

// AddMember adds a member (non-voter first, promoted once it has caught up)
// and publishes its HTTP address. For a member already configured at the
// same Raft address it only publishes: joins and retries are idempotent.
func (s *Server) AddMember(ctx context.Context, req api.AddMemberRequest) error {
	// Both addresses are stored in the replicated state, and a raft_addr
	// that is not host:port would have the leader wait for a member that
	// can never catch up: refuse them before anything starts.
	if err := httpapi.ValidateAddMember(req); err != nil {
		return err
	}
	if !s.Ready() {
		return httpapi.ErrNotLeader
	}
	httpURL := normalizeURL(req.HTTPAddr)
	servers, err := s.node.Servers()
	if err != nil {
		return err
	}
	configured := false
	for _, sv := range servers {
		if sv.ID == req.ID && sv.RaftAddr == req.RaftAddr && sv.Voter {
			configured = true
		}
	}
	if !configured {
		target := s.node.CommitIndex()
		err := s.node.AddMember(ctx, req.ID, req.RaftAddr, func(ctx context.Context) error {
			return s.waitCaughtUp(ctx, httpURL, target)
		})
		if err != nil {
			if errors.Is(err, raftnode.ErrNotLeader) || errors.Is(err, raftnode.ErrUnknownOutcome) {
				return mapErr(err)
			}
			if errors.Is(err, raftnode.ErrNotCaughtUp) {
				return httpapi.Errorf(api.CodeInternal, "%s", err.Error())
			}
			return httpapi.Errorf(api.CodeInvalidArgument, "%s", err.Error())
		}
		s.log.Info("member added", "id", req.ID, "raft", req.RaftAddr, "http", httpURL)
	}
	_, err = s.Propose(ctx, locktable.Command{Op: locktable.OpSetMember, MemberID: req.ID,
		RaftAddr: req.RaftAddr, HTTPAddr: httpURL})
	return err
}

// waitCaughtUp polls the new member's status until it has applied the
// leader's commit index as of the add, or gives up after CatchUpTimeout.
func (s *Server) waitCaughtUp(ctx context.Context, base string, target uint64) error {
	if base == "" {
		return errors.New("no http address to check catch-up")
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CatchUpTimeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/status", nil)
		if resp, err := s.client.Do(req); err == nil {
			var st api.NodeStatus
			derr := json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if derr == nil && st.AppliedIndex >= target {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RemoveMember removes a member. A leader asked to remove itself hands
// leadership over first and lets the client retry on the new leader.
func (s *Server) RemoveMember(ctx context.Context, id string) error {
	if !s.Ready() {
		return httpapi.ErrNotLeader
	}
	servers, err := s.node.Servers()
	if err != nil {
		return err
	}
	found := false
	for _, sv := range servers {
		found = found || sv.ID == id
	}
	if !found {
		return httpapi.Errorf(api.CodeNotFound, "%s", "no member "+id)
	}
	if id == s.cfg.ID {
		if err := s.node.TransferLeadership(""); err != nil {
			return err
		}
		return fmt.Errorf("%w: leadership handed over before removing this member; retry", httpapi.ErrNotLeader)
	}
	if err := s.node.RemoveMember(id); err != nil {
		return mapErr(err)
	}
	s.log.Info("member removed", "id", id)
	_, err = s.Propose(ctx, locktable.Command{Op: locktable.OpRemoveMember, MemberID: id})
	return err
}

// TransferLeadership hands leadership to another member.
func (s *Server) TransferLeadership(ctx context.Context, to string) error {
	if !s.Ready() {
		return httpapi.ErrNotLeader
	}
	if to == s.cfg.ID {
		return nil
	}
	if to != "" {
		// hashicorp/raft accepts a transfer to a non-voter and then never
		// completes it: refuse it, as an unknown member is refused.
		servers, err := s.node.Servers()
		if err != nil {
			return err
		}
		for _, sv := range servers {
			if sv.ID == to && !sv.Voter {
				return httpapi.Errorf(api.CodeInvalidArgument, "member %s is not a voter yet (it is still catching up): leadership can only go to a voter", to)
			}
		}
	}
	if err := s.node.TransferLeadership(to); err != nil {
		if errors.Is(err, raftnode.ErrNotLeader) {
			return mapErr(err)
		}
		return httpapi.Errorf(api.CodeInvalidArgument, "%s", err.Error())
	}
	s.log.Info("leadership transferred", "to", to)
	return nil
}

// Status is this member's own view.
func (s *Server) Status() api.NodeStatus {
	id, _ := s.node.Leader()
	st := api.NodeStatus{ID: s.cfg.ID, State: s.node.State(), LeaderID: id, Term: s.node.Term(),
		CommitIndex: s.node.CommitIndex(), AppliedIndex: s.node.AppliedIndex(),
		LogStore: s.node.LogStore(), Version: s.cfg.Version}
	if st.Version == "" {
		st.Version = "dev"
	}
	s.node.View(func(t *locktable.Table) { st.LastToken = t.LastToken() })
	return st
}

// Readyz: a leader is known and this member's state is current.
func (s *Server) Readyz() (bool, string) {
	id, _ := s.node.Leader()
	if _, at := s.node.Undecodable(); at > 0 {
		return false, fmt.Sprintf("the committed entry at index %d was written by a newer lockd: this member halted there and applies nothing more; upgrade it", at)
	}
	if lc := s.node.LogCheck(); lc.Mismatches > 0 {
		return false, fmt.Sprintf("this member's Raft log differs from what the leader wrote (%d ranges; last: %s): replace its data dir (docs/OPERATIONS.md, Storage)", lc.Mismatches, lc.LastMismatch)
	}
	switch {
	case id == "":
		return false, "no leader known"
	case id == s.cfg.ID && !s.Ready():
		return false, "leader still applying entries of earlier terms"
	case id != s.cfg.ID && s.node.AppliedIndex() < s.node.CommitIndex():
		return false, "applying committed entries"
	case s.LeaderURL() == "":
		return false, "the leader's HTTP address is not known yet"
	}
	return true, ""
}

// Backup returns the encoded state after a linearizable read barrier.
func (s *Server) Backup(ctx context.Context) ([]byte, error) {
	if err := s.ReadIndex(ctx); err != nil {
		return nil, err
	}
	var b []byte
	s.node.View(func(t *locktable.Table) { b = t.Snapshot() })
	return b, nil
}

// RestoreBackup replaces the replicated state with a backup. Only an empty
// cluster takes one unless Force is set. Either way the token counter never
// goes down: the restore is built from the state at the moment it is
// installed, with no entry proposed in between (raftnode.RestoreSnapshot),
// so no token acknowledged before it can be issued again after it. The
// running cluster's member addresses are kept. The apply loop rebuilds the
// timers from the restored state, so sessions get a full TTL from now and
// TTL locks already past their expiry are released after one grace period.
func (s *Server) RestoreBackup(ctx context.Context, data []byte, opt httpapi.RestoreOptions) error {
	if !s.Ready() {
		return httpapi.ErrNotLeader
	}
	restored, err := locktable.Restore(data)
	if err != nil {
		return httpapi.Errorf(api.CodeInvalidArgument, "not a lockd backup: %v", err)
	}
	errNotEmpty := httpapi.Errorf(api.CodeInvalidArgument, "%s; restore into a fresh cluster, or pass force=true to replace it", api.MsgRestoreNotEmpty)
	err = s.node.RestoreSnapshot(ctx, func(current *locktable.Table) ([]byte, error) {
		st := current.Stats()
		if !opt.Force && (st.Locks != 0 || st.Sessions != 0 || st.LastToken != 0) {
			return nil, errNotEmpty
		}
		restored.PrepareRestore(current, opt.MinToken)
		return restored.Snapshot(), nil
	})
	if errors.Is(err, errNotEmpty) {
		return err
	}
	if err != nil {
		return mapErr(err)
	}
	st := restored.Stats()
	s.log.Info("backup restored", "locks", st.Locks, "sessions", st.Sessions, "last_token", st.LastToken)
	return nil
}
