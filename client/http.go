package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/api"
)

// APIConfig configures an API.
type APIConfig struct {
	// Endpoints are base HTTP URLs of cluster members (http:// or https://).
	Endpoints []string
	// TLSConfig is used for https:// endpoints: RootCAs to trust the members
	// (nil: the system roots), Certificates for a client certificate (mTLS).
	// It is cloned. Set it or HTTPClient, not both.
	TLSConfig *tls.Config
	// Token is sent as "Authorization: Bearer <token>" on every request. A
	// refused token gives ErrUnauthenticated (401) or ErrPermissionDenied
	// (403), never retried.
	Token string
	// HTTPClient carries the requests; its CheckRedirect is not used.
	// Default: a client with its own transport (using TLSConfig).
	HTTPClient *http.Client
	// Logger receives retry events. Default: discard.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between retries of a
	// no_leader reply or an unreachable cluster. Defaults 50ms and 2s. An
	// overloaded reply's Retry-After is waited in full.
	MinBackoff, MaxBackoff time.Duration
	// OnRetry, if set, is called before each pause between retries of a
	// call that found no leader (no member answered, no_leader,
	// overloaded, a dropped connection of an acquire), with the error that
	// made it retry: for telling a person what the call waits for. It runs
	// on the calling goroutine; keep it short.
	OnRetry func(err error)
}

// API is a thin client of lockd's plain HTTP API: locks without a session
// (client_id + TTL), lock status, sessions, cluster membership and backups.
// It follows leader redirects (307, re-sending the body), remembers the
// leader, and retries a 503 no_leader or an unreachable member on the other
// endpoints with backoff until ctx is done. 401 and 403 are not retried.
// A redirect is followed only within the cluster: to a configured endpoint
// or to a leader a configured endpoint named (X-Lockd-Leader), and never
// from https to http; others give ErrUntrustedRedirect (see there).
// Safe for concurrent use.
type API struct {
	endpoints []string
	hc        *http.Client
	token     string
	log       *slog.Logger
	min, max  time.Duration

	// configured holds the origins of endpoints; with named (leaders a
	// configured endpoint named), the members redirects may lead to. See
	// leaderHop.
	configured map[string]bool
	onRetry    func(error)
	// reached is set once any member answered (any HTTP status): from then
	// on a round in which every endpoint fails is a cluster restarting or
	// failing over, retried until ctx ends, never "unreachable".
	reached atomic.Bool

	mu     sync.Mutex
	leader string          // last known leader base URL, tried first
	named  map[string]bool // origins
}

// NewAPI returns an API for the given endpoints.
func NewAPI(cfg APIConfig) (*API, error) {
	if err := validateEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	if err := validateTransport(cfg.HTTPClient, cfg.TLSConfig, cfg.Token); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = defaultHTTPClient(cfg.TLSConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = Config{}.withDefaults().Logger
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(2*time.Second, cfg.MinBackoff)
	}
	a := &API{hc: noRedirect(cfg.HTTPClient), token: cfg.Token, log: cfg.Logger, min: cfg.MinBackoff, max: cfg.MaxBackoff,
		configured: make(map[string]bool), named: make(map[string]bool), onRetry: cfg.OnRetry}
	for _, e := range cfg.Endpoints {
		a.endpoints = append(a.endpoints, normalizeEndpoint(e))
		a.configured[origin(e)] = true
	}
	return a, nil
}

// Leader returns the leader's base URL as last seen, or "".
func (a *API) Leader() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leader
}

func (a *API) setLeader(u string) {
	if u == "" {
		return
	}
	a.mu.Lock()
	a.leader = normalizeEndpoint(u)
	a.mu.Unlock()
}

// candidates lists the members to try, the known leader first.
func (a *API) candidates() []string {
	a.mu.Lock()
	l := a.leader
	a.mu.Unlock()
	out := make([]string, 0, len(a.endpoints)+1)
	if l != "" {
		out = append(out, l)
	}
	for _, e := range a.endpoints {
		if e != l {
			out = append(out, e)
		}
	}
	return out
}

// errorBody is any lockd error body: {"error":{...}} plus the optional
// fields some replies carry.
type errorBody struct {
	Error  *api.Error `json:"error"`
	Holder string     `json:"holder"`
	Lock   string     `json:"lock"`
	Leader string     `json:"leader"`
}

// replyError is the error an error reply carries: its JSON error body, or
// fallback under the code its status implies when the body holds none.
func replyError(status int, data []byte, fallback string) *ServerError {
	var eb errorBody
	_ = json.Unmarshal(data, &eb)
	if eb.Error == nil {
		eb.Error = &api.Error{Code: codeForStatus(status), Message: fallback}
	}
	se := serverError(eb.Error, status)
	se.Holder, se.Lock, se.Leader = eb.Holder, eb.Lock, eb.Leader
	return se
}

// maxRedirects bounds leader redirects for one attempt on one member.
const maxRedirects = 5

// maxReplyBytes bounds a JSON reply (and an error body) read into memory.
const maxReplyBytes = 4 << 20

// request is one API call, sent again (to another member, or to the leader
// a follower points to) until it is answered.
type request struct {
	method, path string
	// body returns a fresh reader of the whole body and its length for
	// each send; nil sends none. Readers of earlier sends may still be
	// read by the transport, so each must be independent.
	body        func() (io.Reader, int64, error)
	contentType string
	// expectContinue sends "Expect: 100-continue", so a large body is not
	// sent to a member that redirects or refuses the request.
	expectContinue bool
	// out receives a 2xx JSON reply (and the 409 reply of acquire).
	out any
	// stream, when set, consumes a 2xx reply body instead of out. Its
	// error ends the call: a half-consumed reply cannot be retried.
	stream func(io.Reader) error
	// servedBy, when set, receives the base URL of the member that gave
	// the 2xx reply.
	servedBy *string
	// idempotent: sending the request again has the effect of sending it
	// once (an acquire by client ID), so it is retried after a dropped
	// connection too, not only after one that never reached the member.
	idempotent bool
}

// do sends one request (JSON body in, JSON body out) to the leader. See API.
func (a *API) do(ctx context.Context, method, path string, in, out any) error {
	r := &request{method: method, path: path, out: out}
	if in != nil {
		payload, err := json.Marshal(in)
		if err != nil {
			return err
		}
		r.body = func() (io.Reader, int64, error) { return bytes.NewReader(payload), int64(len(payload)), nil }
		r.contentType = "application/json"
	}
	return a.call(ctx, r)
}

// call sends r to the leader, retrying as API describes.
func (a *API) call(ctx context.Context, r *request) error {
	bo := newBackoff(a.min, a.max)
	var lastErr error // of the last attempt that may be retried, over every round
	for {
		var retryAfter time.Duration
		var round roundErrors
		for _, base := range a.candidates() {
			err, retry := a.try(ctx, r, base+r.path)
			if !retry {
				// A read that ctx ended while the call was still looking
				// for a leader reports that, as if ctx had ended between
				// attempts. A write does not: its last request may have
				// reached a leader, so its outcome is unknown.
				if err != nil && lastErr != nil && ctx.Err() != nil && r.method == http.MethodGet {
					return noLeaderErr(ctx, lastErr)
				}
				return err
			}
			lastErr = err
			round.add(err)
			var se *ServerError
			if errors.As(err, &se) && (se.Status == http.StatusServiceUnavailable || se.Status == http.StatusTooManyRequests) {
				ra := se.retryAfter()
				if se.API.Code == api.CodeNoLeader {
					ra = min(ra, a.max) // a hint to look again soon, not a refusal to wait out
				}
				retryAfter = max(retryAfter, ra)
			}
			if ctx.Err() != nil {
				break
			}
		}
		if err := round.unreachable(); err != nil && !a.reached.Load() && ctx.Err() == nil {
			// Every endpoint refused the connection or the TLS handshake,
			// and none ever answered: nothing will change by waiting.
			return err
		}
		wait := bo.next()
		if retryAfter > wait {
			// The member's own hint, with a little jitter so that the
			// clients it refused do not all come back at once.
			wait = retryAfter + rand.N(retryAfter/5+1)
		}
		a.log.Debug("lockd: retrying", "method", r.method, "path", r.path, "err", lastErr, "wait", wait)
		if ctx.Err() == nil && a.onRetry != nil {
			a.onRetry(lastErr)
		}
		if ctx.Err() != nil || !sleep(ctx, wait) {
			return noLeaderErr(ctx, lastErr)
		}
	}
}

// noLeaderErr is the error of a call whose ctx ended while it was looking
// for a leader: it matches ErrNoLeader (or ErrOverloaded or
// ErrResourceExhausted, when the last member refused the work for now) and
// ctx's error.
func noLeaderErr(ctx context.Context, lastErr error) error {
	if errors.Is(lastErr, ErrNoLeader) {
		return lastErr
	}
	if errors.Is(lastErr, ErrOverloaded) || errors.Is(lastErr, ErrResourceExhausted) {
		return fmt.Errorf("%w: %w", lastErr, ctx.Err())
	}
	return fmt.Errorf("%w: %w (last error: %v)", ErrNoLeader, ctx.Err(), lastErr)
}

// newRequest builds one send of r to u.
func (a *API) newRequest(ctx context.Context, r *request, u string) (*http.Request, error) {
	var body io.Reader
	var size int64
	if r.body != nil {
		var err error
		if body, size, err = r.body(); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	if r.body != nil {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
		// Lets the transport replay the body on a fresh connection.
		req.GetBody = func() (io.ReadCloser, error) {
			b, _, err := r.body()
			if err != nil {
				return nil, err
			}
			return io.NopCloser(b), nil
		}
		if r.contentType != "" {
			req.Header.Set("Content-Type", r.contentType)
		}
		if r.expectContinue && size > 0 {
			req.Header.Set("Expect", "100-continue")
		}
	}
	if r.stream == nil {
		req.Header.Set("Accept", "application/json")
	}
	setAuth(req.Header, a.token)
	return req, nil
}

// try sends the request to one member, following leader redirects. retry
// reports that another member (or a later attempt) may succeed: the member
// was unreachable before the request reached it, or no leader is known.
func (a *API) try(ctx context.Context, r *request, u string) (err error, retry bool) {
	method := r.method
	for hop := 0; ; hop++ {
		req, err := a.newRequest(ctx, r, u)
		if err != nil {
			return err, false
		}
		resp, err := a.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return err, false
			}
			// A dial error means the request never reached the member, so any
			// request may go elsewhere; a read, or an idempotent write, may
			// be retried anyway.
			var op *net.OpError
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return fmt.Errorf("%s %s: %w", method, u, err), (errors.As(err, &op) && op.Op == "dial") || method == http.MethodGet || r.idempotent || permanent(err)
		}
		a.reached.Store(true)
		if resp.StatusCode >= 200 && resp.StatusCode < 300 && r.stream != nil {
			a.setLeader(req.URL.Scheme + "://" + req.URL.Host)
			err := r.stream(resp.Body)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("%s %s: reading reply: %w", method, u, err), false
			}
			return nil, false
		}
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
		resp.Body.Close()
		if rerr != nil {
			return fmt.Errorf("%s %s: reading reply: %w", method, u, rerr), method == http.MethodGet || r.idempotent
		}
		switch {
		case resp.StatusCode == http.StatusTemporaryRedirect || resp.StatusCode == http.StatusPermanentRedirect:
			next, leader, herr := a.redirectTarget(req.URL, resp.Header)
			if herr != nil {
				if isFatalHop(herr) {
					a.log.Warn("lockd: redirect refused", "err", herr)
					return fmt.Errorf("%s %s: %w", method, u, herr), false
				}
				return fmt.Errorf("%s %s: %w", method, u, herr), true
			}
			a.setLeader(leader)
			if hop >= maxRedirects {
				return fmt.Errorf("%s %s: too many redirects", method, u), true
			}
			u = next
			continue
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			if r.servedBy != nil {
				*r.servedBy = req.URL.Scheme + "://" + req.URL.Host
			} else {
				a.setLeader(req.URL.Scheme + "://" + req.URL.Host)
			}
			if r.out != nil && len(bytes.TrimSpace(data)) > 0 {
				if err := json.Unmarshal(data, r.out); err != nil {
					return fmt.Errorf("%s %s: decoding reply: %w", method, u, err), false
				}
			}
			return nil, false
		case httpsRequired(resp.StatusCode, data):
			return fmt.Errorf("%s %s: %w", method, u, ErrHTTPSRequired), false
		default:
			se := replyError(resp.StatusCode, data, fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, bytes.TrimSpace(data)))
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				se.retryAfterHdr = ra
			}
			// The 409 of acquire carries the reply body too.
			if r.out != nil && resp.StatusCode == http.StatusConflict {
				_ = json.Unmarshal(data, r.out)
			}
			// overloaded: the member proposed nothing, so any request may
			// be sent again.
			return se, se.API.Code == api.CodeNoLeader || se.API.Code == api.CodeOverloaded ||
				(se.API.Code == api.CodeResourceExhausted && se.retryAfterHdr != "") // a budget's, not a quota's
		}
	}
}

func codeForStatus(status int) string {
	switch status {
	case 400:
		return api.CodeInvalidArgument
	case 401:
		return api.CodeUnauthenticated
	case 403:
		return api.CodePermissionDenied
	case 404:
		return api.CodeNotFound
	case 413:
		return api.CodePayloadTooLarge
	case 429:
		return api.CodeResourceExhausted
	case 503:
		return api.CodeNoLeader
	}
	return api.CodeInternal
}

func (e *ServerError) retryAfter() time.Duration {
	if s, err := strconv.Atoi(e.retryAfterHdr); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 0
}

func lockPath(name, op string) string {
	p := "/api/v1/locks/" + url.PathEscape(name)
	if op != "" {
		p += "/" + op
	}
	return p
}

func ms(d time.Duration) *int64 {
	v := d.Milliseconds()
	if d > 0 && v == 0 {
		v = 1
	}
	return &v
}

// Acquire tries to take a lock without a session (POST .../acquire). A zero
// ttl and wait leave the server defaults (30s TTL, no wait). On 409 the
// error matches ErrLockHeld or ErrWaitTimeout and, where the server names
// one, ServerError.Holder is the holder. ctx must outlast wait. See
// AcquireRequest for retries and for what happens when ctx ends first.
func (a *API) Acquire(ctx context.Context, name, clientID string, ttl, wait time.Duration) (*api.AcquireReply, error) {
	req := api.AcquireRequest{ClientID: clientID}
	if ttl > 0 {
		req.TTLms = ms(ttl)
	}
	if wait > 0 {
		req.WaitTimeoutMs = ms(wait)
	}
	return a.AcquireRequest(ctx, name, req)
}

// WithdrawTimeout bounds the cancel an acquire sends when its ctx ends
// while it waits (see AcquireRequest).
const WithdrawTimeout = 2 * time.Second

// AcquireRequest sends an acquire request as given.
//
// An acquire is idempotent per client ID (a retry keeps the wait's place in
// the queue, or gets the grant back), so it rides through a failover: a
// dropped connection, no_leader or overloaded is retried, on the member
// that leads then, with what is left of the wait (req.WaitTimeoutMs counts
// from the first send), until the server answers or ctx ends.
//
// When ctx ends while the acquire may be waiting in the queue, it sends a
// cancel (POST .../cancel, bounded by WithdrawTimeout) so that the lock is
// not granted later to nobody. The error then matches ctx's error, and
// also ErrUnknownOutcome when the cancel found no wait to withdraw (the
// lock may have been granted as the call gave up: release it if the lock's
// status shows this client holding it) or could not be sent (the wait
// stays queued until its wait timeout).
func (a *API) AcquireRequest(ctx context.Context, name string, req api.AcquireRequest) (*api.AcquireReply, error) {
	var rep api.AcquireReply
	err := a.callAcquire(ctx, lockPath(name, "acquire"), req.WaitTimeoutMs, func(wait *int64) any {
		r := req
		r.WaitTimeoutMs = wait
		return r
	}, &rep)
	var se *ServerError
	if errors.As(err, &se) && se.Holder == "" {
		se.Holder = rep.Holder
	}
	if se != nil && se.Lock == "" {
		se.Lock = rep.Lock
	}
	if err != nil {
		if waiting(ctx, req.WaitTimeoutMs, err) {
			return nil, a.withdraw(ctx, fmt.Sprintf("lock %q", name), err, func(wctx context.Context) (bool, error) {
				return a.Cancel(wctx, name, req.ClientID)
			})
		}
		return nil, err
	}
	return &rep, nil
}

// AcquireMany takes every lock of req.Locks in one step, or none (POST
// /api/v1/acquire; 2–64 distinct names of limit-1 locks). The reply's
// Grants are in name order. A refused try matches ErrLockHeld and its
// *ServerError names the first blocking lock (Lock) and its holder
// (Holder); a semaphore among the names gives ErrLimitMismatch. ctx must
// outlast the wait. Retries and a ctx that ends first: as AcquireRequest
// (the cancel is POST /api/v1/cancel).
func (a *API) AcquireMany(ctx context.Context, req api.MultiAcquireRequest) (*api.AcquireReply, error) {
	var rep api.AcquireReply
	err := a.callAcquire(ctx, "/api/v1/acquire", req.WaitTimeoutMs, func(wait *int64) any {
		r := req
		r.WaitTimeoutMs = wait
		return r
	}, &rep)
	var se *ServerError
	if errors.As(err, &se) {
		if se.Holder == "" {
			se.Holder = rep.Holder
		}
		if se.Lock == "" {
			se.Lock = rep.Lock
		}
	}
	if err != nil {
		if waiting(ctx, req.WaitTimeoutMs, err) {
			return nil, a.withdraw(ctx, describe(req.Locks), err, func(wctx context.Context) (bool, error) {
				return a.CancelMany(wctx, req.ClientID, req.Locks)
			})
		}
		return nil, err
	}
	return &rep, nil
}

// callAcquire sends an acquire built by body with what is left of wait at
// each send (nil: no wait), retrying it as an idempotent request.
func (a *API) callAcquire(ctx context.Context, path string, wait *int64, body func(wait *int64) any, out any) error {
	var deadline time.Time
	if wait != nil {
		deadline = time.Now().Add(time.Duration(*wait) * time.Millisecond)
	}
	return a.call(ctx, &request{method: http.MethodPost, path: path, contentType: "application/json", idempotent: true, out: out,
		body: func() (io.Reader, int64, error) {
			w := wait
			if wait != nil && *wait > 0 {
				// What is left, in whole milliseconds rounded up: a wait
				// that has not run out is never sent as a try.
				left := int64(0)
				if d := time.Until(deadline); d > 0 {
					left = int64((d + time.Millisecond - 1) / time.Millisecond)
				}
				w = &left
			}
			payload, err := json.Marshal(body(w))
			if err != nil {
				return nil, 0, err
			}
			return bytes.NewReader(payload), int64(len(payload)), nil
		}})
}

// waiting reports an acquire whose ctx ended while it may have been
// queued: one with a wait that got no answer.
func waiting(ctx context.Context, wait *int64, err error) bool {
	if ctx.Err() == nil || wait == nil || *wait <= 0 || errors.Is(err, ErrUnreachable) {
		return false
	}
	var se *ServerError
	return !errors.As(err, &se) || se.Status == http.StatusServiceUnavailable
}

// withdraw cancels the wait of an acquire whose ctx ended (err), bounded
// by WithdrawTimeout, and words what became of it.
func (a *API) withdraw(ctx context.Context, what string, err error, cancel func(context.Context) (bool, error)) error {
	wctx, stop := context.WithTimeout(context.WithoutCancel(ctx), WithdrawTimeout)
	defer stop()
	withdrawn, cerr := cancel(wctx)
	switch {
	case cerr != nil:
		return fmt.Errorf("lockd: %s: gave up waiting, and withdrawing the wait failed (%v): it stays queued until its wait timeout: %w: %w", what, cerr, ErrUnknownOutcome, err)
	case !withdrawn:
		return fmt.Errorf("lockd: %s: gave up waiting; no wait was left to withdraw, so it may have been granted: %w: %w", what, ErrUnknownOutcome, err)
	}
	return fmt.Errorf("lockd: %s: gave up waiting; the wait was withdrawn: %w", what, err)
}

// Cancel withdraws clientID's queued wait on lock name (POST
// /api/v1/locks/{name}/cancel): the waiting acquire is answered
// ErrCancelled. It reports whether a wait was withdrawn; false when none
// was queued — a grant that already happened is not undone (release it).
// A multi-acquire's wait is withdrawn with CancelMany.
func (a *API) Cancel(ctx context.Context, name, clientID string) (bool, error) {
	var rep api.CancelReply
	if err := a.do(ctx, http.MethodPost, lockPath(name, "cancel"), api.CancelRequest{ClientID: clientID}, &rep); err != nil {
		return false, err
	}
	return rep.Cancelled, nil
}

// CancelMany withdraws clientID's queued multi-acquire of exactly names
// (POST /api/v1/cancel, in any order), as Cancel does a single wait.
func (a *API) CancelMany(ctx context.Context, clientID string, names []string) (bool, error) {
	var rep api.CancelReply
	if err := a.do(ctx, http.MethodPost, "/api/v1/cancel", api.CancelManyRequest{ClientID: clientID, Locks: names}, &rep); err != nil {
		return false, err
	}
	return rep.Cancelled, nil
}

// Revoke ends the grants of lock name (DELETE /api/v1/locks/{name}; admin
// access when the cluster runs with tokens): every grant, or with token >
// 0 only that one. The holders are pushed "lost" with reason revoked
// (their Lost closes with ErrRevoked), lock-delays apply, and waiters are
// granted. It returns the tokens revoked (none for a lock without
// holders); a token that names no current grant gives ErrNotHolder.
func (a *API) Revoke(ctx context.Context, name string, token uint64) ([]uint64, error) {
	p := lockPath(name, "")
	if token > 0 {
		p += "?fencing_token=" + strconv.FormatUint(token, 10)
	}
	var rep api.RevokeReply
	if err := a.do(ctx, http.MethodDelete, p, nil, &rep); err != nil {
		return nil, err
	}
	if rep.Revoked == nil {
		rep.Revoked = []uint64{}
	}
	return rep.Revoked, nil
}

// SetValue sets the value of a grant held by clientID with token (POST
// /api/v1/locks/{name}/value); a client that does not hold it gets
// ErrNotHolder.
func (a *API) SetValue(ctx context.Context, name, clientID string, token uint64, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	return a.do(ctx, http.MethodPost, lockPath(name, "value"), api.ValueRequest{ClientID: clientID, FencingToken: token, Value: value}, &api.ValueReply{})
}

// Release releases a lock held by clientID with token.
func (a *API) Release(ctx context.Context, name, clientID string, token uint64) error {
	return a.do(ctx, http.MethodPost, lockPath(name, "release"), api.ReleaseRequest{ClientID: clientID, FencingToken: token}, &api.ReleaseReply{})
}

// Renew extends a lock's TTL (0: the server's default for the lock).
func (a *API) Renew(ctx context.Context, name, clientID string, token uint64, ttl time.Duration) (*api.RenewReply, error) {
	req := api.RenewRequest{ClientID: clientID, FencingToken: token}
	if ttl > 0 {
		req.TTLms = ms(ttl)
	}
	var rep api.RenewReply
	if err := a.do(ctx, http.MethodPost, lockPath(name, "renew"), req, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// Status reads one lock: a linearizable read on the leader, or with stale
// from the first member that answers, from its own state (see
// StaleStatus, which also tells which member that was).
func (a *API) Status(ctx context.Context, name string, stale bool) (*api.LockStatus, error) {
	if stale {
		st, _, err := a.StaleStatus(ctx, name)
		return st, err
	}
	var rep api.LockStatus
	if err := a.do(ctx, http.MethodGet, lockPath(name, ""), nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// Holders reads one page of lock name's holders in token order
// (GET /api/v1/locks/{name}/holders): those with a token above after (""
// for the first page), at most limit (0: the server's default, 1000; at
// most 10 000). A status lists only the 64 lowest tokens of a bigger
// semaphore; the page's Next is the after of the next page, "" on the last.
func (a *API) Holders(ctx context.Context, name, after string, limit int) (*api.HoldersPage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := lockPath(name, "holders")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var rep api.HoldersPage
	if err := a.do(ctx, http.MethodGet, path, nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// StaleStatus reads lock name from the first member that answers, from
// its own state (GET /api/v1/locks/{name}?stale=true): no leader is
// needed, and the answer may lag the leader's by what that member has not
// applied yet (the reply's Stale is then true). member is the base URL of
// the member that answered; MemberStatus tells which one it is.
func (a *API) StaleStatus(ctx context.Context, name string) (st *api.LockStatus, member string, err error) {
	var rep api.LockStatus
	if err := a.call(ctx, &request{method: http.MethodGet, path: lockPath(name, "") + "?stale=true", out: &rep, servedBy: &member}); err != nil {
		return nil, "", err
	}
	return &rep, member, nil
}

// MemberStatus reads one member's own view of the cluster (GET
// /api/v1/status on exactly that member, which needs no token: none is
// sent): its id, Raft state, term, commit and applied index, last token,
// log store and version. member is its base URL (http://host:port or
// https://...; the http_addr of a Member in Cluster's reply); it may be any
// member, not only a configured endpoint. It is tried once: no leader
// routing, no retries. An unreachable member gives the dial error.
func (a *API) MemberStatus(ctx context.Context, member string) (*api.NodeStatus, error) {
	u, err := url.Parse(member)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("lockd: member %q is not an http(s) URL", member)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, normalizeEndpoint(member)+"/api/v1/status", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading reply: %w", req.URL, err)
	}
	switch {
	case httpsRequired(resp.StatusCode, data):
		return nil, fmt.Errorf("GET %s: %w", req.URL, ErrHTTPSRequired)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("GET %s: %w", req.URL, replyError(resp.StatusCode, data, fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, bytes.TrimSpace(data))))
	}
	var st api.NodeStatus
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("GET %s: decoding reply: %w", req.URL, err)
	}
	return &st, nil
}

// WaitStatus is a blocking query of lock name (GET
// /api/v1/locks/{name}?index=N&wait=D): it returns the lock's status once
// a change with an index above index has committed, or when wait ends
// (then with the same index), whichever is first; wait 0 is the server's
// default, 5m, and at most 10m. It may also answer early with an
// unchanged index (after a leader change): compare Index and ask again.
// Pass the Index of the last status read (an index below the lock's
// answers at once).
func (a *API) WaitStatus(ctx context.Context, name string, index uint64, wait time.Duration) (*api.LockStatus, error) {
	if wait < 0 || wait > api.MaxWait {
		return nil, fmt.Errorf("lockd: wait %v out of range 0–%v", wait, api.MaxWait)
	}
	p := fmt.Sprintf("%s?index=%d", lockPath(name, ""), index)
	if wait > 0 {
		p += "&wait=" + wait.String()
	}
	var rep api.LockStatus
	if err := a.do(ctx, http.MethodGet, p, nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// List reads every lock whose name starts with prefix, in name order,
// page after page (see ListPage) until the last. Each page is a
// linearizable read of its own, so a list of several pages is not one
// snapshot: a lock that changes meanwhile shows its state when its page was
// read, and one created or dropped meanwhile may be missing or present.
func (a *API) List(ctx context.Context, prefix string) ([]api.LockStatus, error) {
	var out []api.LockStatus
	after := ""
	for {
		page, err := a.ListPage(ctx, prefix, after, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Locks...)
		if page.Next == "" {
			return out, nil
		}
		after = page.Next
	}
}

// ListPage reads one page of the locks whose name starts with prefix, in
// name order: those after the name after ("" for the first page), at most
// limit of them (0: the server's default, 1000; lockd takes 1–10 000). The
// reply's Next is the after of the next page, "" on the last one.
func (a *API) ListPage(ctx context.Context, prefix, after string, limit int) (*api.LockList, error) {
	if limit < 0 {
		return nil, fmt.Errorf("lockd: list limit %d is negative", limit)
	}
	q := url.Values{}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	p := "/api/v1/locks"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var rep api.LockList
	if err := a.do(ctx, http.MethodGet, p, nil, &rep); err != nil {
		return nil, err
	}
	// A next that does not move forward would have List ask for the same
	// page for ever.
	if rep.Next != "" && rep.Next <= after {
		return nil, fmt.Errorf("lockd: list after %q: the server's next page starts at %q, which is not after it", after, rep.Next)
	}
	return &rep, nil
}

// CreateSession opens an HTTP session (0 ttl: the server default).
func (a *API) CreateSession(ctx context.Context, clientID string, ttl time.Duration) (*api.SessionReply, error) {
	req := api.SessionRequest{ClientID: clientID}
	if ttl > 0 {
		req.TTLms = ms(ttl)
	}
	var rep api.SessionReply
	if err := a.do(ctx, http.MethodPost, "/api/v1/sessions", req, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// KeepAlive refreshes a session; an ended one gives ErrSessionExpired.
func (a *API) KeepAlive(ctx context.Context, sessionID string) (*api.SessionReply, error) {
	var rep api.SessionReply
	if err := a.do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(sessionID)+"/keepalive", nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// DeleteSession ends a session, releasing its locks and dropping its waits.
func (a *API) DeleteSession(ctx context.Context, sessionID string) error {
	return a.do(ctx, http.MethodDelete, "/api/v1/sessions/"+url.PathEscape(sessionID), nil, nil)
}

// Cluster reads the membership and the leader (any member answers).
func (a *API) Cluster(ctx context.Context) (*api.ClusterStatus, error) {
	var rep api.ClusterStatus
	if err := a.do(ctx, http.MethodGet, "/api/v1/cluster", nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// AddMember adds a voter.
func (a *API) AddMember(ctx context.Context, m api.AddMemberRequest) error {
	return a.do(ctx, http.MethodPost, "/api/v1/cluster/members", m, nil)
}

// RemoveMember removes a member.
func (a *API) RemoveMember(ctx context.Context, id string) error {
	return a.do(ctx, http.MethodDelete, "/api/v1/cluster/members/"+url.PathEscape(id), nil, nil)
}

// TransferLeadership asks the leader to hand over, to member to ("" lets
// the cluster pick).
func (a *API) TransferLeadership(ctx context.Context, to string) error {
	return a.do(ctx, http.MethodPost, "/api/v1/cluster/transfer-leadership", api.TransferRequest{To: to}, nil)
}

// SnapshotSave writes a backup of the cluster's state to w (GET
// /api/v1/snapshot, a linearizable read on the leader; needs an admin
// token when auth is on) and returns the number of bytes written. The
// backup is streamed, not held in memory. On an error after the transfer
// began, w holds part of a backup and the call is not retried: write to a
// temporary file and rename it once SnapshotSave returns nil.
func (a *API) SnapshotSave(ctx context.Context, w io.Writer) (int64, error) {
	var n int64
	err := a.call(ctx, &request{method: http.MethodGet, path: "/api/v1/snapshot", stream: func(body io.Reader) error {
		var err error
		n, err = io.Copy(w, body)
		return err
	}})
	return n, err
}

// RestoreOption tunes SnapshotRestore.
type RestoreOption func(*restoreOptions)

type restoreOptions struct {
	minToken uint64
}

// WithMinToken raises the restored token counter to at least n, so that
// every token issued after the restore is above n. Use it when the backup
// is older than the last token the old cluster issued (restoring it into a
// fresh cluster would otherwise issue tokens that resource servers have
// already seen, and refuse as stale): pass at least the highest token in
// use, e.g. the highest a fencing resource server has accepted. 0 (the
// default) leaves the counter as the restore makes it.
func WithMinToken(n uint64) RestoreOption {
	return func(o *restoreOptions) { o.minToken = n }
}

// SnapshotRestore replaces the cluster's state with the backup read from r
// (POST /api/v1/snapshot/restore; needs an admin token when auth is on).
// Without force only a fresh cluster (no lock, session or token issued yet)
// takes it; otherwise the error is a 400 invalid_argument ServerError.
// Either way the token counter never goes down; WithMinToken raises it.
//
// The body must be sent again when a follower redirects to the leader or a
// member is unreachable. When r is an io.ReaderAt and an io.Seeker (an
// *os.File, *bytes.Reader, *strings.Reader), the backup is read from r's
// current offset to its end with ReadAt for each send, never held in memory
// as a whole, and r's offset is left where it was; r must stay open until
// SnapshotRestore returns. Any other reader is read into memory first. The
// body is sent with "Expect: 100-continue", so a member that redirects or
// refuses the request does not receive it.
func (a *API) SnapshotRestore(ctx context.Context, r io.Reader, force bool, opts ...RestoreOption) error {
	var o restoreOptions
	for _, opt := range opts {
		opt(&o)
	}
	body, err := replayable(r)
	if err != nil {
		return fmt.Errorf("lockd: reading the backup: %w", err)
	}
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	if o.minToken > 0 {
		q.Set("min_token", strconv.FormatUint(o.minToken, 10))
	}
	p := "/api/v1/snapshot/restore"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var rep struct {
		Restored bool `json:"restored"`
	}
	return a.call(ctx, &request{method: http.MethodPost, path: p, body: body,
		contentType: "application/octet-stream", expectContinue: true, out: &rep})
}

// replayable turns r into a body that can be sent more than once (see
// SnapshotRestore).
func replayable(r io.Reader) (func() (io.Reader, int64, error), error) {
	ra, isAt := r.(io.ReaderAt)
	sk, isSeeker := r.(io.Seeker)
	if isAt && isSeeker {
		start, err := sk.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		end, err := sk.Seek(0, io.SeekEnd)
		if err != nil {
			return nil, err
		}
		if _, err := sk.Seek(start, io.SeekStart); err != nil {
			return nil, err
		}
		size := max(end-start, 0)
		return func() (io.Reader, int64, error) { return io.NewSectionReader(ra, start, size), size, nil }, nil
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return func() (io.Reader, int64, error) { return bytes.NewReader(data), int64(len(data)), nil }, nil
}

// closeIdle drops idle connections of the underlying transport.
func (a *API) closeIdle() { a.hc.CloseIdleConnections() }
