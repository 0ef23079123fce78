// Package e2e runs the real lockd binary as separate processes on loopback
// and hurts them the way production does: SIGKILL, SIGSTOP, full restarts.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

var builds testutil.Builds

func TestMain(m *testing.M) {
	code := m.Run()
	builds.Remove()
	os.Exit(code)
}

// Bin builds cmd/<name> once per test binary and returns its path.
func Bin(t testing.TB, name string) string { return builds.Path(t, name) }

type proc struct {
	id, dir, httpAddr, raftAddr string
	cmd                         *exec.Cmd
	log                         string
	extra                       []string
}

func (p *proc) url() string { return "http://" + p.httpAddr }

type procCluster struct {
	t     *testing.T
	procs map[string]*proc
	order []string
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startCluster starts n lockd processes bootstrapped together and waits
// until each answers /readyz.
func startCluster(t *testing.T, n int, extra ...string) *procCluster {
	t.Helper()
	pc := &procCluster{t: t, procs: map[string]*proc{}}
	base := t.TempDir()
	var initial []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		p := &proc{id: id, dir: filepath.Join(base, id), httpAddr: freePort(t), raftAddr: freePort(t),
			log: filepath.Join(base, id+".log"), extra: extra}
		pc.procs[id] = p
		pc.order = append(pc.order, id)
		initial = append(initial, id+"="+p.raftAddr)
	}
	for _, id := range pc.order {
		pc.start(id, "--initial-cluster", strings.Join(initial, ","))
	}
	t.Cleanup(func() {
		for _, id := range pc.order {
			pc.kill(id)
		}
		if t.Failed() {
			for _, id := range pc.order {
				b, _ := os.ReadFile(pc.procs[id].log)
				t.Logf("--- log of %s ---\n%s", id, b)
			}
		}
	})
	for _, id := range pc.order {
		pc.waitReady(id, 30*time.Second)
	}
	return pc
}

func (pc *procCluster) start(id string, args ...string) {
	pc.t.Helper()
	p := pc.procs[id]
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		pc.t.Fatal(err)
	}
	full := append([]string{"--id", id, "--data-dir", p.dir, "--http-addr", p.httpAddr, "--raft-addr", p.raftAddr}, args...)
	full = append(full, p.extra...)
	cmd := exec.Command(Bin(pc.t, "lockd"), full...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		pc.t.Fatal(err)
	}
	f.Close()
	p.cmd = cmd
}

// kill sends SIGKILL and reaps the process.
func (pc *procCluster) kill(id string) {
	p := pc.procs[id]
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// signal sends a signal without reaping (SIGSTOP/SIGCONT/SIGTERM).
func (pc *procCluster) signal(id string, sig syscall.Signal) {
	if p := pc.procs[id]; p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

func (pc *procCluster) waitReady(id string, d time.Duration) {
	pc.t.Helper()
	testutil.WaitFor(pc.t, d, "member "+id+" to be ready", func() bool {
		return testutil.Get(pc.procs[id].url()+"/readyz").Status == 200
	})
}

// up returns the ids of running members.
func (pc *procCluster) up() []string {
	var out []string
	for _, id := range pc.order {
		if pc.procs[id].cmd != nil {
			out = append(out, id)
		}
	}
	return out
}

// leader asks the running members who leads, until they agree.
func (pc *procCluster) leader(d time.Duration) string {
	pc.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		votes := map[string]int{}
		up := pc.up()
		for _, id := range up {
			r := testutil.Get(pc.procs[id].url() + "/api/v1/cluster")
			if l := r.Str("leader_id"); l != "" {
				votes[l]++
			}
		}
		for l, n := range votes {
			if n == len(up) && pc.procs[l].cmd != nil {
				return l
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	pc.t.Fatal("members do not agree on a leader")
	return ""
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
