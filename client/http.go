package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/lockd/lockd/api"
)

// APIConfig configures an API.
type APIConfig struct {
	// Endpoints are base HTTP URLs of cluster members.
	Endpoints []string
	// HTTPClient carries the requests; its CheckRedirect is not used.
	// Default: a client with its own transport.
	HTTPClient *http.Client
	// Logger receives retry events. Default: discard.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between retries of a
	// no_leader reply or an unreachable cluster. Defaults 50ms and 2s.
	MinBackoff, MaxBackoff time.Duration
}

// API is a thin client of lockd's plain HTTP API: locks without a session
// (client_id + TTL), lock status, sessions and cluster membership. It
// follows leader redirects (307, re-sending the body), remembers the leader,
// and retries a 503 no_leader or an unreachable member on the other
// endpoints with backoff until ctx is done. Safe for concurrent use.
type API struct {
	endpoints []string
	hc        *http.Client
	log       *slog.Logger
	min, max  time.Duration

	mu     sync.Mutex
	leader string // last known leader base URL, tried first
}

// NewAPI returns an API for the given endpoints.
func NewAPI(cfg APIConfig) (*API, error) {
	if err := validateEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = defaultHTTPClient()
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
	a := &API{hc: noRedirect(cfg.HTTPClient), log: cfg.Logger, min: cfg.MinBackoff, max: cfg.MaxBackoff}
	for _, e := range cfg.Endpoints {
		a.endpoints = append(a.endpoints, normalizeEndpoint(e))
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
	Leader string     `json:"leader"`
}

// maxRedirects bounds leader redirects for one attempt on one member.
const maxRedirects = 5

// do sends one request (JSON body in, JSON body out) to the leader. See API.
func (a *API) do(ctx context.Context, method, path string, in, out any) error {
	var payload []byte
	if in != nil {
		var err error
		if payload, err = json.Marshal(in); err != nil {
			return err
		}
	}
	bo := newBackoff(a.min, a.max)
	for {
		var lastErr error
		var retryAfter time.Duration
		for _, base := range a.candidates() {
			err, retry := a.try(ctx, method, base+path, payload, out)
			if !retry {
				return err
			}
			lastErr = err
			var se *ServerError
			if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable {
				retryAfter = max(retryAfter, se.retryAfter())
			}
			if ctx.Err() != nil {
				break
			}
		}
		wait := bo.next()
		if retryAfter > wait {
			wait = min(retryAfter, a.max)
		}
		a.log.Debug("lockd: retrying", "method", method, "path", path, "err", lastErr, "wait", wait)
		if ctx.Err() != nil || !sleep(ctx, wait) {
			if errors.Is(lastErr, ErrNoLeader) {
				return lastErr
			}
			return fmt.Errorf("%w: %w (last error: %v)", ErrNoLeader, ctx.Err(), lastErr)
		}
	}
}

// try sends the request to one member, following leader redirects. retry
// reports that another member (or a later attempt) may succeed: the member
// was unreachable before the request reached it, or no leader is known.
func (a *API) try(ctx context.Context, method, u string, body []byte, out any) (err error, retry bool) {
	for hop := 0; ; hop++ {
		req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
		if err != nil {
			return err, false
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Accept", "application/json")
		resp, err := a.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return err, false
			}
			// A dial error means the request never reached the member, so any
			// request may go elsewhere; a read may be retried anyway.
			var op *net.OpError
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return fmt.Errorf("%s %s: %w", method, u, err), (errors.As(err, &op) && op.Op == "dial") || method == http.MethodGet
		}
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		resp.Body.Close()
		if rerr != nil {
			return fmt.Errorf("%s %s: reading reply: %w", method, u, rerr), method == http.MethodGet
		}
		switch {
		case resp.StatusCode == http.StatusTemporaryRedirect || resp.StatusCode == http.StatusPermanentRedirect:
			loc, lerr := resp.Location()
			leader := resp.Header.Get(api.HeaderLeader)
			if lerr != nil {
				if leader == "" {
					return fmt.Errorf("%s %s: redirect without Location", method, u), true
				}
				loc, lerr = url.Parse(leader + req.URL.RequestURI())
				if lerr != nil {
					return fmt.Errorf("%s %s: bad leader %q", method, u, leader), true
				}
			}
			if leader == "" {
				leader = loc.Scheme + "://" + loc.Host
			}
			a.setLeader(leader)
			if hop >= maxRedirects {
				return fmt.Errorf("%s %s: too many redirects", method, u), true
			}
			u = loc.String()
			continue
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			a.setLeader(req.URL.Scheme + "://" + req.URL.Host)
			if out != nil && len(bytes.TrimSpace(data)) > 0 {
				if err := json.Unmarshal(data, out); err != nil {
					return fmt.Errorf("%s %s: decoding reply: %w", method, u, err), false
				}
			}
			return nil, false
		default:
			var eb errorBody
			_ = json.Unmarshal(data, &eb)
			if eb.Error == nil {
				eb.Error = &api.Error{Code: codeForStatus(resp.StatusCode), Message: fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, bytes.TrimSpace(data))}
			}
			se := serverError(eb.Error, resp.StatusCode)
			se.Holder, se.Leader = eb.Holder, eb.Leader
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				se.retryAfterHdr = ra
			}
			// The 409 of acquire carries the reply body too.
			if out != nil && resp.StatusCode == http.StatusConflict {
				_ = json.Unmarshal(data, out)
			}
			return se, se.API.Code == api.CodeNoLeader
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
// one, ServerError.Holder is the holder. ctx must outlast wait.
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

// AcquireRequest sends an acquire request as given.
func (a *API) AcquireRequest(ctx context.Context, name string, req api.AcquireRequest) (*api.AcquireReply, error) {
	var rep api.AcquireReply
	err := a.do(ctx, http.MethodPost, lockPath(name, "acquire"), req, &rep)
	var se *ServerError
	if errors.As(err, &se) && se.Holder == "" {
		se.Holder = rep.Holder
	}
	if err != nil {
		return nil, err
	}
	return &rep, nil
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

// Status reads one lock. stale lets any member answer from its local state.
func (a *API) Status(ctx context.Context, name string, stale bool) (*api.LockStatus, error) {
	p := lockPath(name, "")
	if stale {
		p += "?stale=true"
	}
	var rep api.LockStatus
	if err := a.do(ctx, http.MethodGet, p, nil, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// List reads every lock whose name starts with prefix.
func (a *API) List(ctx context.Context, prefix string) ([]api.LockStatus, error) {
	p := "/api/v1/locks"
	if prefix != "" {
		p += "?prefix=" + url.QueryEscape(prefix)
	}
	var rep api.LockList
	if err := a.do(ctx, http.MethodGet, p, nil, &rep); err != nil {
		return nil, err
	}
	return rep.Locks, nil
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

// closeIdle drops idle connections of the underlying transport.
func (a *API) closeIdle() { a.hc.CloseIdleConnections() }
