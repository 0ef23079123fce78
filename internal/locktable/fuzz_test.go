package locktable_test

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// busySnapshot is a small state with a bit of everything, for fuzz targets
// to apply commands to.
func busySnapshot() []byte {
	tb := lt.New()
	for _, c := range []lt.Command{
		owned(mkSess("sess-1", "worker-7", 15000, t0), "tenant-a", lt.Quotas{}),
		owned(acqS("jobs/nightly", "worker-7", "sess-1", 30000, 0, t0), "tenant-a", lt.Quotas{}),
		owned(acq("jobs/nightly", "worker-8", 1000, 5000, t0), "tenant-b", lt.Quotas{}),
		acqS("a", "worker-7", "sess-1", 0, 0, t0),
		acq("b", "c1", 1000, 0, t0),
		rel("b", "c1", 3, t0),
		acq("b", "c2", 100, 0, t0),
		acqS("b", "worker-7", "sess-1", 0, 60000, t0),
		setMember("node1", "127.0.0.1:7071", "http://127.0.0.1:7070", t0),
	} {
		tb.Apply(c)
	}
	return tb.Snapshot()
}

// FuzzDecodeCommand: DecodeCommand never panics; what it accepts re-encodes
// to a canonical form (never longer than the input) that decodes to the same
// command; and Apply takes any decodable command without panicking.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range everyOp() {
		f.Add(encode(c))
	}
	f.Add(encode(lt.Command{Op: lt.OpBatch, Now: t0, Batch: everyOp()}))
	f.Add(encode(owned(acqS("jobs/nightly", "worker-9", "sess-1", 0, 5000, t0), "tenant-a",
		lt.Quotas{Sessions: 10, Locks: 5, WaitersPerLock: 1, LocksPerSession: 2, LocksPerOwner: 3})))
	for _, c := range kindCommands() {
		f.Add(encode(c))
	}
	f.Add(encode(lt.Command{Op: lt.OpBatch, Now: t0, Batch: append(everyOp(), kindCommands()...)}))
	for _, c := range kindsLog() {
		f.Add(encode(c))
	}
	f.Add([]byte{})
	busy, kinds := busySnapshot(), kindsSnapshot(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := lt.DecodeCommand(b)
		if err != nil {
			if !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		b2 := c.Encode()
		if len(b2) > len(b) {
			t.Fatalf("canonical encoding (%d bytes) longer than the input (%d)", len(b2), len(b))
		}
		c2, err := lt.DecodeCommand(b2)
		if err != nil {
			t.Fatalf("re-encoded command does not decode: %v\n%+v", err, c)
		}
		if !commandsEqual(c, c2) {
			t.Fatalf("round trip changed the command\n %+v\n %+v", c, c2)
		}
		if b3 := c2.Encode(); !bytes.Equal(b2, b3) {
			t.Fatalf("encoding is not canonical: %x vs %x", b2, b3)
		}
		lt.New().Apply(c)
		for _, snap := range [][]byte{busy, kinds} {
			tb, err := lt.Restore(snap)
			if err != nil {
				t.Fatal(err)
			}
			prev := tb.LastToken()
			tb.Apply(c)
			if err := checkInvariants(tb, prev); err != nil {
				t.Fatalf("%v: %v", describe(c), err)
			}
			if err := lt.CheckCounters(tb); err != nil {
				t.Fatalf("%v: %v", describe(c), err)
			}
			if err := checkShapes(tb); err != nil {
				t.Fatalf("%v: %v", describe(c), err)
			}
		}
	})
}

// FuzzRestore: Restore never panics, allocates in proportion to its input,
// and what it accepts snapshots to a fixed point and takes further commands
// without panicking.
func FuzzRestore(f *testing.F) {
	f.Add(lt.New().Snapshot())
	f.Add(busySnapshot())
	f.Add([]byte("LOCKDSNP\x01"))
	f.Add([]byte("LOCKDSNP\x02"))
	f.Add([]byte("LOCKDSNP\x03"))
	f.Add(kindsSnapshot(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tb, err := lt.Restore(b)
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20+512*uint64(len(b)) {
			t.Fatalf("Restore of %d bytes allocated %d bytes", len(b), alloc)
		}
		if err != nil {
			if !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if err := lt.CheckCounters(tb); err != nil {
			t.Fatalf("restored: %v", err)
		}
		s := tb.Snapshot()
		tb2, err := lt.Restore(s)
		if err != nil {
			t.Fatalf("a restored table's snapshot does not restore: %v", err)
		}
		if !bytes.Equal(tb2.Snapshot(), s) {
			t.Fatal("snapshot -> restore -> snapshot is not a fixed point")
		}
		// Hostile but well-formed states (a free lock with waiters, a
		// waiter of a missing session...) must still not crash Apply.
		const late = 1 << 62
		for _, li := range sortedHeld(tb) {
			tb.Apply(renew(li.Name, li.ClientID, li.Token, 1000, 0))
			tb.Apply(acq(li.Name, "fuzz", 1000, 1000, 0))
		}
		for _, li := range sortedHeld(tb) {
			tb.Apply(rel(li.Name, li.ClientID, li.Token, 1))
			tb.Apply(expLock(li.Name, li.Token, late))
		}
		// The kinds' commands too: values, revocations, multi-acquires
		// over locks in any state, ends of lock-delays.
		for i, li := range sortedHeld(tb) {
			tb.Apply(setValue(li.Name, li.ClientID, li.Token, "v", 2))
			tb.Apply(shared(acq(li.Name, "fuzz-r", 1000, 1000, 2)))
			tb.Apply(withLimit(2, acq(li.Name, "fuzz-s", 1000, 1000, 2)))
			if i%2 == 0 {
				tb.Apply(revoke(li.Name, 0, 3))
			} else {
				tb.Apply(revoke(li.Name, li.Token, 3))
			}
		}
		if names := tb.List("", 2); len(names) == 2 && names[0].Name < names[1].Name {
			tb.Apply(acqMany("fuzz-m", 1000, 1000, 4, names[0].Name, names[1].Name))
			tb.Apply(shared(acqMany("fuzz-n", 1000, 0, 4, names[0].Name, names[1].Name)))
		}
		for _, li := range tb.List("", 0) {
			tb.Apply(endDelay(li.Name, late))
		}
		for _, w := range sortedWaiters(tb) {
			tb.Apply(tmo(w.Lock, w.ClientID, late))
		}
		for _, s := range sortedSessions(tb) {
			tb.Apply(expSess(s.ID, late))
		}
		if err := lt.CheckCounters(tb); err != nil {
			t.Fatalf("after commands: %v", err)
		}
		tb.List("", 0)
		tb.Stats()
		tb.Snapshot()
	})
}
