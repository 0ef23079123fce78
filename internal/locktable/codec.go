package locktable

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt is returned by every decoder for bytes it cannot trust.
var ErrCorrupt = errors.New("locktable: corrupt encoding")

// maxString bounds any length read from bytes, so a hostile or corrupt
// entry can never make a decoder allocate more than this per field.
const maxString = 1 << 16

// writer appends a compact binary encoding: uvarints and length-prefixed
// strings. It never fails.
type writer struct{ b []byte }

func (w *writer) byte(v byte)      { w.b = append(w.b, v) }
func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *writer) string(s string) {
	w.uvarint(uint64(len(s)))
	w.b = append(w.b, s...)
}

// reader decodes what writer wrote. The first error sticks; callers check
// r.err once at the end.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("short byte")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string { return string(r.stringBytes()) }

// stringBytes reads a length-prefixed string without copying it.
func (r *reader) stringBytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > maxString || n > uint64(len(r.b)) {
		r.fail("string length out of bounds")
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

// internString reads a string like string, but returns the copy kept in
// seen when the same bytes came before: a snapshot repeats each client and
// session id once per lock, and one shared copy saves an allocation and
// its memory per repetition. seen stops growing at maxInterned entries.
func (r *reader) internString(seen map[string]string) string {
	b := r.stringBytes()
	if s, ok := seen[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(seen) < maxInterned {
		seen[s] = s
	}
	return s
}

const maxInterned = 1 << 16

// count reads a collection length and checks it against what the remaining
// bytes could possibly hold (each element takes at least minSize bytes).
func (r *reader) count(minSize int) int {
	n := r.uvarint()
	if r.err != nil {
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(len(r.b)/minSize) {
		r.fail("count out of bounds")
		return 0
	}
	return int(n)
}
