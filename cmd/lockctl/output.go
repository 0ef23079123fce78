package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// exitCode maps an error to lockctl's exit code.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return exitAuth
	case errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrWaitTimeout):
		return exitNotAcquired
	case errors.Is(err, client.ErrNotHolder), errors.Is(err, client.ErrSessionExpired):
		return exitNotHolder
	case errors.Is(err, client.ErrCancelled):
		return exitNotAcquired
	case errors.Is(err, client.ErrNoLeader), errors.Is(err, client.ErrHTTPSRequired), errors.Is(err, client.ErrOverloaded),
		errors.Is(err, context.DeadlineExceeded):
		// Also a request that had no answer within --timeout.
		return exitNoLeader
	}
	var se *client.ServerError
	if errors.As(err, &se) && se.API.Code == "not_found" {
		return exitNotHolder
	}
	return exitError
}

// fail prints a short message naming the cause and returns the exit code.
func (e *env) fail(err error, what string) int {
	fmt.Fprintf(e.stderr, "lockctl: %s\n", safe(e.describe(err, what)))
	return exitCode(err)
}

// note prints a line of prose on stderr (lockctl: ...), its echoed names
// and messages escaped (SPEC 21; see safe).
func (e *env) note(format string, args ...any) {
	fmt.Fprintf(e.stderr, "lockctl: %s\n", safe(fmt.Sprintf(format, args...)))
}

// describe words an error for a person: the cause first, details after.
// Its text echoes what the server said (names, holders, messages): fail
// escapes it (safe) before it reaches the terminal.
func (e *env) describe(err error, what string) string {
	var se *client.ServerError
	errors.As(err, &se)
	msg := ""
	if se != nil && se.API.Message != "" {
		msg = ": " + se.API.Message
	}
	switch {
	case errors.Is(err, client.ErrUnauthenticated):
		if e.g.token == "" {
			return fmt.Sprintf("%s: unauthenticated: the cluster requires a token; set LOCKD_TOKEN or pass --auth-token%s", what, msg)
		}
		return fmt.Sprintf("%s: unauthenticated: the cluster does not know this token (mistyped, or rotated out?)%s", what, msg)
	case errors.Is(err, client.ErrPermissionDenied):
		return fmt.Sprintf("%s: permission denied%s", what, msg)
	case errors.Is(err, client.ErrHTTPSRequired):
		where := strings.TrimSuffix(err.Error(), ": "+client.ErrHTTPSRequired.Error())
		return fmt.Sprintf("%s: this member speaks HTTPS: use https:// endpoints, and --cacert with the members' CA (%s)", what, where)
	case errors.Is(err, client.ErrUnreachable):
		detail := strings.TrimPrefix(err.Error(), client.ErrUnreachable.Error()+": ")
		return fmt.Sprintf("%s: cannot reach the cluster: every endpoint (%s) refused: %s%s", what, e.g.endpoints, detail, connHint(detail))
	case errors.Is(err, client.ErrOverloaded):
		return fmt.Sprintf("%s: the cluster is overloaded: it refused the request until --timeout (%v) ran out; try again later%s", what, e.g.timeout, msg)
	case errors.Is(err, client.ErrCancelled):
		return fmt.Sprintf("%s: the wait was withdrawn by a cancel of client %s (another lockctl with the same --client-id that gave up?)", what, e.clientID())
	case errors.Is(err, client.ErrNoLeader):
		detail := strings.TrimPrefix(err.Error(), client.ErrNoLeader.Error()+": ")
		if se != nil && se.API.Message != "" {
			detail = se.API.Message
		}
		return fmt.Sprintf("%s: no leader (tried %s for %v): %s%s", what, e.g.endpoints, e.g.timeout, detail, connHint(detail))
	case errors.Is(err, client.ErrLockHeld):
		if l := blockingLock(se, what); l != "" {
			return fmt.Sprintf("%s: lock %s held by %s (nothing was taken)", what, l, holderOf(se))
		}
		return fmt.Sprintf("%s: held by %s", what, holderOf(se))
	case errors.Is(err, client.ErrWaitTimeout):
		if l := blockingLock(se, what); l != "" {
			return fmt.Sprintf("%s: timed out waiting (lock %s held by %s)", what, l, holderOf(se))
		}
		return fmt.Sprintf("%s: timed out waiting (held by %s)", what, holderOf(se))
	case errors.Is(err, client.ErrLimitMismatch):
		return fmt.Sprintf("%s: limit mismatch: the lock is in use with another limit or kind (--limit, --shared)%s", what, msg)
	case errors.Is(err, client.ErrResourceExhausted):
		return fmt.Sprintf("%s: resource exhausted: a quota of the cluster is used up%s", what, msg)
	case errors.Is(err, client.ErrNotHolder):
		return fmt.Sprintf("%s: not the holder: client %s does not hold it with that token", what, e.clientID())
	case errors.Is(err, context.Canceled):
		return fmt.Sprintf("%s: interrupted (%v)", what, err)
	case errors.Is(err, client.ErrSessionExpired):
		return fmt.Sprintf("%s: session expired or unknown%s", what, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("%s: no answer from the leader in time (--timeout %v): %v", what, e.g.timeout, err)
	case se != nil:
		return fmt.Sprintf("%s: %s%s", what, se.API.Code, msg)
	}
	return fmt.Sprintf("%s: %v", what, err)
}

// connHint says what a connection failure's text points to.
func connHint(detail string) string {
	switch {
	case strings.Contains(detail, "x509:") || strings.Contains(detail, "tls:"):
		return " (a TLS failure: check --cacert, --cert and --key)"
	case strings.Contains(detail, "server gave HTTP response to HTTPS client") || strings.Contains(detail, "malformed HTTP response"):
		return " (an http/https mismatch: check the endpoints' scheme)"
	case strings.Contains(detail, "connection refused"):
		return " (is lockd running there? check --endpoints or LOCKD_ENDPOINTS)"
	}
	return ""
}

// waitingNote returns what lockctl prints on stderr while a call retries
// for want of a leader: one line when it starts waiting, and one whenever
// what it waits for changes (no leader, an overloaded cluster, no member
// answering), so that a person knows it is not stuck.
func (e *env) waitingNote(what string) func(error) {
	last := ""
	return func(err error) {
		cause := waitCause(err)
		if cause == last {
			return
		}
		last = cause
		until := ""
		if !e.deadline.IsZero() {
			until = " until " + e.deadline.Format("15:04:05")
		}
		e.note("%s: %s (%v); retrying%s", what, cause, err, until)
	}
}

// waitCause words why a call retries.
func waitCause(err error) string {
	var se *client.ServerError
	switch {
	case errors.Is(err, client.ErrOverloaded):
		return "the cluster is overloaded"
	case errors.As(err, &se):
		return "no leader (an election may be under way)"
	case strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset"):
		return "the connection to the member was lost (a failover?)"
	}
	return "no member answers"
}

// blockingLock is the lock a refused multi-lock names, "" when what
// names it already (or none is named).
func blockingLock(se *client.ServerError, what string) string {
	if se == nil || se.Lock == "" || what == "lock "+se.Lock {
		return ""
	}
	return se.Lock
}

func holderOf(se *client.ServerError) string {
	if se != nil && se.Holder != "" {
		return se.Holder
	}
	return "another client"
}

func (e *env) jsonOut() bool { return e.g.output == "json" }

func (e *env) checkOutput() error {
	switch e.g.output {
	case "", "text", "json":
		return nil
	}
	return fmt.Errorf("-o %q: want text or json", e.g.output)
}

// print writes v as JSON, or text as given (its stored strings escaped by
// the caller; safeText is the last guard).
func (e *env) print(v any, text string) {
	if e.jsonOut() {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
		return
	}
	fmt.Fprintln(e.stdout, safeText(strings.TrimRight(text, "\n")))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) ctx(parent context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, e.g.timeout+extra)
	e.deadline, _ = ctx.Deadline()
	return ctx, cancel
}

func apiError(code, msg string) api.Error { return api.Error{Code: code, Message: msg} }
