package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// findRepo returns the root of the lockd main module: dir if given, else the
// first directory upwards from the working directory whose go.mod declares
// module github.com/lockd/lockd.
func findRepo(dir string) (string, error) {
	if dir != "" {
		return filepath.Abs(dir)
	}
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/lockd/lockd\n") {
			return d, nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", errors.New("cannot find the lockd repository (a go.mod of module github.com/lockd/lockd above the working directory); pass --repo or --lockd-bin")
		}
		d = p
	}
}

// buildLockd builds cmd/lockd of the main module (with the main module's own
// go.mod, so the binary is exactly what `go build ./cmd/lockd` gives).
func buildLockd(repo, outDir string) (string, error) {
	if err := os.MkdirAll(filepath.Join(outDir, "bin"), 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(outDir, "bin", "lockd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/lockd")
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building lockd: %v\n%s", err, out)
	}
	return bin, nil
}

// gitDescribe returns the commit and whether the work tree is dirty, for the record.
func gitDescribe(repo string) string {
	out, err := exec.Command("git", "-C", repo, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	s := strings.TrimSpace(string(out))
	st, _ := exec.Command("git", "-C", repo, "status", "--porcelain", "--", ".", ":!bench", ":!docs").Output()
	if len(strings.TrimSpace(string(st))) > 0 {
		s += "+dirty"
	}
	return s
}

type lockdMember struct {
	id, httpURL, raftAddr, dataDir string
	httpAddr                       string
	args                           []string
	p                              *proc
}

// lockdCluster is N real lockd processes on loopback.
type lockdCluster struct {
	bin     string
	dir     string
	members []*lockdMember
}

// startLockd starts an n-member cluster with data under dir. extra flags go
// to every member.
func startLockd(ctx context.Context, bin, dir string, n int, extra []string) (*lockdCluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &lockdCluster{bin: bin, dir: dir}
	var ic []string
	for i := 1; i <= n; i++ {
		hp, err := freePort()
		if err != nil {
			return nil, err
		}
		rp, err := freePort()
		if err != nil {
			return nil, err
		}
		m := &lockdMember{
			id:       fmt.Sprintf("n%d", i),
			httpAddr: fmt.Sprintf("127.0.0.1:%d", hp),
			raftAddr: fmt.Sprintf("127.0.0.1:%d", rp),
			dataDir:  filepath.Join(dir, fmt.Sprintf("n%d", i)),
		}
		m.httpURL = "http://" + m.httpAddr
		ic = append(ic, m.id+"="+m.raftAddr)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.args = append([]string{
			"--id", m.id, "--data-dir", m.dataDir, "--http-addr", m.httpAddr, "--raft-addr", m.raftAddr,
			"--initial-cluster", strings.Join(ic, ","), "--log-level", "warn",
		}, extra...)
	}
	if err := c.startAll(ctx); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// startAll starts every member (on its existing data dir, if any) and waits
// until each is ready.
func (c *lockdCluster) startAll(ctx context.Context) error {
	for _, m := range c.members {
		p, err := startProc("lockd-"+m.id, filepath.Join(c.dir, m.id+".log"), c.bin, m.args...)
		if err != nil {
			return err
		}
		m.p = p
	}
	for _, m := range c.members {
		if err := waitHTTP200(ctx, m.httpURL+"/readyz", 60*time.Second); err != nil {
			return fmt.Errorf("lockd %s: %v\n%s", m.id, err, m.p.logTail(2000))
		}
	}
	return nil
}

func (c *lockdCluster) stop() {
	for _, m := range c.members {
		if m.p != nil {
			m.p.stop(10 * time.Second)
		}
	}
}

func (c *lockdCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.httpURL)
	}
	return eps
}

func (c *lockdCluster) pids() []int {
	var ps []int
	for _, m := range c.members {
		if m.p != nil {
			ps = append(ps, m.p.pid())
		}
	}
	return ps
}

type clusterStatus struct {
	LeaderID   string `json:"leader_id"`
	LeaderHTTP string `json:"leader_http"`
	Term       uint64 `json:"term"`
}

// leader returns the current leader member, polling until one is known.
func (c *lockdCluster) leader(ctx context.Context) (*lockdMember, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range c.members {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.httpURL+"/api/v1/cluster", nil)
			resp, err := hc.Do(req)
			if err != nil {
				continue
			}
			var st clusterStatus
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || st.LeaderID == "" {
				continue
			}
			for _, l := range c.members {
				if l.id == st.LeaderID {
					return l, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, errors.New("lockd: no leader within 30s")
}
