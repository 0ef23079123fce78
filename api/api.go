// Package api holds lockd's public wire types: HTTP request and reply bodies,
// WebSocket messages and error codes. It is pure data, shared by the server,
// the Go client and any other program that speaks to lockd.
package api

import (
	"time"
)

// Error codes, as in the SPEC. Each maps to one HTTP status (see Status).
const (
	CodeInvalidArgument  = "invalid_argument"
	CodeNotFound         = "not_found"
	CodeLockHeld         = "lock_held"
	CodeWaitTimeout      = "wait_timeout"
	CodeNotHolder        = "not_holder"
	CodeSessionExpired   = "session_expired"
	CodeNoLeader         = "no_leader"
	CodeNotLeader        = "not_leader" // WebSocket only: the member is a follower
	CodePayloadTooLarge  = "payload_too_large"
	CodeUnauthenticated  = "unauthenticated"
	CodePermissionDenied = "permission_denied"
	CodeInternal         = "internal"
	CodeStaleToken       = "stale_token" // fencestore
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeLimitMismatch (409): an acquire names another semaphore size
	// than the lock has while it has holders or waiters (or asks for a
	// shared grant of a semaphore, or names a semaphore in a multi-acquire).
	CodeLimitMismatch = "limit_mismatch"
	// CodeCancelled (409): the waiting acquire was withdrawn by a cancel
	// (POST /api/v1/locks/{name}/cancel, or the WebSocket op).
	CodeCancelled = "cancelled"
	// CodeOverloaded (503, with Retry-After): the member refuses new work
	// it cannot commit soon; nothing was proposed. Retry after the delay.
	CodeOverloaded = "overloaded"
)

// CodeResourceExhausted (429): a quota is used up; the message names the
// quota and its value. Nothing changed; retry once something was released.
const CodeResourceExhausted = "resource_exhausted"

// MsgRestoreNotEmpty starts the invalid_argument message of a snapshot
// restore refused because the cluster already holds state (without force);
// lockctl recognizes it to explain --force.
const MsgRestoreNotEmpty = "the cluster already holds state"

// Status returns the HTTP status that goes with an error code.
func Status(code string) int {
	switch code {
	case CodeInvalidArgument:
		return 400
	case CodeNotFound, CodeSessionExpired:
		return 404
	case CodeLockHeld, CodeWaitTimeout, CodeNotHolder, CodeStaleToken, CodeLimitMismatch, CodeCancelled:
		return 409
	case CodeNoLeader, CodeNotLeader, CodeOverloaded:
		return 503
	case CodePayloadTooLarge:
		return 413
	case CodeResourceExhausted:
		return 429
	case CodeUnauthenticated:
		return 401
	case CodeMethodNotAllowed:
		return 405
	case CodePermissionDenied:
		return 403
	default:
		return 500
	}
}

// Error is the body of every error reply: {"error": {...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ErrorReply wraps Error for the HTTP body. Leader is set with not_leader.
type ErrorReply struct {
	Error  Error  `json:"error"`
	Leader string `json:"leader,omitempty"`
}

// Limits from the SPEC. Violations get 400 invalid_argument.
const (
	MaxLockName       = 256
	MaxClientID       = 128
	MinTTLms          = 100
	MaxTTLms          = 86_400_000
	MaxWaitTimeoutMs  = 600_000
	MinSessionTTLms   = 1000
	MaxSessionTTLms   = 3_600_000
	MaxBodyBytes      = 64 << 10
	DefaultLockTTLms  = 30_000
	DefaultSessionTTL = 15_000
)

// More limits: list pages, and a member's raft_addr and http_addr (a DNS
// name of 253 bytes, a port and a URL scheme fit with room to spare).
const (
	MaxListLimit     = 10_000
	DefaultListLimit = 1000
	MaxMemberAddr    = 512
)

// TimeFormat is RFC 3339 in UTC with milliseconds, the SPEC's expires_at.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// FormatTime renders unix milliseconds as SPEC time; 0 (no expiry) gives "".
func FormatTime(ms int64) string {
	if ms == 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(TimeFormat)
}

// ParseTime is the inverse of FormatTime.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// AcquireRequest is the body of POST /api/v1/locks/{name}/acquire.
// Pointers tell an absent field from a zero one.
type AcquireRequest struct {
	ClientID      string `json:"client_id"`
	TTLms         *int64 `json:"ttl_ms,omitempty"`
	WaitTimeoutMs *int64 `json:"wait_timeout_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	// Lock kinds (SPEC "Lock kinds"): Mode is ModeExclusive (default) or
	// ModeShared; Limit the semaphore size (1–10 000; absent: join what
	// the lock has); LockDelayMs the lock-delay (0–60 000); Value the
	// grant's value (≤ 4096 bytes of UTF-8).
	Mode        string  `json:"mode,omitempty"`
	Limit       *int64  `json:"limit,omitempty"`
	LockDelayMs *int64  `json:"lock_delay_ms,omitempty"`
	Value       *string `json:"value,omitempty"`
}

// Modes of a grant, and of a lock's status ("none" when free).
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
	ModeNone      = "none"
)

// Limits of the lock kinds.
const (
	MaxLimit       = 10_000
	MaxLockDelayMs = 60_000
)

// Blocking queries: GET /api/v1/locks/{name}?index=N&wait=D.
const (
	DefaultWait = 5 * time.Minute
	MaxWait     = 10 * time.Minute
)

// AcquireReply is the 200 reply of acquire (and, with Acquired false and
// Error set, its 409 reply).
type AcquireReply struct {
	Acquired     bool   `json:"acquired"`
	Lock         string `json:"lock,omitempty"`
	ClientID     string `json:"client_id,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	ExpiresAt    string `json:"expires_at,omitempty"`
	FencingProof string `json:"fencing_proof,omitempty"`
	Error        *Error `json:"error,omitempty"`
	// Holder names the current holder in a lock_held reply.
	Holder string `json:"holder,omitempty"`
	// Mode is the grant's mode.
	Mode string `json:"mode,omitempty"`
	// Grants are a multi-acquire's grants, in name order (Lock then names
	// the first blocking lock of a refused one).
	Grants []Grant `json:"grants,omitempty"`
}

// Grant is one lock of a multi-acquire's grant.
type Grant struct {
	Lock         string `json:"lock"`
	FencingToken uint64 `json:"fencing_token"`
	ExpiresAt    string `json:"expires_at"`
	Mode         string `json:"mode"`
	FencingProof string `json:"fencing_proof,omitempty"`
}

// ReleaseRequest is the body of POST /api/v1/locks/{name}/release.
type ReleaseRequest struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
}

// ReleaseReply is the 200 reply of release.
type ReleaseReply struct {
	Released bool `json:"released"`
}

// RenewRequest is the body of POST /api/v1/locks/{name}/renew.
type RenewRequest struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	TTLms        *int64 `json:"ttl_ms,omitempty"`
}

// RenewReply is the 200 reply of renew. FencingProof is the grant's proof
// re-signed for its new expiry (with a signing key): a proof expires with
// the grant it was signed for.
type RenewReply struct {
	Renewed      bool   `json:"renewed"`
	ExpiresAt    string `json:"expires_at,omitempty"`
	FencingProof string `json:"fencing_proof,omitempty"`
}

// CancelRequest is the body of POST /api/v1/locks/{name}/cancel.
type CancelRequest struct {
	ClientID string `json:"client_id"`
}

// CancelManyRequest is the body of POST /api/v1/cancel: a multi-acquire's
// wait, named by all its locks.
type CancelManyRequest struct {
	ClientID string   `json:"client_id"`
	Locks    []string `json:"locks"`
}

// CancelReply is the 200 reply of a cancel: whether a queued wait was
// withdrawn (false when none was queued; a grant already made is not
// undone).
type CancelReply struct {
	Cancelled bool `json:"cancelled"`
}

// LockStatus is the reply of GET /api/v1/locks/{name} and an element of
// LockList. lockd never sets SessionID: a session id is a capability,
// shown only to the identity that created the session (SPEC semantics 11);
// the field stays for clients built against older servers.
type LockStatus struct {
	Lock         string `json:"lock"`
	Held         bool   `json:"held"`
	ClientID     string `json:"client_id,omitempty"`
	SessionID    string `json:"session_id,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	ExpiresAt    string `json:"expires_at,omitempty"`
	Waiters      int    `json:"waiters"`
	// Lock kinds and values: the holders' mode ("none" when free), the
	// semaphore size, every grant by token, the lowest token's value, the
	// end of a running lock-delay, and the log index of the lock's last
	// change.
	Mode  string `json:"mode"`
	Limit int64  `json:"limit"`
	// Holders are at most 64 grants, the lowest tokens; HoldersTotal counts
	// every grant, and GET /api/v1/locks/{name}/holders pages them all.
	Holders      []HolderStatus `json:"holders,omitempty"`
	HoldersTotal int            `json:"holders_total"`
	Value        string         `json:"value,omitempty"`
	DelayedUntil string         `json:"delayed_until,omitempty"`
	Index        uint64         `json:"index"`
	// Stale is set on a ?stale=true read: the member's own state, which
	// may lag the leader's.
	Stale bool `json:"stale,omitempty"`
}

// HolderStatus is one grant in a lock's status.
type HolderStatus struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	ExpiresAt    string `json:"expires_at,omitempty"`
	Mode         string `json:"mode"`
	Value        string `json:"value,omitempty"`
}

// HoldersPage is the reply of GET /api/v1/locks/{name}/holders: grants in
// token order; Next is the token to pass as after for the next page, ""
// on the last.
type HoldersPage struct {
	Lock         string         `json:"lock"`
	Holders      []HolderStatus `json:"holders"`
	HoldersTotal int            `json:"holders_total"`
	Next         string         `json:"next"`
	Stale        bool           `json:"stale,omitempty"`
}

// MaxStatusHolders is how many grants a status, list item or watch frame
// shows at most.
const MaxStatusHolders = 64

// RevokeReply is the 200 reply of DELETE /api/v1/locks/{name}: the tokens
// of the grants it ended ([] for a lock with no holder).
type RevokeReply struct {
	Revoked []uint64 `json:"revoked"`
}

// ValueReply is the 200 reply of POST /api/v1/locks/{name}/value.
type ValueReply struct {
	Updated      bool   `json:"updated"`
	FencingToken uint64 `json:"fencing_token"`
}

// LockList is the reply of GET /api/v1/locks?prefix=p&limit=n&after=name:
// one page of locks in name order. Next is the name to pass as after for
// the next page, "" on the last page.
type LockList struct {
	Locks []LockStatus `json:"locks"`
	Next  string       `json:"next"`
}

// SessionRequest is the body of POST /api/v1/sessions.
type SessionRequest struct {
	ClientID string `json:"client_id"`
	TTLms    *int64 `json:"ttl_ms,omitempty"`
}

// SessionReply is the reply of session create and keepalive.
type SessionReply struct {
	SessionID string `json:"session_id,omitempty"`
	TTLms     int64  `json:"ttl_ms"`
}

// Member is one cluster member.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	Voter    bool   `json:"voter"`
}

// ClusterStatus is the reply of GET /api/v1/cluster.
type ClusterStatus struct {
	LeaderID   string   `json:"leader_id"`
	LeaderHTTP string   `json:"leader_http"`
	Term       uint64   `json:"term"`
	Members    []Member `json:"members"`
}

// AddMemberRequest is the body of POST /api/v1/cluster/members.
type AddMemberRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// TransferRequest is the body of POST /api/v1/cluster/transfer-leadership.
type TransferRequest struct {
	To string `json:"to,omitempty"`
}

// NodeStatus is the reply of GET /api/v1/status: this member's own view,
// served locally by any member (used for catch-up checks and dashboards).
type NodeStatus struct {
	ID           string `json:"id"`
	State        string `json:"state"`
	LeaderID     string `json:"leader_id"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	LastToken    uint64 `json:"last_token"`
	// LogStore is the member's Raft log store ("wal" or "bolt"); Version
	// the lockd build's version.
	LogStore string `json:"log_store"`
	Version  string `json:"version"`
}

// Header names.
const (
	HeaderLeader = "X-Lockd-Leader"
)

// MultiAcquireRequest is the body of POST /api/v1/acquire (SPEC
// "Multi-lock"): every named lock in one committed step, or none.
type MultiAcquireRequest struct {
	ClientID      string   `json:"client_id"`
	Locks         []string `json:"locks"`
	Mode          string   `json:"mode,omitempty"`
	TTLms         *int64   `json:"ttl_ms,omitempty"`
	WaitTimeoutMs *int64   `json:"wait_timeout_ms,omitempty"`
	SessionID     string   `json:"session_id,omitempty"`
	LockDelayMs   *int64   `json:"lock_delay_ms,omitempty"`
	Value         *string  `json:"value,omitempty"`
}

// ValueRequest is the body of POST /api/v1/locks/{name}/value (SPEC
// "Values and elections").
type ValueRequest struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	Value        string `json:"value"`
}

// Limits of the lock kinds and values (SPEC).
const (
	MinMultiLocks = 2
	MaxMultiLocks = 64
	MaxValueBytes = 4096
)
