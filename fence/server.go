package fence

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd/lockd/api"
)

// Limits of the fencestore server.
const (
	// DefaultMaxValueBytes is the largest value a PUT may carry unless
	// ServerConfig.MaxValueBytes says otherwise; larger gets 413.
	DefaultMaxValueBytes = 1 << 20
	// MaxKeyBytes is the longest object key; longer gets 400.
	MaxKeyBytes = 1024
)

// MinAdminTokenBytes is the shortest ServerConfig.AdminToken accepted: a
// token that guards resetting any key's fence should not be guessable.
const MinAdminTokenBytes = 16

// ServerConfig configures NewServer.
type ServerConfig struct {
	// Store keeps values and tokens. Required. With a BoltStore each write
	// stores value, token and the key's lock binding in one transaction.
	Store Store
	// VerifyKey, when set, makes every write carry a Fencing-Proof by the
	// lock service's matching private key, and a Fencing-Lock: the proof
	// must be of an exclusive grant of the key's lock, and not expired.
	VerifyKey ed25519.PublicKey
	// Guards binds keys to locks by prefix (fencestore --guard). A key no
	// guard matches is bound by its first accepted write that names a
	// lock. Nil guards nothing.
	Guards *Guards
	// AdminToken, when set, turns on DELETE /v1/objects/{key}/fence, which
	// resets a key's highest token and lock binding; the request must carry
	// "Authorization: Bearer <AdminToken>". At least MinAdminTokenBytes.
	AdminToken string
	// MaxValueBytes bounds a PUT body; 0 means DefaultMaxValueBytes.
	MaxValueBytes int64
	// Logger gets one line per refused write and per failure, one Warn
	// line per admin reset, and one Debug line per accepted write. Nil
	// discards.
	Logger *slog.Logger
	// Now is the clock proofs' expiries are compared with; nil is
	// time.Now.
	Now func() time.Time
}

// Validate reports a config NewServer cannot run with.
func (c ServerConfig) Validate() error {
	if c.Store == nil {
		return errors.New("fence: ServerConfig.Store is required")
	}
	if c.VerifyKey != nil && len(c.VerifyKey) != ed25519.PublicKeySize {
		return fmt.Errorf("fence: ServerConfig.VerifyKey is %d bytes, want %d", len(c.VerifyKey), ed25519.PublicKeySize)
	}
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenBytes {
		return fmt.Errorf("fence: ServerConfig.AdminToken is %d bytes, want at least %d", len(c.AdminToken), MinAdminTokenBytes)
	}
	if c.MaxValueBytes < 0 {
		return fmt.Errorf("fence: ServerConfig.MaxValueBytes is %d, want >= 0", c.MaxValueBytes)
	}
	return nil
}

// server is the fencestore HTTP API.
type server struct {
	store    Store
	auth     authenticator
	guards   *Guards
	admin    [sha256.Size]byte // hash of the admin token; zero when off
	adminOn  bool
	maxValue int64
	log      *slog.Logger
	mux      *http.ServeMux
}

// NewServer returns the fencestore HTTP API:
//
//	PUT /v1/objects/{key}  Fencing-Token (+ Fencing-Lock, Fencing-Proof), body = value
//	                       → 200 {"ok":true,"fencing_token":n}
//	                       → 409 stale_token with "highest_token" when n < the highest accepted
//	                       → 400 missing/malformed header, 413 body too large
//	                       → 403 a write under another lock than the key's; a missing, bad,
//	                         shared-grant or expired proof (with VerifyKey)
//	GET /v1/objects/{key}  → 200 the value, header Fencing-Token = highest accepted and
//	                         Fencing-Lock = the key's lock (when bound); 404 not_found
//	DELETE /v1/objects/{key}/fence[?fencing_token=N]
//	                       → with "Authorization: Bearer <AdminToken>": the key's highest token
//	                         becomes N (default 0) and its lock binding is dropped; the value stays.
//	                         200 {"ok":true,"fencing_token":N,"previous_token":m,"previous_lock":l}
//	                         401 without a valid token; 403 when AdminToken is not set
//	GET /healthz           → 200
//
// Each key is bound to one lock: the lock of the longest Guards prefix that
// matches it, else the lock named by its first accepted write (kept in the
// Store from then on). A write naming another lock is refused, so a proof
// for one lock never writes a key guarded by another.
//
// A PUT checks the binding and the token and stores value, token and binding
// in one Store.Put, so the stored value is always the one written with the
// highest accepted token. A stale token is answered 409 even when its proof
// has also expired. Every error body is {"error":{"code","message"}}. A key
// is one path segment (a "/" inside it is sent as %2F) of 1 to MaxKeyBytes
// bytes.
func NewServer(cfg ServerConfig) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &server{
		store:    cfg.Store,
		auth:     authenticator{Verifier{Key: cfg.VerifyKey, Now: cfg.Now}},
		guards:   cfg.Guards,
		maxValue: cfg.MaxValueBytes,
		log:      cfg.Logger,
		mux:      http.NewServeMux(),
	}
	if s.auth.Now == nil {
		s.auth.Now = time.Now
	}
	if cfg.AdminToken != "" {
		s.admin, s.adminOn = sha256.Sum256([]byte(cfg.AdminToken)), true
	}
	if s.maxValue == 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("/v1/objects/{key}", s.objects)
	s.mux.HandleFunc("/v1/objects/{key}/fence", s.resetFence)
	s.mux.HandleFunc("/healthz", s.healthz)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		newHTTPError(api.CodeNotFound, "no such endpoint: "+r.Method+" "+quote(r.URL.Path)).write(w)
	})
	return s.mux, nil
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// objectKey returns the request's key, or false after answering 400.
func objectKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := r.PathValue("key")
	if len(key) > MaxKeyBytes {
		newHTTPError(api.CodeInvalidArgument,
			fmt.Sprintf("object key is %d bytes, at most %d allowed", len(key), MaxKeyBytes)).write(w)
		return "", false
	}
	return key, true
}

func (s *server) objects(w http.ResponseWriter, r *http.Request) {
	key, ok := objectKey(w, r)
	if !ok {
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.get(w, key)
	case http.MethodPut:
		s.put(w, r, key)
	default:
		methodNotAllowed(w, r, "GET, HEAD, PUT")
	}
}

func (s *server) get(w http.ResponseWriter, key string) {
	rec, err := s.store.Get(key)
	if err != nil {
		s.log.Error("read failed", "key", key, "err", err)
		newHTTPError(api.CodeInternal, "fencing store: "+err.Error()).write(w)
		return
	}
	if rec.Token != 0 || rec.HasValue {
		w.Header().Set(HeaderToken, uitoa(rec.Token))
	}
	if lock := s.keyLock(key, rec); lock != "" {
		w.Header().Set(HeaderLock, lock)
	}
	if !rec.HasValue {
		newHTTPError(api.CodeNotFound, "no object "+quote(key)).write(w)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.Itoa(len(rec.Value)))
	h.Set("Cache-Control", "no-store") // the value changes under the same URL
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(rec.Value)
}

// keyLock is the lock a write to key must name: its guard's, else the one
// stored with it ("" while unbound).
func (s *server) keyLock(key string, rec Record) string {
	if lock := s.guards.Lock(key); lock != "" {
		return lock
	}
	return rec.Lock
}

func (s *server) put(w http.ResponseWriter, r *http.Request, key string) {
	guard := s.guards.Lock(key)
	adm, herr := s.auth.authenticate(r.Header, key, guard)
	if herr != nil {
		s.log.Info("write refused", "key", key, "code", herr.code, "reason", herr.msg)
		herr.write(w)
		return
	}
	wr := adm.Write()
	// A stale token stays stale (the highest only grows) and a binding
	// stays, so refuse before reading a body that would be thrown away.
	// Put checks again. This also answers a stale token whose proof has
	// expired as stale.
	if rec, err := s.store.Get(key); err == nil {
		if _, err := wr.Apply(key, rec); err != nil {
			s.refuse(w, adm, err)
			return
		}
	}
	if herr := s.auth.expired(adm); herr != nil {
		s.log.Info("write refused", "key", key, "token", adm.Token, "lock", adm.Lock, "code", herr.code, "reason", herr.msg)
		herr.write(w)
		return
	}
	value, herr := s.readValue(w, r)
	if herr != nil {
		s.log.Info("write refused", "key", key, "token", adm.Token, "code", herr.code, "reason", herr.msg)
		herr.write(w)
		return
	}
	if err := s.store.Put(key, wr, value); err != nil {
		s.refuse(w, adm, err)
		return
	}
	s.log.Debug("write accepted", "key", key, "token", adm.Token, "lock", adm.Lock, "bytes", len(value))
	writeJSON(w, http.StatusOK, WriteReply{OK: true, FencingToken: adm.Token})
}

func (s *server) refuse(w http.ResponseWriter, adm Admission, err error) {
	logAdmitError(s.log, adm, err)
	admitError(w, err)
}

// readValue reads the body, at most maxValue bytes.
func (s *server) readValue(w http.ResponseWriter, r *http.Request) ([]byte, *httpError) {
	tooLarge := newHTTPError(api.CodePayloadTooLarge,
		fmt.Sprintf("value is larger than %d bytes", s.maxValue))
	if r.ContentLength > s.maxValue {
		return nil, tooLarge
	}
	value, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxValue))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, newHTTPError(api.CodeInvalidArgument, "reading the body: "+err.Error())
	}
	return value, nil
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	e := newHTTPError(api.CodeInvalidArgument, "method "+r.Method+" is not allowed here; use "+allow)
	e.status = http.StatusMethodNotAllowed
	e.write(w)
}
