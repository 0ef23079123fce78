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
	lockFunc  func(r *http.Request, key string) string
	logger    *slog.Logger
	serialize bool
}

// WithVerifyKey makes every write carry a Fencing-Proof signed by the lock
// service's key pub, and a Fencing-Lock naming the lock it covers; a write
// without them, whose proof does not verify, is a shared grant's, or has
// expired (see WithoutProofExpiry), gets 403 permission_denied.
// A key of the wrong size fails closed: every write is refused.
func WithVerifyKey(pub ed25519.PublicKey) Option {
	return func(c *middlewareConfig) { c.auth.Key = pub }
}

// WithProofExpiry sets the clock a proof's expiry is compared with; the
// default is time.Now. With WithVerifyKey, a proof whose expiry is not after
// now() gets 403 (unless WithoutProofExpiry). The expiry is the lease's when
// the proof was signed, by the lock service's clock, so the two machines'
// clocks should agree to well within a TTL.
func WithProofExpiry(now func() time.Time) Option {
	return func(c *middlewareConfig) { c.auth.Now = now }
}

// WithoutProofExpiry accepts proofs whose expiry has passed; the token
// comparison and the key's lock binding still apply. Use it only where
// holders keep a lock by renewing it and cannot fetch a fresh proof: lockd
// signs a proof when it grants (an acquire by the holder re-signs with the
// renewed expiry, a renew does not), so a holder renewing with the Go
// client's auto-renew keeps the proof of its grant, which expires after one
// TTL, and every later write of that still-valid holder would be refused.
// The cost: a holder that lost its lock can still write until the next
// holder of the same lock writes to the key (the window fencing tokens
// alone leave open); refusing expired proofs narrows that to the lease.
func WithoutProofExpiry() Option {
	return func(c *middlewareConfig) { c.auth.AcceptExpired = true }
}

// WithKeyFunc sets how a request maps to the resource key whose highest
// token it is checked against. The default is the URL path, so each path is
// its own resource. Requests mapped to one key share one token sequence.
func WithKeyFunc(fn func(*http.Request) string) Option {
	return func(c *middlewareConfig) { c.keyFunc = fn }
}

// WithLockFunc sets the lock that guards each key: fn returns it for a
// write's request and resource key (WithKeyFunc), or "" to leave the key to
// first-write binding. A write to a guarded key must name fn's lock in
// Fencing-Lock (and with WithVerifyKey carry a proof of it), else 403; the
// guard's lock wins over a lock bound earlier and replaces it. A key fn
// leaves unguarded is bound to the lock of its first admitted write that
// names one, kept in the Checker's Store from then on: a later write under
// another lock, or under none, gets 403.
func WithLockFunc(fn func(r *http.Request, key string) string) Option {
	return func(c *middlewareConfig) { c.lockFunc = fn }
}

// WithGuards guards keys by prefix, as fencestore's --guard does: the
// longest matching prefix's lock guards a key (see WithLockFunc).
func WithGuards(g *Guards) Option {
	return WithLockFunc(func(_ *http.Request, key string) string { return g.Lock(key) })
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
//   - finds the request's key (WithKeyFunc) and the lock that guards it
//     (WithLockFunc): a write naming another lock gets 403
//     permission_denied;
//   - with WithVerifyKey, checks Fencing-Proof: missing, bad, or a shared
//     grant's, 403 permission_denied;
//   - admits the write with c.Check: a write under another lock than the
//     one the key is bound to gets 403 permission_denied; a token lower
//     than the highest admitted gets 409
//     {"error":{"code":"stale_token",...},"highest_token":m}; a proof that
//     has expired (when neither applies) gets 403; in each case the
//     handler does not run;
//   - calls the handler with the Admission in the context (FromContext).
//
// The guarantee is admission at check time: the handler runs only for a
// token that was, atomically, not lower than any token admitted before for
// the key, made under the key's lock, and is now the highest. Two requests
// with tokens 5 and 6 racing never end with 5 admitted after 6. The
// handler's own write is not part of that atomic step (see
// WithSerializedWrites, and NewServer for value and token stored in one
// transaction). A write whose handler fails still raised the token. A nil c
// means NewChecker(nil), tokens in memory.
func Middleware(c *Checker, opts ...Option) func(http.Handler) http.Handler {
	if c == nil {
		c = NewChecker(nil)
	}
	cfg := middlewareConfig{
		auth:     authenticator{Verifier{Now: time.Now}},
		keyFunc:  func(r *http.Request) string { return r.URL.Path },
		lockFunc: func(*http.Request, string) string { return "" },
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.auth.Now == nil {
		cfg.auth.Now = time.Now
	}
	if cfg.lockFunc == nil {
		cfg.lockFunc = func(*http.Request, string) string { return "" }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !isWrite(r.Method) {
				next.ServeHTTP(w, r)
				return
			}
			key := cfg.keyFunc(r)
			guard := cfg.lockFunc(r, key)
			adm, herr := cfg.auth.authenticate(r.Header, key, guard)
			if herr != nil {
				cfg.logger.Info("fenced write refused", "method", r.Method, "path", r.URL.Path, "key", key,
					"code", herr.code, "reason", herr.msg)
				herr.write(w)
				return
			}
			wr := adm.Write()
			if herr := cfg.auth.expired(adm); herr != nil {
				// A write that is also stale or under a foreign lock is
				// refused for that: "the lock was lost" is the more useful
				// answer. Nothing is admitted either way.
				if rec, err := c.Store().Get(key); err == nil {
					if _, err := wr.Apply(key, rec); err != nil {
						logAdmitError(cfg.logger, adm, err)
						admitError(w, err)
						return
					}
				}
				cfg.logger.Info("fenced write refused", "method", r.Method, "path", r.URL.Path, "key", key,
					"code", herr.code, "reason", herr.msg)
				herr.write(w)
				return
			}
			serve := func() error {
				next.ServeHTTP(w, r.WithContext(withAdmission(r.Context(), adm)))
				return nil
			}
			var err error
			if cfg.serialize {
				err = c.Do(key, wr, serve)
			} else if err = c.Check(key, wr); err == nil {
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
	var mismatch *LockMismatchError
	if errors.As(err, &mismatch) {
		l.Info("write under another lock refused", "key", adm.Key, "lock", adm.Lock,
			"bound_lock", mismatch.Bound, "token", adm.Token)
		return
	}
	l.Error("fencing store failed", "key", adm.Key, "token", adm.Token, "err", err)
}
