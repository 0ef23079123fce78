package api

// WebSocket operations (the "op" of a request frame).
const (
	OpHello     = "hello"
	OpAcquire   = "acquire"
	OpRelease   = "release"
	OpRenew     = "renew"
	OpKeepalive = "keepalive"
	OpValue     = "value"
	OpWatch     = "watch"
	OpUnwatch   = "unwatch"
	OpCancel    = "cancel" // withdraw the queued wait on Lock (or a multi-acquire's, on Locks)
)

// WebSocket reply and push types (the "type" of a server frame).
const (
	TypeHello   = "hello"
	TypeGranted = "granted"
	TypeOK      = "ok"
	TypeError   = "error"
	TypeLost    = "lost"
	TypeChanged = "changed" // a watched lock's committed change
	TypeResync  = "resync"  // a watcher fell behind: re-read, then follow the changes again
	// TypeSynced follows a watch's initial frames: the watcher now has the
	// state of everything it watches as of Index, and every later frame of
	// the watch has a higher index.
	TypeSynced = "synced"
)

// Reasons carried by a "lost" push.
const (
	ReasonExpired        = "expired"
	ReasonSessionExpired = "session_expired"
	ReasonRevoked        = "revoked"
)

// WSRequest is one client frame. Fields not used by an op stay empty.
type WSRequest struct {
	ID            uint64 `json:"id"`
	Op            string `json:"op"`
	ClientID      string `json:"client_id,omitempty"`
	SessionTTLms  *int64 `json:"session_ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	Lock          string `json:"lock,omitempty"`
	TTLms         *int64 `json:"ttl_ms,omitempty"`
	WaitTimeoutMs *int64 `json:"wait_timeout_ms,omitempty"`
	FencingToken  uint64 `json:"fencing_token,omitempty"`
	// Lock kinds (acquire; Value also for "value"), as in AcquireRequest;
	// Locks makes an acquire a multi-acquire (Lock then stays empty).
	Mode        string   `json:"mode,omitempty"`
	Limit       *int64   `json:"limit,omitempty"`
	LockDelayMs *int64   `json:"lock_delay_ms,omitempty"`
	Value       *string  `json:"value,omitempty"`
	Locks       []string `json:"locks,omitempty"`
	// Watches: watch Lock, or every lock under Prefix (a present, even
	// empty, prefix); unwatch WatchID.
	Prefix  *string `json:"prefix,omitempty"`
	WatchID uint64  `json:"watch_id,omitempty"`
	// Handoff makes a release hand the lock on to another acquire of the
	// same client and lock, in the same committed step (one commit instead
	// of two): the release is answered under this frame's id, the acquire
	// (its own id, and the acquire fields of this frame) as any acquire.
	// The acquire joins the queue behind every waiter already there.
	Handoff *WSRequest `json:"handoff,omitempty"`
}

// WSMessage is one server frame: a reply to a request (ID set) or a push.
type WSMessage struct {
	ID           uint64  `json:"id,omitempty"`
	Type         string  `json:"type"`
	SessionID    string  `json:"session_id,omitempty"`
	SessionTTLms int64   `json:"session_ttl_ms,omitempty"`
	Lock         string  `json:"lock,omitempty"`
	FencingToken uint64  `json:"fencing_token,omitempty"`
	ExpiresAt    string  `json:"expires_at,omitempty"`
	FencingProof string  `json:"fencing_proof,omitempty"`
	Reason       string  `json:"reason,omitempty"`
	Error        *Error  `json:"error,omitempty"`
	Leader       string  `json:"leader,omitempty"`
	Mode         string  `json:"mode,omitempty"`
	Grants       []Grant `json:"grants,omitempty"`
	Holder       string  `json:"holder,omitempty"`
	// ReadOnly: the hello of a connection whose token has read access only
	// opened no session; the connection serves watches.
	ReadOnly bool `json:"read_only,omitempty"`
	// Watches: the watch a changed, synced or resync frame belongs to, and
	// a change's log index and the lock's status right after it (synced:
	// the index the watch's initial state is as of).
	WatchID uint64      `json:"watch_id,omitempty"`
	Index   uint64      `json:"index,omitempty"`
	Status  *LockStatus `json:"status,omitempty"`
	// Cancelled answers a cancel: whether a queued wait was withdrawn.
	Cancelled *bool `json:"cancelled,omitempty"`
	// RetryAfterMs comes with an overloaded or resource_exhausted error
	// that admission control answered: when to send the request again (the
	// WebSocket's Retry-After).
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
}
