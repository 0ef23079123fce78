package client

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/lockd/lockd/api"
)

// Sentinel errors. Errors returned by this package wrap them, so match with
// errors.Is, never by string. An error that came from the server is a
// *ServerError, which also unwraps to the server's *api.Error.
var (
	// ErrLockHeld: the lock is held by someone else and the call did not wait.
	ErrLockHeld = errors.New("lockd: lock held by another client")
	// ErrWaitTimeout: the wait for the lock ended before it was granted.
	ErrWaitTimeout = errors.New("lockd: timed out waiting for the lock")
	// ErrNotHolder: the lock is no longer held with this token (released,
	// expired, or taken over after a loss).
	ErrNotHolder = errors.New("lockd: not the holder of the lock")
	// ErrSessionExpired: the session ended on the server (or, with
	// ErrLeaseExpired, by the client's own conservative lease).
	ErrSessionExpired = errors.New("lockd: session expired")
	// ErrNoLeader: no member could name a leader, or none could be reached.
	ErrNoLeader = errors.New("lockd: no leader")
	// ErrUnauthenticated: the cluster wants a valid bearer token (HTTP 401
	// unauthenticated): none was configured (Config.Token), or it is not
	// known (mistyped, rotated out). Never retried.
	ErrUnauthenticated = errors.New("lockd: unauthenticated")
	// ErrPermissionDenied: the token is known but lacks the access the call
	// needs (HTTP 403 permission_denied): a lock outside its prefixes, a
	// read-only token taking a lock, a cluster operation or backup without
	// admin access. Never retried.
	ErrPermissionDenied = errors.New("lockd: permission denied")

	// ErrLeaseExpired: the client's conservative local lease ran out: no
	// keepalive or renew sent early enough was confirmed, so the server may
	// already have given the lock away. Lost() closes with this cause.
	ErrLeaseExpired = errors.New("lockd: local lease ran out before the leader confirmed it")
	// ErrLockExpired: the server expired the lock's own TTL.
	ErrLockExpired = errors.New("lockd: lock TTL expired")
	// ErrRevoked: the grant was revoked (DELETE /api/v1/locks/{name}, an
	// admin operation, or Client.Revoke): the server pushed "lost" with
	// reason revoked. Lost closes with this cause.
	ErrRevoked = errors.New("lockd: lock revoked")
	// ErrLimitMismatch: an acquire named another semaphore size
	// (WithLimit) than the lock has while it has holders or waiters, asked
	// for a shared grant of a semaphore, or named a semaphore in a
	// multi-acquire (HTTP 409 limit_mismatch).
	ErrLimitMismatch = errors.New("lockd: the lock has another limit")
	// ErrResourceExhausted: a quota of the cluster is used up (HTTP 429
	// resource_exhausted; the message names the quota): sessions in the
	// cluster, waiters per lock, locks and waits per session, locks in the
	// table. Nothing changed; retry once something was released.
	ErrResourceExhausted = errors.New("lockd: resource exhausted")
	// ErrReleased: the lock was released by this client.
	ErrReleased = errors.New("lockd: lock released")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("lockd: client closed")
	// ErrUnknownOutcome: a request was sent but no answer came (ctx ended,
	// the connection broke): the server may or may not have applied it. A
	// Release that ends so closes Lost with this cause: the lock must be
	// taken as gone, and the client goes on releasing it in the background.
	ErrUnknownOutcome = errors.New("lockd: outcome unknown: the request may or may not have taken effect")

	// ErrMaybeGrantedLost comes with ErrLockHeld or ErrWaitTimeout when an
	// acquire was re-sent after its connection failed: an earlier send may
	// have been granted, and that grant ended (its TTL or the session ran
	// out) before the client could hear of it. The caller does not hold the
	// lock either way; a history of grants must count the attempt as
	// possibly granted.
	ErrMaybeGrantedLost = errors.New("lockd: an earlier send of this acquire may have been granted and lost while the client was away")

	// ErrElectionNotLeader: Proclaim (or Election.Err) of a candidate that
	// does not lead: never elected, resigned, or its leadership was lost.
	ErrElectionNotLeader = errors.New("lockd: not the leader of the election")
	// ErrElectionNoLeader: Election.Leader found nobody leading.
	ErrElectionNoLeader = errors.New("lockd: the election has no leader")

	// ErrHTTPSRequired: an http:// endpoint reached a member that serves
	// HTTPS (it answered "400 Client sent an HTTP request to an HTTPS
	// server"). Use https:// endpoints, and trust the members' CA
	// (Config.TLSConfig.RootCAs; lockctl --cacert). Not retried: every
	// later attempt would get the same answer.
	ErrHTTPSRequired = errors.New("lockd: this member speaks HTTPS: use an https:// endpoint, and trust its CA (TLSConfig.RootCAs; lockctl --cacert)")

	// ErrHeldByThisClient: TryAcquire (or TryAcquireMany) of a lock this
	// Client already holds, or is already acquiring in another call. It
	// also matches ErrLockHeld: the lock is not free for this call. A Client
	// is one holder: use the *Lock it has, or Release it first (Acquire,
	// unlike TryAcquire, waits for that).
	ErrHeldByThisClient = errors.New("lockd: the lock is already held or being acquired by this client")

	// ErrCancelled: the wait was withdrawn by a cancel (HTTP 409
	// cancelled): this client's own, when its context ended (see
	// Client.Acquire), or another user of the same client ID's (POST
	// /api/v1/locks/{name}/cancel, lockctl giving up). The lock was not
	// granted to this wait.
	ErrCancelled = errors.New("lockd: the wait was withdrawn (cancelled)")
	// ErrOverloaded: the member refused new work it cannot commit soon
	// (HTTP 503 overloaded, with Retry-After); nothing was proposed. The
	// client backs off and retries it as it does no_leader, so a call
	// returns it only when its ctx ended while the cluster was still
	// refusing.
	ErrOverloaded = errors.New("lockd: the cluster is overloaded")

	// ErrUntrustedRedirect: a member sent the client (a 307, or a
	// WebSocket not_leader reply) where it does not send its token: to a
	// host that is neither a configured endpoint nor a leader one of them
	// named, or from https to http. Nothing was sent there. A configured
	// endpoint's redirect, or one from https to http, is refused at once
	// (the error matches this); a redirect onward from a leader reached
	// through a redirect is retried via the configured endpoints, so the
	// call ends with ErrNoLeader if no member leads to a trusted leader.
	ErrUntrustedRedirect = errors.New("lockd: untrusted redirect")
)

// ServerError is an error reply from lockd. It matches the sentinel of its
// code with errors.Is (lock_held → ErrLockHeld, ...) and unwraps to the
// wire *api.Error for errors.As.
type ServerError struct {
	// API is the error as the server sent it.
	API api.Error
	// Status is the HTTP status; 0 for a WebSocket reply.
	Status int
	// Holder names the current holder in a lock_held reply, when the server
	// tells.
	Holder string
	// Lock names the lock that refused a multi-acquire (the first
	// blocking one of lock_held, the semaphore of limit_mismatch), when
	// the server tells.
	Lock string
	// Leader is the leader's HTTP URL a not_leader reply pointed to.
	Leader string

	retryAfterHdr string
}

func (e *ServerError) Error() string {
	s := "lockd: " + e.API.Code
	if e.API.Message != "" {
		s += ": " + e.API.Message
	}
	switch {
	case e.Lock != "" && e.Holder != "":
		s += " (lock " + e.Lock + " held by " + e.Holder + ")"
	case e.Holder != "":
		s += " (held by " + e.Holder + ")"
	case e.Lock != "":
		s += " (lock " + e.Lock + ")"
	}
	return s
}

// Unwrap exposes the wire error, for errors.As(err, new(*api.Error)).
func (e *ServerError) Unwrap() error { return &e.API }

// Is matches the sentinel that goes with the code.
func (e *ServerError) Is(target error) bool {
	s := sentinel(e.API.Code)
	return s != nil && s == target
}

func sentinel(code string) error {
	switch code {
	case api.CodeLockHeld:
		return ErrLockHeld
	case api.CodeWaitTimeout:
		return ErrWaitTimeout
	case api.CodeNotHolder:
		return ErrNotHolder
	case api.CodeSessionExpired:
		return ErrSessionExpired
	case api.CodeNoLeader, api.CodeNotLeader:
		return ErrNoLeader
	case api.CodeUnauthenticated:
		return ErrUnauthenticated
	case api.CodePermissionDenied:
		return ErrPermissionDenied
	case api.CodeLimitMismatch:
		return ErrLimitMismatch
	case api.CodeResourceExhausted:
		return ErrResourceExhausted
	case api.CodeCancelled:
		return ErrCancelled
	case api.CodeOverloaded:
		return ErrOverloaded
	}
	return nil
}

// isAuthError reports a refused token: retrying cannot help.
func isAuthError(err error) bool {
	return errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrPermissionDenied)
}

func serverError(e *api.Error, status int) *ServerError {
	se := &ServerError{Status: status}
	if e != nil {
		se.API = *e
	}
	return se
}

// waitTimeoutErr is the error of a wait that a resend (after a reconnect,
// with no wait time left) found still held: from the caller's side the wait
// timed out. what names the lock(s).
func waitTimeoutErr(what string, cause error) error {
	return fmt.Errorf("%w: %s (%v)", ErrWaitTimeout, what, cause)
}

// httpsOnlyReply is the body Go's (and most) HTTPS servers answer a plain
// HTTP request with, under status 400.
const httpsOnlyReply = "Client sent an HTTP request to an HTTPS server"

// httpsRequired reports a 400 reply that says the request should have been
// made over HTTPS.
func httpsRequired(status int, body []byte) bool {
	return status == 400 && bytes.Contains(body, []byte(httpsOnlyReply))
}

// heldHereError is the error of a try on a lock this client already holds
// or is acquiring: it matches ErrHeldByThisClient and ErrLockHeld, and says
// which of the two it is.
type heldHereError struct {
	what    string // the lock(s) asked for
	lock    string // the one this client holds or awaits
	token   uint64 // its token, when held
	pending bool   // acquiring in another call, not held
}

func (e *heldHereError) Error() string {
	prefix := "lockd: "
	if e.what != fmt.Sprintf("lock %q", e.lock) {
		prefix += e.what + ": "
	}
	if e.pending {
		return fmt.Sprintf("%slock %q is already being acquired by this client, in another call", prefix, e.lock)
	}
	return fmt.Sprintf("%slock %q is already held by this client (token %d): use the Lock you have, or release it first", prefix, e.lock, e.token)
}

func (e *heldHereError) Is(target error) bool {
	return target == ErrHeldByThisClient || target == ErrLockHeld
}
