// Package chaos is lockd's fault-injection suite: real lockd processes on
// loopback with a fault-injecting proxy on every directed Raft link, a
// nemesis that kills, pauses, partitions and reconfigures them while
// clients (raw HTTP and the Go client over WebSocket) work, and checkers
// that read the recorded history: mutual exclusion, fencing-token order
// (also across a forced restore), FIFO, durability of acknowledged writes,
// the fencestore's token order, linearizability of lock operations with
// porcupine, the lock kinds (semaphore limits, shared beside exclusive,
// atomic multi-acquires, lock-delays, revocation), elections and watches
// (one leader at a time, leaders seen in token order, values set by their
// leaders, watches in log order with no change skipped, every status at
// one index the same, the final state shown) — and liveness: locks
// expire, waiters are told, the Go client lets go in time, watches and
// blocking queries keep up, no member dies (see README.md).
//
//	go test ./test/chaos -run Chaos -v                         # CI: ~30 s on 3 members + ~15 s on 5
//	go test ./test/chaos -run Chaos -v -timeout 0 -chaos.duration=10m -chaos.members=5 -chaos.seed=7
//	go test ./test/chaos -run Replay -v -chaos.replay=test/chaos/runs/<run>/history.json
//
// A failed run writes its history, violations and member logs to
// test/chaos/runs/<time>-seed<N>-m<members>/.
package chaos

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "length of one chaos run (0: the CI profile: about 30 s on 3 members, then 15 s on 5)")
	flagMembers  = flag.Int("chaos.members", 0, "cluster size for -chaos.duration runs (default 5)")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the fault schedule and the workload (0: from the clock; printed)")
	flagFaults   = flag.String("chaos.faults", "", "comma-separated fault kinds (default: all; see AllFaults)")
	flagKeep     = flag.Bool("chaos.keep", false, "write the history and logs of a passing run too")
	flagReplay   = flag.String("chaos.replay", "", "history.json of an earlier run to check again (TestReplay)")
	flagOverload = flag.Bool("chaos.overload", false, "a -chaos.duration run with the overload phase: flood generators and bursts of waits offer far more than the cluster commits, the whole run long")
	flagLockd    = flag.String("chaos.lockd-flags", "", "extra lockd flags for every member, space-separated (e.g. \"--log-store bolt\": the default is wal)")
)

// processStart is when this test binary started: cmd/go kills a test
// binary at -timeout plus one minute, so long runs budget against it.
var processStart = time.Now()

func TestMain(m *testing.M) {
	flag.Parse()
	// A run asked to last longer than the default test timeout must not be
	// killed by it: raise the binary's own alarm. (cmd/go still kills the
	// binary at its -timeout + 1m; runs shorten themselves to fit, see
	// runBudget, and say so.)
	if f := flag.Lookup("test.timeout"); f != nil {
		if cur, err := time.ParseDuration(f.Value.String()); err == nil && cur > 0 {
			cmdGoKill = processStart.Add(cur + time.Minute)
			if need := *flagDuration + 10*time.Minute; *flagDuration > 0 && cur < need {
				_ = f.Value.Set(need.String())
			}
		}
	}
	if err := checkFaultFlag(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { builds.Remove() }))
}

// cmdGoKill is when cmd/go will kill this binary (zero: no known limit).
var cmdGoKill time.Time

func checkFaultFlag() error {
	for _, k := range faultKinds(nil) {
		known := false
		for _, a := range AllFaults {
			known = known || a == k
		}
		if !known {
			return fmt.Errorf("-chaos.faults: unknown kind %q; known: %s", k, strings.Join(AllFaults, ","))
		}
	}
	return nil
}

// faultKinds returns the kinds named by -chaos.faults, or def (all kinds
// when def is nil).
func faultKinds(def []string) []string {
	if *flagFaults == "" {
		if def == nil {
			return AllFaults
		}
		return def
	}
	var out []string
	for _, k := range strings.Split(*flagFaults, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}
