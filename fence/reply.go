package fence

import (
	"encoding/json"
	"net/http"

	"github.com/lockd/lockd/api"
)

// WriteReply is fencestore's 200 reply to a write:
// {"ok": true, "fencing_token": n}.
type WriteReply struct {
	OK           bool   `json:"ok"`
	FencingToken uint64 `json:"fencing_token"`
}

// StaleTokenReply is the 409 reply to a write with a stale token:
// {"error": {"code": "stale_token", "message": ...}, "highest_token": m}.
type StaleTokenReply struct {
	Error        api.Error `json:"error"`
	HighestToken uint64    `json:"highest_token"`
}

// httpError is an error reply about to be written.
type httpError struct {
	status int
	code   string
	msg    string
}

func newHTTPError(code, msg string) *httpError {
	return &httpError{status: api.Status(code), code: code, msg: msg}
}

func (e *httpError) write(w http.ResponseWriter) {
	writeJSON(w, e.status, api.ErrorReply{Error: api.Error{Code: e.code, Message: e.msg}})
}

func writeStale(w http.ResponseWriter, e *StaleTokenError) {
	writeJSON(w, api.Status(api.CodeStaleToken), StaleTokenReply{
		Error:        api.Error{Code: api.CodeStaleToken, Message: staleMessage(e)},
		HighestToken: e.Highest,
	})
}

func staleMessage(e *StaleTokenError) string {
	return "fencing token " + uitoa(e.Token) + " is stale: a write with token " + uitoa(e.Highest) +
		" was already accepted for this resource (the lock was lost)"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // only our own reply types come here; they always marshal
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal","message":"encoding the reply failed"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
