package server

import (
	"errors"
	"fmt"

	"github.com/lockd/lockd/internal/locktable"
)

// DefaultQuotas are the defaults of lockd's quota flags: generous enough
// for the measured scale (one million held locks, a hundred thousand
// waiters; see docs/BENCHMARKS.md) and the benchmarks, low enough that no
// client can grow the replicated state until members run out of memory.
// The per-token quotas are off by default: with several tenants on one
// cluster, set them so that one cannot starve the rest.
var DefaultQuotas = locktable.Quotas{
	Sessions:        100_000,
	Locks:           2_000_000, // about 1.7 GiB of leader memory at ~850 MiB per million held locks
	WaitersPerLock:  10_000,
	LocksPerSession: 10_000,
	// Grants held plus waits queued: a semaphore's holders each count, so
	// a few semaphores cannot hold more than the locks quota allows.
	Grants: 2_000_000,
	// Values are up to 4 KiB each: without a byte bound, a million values
	// would be 4 GiB on every member.
	ValueBytes: 256 << 20,
}

// DefaultMaxWatches is --max-watches: a watch costs ~6 KiB while idle (its
// forwarding goroutine's stack, its buffer of changes, its records), so
// this bounds what watchers make a member hold to ~50 MiB however many
// connections open them (lockbench amplify, case c). Raise it on a member
// with the memory for more.
const DefaultMaxWatches = 8192

// stampQuotas writes this leader's configured quotas into the commands
// that Apply checks them on, as Propose stamps the time: Apply reads no
// configuration, so every member decides a command alike whatever its own
// flags say (the leader's at the time of the proposal win).
func (s *Server) stampQuotas(cmd *locktable.Command) {
	switch cmd.Op {
	case locktable.OpAcquire, locktable.OpCreateSession, locktable.OpSetValue:
		cmd.Quotas = s.cfg.Quotas
	}
}

// validateQuotas refuses negative quotas (0 means no limit).
func validateQuotas(q locktable.Quotas) error {
	var errs []error
	for _, x := range []struct {
		quota locktable.Quota
		v     int64
	}{
		{locktable.QuotaSessions, q.Sessions}, {locktable.QuotaSessionsPerOwner, q.SessionsPerOwner},
		{locktable.QuotaLocks, q.Locks}, {locktable.QuotaWaitersPerLock, q.WaitersPerLock},
		{locktable.QuotaLocksPerSession, q.LocksPerSession}, {locktable.QuotaLocksPerOwner, q.LocksPerOwner},
		{locktable.QuotaGrants, q.Grants}, {locktable.QuotaValueBytes, q.ValueBytes},
	} {
		if x.v < 0 {
			errs = append(errs, fmt.Errorf("--%s %d: want 0 (no limit) or more", x.quota, x.v))
		}
	}
	return errors.Join(errs...)
}
