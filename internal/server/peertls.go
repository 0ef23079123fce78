package server

import (
	"sync/atomic"

	"github.com/lockd/lockd/internal/raftnode"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// raftMembers gives the Raft transport's TLS checks the current Raft
// configuration. The transport accepts and dials before raftnode.New
// returns, so the node arrives later; until then, and whenever the
// configuration is empty (a member that is joining), the checks accept any
// member certificate of the cluster.
type raftMembers struct {
	node atomic.Pointer[raftnode.Node]
}

func (r *raftMembers) list() []tlsfiles.Member {
	n := r.node.Load()
	if n == nil {
		return nil
	}
	servers, err := n.Servers()
	if err != nil {
		return nil
	}
	out := make([]tlsfiles.Member, len(servers))
	for i, s := range servers {
		out[i] = tlsfiles.Member{ID: s.ID, Addr: s.RaftAddr}
	}
	return out
}

// peerPolicy is who may speak Raft with this member (see Config.PeerTLS).
func peerPolicy(cfg Config, members *raftMembers) tlsfiles.Peers {
	return tlsfiles.Peers{Cluster: cfg.ClusterID, Self: cfg.ID, Members: members.list}
}
