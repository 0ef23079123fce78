package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// OpKind names what an operation did.
type OpKind string

// Operation kinds recorded in a history.
const (
	KindAcquire OpKind = "acquire"
	KindRelease OpKind = "release"
	KindRenew   OpKind = "renew"
	KindRead    OpKind = "read"  // linearizable GET /api/v1/locks/{name}
	KindFence   OpKind = "fence" // PUT to fencestore with the holder's token
	// KindKeepalive is a session keepalive sent to one member on purpose
	// (Node), redirects not followed: one sent to a paused leader.
	KindKeepalive OpKind = "keepalive"
	// KindLost is the Go client telling its holder that a lock is gone:
	// Lock.Lost() closed (Return), after the holder stopped relying on it
	// (Invoke: the same moment, or when the holder began closing the
	// client). Token names the grant, Err the client's reason.
	KindLost OpKind = "lost"
	// KindMemberAdd is POST /api/v1/cluster/members with a body no member
	// may accept (Node: the member it was sent to).
	KindMemberAdd OpKind = "member-add"
	// KindMemberExit records a member process that exited without the
	// harness stopping it (Node), found at Invoke.
	KindMemberExit OpKind = "member-exit"
	// KindMemberPanic records panics found in a member's log after the run
	// (Node: the log, Err: the panic and where, and how often).
	KindMemberPanic OpKind = "member-panic"
	// KindMulti is a multi-acquire (POST /api/v1/acquire, or a WebSocket
	// acquire with "locks"): Locks in name order, Grants from the reply;
	// a refusal names the first blocking lock in Lock (and its Holder).
	KindMulti OpKind = "acquire-many"
	// KindRevoke is DELETE /api/v1/locks/{name}[?fencing_token=Token]:
	// Revoked lists the tokens the reply says it ended.
	KindRevoke OpKind = "revoke"
	// KindWSClosed is the end of a raw WebSocket connection of the kinds
	// workload (Invoke: when the client saw it end): pushes for its
	// session stop there.
	KindWSClosed OpKind = "ws-closed"
	// KindValue sets a held grant's value (POST /api/v1/locks/{name}/value,
	// the WebSocket op "value", or the Go client's Proclaim): Token names
	// the grant, Value the value sent.
	KindValue OpKind = "value"
	// KindWatch is a WebSocket watch request (Lock, or Prefix), answered
	// with WatchID; KindUnwatch ends one (also recorded, with Tag "stop",
	// for every watch still running when the observers stop: its last
	// frames are then what it ended with).
	KindWatch   OpKind = "watch"
	KindUnwatch OpKind = "unwatch"
	// KindChanged is one changed frame a watcher received (Invoke = Return
	// = when it was read): WatchID, Lock, Index, and the status in the
	// read fields (Held, Holder, OutToken, Waiters, Holders, Value, ...).
	// A Go-client watch event is one too (Resync when it was read again);
	// an Election.Observe event carries only the leader (Tag "observe").
	KindChanged OpKind = "changed"
	// KindResync is a resync frame (WatchID): changes were dropped, the
	// watcher re-reads.
	KindResync OpKind = "resync"
	// KindSynced is a synced frame (WatchID, Index): the watch's initial
	// frames read before it are the state of what it follows as of Index,
	// and every later frame is above it.
	KindSynced OpKind = "synced"
	// KindFinal is a lock's status in the replicated state after the run
	// quiesced: every member agreed on it at one applied index (Index: the
	// lock's; absent locks were free).
	KindFinal OpKind = "final"
	// KindCancel withdraws ClientID's queued wait on Lock (or a
	// multi-acquire's, on Locks): POST .../cancel, POST /api/v1/cancel or
	// the WebSocket op (SPEC 18). Withdrawn is the reply's "cancelled".
	KindCancel OpKind = "cancel"
)

// Outcome is what the client learned.
type Outcome string

// Outcomes. Unknown means the request may or may not have taken effect: a
// timeout, a connection reset after the request was sent, a 503 (the server
// cannot always tell whether it proposed), a client-side give-up. Fail is a
// definite refusal (a 409, or nothing was sent: connection refused).
const (
	Ok      Outcome = "ok"
	Fail    Outcome = "fail"
	Unknown Outcome = "unknown"
)

// Op is one operation of a history. Times are nanoseconds since the run's
// monotonic base, taken just before the request was sent (Invoke) and just
// after its reply was read or the client gave up (Return).
type Op struct {
	ID     int    `json:"id"`
	Worker string `json:"worker"` // which workload goroutine
	Via    string `json:"via"`    // "http" (raw API), "client" (Go client, WebSocket), "nemesis"
	Kind   OpKind `json:"kind"`
	Lock   string `json:"lock"` // lock name; the object key for fence writes
	// ClientID is the lock client: holder identity on the server.
	ClientID string `json:"client_id,omitempty"`
	// Attempt groups the retries of one logical acquire (same client id):
	// the grant may come from any of them.
	Attempt int64  `json:"attempt,omitempty"`
	TTLms   int64  `json:"ttl_ms,omitempty"`
	WaitMs  int64  `json:"wait_ms,omitempty"`
	Token   uint64 `json:"token,omitempty"` // input token (release, renew, fence)

	Invoke  int64   `json:"invoke"`
	Return  int64   `json:"return"`
	Outcome Outcome `json:"outcome"`
	Code    string  `json:"code,omitempty"` // error code of a definite refusal
	// RetryAfterMs is the retry delay of an admission refusal
	// (overloaded, a budget's resource_exhausted).
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Status       int    `json:"status,omitempty"`
	Err          string `json:"err,omitempty"`
	// GaveUp: the client stopped waiting for the reply on its own timeout,
	// the connection still open (not a reset, a refusal or the run's end).
	GaveUp bool `json:"gave_up,omitempty"`

	// Output.
	OutToken uint64 `json:"out_token,omitempty"` // acquire/read: the grant's token; fence 409: highest
	Holder   string `json:"holder,omitempty"`    // read: holder; lock_held: who holds it
	Held     bool   `json:"held,omitempty"`      // read
	Waiters  int    `json:"waiters,omitempty"`   // read
	// ExpiresAt is the server's expires_at of the grant (acquire and renew
	// replies, reads of a held lock) in history time, converted from the
	// leader's wall clock (one machine). 0: none reported.
	ExpiresAt int64 `json:"expires_at,omitempty"`
	// Node is the member a request was sent to on purpose (keepalives to a
	// paused leader, member additions, member exits).
	Node string `json:"node,omitempty"`
	// ExpiryLB is, for an acquire or renew that (maybe) took effect, the
	// earliest moment the server may end the grant on its own (TTL,
	// session): Invoke + TTL less a clock margin, or earlier for grants the
	// Go client may drop by itself. 0: the grant may end at any time.
	ExpiryLB int64 `json:"expiry_lb,omitempty"`
	// Tag marks ops of a scenario: "fifo:R:holder", "fifo:R:w2",
	// "fifo:R:confirm", "durable:R:I", "durable:R:I:check",
	// "mismatch:T" (an acquire with a wrong limit sent while the sender's
	// own grant T of the lock held), "delay:R:holder", "delay:R:waiter".
	Tag string `json:"tag,omitempty"`

	// Lock kinds (SPEC "Lock kinds"), on locks named kindPrefix*.
	// Mode: acquire, the mode asked for; read, the status's mode.
	// GrantMode: the mode of an acquire's grant as the reply gave it.
	Mode      string `json:"mode,omitempty"`
	GrantMode string `json:"grant_mode,omitempty"`
	// Limit: acquire, the limit asked for (0: none given); read, the
	// status's limit.
	Limit   int64 `json:"limit,omitempty"`
	DelayMs int64 `json:"delay_ms,omitempty"` // acquire: lock_delay_ms
	// Locks and Grants: a multi-acquire's names (name order) and the
	// grants its reply listed.
	Locks  []string   `json:"locks,omitempty"`
	Grants []GrantRec `json:"grants,omitempty"`
	// Holders: a read of a kinds lock, every grant the status listed (by
	// token); DelayedUntil its delayed_until (history time).
	Holders      []HolderRec `json:"holders,omitempty"`
	DelayedUntil int64       `json:"delayed_until,omitempty"`
	// Revoked: the tokens a revoke's reply says it ended.
	Revoked []uint64 `json:"revoked,omitempty"`
	// Snap numbers the reads of one list request that was one page: a
	// snapshot of the whole table at one log index, in which a lock that
	// is not listed is free.
	Snap int64 `json:"snap,omitempty"`

	// Values, elections and watches (SPEC "Lock kinds, values, elections
	// and watches"). Value: the value an acquire or a value op sent, or a
	// status's value (read, changed, final). Index: a status's index (the
	// log index of the lock's last change; a frame's index); StatusIndex a
	// changed frame's status.index, which must equal it. BlockIndex: a
	// blocking read's ?index=N (Tag "blocking", its ?wait= in WaitMs).
	Value       string `json:"value,omitempty"`
	Index       uint64 `json:"index,omitempty"`
	StatusIndex uint64 `json:"status_index,omitempty"`
	BlockIndex  uint64 `json:"block_index,omitempty"`
	// WatchID: the watch a watch op started or a frame belongs to, on the
	// connection of ClientID; Prefix: what a prefix watch follows.
	WatchID uint64 `json:"watch_id,omitempty"`
	Prefix  string `json:"prefix,omitempty"`
	// Resync: a Go-client watch event read again rather than pushed.
	Resync bool `json:"resync,omitempty"`
	// Withdrawn: a cancel's reply said a queued wait was withdrawn.
	Withdrawn bool `json:"withdrawn,omitempty"`
}

// GrantRec is one grant of a multi-acquire's reply.
type GrantRec struct {
	Lock      string `json:"lock"`
	Token     uint64 `json:"token"`
	ExpiresAt int64  `json:"expires_at,omitempty"` // history time
	Mode      string `json:"mode,omitempty"`
}

// HolderRec is one grant a lock's status listed.
type HolderRec struct {
	Client    string `json:"client"`
	Token     uint64 `json:"token"`
	ExpiresAt int64  `json:"expires_at,omitempty"` // history time
	Mode      string `json:"mode,omitempty"`
	Value     string `json:"value,omitempty"`
}

// shown returns the grants a successful read shows held: every holder of
// a kinds lock's status, or the one holder of an ordinary lock.
func (o Op) shown() []HolderRec {
	if o.Kind != KindRead || o.Outcome != Ok {
		return nil
	}
	if len(o.Holders) > 0 {
		return o.Holders
	}
	if !o.Held {
		return nil
	}
	return []HolderRec{{Client: o.Holder, Token: o.OutToken, ExpiresAt: o.ExpiresAt, Mode: o.Mode}}
}

// observed reports whether the op shows a lock's status: a successful
// read, a changed frame or event, a final state.
func (o Op) observed() bool {
	switch o.Kind {
	case KindRead:
		return o.Outcome == Ok
	case KindChanged, KindFinal:
		return true
	}
	return false
}

// holders returns the grants a status the op shows lists (the holder
// fields of a status without a holders list), with their values.
func (o Op) holders() []HolderRec {
	if !o.observed() {
		return nil
	}
	if len(o.Holders) > 0 {
		return o.Holders
	}
	if !o.Held {
		return nil
	}
	return []HolderRec{{Client: o.Holder, Token: o.OutToken, ExpiresAt: o.ExpiresAt, Mode: o.Mode, Value: o.Value}}
}

func (o Op) String() string {
	s := fmt.Sprintf("#%d %s %s %s(%s", o.ID, o.Worker, o.Via, o.Kind, o.Lock)
	if o.Prefix != "" {
		s += fmt.Sprintf("prefix %q", o.Prefix)
	}
	if o.WatchID != 0 {
		s += fmt.Sprintf(" watch=%d", o.WatchID)
	}
	if o.ClientID != "" {
		s += " client=" + o.ClientID
	}
	if o.Token != 0 {
		s += fmt.Sprintf(" token=%d", o.Token)
	}
	if o.TTLms != 0 {
		s += fmt.Sprintf(" ttl=%dms", o.TTLms)
	}
	if o.WaitMs != 0 {
		s += fmt.Sprintf(" wait=%dms", o.WaitMs)
	}
	if o.Mode != "" && !o.observed() {
		s += " mode=" + o.Mode
	}
	if o.Limit != 0 && !o.observed() {
		s += fmt.Sprintf(" limit=%d", o.Limit)
	}
	if o.DelayMs != 0 {
		s += fmt.Sprintf(" lock_delay=%dms", o.DelayMs)
	}
	if len(o.Locks) > 0 {
		s += " locks=" + strings.Join(o.Locks, ",")
	}
	if o.Value != "" && (o.Kind == KindAcquire || o.Kind == KindValue) {
		s += fmt.Sprintf(" value=%q", o.Value)
	}
	if o.Tag == "blocking" {
		s += fmt.Sprintf(" index=%d", o.BlockIndex)
	}
	s += fmt.Sprintf(") [%s, %s] → %s", ms(o.Invoke), ms(o.Return), o.Outcome)
	if o.Code != "" {
		s += " " + o.Code
	}
	if o.observed() && o.Index != 0 {
		s += fmt.Sprintf(" at index %d", o.Index)
		if o.Kind == KindChanged && o.StatusIndex != o.Index {
			s += fmt.Sprintf(" (status index %d)", o.StatusIndex)
		}
		if o.Resync {
			s += " (resync)"
		}
	}
	switch {
	case o.observed() && len(o.Holders) > 0:
		hs := make([]string, len(o.Holders))
		for i, h := range o.Holders {
			hs[i] = fmt.Sprintf("%s/%d/%s", h.Client, h.Token, h.Mode)
			if h.Value != "" {
				hs[i] += fmt.Sprintf("/%q", h.Value)
			}
			if h.ExpiresAt != 0 {
				hs[i] += "/exp " + ms(h.ExpiresAt)
			}
		}
		s += fmt.Sprintf(" held (%s, limit %d) by [%s] waiters %d", o.Mode, o.Limit, strings.Join(hs, " "), o.Waiters)
	case o.observed() && o.Held:
		s += fmt.Sprintf(" held by %s token %d waiters %d", o.Holder, o.OutToken, o.Waiters)
	case o.observed():
		s += fmt.Sprintf(" free waiters %d", o.Waiters)
	case o.OutToken != 0:
		s += fmt.Sprintf(" token %d", o.OutToken)
	}
	if o.GrantMode != "" {
		s += " granted " + o.GrantMode
	}
	for _, g := range o.Grants {
		s += fmt.Sprintf(" [%s token %d %s", g.Lock, g.Token, g.Mode)
		if g.ExpiresAt != 0 {
			s += " expires_at " + ms(g.ExpiresAt)
		}
		s += "]"
	}
	if o.Kind == KindRevoke && o.Outcome == Ok {
		s += fmt.Sprintf(" revoked %v", o.Revoked)
	}
	if o.Kind == KindCancel && o.Outcome == Ok {
		s += fmt.Sprintf(" cancelled %v", o.Withdrawn)
	}
	if o.observed() && o.Value != "" {
		s += fmt.Sprintf(" value %q", o.Value)
	}
	if o.DelayedUntil != 0 {
		s += " delayed_until " + ms(o.DelayedUntil)
	}
	if o.ExpiresAt != 0 {
		s += " expires_at " + ms(o.ExpiresAt)
	}
	if o.Node != "" {
		s += " on " + o.Node
	}
	if o.Holder != "" && !o.observed() {
		s += " holder " + o.Holder
	}
	if o.Err != "" {
		s += " (" + o.Err + ")"
	}
	if o.Tag != "" {
		s += " tag=" + o.Tag
	}
	return s
}

// ms renders a history time.
func ms(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }

// Fault is one nemesis action, from injection to heal.
type Fault struct {
	Kind    string   `json:"kind"`
	Targets []string `json:"targets,omitempty"`
	Detail  string   `json:"detail,omitempty"`
	Start   int64    `json:"start"`
	End     int64    `json:"end"`
	// Failover is, for faults that take the leader away, the time from
	// injection to the first write a member answered again (ns); 0 if not
	// measured.
	Failover int64 `json:"failover,omitempty"`
	// FailoverBy is the member that answered that write: the leader then.
	FailoverBy string `json:"failover_by,omitempty"`
	Err        string `json:"err,omitempty"`
	// Healed is when the harness undid the fault (SIGCONT, links healed,
	// members restarted); Healthy when the cluster was seen healthy again
	// afterwards (0: it was not).
	Healed  int64 `json:"healed,omitempty"`
	Healthy int64 `json:"healthy,omitempty"`
	// Stuck: the cluster did not become healthy after the fault.
	Stuck bool `json:"stuck,omitempty"`
}

// settled is the end of the fault's disturbance: when the cluster was
// healthy again, or the latest time known for it.
func (f Fault) settled() int64 { return max(f.Healthy, f.End, f.Healed) }

// History is everything a run recorded; it is what the checkers read and
// what a failed run writes to disk for replay (TestReplay).
type History struct {
	Seed     uint64    `json:"seed"`
	Members  int       `json:"members"`
	Started  time.Time `json:"started"` // wall time of the monotonic base
	Duration string    `json:"duration"`
	// ElectionTimeoutMs is the members' --election-timeout: the grace a new
	// leader may give a lock past its expires_at (0: lockd's default).
	ElectionTimeoutMs int64   `json:"election_timeout_ms,omitempty"`
	Ops               []Op    `json:"ops"`
	Faults            []Fault `json:"faults"`
	// Notes are harness observations that are not operations (liveness
	// trouble, replica comparison), kept for the reader of a failed run.
	Notes []string `json:"notes,omitempty"`
	// Flood is what the overload phase's flood was answered (nil without
	// one).
	Flood *FloodReport `json:"flood,omitempty"`
}

// Recorder collects a history from many goroutines. Times come from one
// monotonic base.
type Recorder struct {
	base     time.Time
	attempts atomic.Int64
	mu       sync.Mutex
	// ops in chunks of recChunk: appending never copies the whole history
	// under mu (a 10-minute run records some 200,000 ops of ~700 bytes,
	// and every worker waits on mu while a slice that size grows).
	ops    [][]Op
	n      int
	faults []Fault
	notes  []string
}

const recChunk = 4096

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{base: time.Now()} }

// Now is the current history time.
func (r *Recorder) Now() int64 { return int64(time.Since(r.base)) }

// At converts a time.Time (with a monotonic reading) to history time.
func (r *Recorder) At(t time.Time) int64 { return int64(t.Sub(r.base)) }

// NewAttempt returns a fresh attempt id.
func (r *Recorder) NewAttempt() int64 { return r.attempts.Add(1) }

// Add appends an op and returns it with its id.
func (r *Recorder) Add(op Op) Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = r.n
	r.n++
	if len(r.ops) == 0 || len(r.ops[len(r.ops)-1]) == recChunk {
		r.ops = append(r.ops, make([]Op, 0, recChunk))
	}
	r.ops[len(r.ops)-1] = append(r.ops[len(r.ops)-1], op)
	return op
}

// AddFault appends a nemesis action.
func (r *Recorder) AddFault(f Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
}

// Note records a harness observation.
func (r *Recorder) Note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf("[%s] ", ms(int64(time.Since(r.base))))+fmt.Sprintf(format, args...))
}

// History returns a copy of what was recorded, ops in invoke order.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := make([]Op, 0, r.n)
	for _, c := range r.ops {
		all = append(all, c...)
	}
	h := History{Started: r.base, Ops: all,
		Faults: append([]Fault(nil), r.faults...), Notes: append([]string(nil), r.notes...)}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Invoke < h.Ops[j].Invoke })
	for i := range h.Ops {
		h.Ops[i].ID = i
	}
	return h
}

// WriteJSON writes the history to path.
func (h History) WriteJSON(path string) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadHistory loads a history written by WriteJSON.
func ReadHistory(path string) (History, error) {
	var h History
	b, err := os.ReadFile(path)
	if err != nil {
		return h, err
	}
	err = json.Unmarshal(b, &h)
	return h, err
}
