package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/testutil/walfault"
)

// startNode starts a one-member cluster on dir and waits until it leads.
func startNode(t *testing.T, dir, store string) (*Node, error) {
	t.Helper()
	n, err := New(Config{ID: "n1", DataDir: dir, RaftAddr: "127.0.0.1:0", LogStore: store,
		RaftLogLevel: "error"})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { n.Kill() })
	waitFor(t, 10*time.Second, "a leader", func() bool { return n.IsLeader() })
	return n, nil
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func acquire(lock string) locktable.Command {
	return locktable.Command{Op: locktable.OpAcquire, Now: time.Now().UnixMilli(), Lock: lock, ClientID: "c", TTLms: 600000}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestChooseLogStore(t *testing.T) {
	for _, tc := range []struct {
		name, holds, want string
		store             string // "" when refused
		refusal           string
	}{
		{"new dir, default", "", "", "wal", ""},
		{"new dir, bolt asked", "", "bolt", "bolt", ""},
		{"new dir, wal asked", "", "wal", "wal", ""},
		{"bolt dir, default", "raft.db", "", "bolt", ""},
		{"bolt dir, bolt asked", "raft.db", "bolt", "bolt", ""},
		{"bolt dir, wal asked", "raft.db", "wal", "", "holds a bolt log, not wal"},
		{"wal dir, default", "wal", "", "wal", ""},
		{"wal dir, bolt asked", "wal", "bolt", "", "holds a wal log, not bolt"},
		{"both", "raft.db wal", "", "", "holds both"},
		{"memory on a bolt dir", "raft.db", "memory", "memory", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range strings.Fields(tc.holds) {
				var err error
				if f == "wal" {
					err = os.Mkdir(filepath.Join(dir, f), 0o750)
				} else {
					err = os.WriteFile(filepath.Join(dir, f), nil, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			store, found, err := chooseLogStore(dir, tc.want)
			if tc.store == "" {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("got %q, %v; want a refusal saying %q", store, err, tc.refusal)
				}
				return
			}
			if err != nil || store != tc.store || found != (tc.holds != "" && tc.want != "memory") {
				t.Fatalf("got %q (found %v), %v; want %q", store, found, err, tc.store)
			}
		})
	}
}

// TestNewDataDirGetsWAL: with no store asked for, a new data dir is created
// with raft-wal, and a restart finds it again.
func TestNewDataDirGetsWAL(t *testing.T) {
	dir := t.TempDir()
	n, err := startNode(t, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if n.LogStore() != "wal" || !exists(filepath.Join(dir, "wal")) || exists(filepath.Join(dir, "raft.db")) {
		t.Fatalf("store %q; wal/ %v raft.db %v", n.LogStore(), exists(filepath.Join(dir, "wal")), exists(filepath.Join(dir, "raft.db")))
	}
	if !n.LogCheck().Enabled {
		t.Fatal("the wal log is not verified")
	}
	if _, err := n.Propose(t.Context(), acquire("a")); err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	n, err = startNode(t, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if n.LogStore() != "wal" || !n.HadState() {
		t.Fatalf("restart: store %q, had state %v", n.LogStore(), n.HadState())
	}
}

// TestBoltDataDirKeepsBolt: a data dir made by an earlier lockd (bolt, the
// old default) keeps bolt when restarted with no flag, keeps its state, is
// never converted, and refuses an explicit wal.
func TestBoltDataDirKeepsBolt(t *testing.T) {
	dir := t.TempDir()
	n, err := startNode(t, dir, "bolt")
	if err != nil {
		t.Fatal(err)
	}
	res, err := n.Propose(t.Context(), acquire("kept"))
	if err != nil || !res.Granted {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	n.Shutdown()

	n, err = startNode(t, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if n.LogStore() != "bolt" || exists(filepath.Join(dir, "wal")) {
		t.Fatalf("restart with no flag: store %q, wal/ created %v", n.LogStore(), exists(filepath.Join(dir, "wal")))
	}
	if err := n.Barrier(t.Context()); err != nil {
		t.Fatal(err)
	}
	var held bool
	n.View(func(tb *locktable.Table) { held = tb.Get("kept").Held })
	if !held {
		t.Fatal("the bolt data dir lost its state")
	}
	n.Shutdown()

	_, err = New(Config{ID: "n1", DataDir: dir, RaftAddr: "127.0.0.1:0", LogStore: "wal"})
	if err == nil || !strings.Contains(err.Error(), "holds a bolt log") || !strings.Contains(err.Error(), "--log-store bolt") {
		t.Fatalf("wal asked on a bolt data dir: %v", err)
	}
	if exists(filepath.Join(dir, "wal")) {
		t.Fatal("the refused start left a wal/ behind")
	}
}

// TestWALInUseIsRefused: raft-wal waits forever for its lock; a second
// member on a data dir in use must fail at once instead.
func TestWALInUseIsRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := startNode(t, dir, ""); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := New(Config{ID: "n1", DataDir: dir, RaftAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "another lockd") {
		t.Fatalf("a second member on a wal in use: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refused after %v", d)
	}
}

// cluster starts n members bootstrapped together on fresh data dirs with
// the default store and returns them once one leads.
func cluster(t *testing.T, n int, mod func(*Config)) []*Node {
	t.Helper()
	base := t.TempDir()
	lns := make([]net.Listener, n)
	var peers []Peer
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), RaftAddr: ln.Addr().String()})
	}
	nodes := make([]*Node, n)
	for i, p := range peers {
		cfg := Config{ID: p.ID, DataDir: filepath.Join(base, p.ID), RaftAddr: p.RaftAddr, Listener: lns[i],
			InitialCluster: peers, Logger: slog.New(slog.DiscardHandler), RaftLogLevel: "error"}
		if mod != nil {
			mod(&cfg)
		}
		node, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = node
		t.Cleanup(func() { node.Kill() })
	}
	leader(t, nodes)
	return nodes
}

func leader(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	var l *Node
	waitFor(t, 15*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			if n.IsLeader() {
				l = n
				return true
			}
		}
		return false
	})
	return l
}

// traffic proposes count acquires from 8 goroutines (so group commit packs
// some into one entry) and waits until every member applied them.
func traffic(t *testing.T, nodes []*Node, prefix string, count int) {
	t.Helper()
	l := leader(t, nodes)
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			var err error
			for i := g; i < count && err == nil; i += 8 {
				_, err = l.Propose(t.Context(), acquire(fmt.Sprintf("%s-%d", prefix, i)))
			}
			errs <- err
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	target := l.AppliedIndex()
	waitFor(t, 10*time.Second, "every member to apply the traffic", func() bool {
		for _, n := range nodes {
			if n.AppliedIndex() < target {
				return false
			}
		}
		return true
	})
}

func checks(nodes []*Node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s %s: %+v\n", n.ID(), n.State(), n.LogCheck())
	}
	return b.String()
}

// TestLogCheckOnThreeMembers: the leader writes checkpoints by itself
// (here every 32 entries or 50 ms), every member checks each range against
// the leader's checksum, and after traffic — across a change of leader —
// none reports a mismatch. Checkpoints leave the state alone.
func TestLogCheckOnThreeMembers(t *testing.T) {
	nodes := cluster(t, 3, func(c *Config) { c.CheckpointEntries, c.CheckpointInterval = 32, 50*time.Millisecond })
	traffic(t, nodes, "a", 400)
	// The leader checkpoints only while entries are appended: on a loaded
	// machine the traffic can end before its checkpointer first looked, so
	// a trickle goes on until every member verified two ranges.
	trickle := 0
	waitFor(t, 20*time.Second, "every member to verify two ranges", func() bool {
		for _, n := range nodes {
			if n.LogCheck().Verified < 2 {
				trickle++
				_, _ = leader(t, nodes).Propose(t.Context(), acquire(fmt.Sprintf("trickle-%d", trickle)))
				return false
			}
		}
		return true
	})

	old := leader(t, nodes)
	if err := old.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a new leader", func() bool {
		for _, n := range nodes {
			if n != old && n.IsLeader() {
				return true
			}
		}
		return false
	})
	before := make([]uint64, len(nodes))
	for i, n := range nodes {
		before[i] = n.LogCheck().Verified
	}
	traffic(t, nodes, "b", 200)
	if _, err := leader(t, nodes).Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every member to verify a range written by the new leader", func() bool {
		for i, n := range nodes {
			if n.LogCheck().Verified <= before[i] {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if lc := n.LogCheck(); !lc.Enabled || lc.Mismatches != 0 {
			t.Fatalf("after traffic:\n%s", checks(nodes))
		}
	}
	if _, err := old.Checkpoint(t.Context()); err == nil {
		t.Fatal("a follower wrote a checkpoint")
	}
	var snaps [][]byte
	for _, n := range nodes {
		n.View(func(tb *locktable.Table) { snaps = append(snaps, tb.Snapshot()) })
	}
	for i := range snaps {
		if string(snaps[i]) != string(snaps[0]) {
			t.Fatalf("member %s's state differs from n1's", nodes[i].ID())
		}
	}
	t.Logf("\n%s", checks(nodes))
}

// TestLogCheckFindsCorruptFollowerLog: a byte of an entry flipped in a
// follower's wal on disk (the member itself never notices: it serves reads
// from its cache and applied the entry long ago) is found at the next
// checkpoint by that follower, and only by it.
func TestLogCheckFindsCorruptFollowerLog(t *testing.T) {
	nodes := cluster(t, 3, func(c *Config) { c.CheckpointEntries, c.CheckpointInterval = 1<<40, time.Hour })
	l := leader(t, nodes)
	const name = "corrupt-me-7f3a9c"
	if _, err := l.Propose(t.Context(), acquire(name)); err != nil {
		t.Fatal(err)
	}
	traffic(t, nodes, "x", 50)
	var f *Node
	for _, n := range nodes {
		if n != l {
			f = n
			break
		}
	}
	walfault.FlipInWAL(t, filepath.Join(f.cfg.DataDir, "wal"), name)

	if _, err := l.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every member to finish its check", func() bool {
		for _, n := range nodes {
			if lc := n.LogCheck(); lc.Verified+lc.Mismatches == 0 {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		lc := n.LogCheck()
		if n == f && (lc.Mismatches != 1 || !strings.Contains(lc.LastMismatch, "storage corruption")) ||
			n != f && lc.Mismatches != 0 {
			t.Fatalf("follower %s has the corrupt log:\n%s", f.ID(), checks(nodes))
		}
	}
}

// TestCheckpointIsANoOp: a checkpoint entry changes no state and sets
// nothing in motion on any member; only the node writes one.
func TestCheckpointIsANoOp(t *testing.T) {
	var effects []Effect
	f := newFSM(slog.New(slog.DiscardHandler), func(e Effect) { effects = append(effects, e) })
	applyCmd(t, f, 1, acquireBytes("a"))
	before := f.table.Snapshot()
	if r := applyCmd(t, f, 2, checkpointEntry); r.Code != locktable.OK || len(r.Events) != 0 {
		t.Fatalf("checkpoint applied as %+v", r)
	}
	if string(f.table.Snapshot()) != string(before) || len(effects) != 1 || f.index != 2 {
		t.Fatalf("a checkpoint changed the state or set something in motion: effects %+v", effects)
	}
	n := &Node{}
	if _, err := n.Propose(context.Background(), locktable.Command{Op: locktable.OpCheckpoint}); err == nil {
		t.Fatal("Propose took a checkpoint")
	}
}

// TestWALReopensAfterTailCut: raft-wal before v0.4.1 marked its tail segment
// sealed when Raft cut the log's tail but wrote no index for it, so the
// member could not read its log after a restart ("sealed segment has no
// index block", hashicorp/raft-wal#31); a chaos run's crash-all hit it.
func TestWALReopensAfterTailCut(t *testing.T) {
	dir := t.TempDir()
	open := func() (*raftwal.WAL, *metadb.BoltMetaDB) {
		meta := &metadb.BoltMetaDB{}
		w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
		if err != nil {
			t.Fatal(err)
		}
		return w, meta
	}
	w, meta := open()
	for i := uint64(1); i <= 5; i++ {
		if err := w.StoreLogs([]*raft.Log{entry(i, 1, "x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DeleteRange(5, 5); err != nil { // a new leader cuts the tail
		t.Fatal(err)
	}
	if err := w.StoreLogs([]*raft.Log{entry(5, 2, "y")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	meta.Close()

	w, meta = open()
	defer meta.Close()
	defer w.Close()
	var l raft.Log
	for i := uint64(1); i <= 5; i++ {
		if err := w.GetLog(i, &l); err != nil {
			t.Fatalf("entry %d after a restart: %v", i, err)
		}
	}
	if l.Term != 2 {
		t.Fatalf("entry 5 is of term %d, want the leader's 2", l.Term)
	}
}
