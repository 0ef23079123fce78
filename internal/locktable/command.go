package locktable

import "fmt"

// Op names a state-machine command.
type Op uint8

// The commands. Values are part of the log format: never renumber.
const (
	OpAcquire       Op = 1  // grant, re-grant (idempotent) or enqueue
	OpRelease       Op = 2  // holder gives the lock up; hand-off to the next waiter
	OpRenew         Op = 3  // holder pushes its expiry out
	OpExpireLock    Op = 4  // leader timer: lock TTL ran out (re-checked here)
	OpTimeoutWaiter Op = 5  // leader timer: a waiter's deadline passed (re-checked here)
	OpCreateSession Op = 6  // id chosen by the leader
	OpDeleteSession Op = 7  // client ends its session
	OpExpireSession Op = 8  // leader timer: no keepalive for the session TTL
	OpSetMember     Op = 9  // a member publishes its addresses
	OpRemoveMember  Op = 10 // a member left the configuration
	OpBatch         Op = 11 // several commands in one log entry (group commit)
	OpCheckpoint    Op = 12 // log verifier checkpoint: changes nothing, sets nothing in motion
	OpRevoke        Op = 13 // an operator ends a lock's grants (all, or the one with Token)
	OpEndDelay      Op = 14 // leader timer: a lock-delay ran out (re-checked here)
	OpSetValue      Op = 15 // a holder sets its grant's value
	OpCancel        Op = 16 // a client withdraws its queued wait (Lock, or a multi-acquire's Locks)
)

var opNames = map[Op]string{
	OpAcquire: "acquire", OpRelease: "release", OpRenew: "renew",
	OpExpireLock: "expire_lock", OpTimeoutWaiter: "timeout_waiter",
	OpCreateSession: "create_session", OpDeleteSession: "delete_session",
	OpExpireSession: "expire_session", OpSetMember: "set_member",
	OpRemoveMember: "remove_member", OpBatch: "batch", OpCheckpoint: "checkpoint",
	OpRevoke: "revoke", OpEndDelay: "end_delay", OpSetValue: "set_value",
	OpCancel: "cancel",
}

// firstV2Op is the first op a version-1 decoder does not know;
// firstV3Op the first a version-2 decoder does not know.
const (
	firstV2Op = OpRevoke
	firstV3Op = OpCancel
)

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Command is one state-machine input. Now is wall-clock unix milliseconds
// stamped by the leader before it proposes: Apply never reads a clock, so
// every member reaches the same state from the same log.
//
// One flat struct serves every op; the encoding writes only the fields set.
type Command struct {
	Op        Op
	Now       int64
	Lock      string
	ClientID  string
	SessionID string
	// Token is the grant a command acts on (release, renew, value, expire,
	// revoke); on an acquire, the client's grant of the same lock to
	// release first, in the same step (a hand-off).
	Token    uint64
	TTLms    int64 // lock TTL (acquire, renew) or session TTL (create session)
	WaitMs   int64 // acquire: how long to queue; 0 = try once
	MemberID string
	RaftAddr string
	HTTPAddr string
	Batch    []Command // OpBatch only; nesting is refused
	// Owner is the identity the command acts for: the auth token's name,
	// "" with auth off. Create session records it as the session's owner;
	// acquire records it on the holder or waiter it makes and charges it
	// for the per-owner quotas.
	Owner string
	// Quotas are the limits this command is checked against (acquire,
	// create session), stamped by the leader from its configuration as it
	// stamps Now: Apply never reads configuration either.
	Quotas Quotas

	// Lock kinds (acquire). Mode is the grant's mode; Limit the semaphore
	// size the acquire asks for (0: none given, join what the lock has);
	// DelayMs the lock-delay of the grant; Value its value (also
	// OpSetValue); Locks the names of a multi-acquire, in name order and
	// distinct (Lock is then empty).
	Mode    Mode
	Limit   int64
	DelayMs int64
	Value   string
	Locks   []string

	// Term is the Raft term of the leader whose timer decided the command
	// (expire lock, time out waiter, expire session, end delay). Apply
	// refuses it when the entry was appended in another term: a timer of a
	// leader that lost office and won it back (or a proposal that raced the
	// change) decided on what that leader knew then, not on the keepalives
	// and renewals another leader acknowledged since. 0: not a timer's.
	Term uint64
}

// commandVersion is the first byte of every encoded command. A member that
// sees a higher version refuses to apply it rather than guess.
//
// Version 2 adds the lock kinds (mode, limit, lock-delay, value, multi-lock
// names) and the ops from OpRevoke on; version 3 the timers' Term and
// OpCancel. A command is written in the oldest version that carries it, so
// a member not yet upgraded follows the log until the first command it
// could not apply alike — which halts it (see FromNewerVersion) instead of
// letting it skip an entry the others apply.
const commandVersion = 3

// field bits of the presence mask.
const (
	fLock = 1 << iota
	fClient
	fSession
	fToken
	fTTL
	fWait
	fMemberID
	fRaftAddr
	fHTTPAddr
	fBatch
	fOwner
	fQuotas
	fMode
	fLimit
	fDelay
	fValue
	fLocks
	fTerm
	fLast = fTerm
	// fV1 and fV2 are the fields a version-1 or version-2 command may carry.
	fV1 = fQuotas<<1 - 1
	fV2 = fLocks<<1 - 1
)

// maxLocks bounds the names of one multi-acquire in the log format (the API
// allows MaxMultiLocks).
const maxLocks = 1024

// maxBatch bounds the number of commands in one batch entry.
const maxBatch = 4096

// Encode returns the compact binary form of c, as stored in the Raft log.
func (c *Command) Encode() []byte {
	w := &writer{b: make([]byte, 0, 32+len(c.Lock)+len(c.ClientID)+len(c.SessionID))}
	w.byte(c.version())
	c.encode(w)
	return w.b
}

// version is the oldest command version that can carry c.
func (c *Command) version() byte {
	v := byte(1)
	switch mask := c.mask(); {
	case c.Op >= firstV3Op || mask&^fV2 != 0 || (c.Op == OpAcquire && c.Token != 0) || c.Quotas.sinceV3():
		return 3 // an acquire's Token (a hand-off) means nothing to older members
	case c.Op >= firstV2Op || mask&^fV1 != 0:
		v = 2
	}
	for i := range c.Batch {
		v = max(v, c.Batch[i].version())
	}
	return v
}

// mask is the presence mask of c's fields.
func (c *Command) mask() uint64 {
	var mask uint64
	for _, f := range [...]struct {
		bit uint64
		set bool
	}{
		{fLock, c.Lock != ""}, {fClient, c.ClientID != ""}, {fSession, c.SessionID != ""},
		{fToken, c.Token != 0}, {fTTL, c.TTLms != 0}, {fWait, c.WaitMs != 0},
		{fMemberID, c.MemberID != ""}, {fRaftAddr, c.RaftAddr != ""}, {fHTTPAddr, c.HTTPAddr != ""},
		{fBatch, len(c.Batch) > 0}, {fOwner, c.Owner != ""}, {fQuotas, c.Quotas != (Quotas{})},
		{fMode, c.Mode != 0}, {fLimit, c.Limit != 0}, {fDelay, c.DelayMs != 0},
		{fValue, c.Value != ""}, {fLocks, len(c.Locks) > 0}, {fTerm, c.Term != 0},
	} {
		if f.set {
			mask |= f.bit
		}
	}
	return mask
}

func (c *Command) encode(w *writer) {
	w.byte(byte(c.Op))
	w.varint(c.Now)
	mask := c.mask()
	w.uvarint(mask)
	if mask&fLock != 0 {
		w.string(c.Lock)
	}
	if mask&fClient != 0 {
		w.string(c.ClientID)
	}
	if mask&fSession != 0 {
		w.string(c.SessionID)
	}
	if mask&fToken != 0 {
		w.uvarint(c.Token)
	}
	if mask&fTTL != 0 {
		w.varint(c.TTLms)
	}
	if mask&fWait != 0 {
		w.varint(c.WaitMs)
	}
	if mask&fMemberID != 0 {
		w.string(c.MemberID)
	}
	if mask&fRaftAddr != 0 {
		w.string(c.RaftAddr)
	}
	if mask&fHTTPAddr != 0 {
		w.string(c.HTTPAddr)
	}
	if mask&fBatch != 0 {
		w.uvarint(uint64(len(c.Batch)))
		for i := range c.Batch {
			c.Batch[i].encode(w)
		}
	}
	if mask&fOwner != 0 {
		w.string(c.Owner)
	}
	if mask&fQuotas != 0 {
		c.Quotas.encode(w)
	}
	if mask&fMode != 0 {
		w.byte(byte(c.Mode))
	}
	if mask&fLimit != 0 {
		w.varint(c.Limit)
	}
	if mask&fDelay != 0 {
		w.varint(c.DelayMs)
	}
	if mask&fValue != 0 {
		w.string(c.Value)
	}
	if mask&fLocks != 0 {
		w.uvarint(uint64(len(c.Locks)))
		for _, n := range c.Locks {
			w.string(n)
		}
	}
	if mask&fTerm != 0 {
		w.uvarint(c.Term)
	}
}

// DecodeCommand parses bytes made by Encode. It bounds every length it reads
// and rejects trailing bytes, unknown ops and unknown versions.
func DecodeCommand(b []byte) (Command, error) {
	r := &reader{b: b}
	v := r.byte()
	if r.err == nil && (v < 1 || v > commandVersion) {
		return Command{}, fmt.Errorf("%w: command version %d", ErrCorrupt, v)
	}
	c := decodeCommand(r, true)
	if r.err == nil && v < c.version() {
		// What an older version cannot carry is never written in it.
		r.fail(fmt.Sprintf("version-%d command with version-%d fields", v, c.version()))
	}
	if r.err == nil && v == 1 && c.version() != 1 {
		// Canonical: what version 1 can carry is written as version 1.
		r.fail("version-1 command with version-2 fields")
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return Command{}, r.err
	}
	return c, nil
}

func decodeCommand(r *reader, allowBatch bool) Command {
	var c Command
	c.Op = Op(r.byte())
	if _, ok := opNames[c.Op]; !ok && r.err == nil {
		r.fail("unknown op")
	}
	c.Now = r.varint()
	mask := r.uvarint()
	if mask >= fLast<<1 {
		r.fail("unknown field")
	}
	if mask&fLock != 0 {
		c.Lock = r.string()
	}
	if mask&fClient != 0 {
		c.ClientID = r.string()
	}
	if mask&fSession != 0 {
		c.SessionID = r.string()
	}
	if mask&fToken != 0 {
		c.Token = r.uvarint()
	}
	if mask&fTTL != 0 {
		c.TTLms = r.varint()
	}
	if mask&fWait != 0 {
		c.WaitMs = r.varint()
	}
	if mask&fMemberID != 0 {
		c.MemberID = r.string()
	}
	if mask&fRaftAddr != 0 {
		c.RaftAddr = r.string()
	}
	if mask&fHTTPAddr != 0 {
		c.HTTPAddr = r.string()
	}
	if mask&fBatch != 0 {
		if !allowBatch || c.Op != OpBatch {
			r.fail("nested or misplaced batch")
			return c
		}
		n := r.count(3)
		if n > maxBatch {
			r.fail("batch too large")
			return c
		}
		c.Batch = make([]Command, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			c.Batch = append(c.Batch, decodeCommand(r, false))
		}
	}
	if mask&fOwner != 0 {
		c.Owner = r.string()
	}
	if mask&fQuotas != 0 {
		c.Quotas = decodeQuotas(r)
	}
	if mask&fMode != 0 {
		c.Mode = Mode(r.byte())
		if c.Mode > Shared && r.err == nil {
			r.fail("unknown mode")
		}
	}
	if mask&fLimit != 0 {
		c.Limit = r.varint()
	}
	if mask&fDelay != 0 {
		c.DelayMs = r.varint()
	}
	if mask&fValue != 0 {
		c.Value = r.string()
	}
	if mask&fLocks != 0 {
		n := r.count(1)
		if n > maxLocks {
			r.fail("too many lock names")
			return c
		}
		c.Locks = make([]string, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			c.Locks = append(c.Locks, r.string())
		}
	}
	if mask&fTerm != 0 {
		c.Term = r.uvarint()
	}
	return c
}
