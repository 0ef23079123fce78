package raftnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"
)

// memberIDFile records, in the data dir, the id of the member that owns it.
// Started with another --id, a member would find itself in no
// configuration and wait leaderless forever ("not part of stable
// configuration"); it refuses to start instead and names the owner.
const memberIDFile = "member-id"

func checkMemberID(dir, id string) error {
	b, err := os.ReadFile(filepath.Join(dir, memberIDFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("raftnode: read %s: %w", filepath.Join(dir, memberIDFile), err)
	}
	if owner := strings.TrimSpace(string(b)); owner != id {
		return fmt.Errorf("raftnode: data dir %s belongs to member %q, not %q: start it with --id %s, or give this member its own --data-dir", dir, owner, id, owner)
	}
	return nil
}

func writeMemberID(dir, id string) error {
	path := filepath.Join(dir, memberIDFile)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == id {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o640); err != nil {
		return fmt.Errorf("raftnode: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("raftnode: write %s: %w", path, err)
	}
	return nil
}

// checkInConfiguration refuses a data dir (from before member-id files)
// whose latest configuration has members but not this one: it belongs to
// another member, or this member was removed from the cluster.
func (n *Node) checkInConfiguration() error {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("raftnode: read the configuration: %w", err)
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return nil // a joiner that was never added: it waits to be
	}
	var ids []string
	for _, s := range servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			return nil
		}
		ids = append(ids, string(s.ID))
	}
	return fmt.Errorf("%w: the configuration in data dir %s has members %s but not %q: the data dir belongs to another member (start that one with its own --id), or %q was removed from the cluster (give it a fresh --data-dir and --join to come back)",
		ErrRemoved, n.cfg.DataDir, strings.Join(ids, ", "), n.cfg.ID, n.cfg.ID)
}

// ErrRemoved: this member is not in the cluster's configuration.
var ErrRemoved = errors.New("raftnode: this member is not part of the cluster")

// Removed reports whether the latest configuration has members but not
// this one: the member was removed (a joiner that was never added sees an
// empty configuration).
func (n *Node) Removed() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return false
	}
	for _, s := range servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			return false
		}
	}
	return true
}
