package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// FaultRestore is a forced `lockctl snapshot restore` of a backup taken a
// moment earlier, while acquire loops run (the restore phase). It rolls
// the lock table back by design; tokens must not go back (SPEC semantics
// 13).
const FaultRestore = "restore"

// restorePhase runs after the chaos, on its own locks (restore-*): acquire
// loops with fresh client ids, and meanwhile, rounds times, `lockctl
// snapshot save` then, after more grants, `lockctl snapshot restore
// --force`. Its ops carry TagRestore: the checkers that assume state only
// moves forward leave them out; the token checkers and the expiry checker
// read them. At the end the restore-* locks are listed until every one
// that should have come free was seen again.
func restorePhase(t *testing.T, c *Cluster, rec *Recorder, seed uint64, rounds int, et time.Duration) {
	lockctl := builds.Path(t, "lockctl")
	dir := t.TempDir()
	w := NewWorkload(rec, WorkloadOptions{Endpoints: c.Endpoints(), Seed: seed, ElectionTimeout: et})
	defer w.hc.CloseIdleConnections()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.restoreLoop(ctx, i, rand.New(rand.NewPCG(seed, uint64(1000+i))))
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 1100))
	eps := strings.Join(c.Endpoints(), ",")
	for round := 1; round <= rounds; round++ {
		sleep(context.Background(), jitter(rng, 500*time.Millisecond, time.Second))
		file := filepath.Join(dir, fmt.Sprintf("backup-%d.snap", round))
		f := Fault{Kind: FaultRestore, Detail: "lockctl snapshot save, then snapshot restore --force"}
		if out, err := runLockctl(lockctl, eps, "snapshot", "save", file); err != nil {
			f.Start, f.End, f.Err = rec.Now(), rec.Now(), fmt.Sprintf("snapshot save: %v: %s", err, out)
			rec.AddFault(f)
			continue
		}
		// Grants after the save, which the restore takes back.
		sleep(context.Background(), jitter(rng, 300*time.Millisecond, 800*time.Millisecond))
		f.Start = rec.Now()
		out, err := runLockctl(lockctl, eps, "snapshot", "restore", file, "--force")
		f.End = rec.Now()
		if err != nil {
			f.Err = fmt.Sprintf("snapshot restore: %v: %s", err, out)
		}
		f.Healed = f.End
		if err := c.WaitHealthy(20 * time.Second); err != nil {
			f.Stuck = true
			f.Err = strings.TrimPrefix(f.Err+"; ", "; ") + err.Error()
		}
		f.Healthy = rec.Now()
		rec.AddFault(f)
	}
	sleep(context.Background(), time.Second)
	stop()
	wg.Wait()
	w.settle(context.Background(), "restore-", TagRestore, 10*time.Second)
}

// restoreLoop makes as many grants as it can — a fresh client id each,
// on a few locks of its own, mostly free — and releases them at once, or
// one time in five walks away (so the backups hold grants to bring back).
func (w *Workload) restoreLoop(ctx context.Context, id int, rng *rand.Rand) {
	name := fmt.Sprintf("restore%d", id)
	ep := &endpoint{next: id}
	for seq := 0; ctx.Err() == nil; seq++ {
		lock := fmt.Sprintf("restore-%d-%d", id, rng.IntN(6))
		cid := fmt.Sprintf("r%d-%d", id, seq)
		ttl := jitter(rng, 500*time.Millisecond, 1500*time.Millisecond)
		g := w.acquireChain(ctx, ep, rng, name, lock, cid, ttl, 0, TagRestore, 3*time.Second)
		if g.Outcome != Ok {
			continue
		}
		if rng.IntN(5) != 0 {
			w.releaseChain(ctx, ep, rng, name, lock, cid, g.OutToken, TagRestore)
		}
	}
}

// runLockctl runs lockctl against the cluster and returns its output.
func runLockctl(bin, endpoints string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--endpoints", endpoints, "--timeout", "15s"}, args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
