package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
)

// apiError is an error with a SPEC code; handlers return it and writeError
// renders it.
type apiError struct {
	code string
	msg  string
	// retryAfter is when to try again (overloaded, a budget): sent as
	// Retry-After, and retry_after_ms on a WebSocket.
	retryAfter time.Duration
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
// 1–256 bytes of [A-Za-z0-9._:/-]. The state machine keeps the same rule
// for what it restores.
func ValidLockName(name string) string { return locktable.LockNameProblem(name) }

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
	return decodeJSON("body", b, v)
}

// decodeJSON reads exactly one JSON object from b into v (a pointer to a
// struct): unknown fields rejected, nothing after the object. what names
// the input in errors ("body", "frame").
//
// Field names must match v's json tags exactly. encoding/json matches
// them case-insensitively ("TTL_MS" would set ttl_ms), so the object's
// member names are checked on their own as well; a name given twice is
// refused too, rather than silently taking the last.
func decodeJSON(what string, b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("malformed JSON %s: %v", what, err)
	}
	if dec.More() {
		return invalid("malformed JSON %s: data after the object", what)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return invalid("malformed JSON %s: data after the object", what)
	}
	return checkMemberNames(b, jsonFields(reflect.TypeOf(v).Elem()))
}

// checkMemberNames walks the members of the JSON object in b (already
// decoded once, so well-formed) and refuses a name that is not exactly one
// of fields, or that comes twice. Only the top level is checked: every
// request body and frame is a flat object.
//
// It runs on every request and frame, so it scans the bytes itself and
// allocates nothing on the way (a json.Decoder's tokens cost a fifth of a
// leader's CPU in a burst of 100k waits); b is known to be well-formed, so
// the scan only needs to find where each member name and value ends.
func checkMemberNames(b []byte, fields *fieldSet) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil
	}
	var seen []bool
	if len(fields.names) > 64 {
		seen = make([]bool, len(fields.names))
	}
	var seenBits uint64
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] == '}' {
			return nil
		}
		if b[i] == ',' {
			i++
			continue
		}
		end := stringEnd(b, i)
		raw := b[i+1 : end-1]
		k, ok := fields.index[string(raw)] // no allocation: a map lookup
		if !ok {
			name := string(raw)
			if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
				// Escapes, or bytes that are not UTF-8 (decoded as U+FFFD):
				// the name as encoding/json reads it.
				_ = json.Unmarshal(b[i:end], &name)
				k, ok = fields.index[name]
			}
			if !ok {
				for _, f := range fields.names {
					if strings.EqualFold(f, name) {
						return invalid("unknown field %q (field names are case-sensitive: %q)", name, f)
					}
				}
				return invalid("unknown field %q", name)
			}
		}
		if seen != nil {
			if seen[k] {
				return invalid("field %q is given twice", fields.names[k])
			}
			seen[k] = true
		} else {
			if seenBits&(1<<k) != 0 {
				return invalid("field %q is given twice", fields.names[k])
			}
			seenBits |= 1 << k
		}
		i = skipSpace(b, end)
		if i < len(b) && b[i] == ':' {
			i++
		}
		i = valueEnd(b, skipSpace(b, i))
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at b[i]
// (a quote).
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the JSON value starting at b[i].
func valueEnd(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = stringEnd(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of the enclosing object
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}

// fieldSet is the JSON member names of a request type, each with its
// index (for the duplicate check).
type fieldSet struct {
	index map[string]int
	names []string
}

// fieldCache holds the fieldSet of each request type.
var fieldCache sync.Map // reflect.Type -> *fieldSet

// jsonFields returns the member names encoding/json gives struct type t's
// fields (json tag name, else the Go name; embedded structs flattened).
func jsonFields(t reflect.Type) *fieldSet {
	if fs, ok := fieldCache.Load(t); ok {
		return fs.(*fieldSet)
	}
	m := map[string]struct{}{}
	addJSONFields(t, m)
	fs := &fieldSet{index: make(map[string]int, len(m))}
	for name := range m {
		fs.names = append(fs.names, name)
	}
	slices.Sort(fs.names)
	for k, name := range fs.names {
		fs.index[name] = k
	}
	fieldCache.Store(t, fs)
	return fs
}

func addJSONFields(t reflect.Type, m map[string]struct{}) {
	if t.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				addJSONFields(ft, m)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = struct{}{}
	}
}

// ValidateAddMember checks an add-member request at the door: every field
// is stored in the replicated state, and one the state machine's decoder
// cannot read back would crash every member on every restart (SPEC
// semantics 12). It is also the server's own check.
func ValidateAddMember(req api.AddMemberRequest) error {
	if err := validClientID("id", req.ID); err != nil {
		return err
	}
	if err := CheckRaftAddr(req.RaftAddr); err != nil {
		return err
	}
	return CheckHTTPAddr(req.HTTPAddr)
}

// CheckRaftAddr checks a member's Raft address: host:port, the host a DNS
// name or an IP address, the port a number 1-65535.
func CheckRaftAddr(addr string) error {
	if addr == "" {
		return invalid("raft_addr is required (host:port)")
	}
	if len(addr) > api.MaxMemberAddr {
		return invalid("raft_addr is %d bytes, the limit is %d", len(addr), api.MaxMemberAddr)
	}
	if err := printableASCII("raft_addr", addr); err != nil {
		return err
	}
	return checkHostPort("raft_addr", addr)
}

// CheckHTTPAddr checks a member's client API address: an http or https URL
// (scheme://host[:port][/path], no user, query or fragment) or a bare
// host:port, which means http.
func CheckHTTPAddr(addr string) error {
	if addr == "" {
		return invalid("http_addr is required (http://host:port)")
	}
	if len(addr) > api.MaxMemberAddr {
		return invalid("http_addr is %d bytes, the limit is %d", len(addr), api.MaxMemberAddr)
	}
	if err := printableASCII("http_addr", addr); err != nil {
		return err
	}
	if !strings.Contains(addr, "://") {
		return checkHostPort("http_addr", addr)
	}
	u, err := url.Parse(addr)
	if err != nil {
		return invalid("http_addr is not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return invalid("http_addr scheme must be http or https, got %q", u.Scheme)
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return invalid("http_addr must be scheme://host[:port][/path], with no user, query or fragment")
	}
	if err := checkHost("http_addr", u.Hostname()); err != nil {
		return err
	}
	if u.Port() != "" || strings.HasSuffix(u.Host, ":") {
		return checkPort("http_addr", u.Port())
	}
	return nil
}

// printableASCII refuses anything but the printable ASCII an address is
// made of: no spaces, control characters or other UTF-8.
func printableASCII(field, s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return invalid("%s has byte 0x%02x at %d; an address is printable ASCII with no spaces", field, s[i], i)
		}
	}
	return nil
}

func checkHostPort(field, hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return invalid("%s must be host:port: %v", field, err)
	}
	if err := checkHost(field, host); err != nil {
		return err
	}
	return checkPort(field, port)
}

// checkHost accepts an IP address or a DNS name (letters, digits, '-', '.',
// '_'; at most 253 bytes).
func checkHost(field, host string) error {
	if host == "" {
		return invalid("%s has no host", field)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if len(host) > 253 {
		return invalid("%s host is %d bytes, a DNS name has at most 253", field, len(host))
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return invalid("%s host %q has character %q; use a DNS name or an IP address", field, host, c)
		}
	}
	return nil
}

func checkPort(field, port string) error {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || port[0] == '+' {
		return invalid("%s port must be a number from 1 to 65535, got %q", field, port)
	}
	return nil
}

// listParams reads and checks the query of GET /api/v1/locks: prefix and
// after are lock names (or empty), limit 1-10 000 (default 1000).
func listParams(q url.Values) (prefix, after string, limit int, err error) {
	prefix, after, limit = q.Get("prefix"), q.Get("after"), api.DefaultListLimit
	if prefix != "" {
		if why := ValidLockName(prefix); why != "" {
			return "", "", 0, invalid("prefix: %s", why)
		}
	}
	if after != "" {
		if why := ValidLockName(after); why != "" {
			return "", "", 0, invalid("after: %s", why)
		}
	}
	if v := q.Get("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > api.MaxListLimit {
			return "", "", 0, invalid("limit must be a number from 1 to %d, got %q", api.MaxListLimit, v)
		}
		limit = n
	}
	return prefix, after, limit, nil
}

// errFrameTooLarge: a WebSocket frame over the 64 KiB every request is held to.
var errFrameTooLarge = errors.New("frame too large")

// readFrame reads one WebSocket message of at most api.MaxBodyBytes. A
// larger one is errFrameTooLarge, found out by reading one byte past the
// limit (the connection's own read limit, just above, would close it
// without a word).
func readFrame(ctx context.Context, c *websocket.Conn) (websocket.MessageType, []byte, error) {
	typ, rd, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(rd, api.MaxBodyBytes+1))
	if err != nil {
		return 0, nil, err
	}
	if len(b) > api.MaxBodyBytes {
		return typ, nil, errFrameTooLarge
	}
	return typ, b, nil
}

// frameID is the id of a frame refused as malformed, when it can still be
// read, so the client learns which of its requests failed (0 otherwise).
func frameID(b []byte) uint64 {
	var probe struct {
		ID uint64 `json:"id"`
	}
	_ = json.Unmarshal(b, &probe)
	return probe.ID
}
