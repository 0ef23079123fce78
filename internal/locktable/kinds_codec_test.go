package locktable_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	lt "github.com/lockd/lockd/internal/locktable"
)

// kindCommands has realistic commands that use the lock kinds' fields and
// ops (command version 2).
func kindCommands() []lt.Command {
	return []lt.Command{
		shared(acqS("db/replica", "reader-1", "sess-1", 0, 5000, t0)),
		withLimit(5, acq("pool/gpu", "job-17", 30000, 60000, t0)),
		withDelay(15000, acqS("jobs/nightly", "worker-7", "sess-1", 30000, 0, t0)),
		withValue("10.0.0.7:7070", acqS("election/leader", "node-7", "sess-1", 0, 600000, t0)),
		withSession("sess-1", acqMany("mover", 0, 5000, t0, "acct/1", "acct/2", "acct/3")),
		shared(withDelay(100, acqMany("auditor", 1000, 0, t0, "acct/1", "acct/2"))),
		revoke("jobs/nightly", 0, t0),
		revoke("jobs/nightly", 42, t0),
		endDelay("jobs/nightly", t0),
		setValue("election/leader", "node-7", 42, "10.0.0.7:7171", t0),
		setValue("election/leader", "node-7", 42, "", t0),
	}
}

func TestKindCommandRoundTrip(t *testing.T) {
	cases := append(kindCommands(),
		lt.Command{Op: lt.OpBatch, Now: t0, Batch: kindCommands()},
		lt.Command{Op: lt.OpBatch, Now: t0, Batch: append(everyOp(), revoke("a", 0, t0))},
		lt.Command{Op: lt.OpAcquire, Mode: lt.Shared, Limit: -3, DelayMs: -1, Value: "ключ\x00\xff",
			Locks: []string{"", "b", strings.Repeat("n", 1<<16)}},
		lt.Command{Op: lt.OpAcquire, Limit: lt.MaxLimit, DelayMs: lt.MaxLockDelayMs, Value: strings.Repeat("v", lt.MaxValueBytes)},
	)
	for i, c := range cases {
		b := c.Encode()
		if b[0] != 2 {
			t.Errorf("%d %v: version %d, want 2", i, describe(c), b[0])
		}
		got, err := lt.DecodeCommand(b)
		if err != nil {
			t.Fatalf("%d %v: decode: %v", i, describe(c), err)
		}
		if !commandsEqual(got, c) {
			t.Fatalf("%d: round trip\n got  %+v\n want %+v", i, got, c)
		}
		if b2 := got.Encode(); !bytes.Equal(b, b2) {
			t.Fatalf("%d: re-encoding differs:\n %x\n %x", i, b, b2)
		}
	}
}

// TestCommandVersionProperty: every command round-trips; it is written in
// the oldest version a member could apply it alike (version 1: an op below
// OpRevoke and none of the kinds' fields; version 2: an op below OpCancel,
// no timer term and no hand-off; else version 3), in it or in any command
// of its batch; and a command relabelled with an older version is refused,
// never read as something else.
func TestCommandVersionProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawKindCommand(t, "c")
		if rapid.IntRange(0, 3).Draw(t, "batch") == 0 {
			b := lt.Command{Op: lt.OpBatch, Now: c.Now}
			for i, n := 0, rapid.IntRange(0, 3).Draw(t, "batchLen"); i < n; i++ {
				b.Batch = append(b.Batch, drawKindCommand(t, "sub"))
			}
			c = b
		}
		b := c.Encode()
		got, err := lt.DecodeCommand(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !commandsEqual(got, c) {
			t.Fatalf("round trip\n got  %+v\n want %+v", got, c)
		}
		if want := byte(versionOf(c)); b[0] != want {
			t.Fatalf("%v: version %d, want %d", describe(c), b[0], want)
		}
		for older := byte(1); older < b[0]; older++ {
			bo := append([]byte{older}, b[1:]...)
			if got, err := lt.DecodeCommand(bo); !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("a version-%d command labelled version %d decoded: %+v, %v", b[0], older, got, err)
			}
		}
	})
}

// versionOf is the version a command must be written as, worked out from
// the fields, independently of the encoder.
func versionOf(c lt.Command) int {
	v := 1
	switch {
	case c.Op >= lt.OpCancel || c.Term != 0 || (c.Op == lt.OpAcquire && c.Token != 0) || c.Quotas.Grants != 0 || c.Quotas.ValueBytes != 0:
		return 3
	case c.Op >= lt.OpRevoke || c.Mode != 0 || c.Limit != 0 || c.DelayMs != 0 || c.Value != "" || len(c.Locks) > 0:
		v = 2
	}
	for _, s := range c.Batch {
		v = max(v, versionOf(s))
	}
	return v
}

// drawKindCommand draws a command of a known op other than batch, old
// fields usually set, the kinds' fields sometimes.
func drawKindCommand(t *rapid.T, label string) lt.Command {
	str := func(name string) string {
		if rapid.Bool().Draw(t, label+"."+name+"?") {
			return ""
		}
		return rapid.StringN(1, 8, -1).Draw(t, label+"."+name)
	}
	ops := []lt.Op{lt.OpAcquire, lt.OpRelease, lt.OpRenew, lt.OpExpireLock, lt.OpTimeoutWaiter,
		lt.OpCreateSession, lt.OpDeleteSession, lt.OpExpireSession, lt.OpSetMember, lt.OpRemoveMember,
		lt.OpCheckpoint, lt.OpRevoke, lt.OpEndDelay, lt.OpSetValue, lt.OpCancel}
	c := lt.Command{
		Op:        rapid.SampledFrom(ops).Draw(t, label+".op"),
		Now:       rapid.Int64().Draw(t, label+".now"),
		Lock:      str("lock"),
		ClientID:  str("client"),
		SessionID: str("session"),
		Token:     rapid.SampledFrom([]uint64{0, 1, 1 << 63}).Draw(t, label+".token"),
		TTLms:     rapid.SampledFrom([]int64{0, 1000, -1}).Draw(t, label+".ttl"),
		WaitMs:    rapid.SampledFrom([]int64{0, 5000}).Draw(t, label+".wait"),
		Owner:     str("owner"),
		Term:      rapid.SampledFrom([]uint64{0, 0, 0, 7}).Draw(t, label+".term"),
	}
	if rapid.IntRange(0, 3).Draw(t, label+".quotas") == 0 {
		c.Quotas = lt.Quotas{Locks: 5, LocksPerOwner: rapid.Int64Range(-1, 3).Draw(t, label+".q"),
			Grants: rapid.SampledFrom([]int64{0, 0, 7}).Draw(t, label+".qg")}
	}
	if rapid.IntRange(0, 2).Draw(t, label+".kinds") == 0 {
		c.Mode = lt.Mode(rapid.IntRange(0, 1).Draw(t, label+".mode"))
		c.Limit = rapid.SampledFrom([]int64{0, 0, 1, 3, lt.MaxLimit, -1}).Draw(t, label+".limit")
		c.DelayMs = rapid.SampledFrom([]int64{0, 0, 100, lt.MaxLockDelayMs}).Draw(t, label+".delay")
		c.Value = str("value")
		for i, n := 0, rapid.SampledFrom([]int{0, 0, 2, 3}).Draw(t, label+".nlocks"); i < n; i++ {
			c.Locks = append(c.Locks, rapid.StringN(0, 8, -1).Draw(t, label+".name"))
		}
	}
	return c
}

// TestKindCommandEncodingGolden pins version 2 of the log format, bytes
// worked out by hand.
func TestKindCommandEncodingGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    lt.Command
		hex  string
	}{
		// version 2, op 13, Now 0, mask lock|token = 0b1001, "a", token 5.
		{"revoke", revoke("a", 5, 0), "02" + "0d" + "00" + "09" + "0161" + "05"},
		// op 14, mask lock.
		{"end delay", endDelay("a", 0), "02" + "0e" + "00" + "01" + "0161"},
		// op 15, Now 1 (zigzag 02), mask lock|client|token|value = 1|2|8|1<<15 = 0x800b
		// (uvarint 8b 80 02), "a", "c", 7, value "v".
		{"set value", setValue("a", "c", 7, "v", 1), "02" + "0f" + "02" + "8b8002" + "0161" + "0163" + "07" + "0176"},
		// op 1, mask client|ttl|mode|locks = 2|16|1<<12|1<<16 = 0x11012 (uvarint 92 a0 04),
		// "m", ttl 100 (c8 01), mode 1, 2 names "a" "b".
		{"shared multi", shared(acqMany("m", 100, 0, 0, "a", "b")),
			"02" + "01" + "00" + "92a004" + "016d" + "c801" + "01" + "02" + "0161" + "0162"},
		// op 1, mask lock|client|ttl|limit|delay = 1|2|16|1<<13|1<<14 = 0x6013 (uvarint 93 c0 01),
		// "s", "c", ttl 100, limit 3 (zigzag 06), delay 500 (zigzag 1000 = e8 07).
		{"semaphore with a delay", withDelay(500, withLimit(3, acq("s", "c", 100, 0, 0))),
			"02" + "01" + "00" + "93c001" + "0173" + "0163" + "c801" + "06" + "e807"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := hex.DecodeString(tc.hex)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.c.Encode(); !bytes.Equal(got, want) {
				t.Fatalf("Encode = %x, want %x", got, want)
			}
			got, err := lt.DecodeCommand(want)
			if err != nil || !commandsEqual(got, tc.c) {
				t.Fatalf("Decode = %+v, %v", got, err)
			}
		})
	}
	for op, want := range map[lt.Op]uint8{lt.OpRevoke: 13, lt.OpEndDelay: 14, lt.OpSetValue: 15} {
		if uint8(op) != want {
			t.Errorf("%v = %d, want %d", op, uint8(op), want)
		}
	}
	if lt.Exclusive != 0 || lt.Shared != 1 {
		t.Errorf("modes %d %d, want 0 1", lt.Exclusive, lt.Shared)
	}
}

func TestDecodeKindCommandRejects(t *testing.T) {
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	str := func(s string) []byte { return append(uv(uint64(len(s))), s...) }
	head := func(version, op byte, mask uint64) []byte { return append([]byte{version, op, 0}, uv(mask)...) }
	raw := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	const fMode, fLimit, fLocks, fTerm = 1 << 12, 1 << 13, 1 << 16, 1 << 17
	var manyNames []byte
	for i := 0; i < 1025; i++ {
		manyNames = append(manyNames, str("n")...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"version 1 with a mode", raw(head(1, 1, fMode), []byte{1})},
		{"version 1 with a limit", raw(head(1, 1, fLimit), uv(4))},
		{"version 1 with lock names", raw(head(1, 1, fLocks), uv(2), str("a"), str("b"))},
		{"version 1 revoke", raw(head(1, 13, 1), str("a"))},
		{"version 1 set value", raw(head(1, 15, 0))},
		{"version 1 batch holding a version-2 command", raw(head(1, 11, 1<<9), uv(1), []byte{14, 0, 1}, str("a"))},
		{"unknown mode", raw(head(2, 1, fMode), []byte{2})},
		{"version 2 cancel", raw(head(2, 16, 1), str("a"))},
		{"version 2 with a term", raw(head(2, 4, 1|fTerm), str("a"), uv(7))},
		{"op 17", head(3, 17, 0)},
		{"field bit after the last", head(3, 1, fTerm<<1)},
		{"1025 lock names", raw(head(2, 1, fLocks), uv(1025), manyNames)},
		{"lock names beyond the bytes", raw(head(2, 1, fLocks), uv(1<<40))},
		{"a lock name cut short", raw(head(2, 1, fLocks), uv(2), str("a"), uv(5), []byte("ab"))},
		{"version 4", head(4, 1, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := lt.DecodeCommand(tc.b)
			if err == nil {
				t.Fatalf("decoded %+v", c)
			}
			if !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if !reflect.DeepEqual(c, lt.Command{}) {
				t.Fatalf("error with a non-zero command %+v", c)
			}
		})
	}
	if !lt.FromNewerVersion(head(4, 1, 0)) || lt.FromNewerVersion(head(3, 1, 0)) {
		t.Error("FromNewerVersion does not tell version 4 from 3")
	}
	t.Run("every truncation", func(t *testing.T) {
		full := encode(lt.Command{Op: lt.OpBatch, Now: t0, Batch: kindCommands()})
		for n := 0; n < len(full); n++ {
			if _, err := lt.DecodeCommand(full[:n]); !errors.Is(err, lt.ErrCorrupt) {
				t.Fatalf("prefix %d/%d: %v", n, len(full), err)
			}
		}
	})
	t.Run("1024 lock names are fine", func(t *testing.T) {
		c, err := lt.DecodeCommand(raw(head(2, 1, fLocks), uv(1024), manyNames[:2*1024]))
		if err != nil || len(c.Locks) != 1024 {
			t.Fatalf("%d names, %v", len(c.Locks), err)
		}
	})
}

// kindsLog builds a state with every lock kind: shared holders, a
// semaphore with holders and a waiter, a multi-acquire waiting in three
// queues (one of them free), a lock-delay with a waiter, another with
// nobody, values, and per-lock indexes.
func kindsLog() []lt.Command {
	return []lt.Command{
		mkSess("sess-1", "worker-7", 15000, t0),
		shared(withValue("r1", acq("db/replica", "reader-1", 30000, 0, t0))),
		shared(acqS("db/replica", "reader-2", "sess-1", 0, 0, t0)),
		acq("db/replica", "writer", 1000, 60000, t0),
		shared(acq("db/replica", "reader-3", 1000, 60000, t0)),
		withLimit(2, acq("pool/gpu", "job-1", 30000, 0, t0)),
		withLimit(2, acq("pool/gpu", "job-2", 30000, 0, t0)),
		acq("pool/gpu", "job-3", 30000, 60000, t0),
		acq("acct/3", "teller", 30000, 0, t0),
		withSession("sess-1", withValue("move", acqMany("mover", 0, 60000, t0, "acct/1", "acct/2", "acct/3"))),
		withDelay(5000, withValue("10.0.0.7:7070", acq("election/leader", "node-7", 100, 0, t0))),
		acq("election/leader", "node-8", 1000, 60000, t0),
		expLock("election/leader", 6, t0+100),
		withDelay(200, acq("gone", "c9", 1000, 0, t0)),
		revoke("gone", 0, t0+200),
	}
}

func kindsTable(t testing.TB) *lt.Table {
	t.Helper()
	tb := lt.New()
	for i, c := range kindsLog() {
		if r := tb.ApplyAt(uint64(100+i), c); r.Code != lt.OK {
			t.Fatalf("kinds log %d %v: %+v", i, describe(c), r)
		}
	}
	return tb
}

func kindsSnapshot(t testing.TB) []byte { return kindsTable(t).Snapshot() }

func TestKindsSnapshotRoundTrip(t *testing.T) {
	tb := kindsTable(t)
	if err := checkTable(tb, 0); err != nil {
		t.Fatal(err)
	}
	// The state is what it claims to be.
	if li := tb.Get("db/replica"); len(li.Holders) != 2 || li.Mode != lt.Shared || li.Waiters != 2 || li.Value != "r1" {
		t.Fatalf("db/replica: %+v", li)
	}
	if li := tb.Get("pool/gpu"); li.Limit != 2 || len(li.Holders) != 2 || li.Waiters != 1 {
		t.Fatalf("pool/gpu: %+v", li)
	}
	if li := tb.Get("acct/1"); li.Held || li.Waiters != 1 || tb.Waiters("acct/1")[0].Locks == nil {
		t.Fatalf("acct/1: %+v", li)
	}
	if li := tb.Get("election/leader"); li.Held || li.DelayedUntil != t0+5100 || li.Waiters != 1 {
		t.Fatalf("election/leader: %+v", li)
	}
	if li := tb.Get("gone"); li.Held || li.DelayedUntil != t0+400 || li.Waiters != 0 || li.Index != 114 {
		t.Fatalf("gone: %+v", li)
	}
	back, err := lt.Restore(tb.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if a, b := view(tb), view(back); !reflect.DeepEqual(a, b) {
		t.Fatalf("restored table reads differently:\n orig     %+v\n restored %+v", a, b)
	}
	for _, n := range []string{"db/replica", "pool/gpu", "acct/1", "acct/2", "acct/3", "election/leader", "gone"} {
		if a, b := tb.Get(n), back.Get(n); !reflect.DeepEqual(a, b) || !reflect.DeepEqual(tb.Waiters(n), back.Waiters(n)) {
			t.Fatalf("%s restored as %+v, was %+v", n, b, a)
		}
	}
	// Both follow the same log alike.
	for i, c := range []lt.Command{
		endDelay("election/leader", t0+5100),
		rel("acct/3", "teller", 5, t0+5101),
		expSess("sess-1", t0+20000),
		revoke("pool/gpu", 0, t0+20001),
		endDelay("gone", t0+20002),
	} {
		r1, r2 := tb.ApplyAt(uint64(200+i), c), back.ApplyAt(uint64(200+i), c)
		if !reflect.DeepEqual(r1, r2) || len(r1.Events) == 0 {
			t.Fatalf("%v: %+v vs %+v", describe(c), r1, r2)
		}
		if !bytes.Equal(tb.Snapshot(), back.Snapshot()) {
			t.Fatalf("%v: states diverged", describe(c))
		}
		if err := checkTable(tb, 0); err != nil {
			t.Fatalf("%v: %v", describe(c), err)
		}
	}
}
