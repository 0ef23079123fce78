package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdMemberMain is the hidden subcommand `lockbench etcd-member`: one etcd
// member through go.etcd.io/etcd/server/v3/embed, in its own process, with
// etcd's defaults (fsync on, 100 ms heartbeat, 1 s election, snapshot every
// 10,000 entries, no auto-compaction). It stops on SIGTERM.
func etcdMemberMain(args []string) int {
	fs := flag.NewFlagSet("etcd-member", flag.ContinueOnError)
	name := fs.String("name", "", "member name")
	dir := fs.String("data-dir", "", "data dir")
	clientURL := fs.String("client-url", "", "client URL")
	peerURL := fs.String("peer-url", "", "peer URL")
	initial := fs.String("initial-cluster", "", "name=peerURL,...")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cu, err1 := url.Parse(*clientURL)
	pu, err2 := url.Parse(*peerURL)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "etcd-member: bad URL")
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = *initial
	cfg.InitialClusterToken = "lockbench"
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{"stderr"}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		return 1
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd-member: not ready after 60s")
		e.Close()
		return 1
	case <-sig:
		e.Close()
		return 0
	}
	select {
	case <-sig:
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		e.Close()
		return 1
	}
	e.Close()
	return 0
}

type etcdMember struct {
	name, clientURL, peerURL string
	p                        *proc
}

// etcdCluster is N etcd members, each a re-executed lockbench process.
type etcdCluster struct {
	dir     string
	members []*etcdMember
}

func startEtcd(ctx context.Context, dir string, n int) (*etcdCluster, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &etcdCluster{dir: dir}
	var ic []string
	for i := 1; i <= n; i++ {
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
		m := &etcdMember{
			name:      fmt.Sprintf("e%d", i),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", cp),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", pp),
		}
		ic = append(ic, m.name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		p, err := startProc("etcd-"+m.name, filepath.Join(dir, m.name+".log"), self, "etcd-member",
			"--name", m.name, "--data-dir", filepath.Join(dir, m.name), "--client-url", m.clientURL,
			"--peer-url", m.peerURL, "--initial-cluster", strings.Join(ic, ","))
		if err != nil {
			c.stop()
			return nil, err
		}
		m.p = p
	}
	if _, err := c.leader(ctx); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *etcdCluster) stop() {
	for _, m := range c.members {
		if m.p != nil {
			m.p.stop(10 * time.Second)
		}
	}
}

func (c *etcdCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL)
	}
	return eps
}

func (c *etcdCluster) pids() []int {
	var ps []int
	for _, m := range c.members {
		if m.p != nil {
			ps = append(ps, m.p.pid())
		}
	}
	return ps
}

// leader asks each member for its status until one reports itself leader.
func (c *etcdCluster) leader(ctx context.Context) (*etcdMember, error) {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		for _, m := range c.members {
			if m.p != nil && m.p.exited() {
				return nil, fmt.Errorf("etcd %s exited: %v\n%s", m.name, m.p.err, m.p.logTail(2000))
			}
			cli, err := newEtcdClient([]string{m.clientURL})
			if err != nil {
				last = err
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := cli.Status(sctx, m.clientURL)
			cancel()
			cli.Close()
			if err != nil {
				last = err
				continue
			}
			if st.Leader != 0 && st.Leader == st.Header.MemberId {
				return m, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, errors.Join(errors.New("etcd: no leader within 60s"), last)
}

// newEtcdClient makes a clientv3 client with etcd's defaults and a quiet logger.
func newEtcdClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}
