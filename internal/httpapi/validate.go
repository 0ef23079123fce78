package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
)

// apiError is an error with a SPEC code; handlers return it and writeError
// renders it.
type apiError struct {
	code string
	msg  string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

// Errorf returns an error that renders as the SPEC error with this code.
func Errorf(code, format string, a ...any) error {
	return &apiError{code: code, msg: fmt.Sprintf(format, a...)}
}

func invalid(format string, a ...any) error {
	return &apiError{code: api.CodeInvalidArgument, msg: fmt.Sprintf(format, a...)}
}

// ValidLockName reports why a lock name breaks the SPEC limits ("" = ok):
// 1–256 bytes of [A-Za-z0-9._:/-].
func ValidLockName(name string) string {
	if len(name) == 0 {
		return "lock name is empty"
	}
	if len(name) > api.MaxLockName {
		return fmt.Sprintf("lock name is %d bytes, the limit is %d", len(name), api.MaxLockName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '/', c == '-':
		default:
			return fmt.Sprintf("lock name has character %q at byte %d; allowed are [A-Za-z0-9._:/-]", c, i)
		}
	}
	return ""
}

// validClientID checks client_id: 1–128 bytes, printable UTF-8.
func validClientID(field, id string) error {
	if id == "" {
		return invalid("%s is required", field)
	}
	if len(id) > api.MaxClientID {
		return invalid("%s is %d bytes, the limit is %d", field, len(id), api.MaxClientID)
	}
	if !utf8.ValidString(id) {
		return invalid("%s is not valid UTF-8", field)
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return invalid("%s has a non-printable character %q", field, r)
		}
	}
	return nil
}

func validSessionID(id string) error {
	if len(id) > api.MaxClientID {
		return invalid("session_id is %d bytes, the limit is %d", len(id), api.MaxClientID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return invalid("session_id has an invalid character at byte %d", i)
		}
	}
	return nil
}

func checkRange(field string, v *int64, lo, hi int64) error {
	if v == nil {
		return nil
	}
	if *v < lo || *v > hi {
		return invalid("%s must be between %d and %d, got %d", field, lo, hi, *v)
	}
	return nil
}

// decode reads one JSON object into v: body at most 64 KiB (413 beyond),
// unknown fields rejected, nothing after the object. An empty body is
// allowed only when allowEmpty.
func decode(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(w, r.Body, api.MaxBodyBytes)
	b, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{code: api.CodePayloadTooLarge, msg: fmt.Sprintf("request body is over %d KiB", api.MaxBodyBytes>>10)}
		}
		return invalid("reading body: %v", err)
	}
	if len(b) == 0 {
		if allowEmpty {
			return nil
		}
		return invalid("request body is empty; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("malformed JSON body: %v", err)
	}
	if dec.More() {
		return invalid("malformed JSON body: data after the object")
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return invalid("malformed JSON body: data after the object")
	}
	return nil
}
