package fence

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

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

// ServerConfig configures NewServer.
type ServerConfig struct {
	// Store keeps values and tokens. Required. With a BoltStore each write
	// stores value and token in one transaction.
	Store Store
	// VerifyKey, when set, makes every write carry a Fencing-Proof by the
	// lock service's matching private key, and a Fencing-Lock.
	VerifyKey ed25519.PublicKey
	// MaxValueBytes bounds a PUT body; 0 means DefaultMaxValueBytes.
	MaxValueBytes int64
	// Logger gets one line per refused write and per failure, and one
	// Debug line per accepted write. Nil discards.
	Logger *slog.Logger
}

// Validate reports a config NewServer cannot run with.
func (c ServerConfig) Validate() error {
	if c.Store == nil {
		return errors.New("fence: ServerConfig.Store is required")
	}
	if c.VerifyKey != nil && len(c.VerifyKey) != ed25519.PublicKeySize {
		return fmt.Errorf("fence: ServerConfig.VerifyKey is %d bytes, want %d", len(c.VerifyKey), ed25519.PublicKeySize)
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
	maxValue int64
	log      *slog.Logger
	mux      *http.ServeMux
}

// NewServer returns the fencestore HTTP API:
//
//	PUT /v1/objects/{key}  Fencing-Token (+ Fencing-Lock, Fencing-Proof), body = value
//	                       → 200 {"ok":true,"fencing_token":n}
//	                       → 409 stale_token with "highest_token" when n < the highest accepted
//	                       → 400 missing/malformed header, 403 missing/bad proof, 413 body too large
//	GET /v1/objects/{key}  → 200 the value, header Fencing-Token = highest accepted; 404 not_found
//	GET /healthz           → 200
//
// A PUT checks the token and stores value and token in one Store.Put, so the
// stored value is always the one written with the highest accepted token.
// Every error body is {"error":{"code","message"}}. A key is one path
// segment (a "/" inside it is sent as %2F) of 1 to MaxKeyBytes bytes.
func NewServer(cfg ServerConfig) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &server{
		store:    cfg.Store,
		auth:     authenticator{pub: cfg.VerifyKey},
		maxValue: cfg.MaxValueBytes,
		log:      cfg.Logger,
		mux:      http.NewServeMux(),
	}
	if s.maxValue == 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("/v1/objects/{key}", s.objects)
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

func (s *server) objects(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if len(key) > MaxKeyBytes {
		newHTTPError(api.CodeInvalidArgument,
			fmt.Sprintf("object key is %d bytes, at most %d allowed", len(key), MaxKeyBytes)).write(w)
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

func (s *server) put(w http.ResponseWriter, r *http.Request, key string) {
	adm, herr := s.auth.authenticate(r.Header)
	if herr != nil {
		s.log.Info("write refused", "key", key, "code", herr.code, "reason", herr.msg)
		herr.write(w)
		return
	}
	adm.Key = key
	// A stale token stays stale (the highest only grows), so refuse it
	// before reading a body that would be thrown away. Put checks again.
	if rec, err := s.store.Get(key); err == nil && adm.Token < rec.Token {
		s.refuse(w, adm, &StaleTokenError{Key: key, Token: adm.Token, Highest: rec.Token})
		return
	}
	value, herr := s.readValue(w, r)
	if herr != nil {
		s.log.Info("write refused", "key", key, "token", adm.Token, "code", herr.code, "reason", herr.msg)
		herr.write(w)
		return
	}
	if err := s.store.Put(key, adm.Token, value); err != nil {
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
