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
)

var opNames = map[Op]string{
	OpAcquire: "acquire", OpRelease: "release", OpRenew: "renew",
	OpExpireLock: "expire_lock", OpTimeoutWaiter: "timeout_waiter",
	OpCreateSession: "create_session", OpDeleteSession: "delete_session",
	OpExpireSession: "expire_session", OpSetMember: "set_member",
	OpRemoveMember: "remove_member", OpBatch: "batch", OpCheckpoint: "checkpoint",
}

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
	Token     uint64
	TTLms     int64 // lock TTL (acquire, renew) or session TTL (create session)
	WaitMs    int64 // acquire: how long to queue; 0 = try once
	MemberID  string
	RaftAddr  string
	HTTPAddr  string
	Batch     []Command // OpBatch only; nesting is refused
	// Owner is the identity the command acts for: the auth token's name,
	// "" with auth off. Create session records it as the session's owner;
	// acquire records it on the holder or waiter it makes and charges it
	// for the per-owner quotas.
	Owner string
	// Quotas are the limits this command is checked against (acquire,
	// create session), stamped by the leader from its configuration as it
	// stamps Now: Apply never reads configuration either.
	Quotas Quotas
}

// commandVersion is the first byte of every encoded command. A member that
// sees a higher version refuses to apply it rather than guess.
const commandVersion = 1

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
	fLast = fQuotas
)

// maxBatch bounds the number of commands in one batch entry.
const maxBatch = 4096

// Encode returns the compact binary form of c, as stored in the Raft log.
func (c *Command) Encode() []byte {
	w := &writer{b: make([]byte, 0, 32+len(c.Lock)+len(c.ClientID)+len(c.SessionID))}
	w.byte(commandVersion)
	c.encode(w)
	return w.b
}

func (c *Command) encode(w *writer) {
	w.byte(byte(c.Op))
	w.varint(c.Now)
	var mask uint64
	if c.Lock != "" {
		mask |= fLock
	}
	if c.ClientID != "" {
		mask |= fClient
	}
	if c.SessionID != "" {
		mask |= fSession
	}
	if c.Token != 0 {
		mask |= fToken
	}
	if c.TTLms != 0 {
		mask |= fTTL
	}
	if c.WaitMs != 0 {
		mask |= fWait
	}
	if c.MemberID != "" {
		mask |= fMemberID
	}
	if c.RaftAddr != "" {
		mask |= fRaftAddr
	}
	if c.HTTPAddr != "" {
		mask |= fHTTPAddr
	}
	if len(c.Batch) > 0 {
		mask |= fBatch
	}
	if c.Owner != "" {
		mask |= fOwner
	}
	if c.Quotas != (Quotas{}) {
		mask |= fQuotas
	}
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
}

// DecodeCommand parses bytes made by Encode. It bounds every length it reads
// and rejects trailing bytes, unknown ops and unknown versions.
func DecodeCommand(b []byte) (Command, error) {
	r := &reader{b: b}
	if v := r.byte(); r.err == nil && v != commandVersion {
		return Command{}, fmt.Errorf("%w: command version %d", ErrCorrupt, v)
	}
	c := decodeCommand(r, true)
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
	return c
}
