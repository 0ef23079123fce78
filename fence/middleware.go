package fence

import (
	"crypto/ed25519"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// Option configures Middleware.
type Option func(*middlewareConfig)

type middlewareConfig struct {
	auth      authenticator
	keyFunc   func(*http.Request) string
	logger    *slog.Logger
	serialize bool
}

// WithVerifyKey makes every write carry a Fencing-Proof signed by the lock
// service's key pub, and a Fencing-Lock naming the lock it covers; a write
// without them, or whose proof does not verify, gets 403 permission_denied.
// A key of the wrong size fails closed: every write is refused.
func WithVerifyKey(pub ed25519.PublicKey) Option {
	return func(c *middlewareConfig) { c.auth.pub = pub }
}

// WithProofExpiry also refuses (403) a proof whose expiry is not after
// now(). Off by default: the expiry is the lease's at grant time, a renewed
// lock keeps its old proof, and the clocks of two machines differ; the
// token comparison is what keeps a stale holder out. Turn it on to bound how
// long a proof is worth where renewals re-sign and clocks are close.
// It needs WithVerifyKey.
func WithProofExpiry(now func() time.Time) Option {
	return func(c *middlewareConfig) { c.auth.now = now }
}

// WithKeyFunc sets how a request maps to the resource key whose highest
// token it is checked against. The default is the URL path, so each path is
// its own resource. Requests mapped to one key share one token sequence.
func WithKeyFunc(fn func(*http.Request) string) Option {
	return func(c *middlewareConfig) { c.keyFunc = fn }
}

// WithLogger logs refused writes (Info) and store failures (Error).
// The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *middlewareConfig) { c.logger = l }
}

// WithSerializedWrites holds the resource key's lock from the token check
// until the wrapped handler returns (Checker.Do), so fenced writes to one
// key run one at a time and take effect in token order: no handler of a
// lower token runs after a higher token was admitted. Without it, the
// handlers of two admitted writes (say 6, then 7) may run concurrently and
// 6's write may land last. The cost: writes to one key wait for each other,
// so a slow writer delays the next one; give the server read timeouts.
func WithSerializedWrites() Option {
	return func(c *middlewareConfig) { c.serialize = true }
}

// Middleware fences the writes (PUT, POST, PATCH, DELETE) that reach the
// wrapped handler; other methods pass through unchecked. For a write it
//
//   - reads Fencing-Token (required) and Fencing-Lock: a missing or
//     malformed header gets 400 invalid_argument naming the header;
//   - with WithVerifyKey, checks Fencing-Proof: 403 permission_denied;
//   - admits the token with c.Check against the request's key (WithKeyFunc):
//     a token lower than the highest admitted gets 409
//     {"error":{"code":"stale_token",...},"highest_token":m}, and the handler
//     does not run;
//   - calls the handler with the Admission in the context (FromContext).
//
// The guarantee is admission at check time: the handler runs only for a
// token that was, atomically, not lower than any token admitted before for
// the key, and is now the highest. Two requests with tokens 5 and 6 racing
// never end with 5 admitted after 6. The handler's own write is not part of
// that atomic step (see WithSerializedWrites, and NewServer for value and
// token stored in one transaction). A write whose handler fails still raised
// the token. A nil c means NewChecker(nil), tokens in memory.
func Middleware(c *Checker, opts ...Option) func(http.Handler) http.Handler {
	if c == nil {
		c = NewChecker(nil)
	}
	cfg := middlewareConfig{keyFunc: func(r *http.Request) string { return r.URL.Path }}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !isWrite(r.Method) {
				next.ServeHTTP(w, r)
				return
			}
			adm, herr := cfg.auth.authenticate(r.Header)
			if herr != nil {
				cfg.logger.Info("fenced write refused", "method", r.Method, "path", r.URL.Path,
					"code", herr.code, "reason", herr.msg)
				herr.write(w)
				return
			}
			adm.Key = cfg.keyFunc(r)
			serve := func() error {
				next.ServeHTTP(w, r.WithContext(withAdmission(r.Context(), adm)))
				return nil
			}
			var err error
			if cfg.serialize {
				err = c.Do(adm.Key, adm.Token, serve)
			} else if err = c.Check(adm.Key, adm.Token); err == nil {
				err = serve()
			}
			if err != nil {
				logAdmitError(cfg.logger, adm, err)
				admitError(w, err)
			}
		})
	}
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

func logAdmitError(l *slog.Logger, adm Admission, err error) {
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		l.Info("stale fencing token refused", "key", adm.Key, "lock", adm.Lock,
			"token", adm.Token, "highest", stale.Highest)
		return
	}
	l.Error("fencing store failed", "key", adm.Key, "token", adm.Token, "err", err)
}
