package httpapi

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/notify"
)

// validKinds checks the lock-kind fields of an acquire (SPEC "Lock kinds")
// and returns them as the command fields they become.
func validKinds(mode string, limit, delay *int64, value *string) (locktable.Command, error) {
	var c locktable.Command
	switch mode {
	case "", api.ModeExclusive:
	case api.ModeShared:
		c.Mode = locktable.Shared
	default:
		return c, invalid("mode must be %q or %q, got %q", api.ModeExclusive, api.ModeShared, mode)
	}
	if err := checkRange("limit", limit, 1, api.MaxLimit); err != nil {
		return c, err
	}
	if limit != nil {
		c.Limit = *limit
	}
	if c.Mode == locktable.Shared && c.Limit > 1 {
		return c, invalid("mode shared with limit %d: a semaphore's holders are exclusive (each holds one permit)", c.Limit)
	}
	if err := checkRange("lock_delay_ms", delay, 0, api.MaxLockDelayMs); err != nil {
		return c, err
	}
	if delay != nil {
		c.DelayMs = *delay
	}
	if value != nil {
		if err := validValue(*value); err != nil {
			return c, err
		}
		c.Value = *value
	}
	return c, nil
}

func validValue(v string) error {
	if len(v) > api.MaxValueBytes || !utf8.ValidString(v) {
		return invalid("value must be valid UTF-8 of at most %d bytes (got %d bytes)", api.MaxValueBytes, len(v))
	}
	return nil
}

// acquireMany is POST /api/v1/acquire: every named lock in one committed
// step, or none (SPEC "Multi-lock").
func (h *Handler) acquireMany(w http.ResponseWriter, r *http.Request) {
	start, outcome := time.Now(), ""
	defer func() {
		if outcome != "" {
			h.obs.AcquireDone(outcome, time.Since(start))
		}
	}()
	reject := func(err error) {
		outcome, _ = errorCode(err)
		writeError(w, err)
	}
	var req api.MultiAcquireRequest
	if err := decode(w, r, &req, false); err != nil {
		reject(err)
		return
	}
	names, err := validMultiAcquire(&req)
	if err != nil {
		reject(err)
		return
	}
	kinds, err := validKinds(req.Mode, nil, req.LockDelayMs, req.Value)
	if err != nil {
		reject(err)
		return
	}
	var who auth.Identity
	for _, name := range names {
		var ok bool
		if who, ok = h.allow(w, r, auth.Lock, name, false); !ok {
			return
		}
	}
	if !h.leaderWithSession(w, r, who, req.SessionID, reject) {
		return
	}
	ttl, wait := acquireTimes(req.TTLms, req.WaitTimeoutMs, req.SessionID)
	cmd := kinds
	cmd.Op, cmd.Locks, cmd.ClientID, cmd.SessionID = locktable.OpAcquire, names, req.ClientID, req.SessionID
	cmd.TTLms, cmd.WaitMs, cmd.Owner = ttl, wait, who.Name
	outcome = h.acquireLoop(w, r, cmd, names, acquireAnswers{
		granted: func(res locktable.Result) { writeJSON(w, 200, h.grantsReply(req.ClientID, res.Grants)) },
		refused: func(res locktable.Result) string {
			if res.Code == locktable.CodeLockHeld {
				code, msg := errorCode(stateError(res.Code, res.Lock, res.Holder))
				writeJSON(w, 409, lockHeldReply{Lock: res.Lock, Holder: res.Holder, Error: &api.Error{Code: code, Message: msg}})
				return code
			}
			lock := res.Lock
			if lock == "" {
				lock = strings.Join(names, ", ")
			}
			return writeErrorCode(w, h.refusal("acquire", resultError(res, lock)))
		},
		// A try by a client whose earlier multi-acquire of the same locks
		// waits: that wait keeps its place and answers for itself.
		tryQueued: func() string {
			writeJSON(w, 409, lockHeldReply{Lock: names[0],
				Error: &api.Error{Code: api.CodeLockHeld, Message: "locks " + strings.Join(names, ", ") +
					" are not free; the earlier wait of this client keeps its place in their queues"}})
			return api.CodeLockHeld
		},
	})
}

// leaderWithSession routes an acquire to the leader and checks the
// caller's access to the session it names; false when it answered.
func (h *Handler) leaderWithSession(w http.ResponseWriter, r *http.Request, who auth.Identity, session string, reject func(error)) bool {
	if h.routeToLeader(w, r) {
		return false
	}
	if session != "" {
		if err := h.sessionAccess(who, session); err != nil {
			reject(err)
			return false
		}
	}
	return true
}

// acquireTimes applies the SPEC's defaults to an acquire's ttl_ms and
// wait_timeout_ms: 30 s without a session, no TTL of its own with one;
// no wait.
func acquireTimes(ttl, wait *int64, session string) (ttlMs, waitMs int64) {
	switch {
	case ttl != nil:
		ttlMs = *ttl
	case session == "":
		ttlMs = api.DefaultLockTTLms
	}
	if wait != nil {
		waitMs = *wait
	}
	return ttlMs, waitMs
}

// acquireAnswers are the replies of one kind of acquire (one lock, or a
// multi-acquire) for acquireLoop; refused and tryQueued return the
// outcome for metrics.
type acquireAnswers struct {
	granted   func(res locktable.Result)
	refused   func(res locktable.Result) string
	tryQueued func() string // a try that found this client's earlier wait queued
}

// acquireLoop proposes an acquire and answers it: at once when the state
// machine grants or refuses it, after the committed hand-off (or the end
// of the wait) when it queued. It subscribes to the client's events before
// proposing, so no grant can slip past; if the event stream overflowed, it
// re-proposes the idempotent acquire to learn where the wait stands,
// keeping its queue places. It returns the outcome for metrics.
func (h *Handler) acquireLoop(w http.ResponseWriter, r *http.Request, cmd locktable.Command, names []string, a acquireAnswers) string {
	wait := cmd.WaitMs
	deadline := time.Now().Add(time.Duration(wait) * time.Millisecond)
	for {
		var sub *notify.Sub
		if wait > 0 {
			sub = h.b.Subscribe(cmd.ClientID)
		}
		res, err := h.propose(r.Context(), cmd)
		if err != nil {
			closeSub(sub)
			return writeErrorCode(w, err)
		}
		switch {
		case res.Granted:
			closeSub(sub)
			a.granted(res)
			return "granted"
		case res.Code != locktable.OK:
			closeSub(sub)
			return a.refused(res)
		}
		if wait == 0 {
			closeSub(sub)
			return a.tryQueued()
		}
		retry, outcome := h.awaitGrant(w, r, sub, names, cmd.ClientID, deadline, queuedDeadline(res, cmd.ClientID))
		closeSub(sub)
		if !retry {
			return outcome
		}
		cmd.WaitMs = max(time.Until(deadline).Milliseconds(), 1)
	}
}

// writeErrorCode writes err's reply and returns its code.
func writeErrorCode(w http.ResponseWriter, err error) string {
	code, _ := errorCode(err)
	writeError(w, err)
	return code
}

// lockHeldReply is a 409 lock_held reply: unlike api.AcquireReply it
// always carries holder, "" when the lock is free but not for a newcomer
// (SPEC "Tries and queues"), and lock for a multi-acquire.
type lockHeldReply struct {
	Acquired bool       `json:"acquired"`
	Lock     string     `json:"lock,omitempty"`
	Holder   string     `json:"holder"`
	Error    *api.Error `json:"error"`
}

// validMultiAcquire checks a multi-acquire and returns its names in name
// order (the order every grant and every queue append follows).
func validMultiAcquire(req *api.MultiAcquireRequest) ([]string, error) {
	if err := validClientID("client_id", req.ClientID); err != nil {
		return nil, err
	}
	names, err := validLockSet(req.Locks)
	if err != nil {
		return nil, err
	}
	if err := checkRange("ttl_ms", req.TTLms, api.MinTTLms, api.MaxTTLms); err != nil {
		return nil, err
	}
	if err := checkRange("wait_timeout_ms", req.WaitTimeoutMs, 0, api.MaxWaitTimeoutMs); err != nil {
		return nil, err
	}
	if err := validSessionID(req.SessionID); err != nil {
		return nil, err
	}
	return names, nil
}

// validLockSet checks a multi-acquire's names (distinct valid names, 2 to
// 64 of them) and returns them in name order.
func validLockSet(locks []string) ([]string, error) {
	if n := len(locks); n < api.MinMultiLocks || n > api.MaxMultiLocks {
		return nil, invalid("locks names %d locks; a multi-acquire takes %d to %d distinct names", n, api.MinMultiLocks, api.MaxMultiLocks)
	}
	seen := make(map[string]bool, len(locks))
	for i, name := range locks {
		if why := ValidLockName(name); why != "" {
			return nil, invalid("locks[%d]: %s", i, why)
		}
		if seen[name] {
			return nil, invalid("locks names %q twice", name)
		}
		seen[name] = true
	}
	names := slices.Clone(locks)
	slices.Sort(names)
	return names, nil
}

// setValue is POST /api/v1/locks/{name}/value: the holder sets its grant's
// value (SPEC "Values and elections").
func (h *Handler) setValue(w http.ResponseWriter, r *http.Request) {
	var req api.ValueRequest
	name, who, ok := h.holderRequest(w, r, &req, func() (string, uint64) { return req.ClientID, req.FencingToken })
	if !ok {
		return
	}
	if err := validValue(req.Value); err != nil {
		writeError(w, err)
		return
	}
	if h.routeToLeader(w, r) {
		return
	}
	res, err := h.propose(r.Context(), locktable.Command{Op: locktable.OpSetValue, Lock: name,
		ClientID: req.ClientID, Token: req.FencingToken, Value: req.Value, Owner: who.Name})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, resultError(res, name))
		return
	}
	writeJSON(w, 200, api.ValueReply{Updated: true, FencingToken: res.Token})
}

// revoke is DELETE /api/v1/locks/{name}[?fencing_token=N]: an operator ends
// the lock's grants (or the one named), with lock-delay and hand-off as for
// an expiry (SPEC "Revocation").
func (h *Handler) revoke(w http.ResponseWriter, r *http.Request) {
	name, err := lockName(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, ok := h.allow(w, r, auth.Admin, "", false); !ok {
		return
	}
	var token uint64
	if v := r.URL.Query().Get("fencing_token"); v != "" || r.URL.Query().Has("fencing_token") {
		token, err = strconv.ParseUint(v, 10, 64)
		if err != nil || token == 0 {
			writeError(w, invalid("fencing_token must be a positive integer, got %q", v))
			return
		}
	}
	if h.routeToLeader(w, r) {
		return
	}
	res, err := h.propose(r.Context(), locktable.Command{Op: locktable.OpRevoke, Lock: name, Token: token})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Code != locktable.OK {
		writeError(w, &apiError{code: api.CodeNotHolder, msg: "lock " + name + " has no grant with fencing token " + strconv.FormatUint(token, 10)})
		return
	}
	writeJSON(w, 200, api.RevokeReply{Revoked: res.Tokens})
}
