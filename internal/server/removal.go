package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
)

// A member removed from the configuration often never learns it: the
// leader stops replicating to it as the removal commits, so its own
// configuration still lists it, and it stands for elections nobody answers,
// serving no_leader. watchRemoval finds out instead: while this member has
// no leader, it asks the members it knows whom they follow; a member that
// has a leader and a configuration without this one says it was removed.
// The member then logs it and stops (Removed), rather than run on uselessly.

// removalCheckEvery is how often a leaderless member checks.
const removalCheckEvery = 2 * time.Second

// Removed is closed when this member learned it was removed from the
// cluster; the process should stop.
func (s *Server) Removed() <-chan struct{} { return s.removed }

func (s *Server) watchRemoval() {
	defer s.wg.Done()
	t := time.NewTicker(removalCheckEvery)
	defer t.Stop()
	leaderless := 0
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if id, _ := s.node.Leader(); id != "" {
			leaderless = 0
			continue
		}
		leaderless++
		if leaderless < 2 { // an election in progress
			continue
		}
		if by, ok := s.removedFrom(); ok {
			s.log.Error("this member was removed from the cluster; stopping (to rejoin, start it with a fresh --data-dir and --join)",
				"id", s.cfg.ID, "seen_by", by)
			close(s.removed)
			return
		}
	}
}

// removedFrom asks the other members this one knows; it reports a member
// that follows a leader and whose configuration lacks this member.
func (s *Server) removedFrom() (string, bool) {
	if s.node.Removed() {
		return s.cfg.ID, true
	}
	var peers []locktable.Member
	s.node.View(func(t *locktable.Table) { peers = t.Members() })
	for _, p := range peers {
		if p.ID == s.cfg.ID || p.HTTPAddr == "" {
			continue
		}
		cs, err := s.clusterOf(p.HTTPAddr)
		if err != nil || cs.LeaderID == "" || len(cs.Members) == 0 {
			continue
		}
		in := false
		for _, m := range cs.Members {
			in = in || m.ID == s.cfg.ID
		}
		if !in {
			return p.ID, true
		}
	}
	return "", false
}

func (s *Server) clusterOf(base string) (api.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(s.baseCtx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, normalizeURL(base)+"/api/v1/cluster", nil)
	if err != nil {
		return api.ClusterStatus{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return api.ClusterStatus{}, err
	}
	defer resp.Body.Close()
	var cs api.ClusterStatus
	if resp.StatusCode != http.StatusOK {
		return cs, errStatus(resp.StatusCode)
	}
	err = json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&cs)
	return cs, err
}

type errStatus int

func (e errStatus) Error() string { return http.StatusText(int(e)) }
