// Package locktable is lockd's replicated state machine: named locks with
// holders and FIFO wait queues, client sessions, the member address book and
// the one global fencing-token counter.
//
// It is pure and deterministic. Apply reads no clock (time arrives in the
// command, stamped by the leader), does no I/O and starts no goroutine, so
// every member that applies the same log reaches byte-identical state. It is
// not safe for concurrent use; the Raft adapter serialises access.
package locktable

import (
	"maps"
	"sort"
)

// Mode is how a grant holds its lock.
type Mode uint8

// The modes. Values are part of the log and snapshot formats.
const (
	Exclusive Mode = 0 // alone, or as one permit of a semaphore
	Shared    Mode = 1 // with other shared holders, never with an exclusive one
)

func (m Mode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// Limits of the lock kinds (SPEC "Lock kinds").
const (
	MaxLimit       = 10_000 // semaphore permits
	MaxLockDelayMs = 60_000
	MaxValueBytes  = 4096
	MinMultiLocks  = 2
	MaxMultiLocks  = 64
)

// Holder is one grant of a lock: the only one of an exclusive lock, one of
// several shared holders, or one permit of a semaphore.
type Holder struct {
	ClientID  string
	SessionID string // "" for a lock held by TTL alone
	Owner     string // identity charged for it (see Command.Owner)
	Token     uint64
	TTLms     int64 // 0: no TTL of its own (held through its session)
	ExpiresAt int64 // unix ms; 0 when TTLms is 0
	GrantedAt int64
	Mode      Mode
	DelayMs   int64  // lock-delay applied when this grant ends without a release
	Value     string // the holder's value (elections: the leader's address)
}

// Waiter is a queued acquire. A multi-acquire waits in the queue of each of
// its locks at once: every copy carries the same Locks.
type Waiter struct {
	ClientID   string
	SessionID  string
	Owner      string // identity charged for it (see Command.Owner)
	TTLms      int64  // TTL the grant will carry
	Deadline   int64  // unix ms after which it must never be granted
	EnqueuedAt int64
	Mode       Mode
	DelayMs    int64
	Value      string
	Locks      []string // a multi-acquire's locks in name order; nil for one lock
}

// Lock is one named lock. It exists in the table while held, waited on or
// delayed.
type Lock struct {
	Name    string
	Holders []*Holder // in token order
	Waiters []Waiter
	// Limit is the number of exclusive holders the lock admits (a
	// semaphore's permits); 0 and 1 both mean an ordinary lock.
	Limit int64
	// DelayedUntil is when a lock-delay ends (unix ms; 0: none): until the
	// leader proposes its end, the lock is granted to no one.
	DelayedUntil int64
	// Index is the log index of the last committed change to the lock.
	Index uint64
}

// limit is the number of exclusive holders l admits.
func (l *Lock) limit() int64 { return max(1, l.Limit) }

// first is the holder with the lowest token, or nil.
func (l *Lock) first() *Holder {
	if len(l.Holders) == 0 {
		return nil
	}
	return l.Holders[0]
}

// holderOf returns the position of client's grant, or -1.
func (l *Lock) holderOf(client string) int {
	for i, h := range l.Holders {
		if h.ClientID == client {
			return i
		}
	}
	return -1
}

// waiterOf returns the position of client's wait, or -1.
func (l *Lock) waiterOf(client string) int {
	for i := range l.Waiters {
		if l.Waiters[i].ClientID == client {
			return i
		}
	}
	return -1
}

// canHold reports whether one more holder of mode m fits beside the
// current holders: shared holders only with shared ones on an ordinary
// lock; exclusive holders up to the limit, never beside a shared one.
func (l *Lock) canHold(m Mode) bool {
	if len(l.Holders) == 0 {
		return true
	}
	if m == Shared {
		return l.limit() == 1 && l.Holders[0].Mode == Shared
	}
	return l.Holders[0].Mode == Exclusive && int64(len(l.Holders)) < l.limit()
}

// Session is a client session kept alive by keepalives to the leader.
type Session struct {
	ID       string
	ClientID string
	// Owner is the identity that created the session (the auth token's
	// name; "" with auth off): only it, or an admin, may use the session.
	Owner     string
	TTLms     int64
	CreatedAt int64

	// Indexes rebuilt from locks; never encoded.
	holds map[string]struct{}
	waits map[string]struct{}
	used  int // locks held plus waits queued through it (quota count)
}

// Member is a cluster member's published addresses.
type Member struct {
	ID       string
	RaftAddr string
	HTTPAddr string
}

// releaseMemo remembers recent explicit releases so a retried release (its
// first reply lost to a timeout or a leader change) is answered "released"
// instead of not_holder. Bounded and deterministic: a ring in log order.
type releaseMemo struct {
	Lock     string
	Token    uint64
	ClientID string
}

const releaseMemoSize = 4096

// Table is the whole replicated state.
type Table struct {
	lastToken    uint64
	locks        lockIndex // by name, in name order
	sessions     map[string]*Session
	members      map[string]Member
	memo         []releaseMemo // ring, oldest at memoHead once full
	memoHead     int
	memoIdx      map[memoKey]string // (lock, token) -> client id
	applying     uint64             // log index of the command being applied; never encoded
	applyingTerm uint64             // Raft term of the entry being applied (0: unknown); never encoded
	changed      uint64             // log index of the last change to any lock (dropped ones too)
	gone         freedLocks         // when recently dropped locks last changed; derived, never encoded
	usage        map[string]*usage  // per owner identity; derived, never encoded
	ids          idCache            // shared copies of ids; derived, never encoded
	dl           deadlines          // every deadline in time order, for the leader's timers; derived, never encoded
	count        counts             // what the table holds, kept by every change; derived, never encoded
}

// counts is what the table holds, kept up to date by the few primitives
// that add or remove a holder or a waiter (grant, unhold, enqueue, unwait)
// or change a value, so that metrics and the cluster-wide quotas cost O(1)
// instead of a walk of every lock under the lock Apply waits on.
type counts struct {
	held       int   // locks with at least one holder
	holders    int   // grants
	waiters    int   // queued waits (a multi-acquire once per queue)
	valueBytes int64 // bytes of the values of every holder and waiter
}

type memoKey struct {
	lock  string
	token uint64
}

// New returns an empty table.
func New() *Table {
	return &Table{
		locks:    newLockIndex(),
		sessions: map[string]*Session{},
		members:  map[string]Member{},
		memoIdx:  map[memoKey]string{},
		usage:    map[string]*usage{},
		dl:       newDeadlines(),
	}
}

// LastToken is the highest fencing token ever issued (0 before the first).
func (t *Table) LastToken() uint64 { return t.lastToken }

// LockInfo is a read-only copy of one lock's state.
type LockInfo struct {
	Name string
	Held bool
	// The holder with the lowest token (the only one of an exclusive lock).
	ClientID  string
	SessionID string
	Token     uint64
	TTLms     int64
	ExpiresAt int64
	Value     string
	Mode      Mode // the holders' mode; meaningless when !Held

	// Holders are the grants with the lowest tokens, in token order: at
	// most MaxStatusHolders (a semaphore may have 10 000); HoldersTotal
	// counts them all, and HoldersPage pages through them.
	Holders      []Holder
	HoldersTotal int
	Waiters      int
	Limit        int64 // 1 for an ordinary lock
	DelayedUntil int64 // unix ms; 0: no lock-delay running
	Index        uint64
}

// MaxStatusHolders bounds the grants one status copies (SPEC 16): a
// status, list item or watch frame shows at most this many.
const MaxStatusHolders = 64

func (l *Lock) info() LockInfo {
	li := LockInfo{Name: l.Name, Waiters: len(l.Waiters), Limit: l.limit(),
		DelayedUntil: l.DelayedUntil, Index: l.Index, HoldersTotal: len(l.Holders)}
	if h := l.first(); h != nil {
		li.Held, li.ClientID, li.SessionID = true, h.ClientID, h.SessionID
		li.Token, li.TTLms, li.ExpiresAt = h.Token, h.TTLms, h.ExpiresAt
		li.Value, li.Mode = h.Value, h.Mode
		li.Holders = make([]Holder, min(len(l.Holders), MaxStatusHolders))
		for i := range li.Holders {
			li.Holders[i] = *l.Holders[i]
		}
	}
	return li
}

// HoldersPage returns the grants of a lock with a token above after, in
// token order, at most limit of them, and the token to pass as after for
// the next page (0 on the last).
func (t *Table) HoldersPage(name string, after uint64, limit int) ([]Holder, uint64) {
	l, ok := t.locks.get(name)
	if !ok {
		return []Holder{}, 0
	}
	i := sort.Search(len(l.Holders), func(i int) bool { return l.Holders[i].Token > after })
	out := make([]Holder, 0, min(limit, len(l.Holders)-i))
	for ; i < len(l.Holders) && len(out) < limit; i++ {
		out = append(out, *l.Holders[i])
	}
	if i < len(l.Holders) && len(out) > 0 {
		return out, out[len(out)-1].Token
	}
	return out, 0
}

// HolderOf returns client's grant of a lock, if it holds one.
func (t *Table) HolderOf(name, client string) (Holder, bool) {
	l, ok := t.locks.get(name)
	if !ok {
		return Holder{}, false
	}
	if i := l.holderOf(client); i >= 0 {
		return *l.Holders[i], true
	}
	return Holder{}, false
}

// Get returns the state of one lock; a lock nobody holds, waits on or
// delays is reported free, at the index of its last change if it was
// dropped recently, else at an index above every change the table no
// longer remembers (freedLocks).
func (t *Table) Get(name string) LockInfo {
	if l, ok := t.locks.get(name); ok {
		return l.info()
	}
	return LockInfo{Name: name, Limit: 1, Index: t.gone.index(name)}
}

// LastChange is the log index of the last change to any lock, including
// locks since freed and dropped: at or above the last change of every lock.
func (t *Table) LastChange() uint64 { return t.changed }

// List returns every lock whose name starts with prefix, sorted by name.
func (t *Table) List(prefix string, limit int) []LockInfo {
	out, _ := t.ListPage(prefix, "", limit)
	return out
}

// WaiterInfo is a read-only copy of one waiter, with its lock's name.
type WaiterInfo struct {
	Lock string
	Waiter
	Position int
}

// Waiters returns the queue of one lock in grant order.
func (t *Table) Waiters(name string) []Waiter {
	l, ok := t.locks.get(name)
	if !ok {
		return nil
	}
	return append([]Waiter(nil), l.Waiters...)
}

// Session returns a copy of a session and whether it exists.
func (t *Table) Session(id string) (Session, bool) {
	s, ok := t.sessions[id]
	if !ok {
		return Session{}, false
	}
	return s.copy(), true
}

// copy is the session without its indexes and counters.
func (s *Session) copy() Session {
	return Session{ID: s.ID, ClientID: s.ClientID, Owner: s.Owner, TTLms: s.TTLms, CreatedAt: s.CreatedAt}
}

// Members returns the published member addresses, sorted by id.
func (t *Table) Members() []Member {
	out := make([]Member, 0, len(t.members))
	for _, id := range sortedKeys(t.members) {
		out = append(out, t.members[id])
	}
	return out
}

// PrepareRestore adapts a table decoded from a backup before it replaces a
// running cluster's state: it takes the running cluster's member address
// book (the backup's may name other hosts) and never lets the token counter
// go below the running cluster's, nor below minToken (what an operator knows
// an earlier cluster issued), so a restore cannot make a token repeat.
func (t *Table) PrepareRestore(current *Table, minToken uint64) {
	t.members = maps.Clone(current.members)
	t.lastToken = max(t.lastToken, current.lastToken, minToken)
}

// Stats counts what the table holds, for metrics.
type Stats struct {
	Locks, Held, Holders, Waiters, Sessions int
	ValueBytes                              int64
	LastToken                               uint64
}

// Size returns the number of locks and sessions without walking them.
func (t *Table) Size() (locks, sessions int) { return t.locks.Len(), len(t.sessions) }

// Stats returns the table's counts, kept as it changes: O(1).
func (t *Table) Stats() Stats {
	return Stats{Locks: t.locks.Len(), Sessions: len(t.sessions), LastToken: t.lastToken,
		Held: t.count.held, Holders: t.count.holders, Waiters: t.count.waiters, ValueBytes: t.count.valueBytes}
}

// ForEachHolder calls fn for every grant of every lock, in no particular
// order (no sort: a new leader rebuilds its timers from it while Apply
// waits). Never use it where order reaches the replicated state.
func (t *Table) ForEachHolder(fn func(lock string, h Holder)) {
	for l := range t.locks.all {
		name := l.Name
		for _, h := range l.Holders {
			fn(name, *h)
		}
	}
}

// ForEachDelayed calls fn for every lock with a lock-delay running.
func (t *Table) ForEachDelayed(fn func(lock string, until int64)) {
	for l := range t.locks.all {
		name := l.Name
		if l.DelayedUntil != 0 {
			fn(name, l.DelayedUntil)
		}
	}
}

// ForEachWaiter calls fn for every waiter, each lock's in queue order, the
// locks in no particular order.
func (t *Table) ForEachWaiter(fn func(WaiterInfo)) {
	for l := range t.locks.all {
		name := l.Name
		for i, w := range l.Waiters {
			fn(WaiterInfo{Lock: name, Waiter: w, Position: i})
		}
	}
}

// ForEachSession calls fn for every session, in no particular order.
func (t *Table) ForEachSession(fn func(Session)) {
	for _, s := range t.sessions {
		fn(s.copy())
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// recount sets the counts from the state (after Restore).
func (t *Table) recount() {
	t.count = counts{}
	for l := range t.locks.all {
		if len(l.Holders) > 0 {
			t.count.held++
		}
		t.count.holders += len(l.Holders)
		t.count.waiters += len(l.Waiters)
		for _, h := range l.Holders {
			t.count.valueBytes += int64(len(h.Value))
		}
		for _, w := range l.Waiters {
			t.count.valueBytes += int64(len(w.Value))
		}
	}
}
