package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Terminal output (SPEC 21). Values, client ids, lock names, member ids and
// addresses, and the server's error messages that echo them are strings
// other clients chose; written raw, a newline in one forges a line of
// output (elect --listen would print two leaders), and an escape sequence
// drives the operator's terminal (colours, cursor moves, window titles,
// bidi overrides that reorder what is shown). So text output never writes
// one raw: a character a terminal acts on or hides is written as Go's %q
// writes it (\n, \r, \x1b, \u202e, and \x.. for a byte that is not UTF-8),
// and a plain printable string — any script, spaces included — prints
// unchanged. -o json is untouched: JSON escapes control characters itself.
//
// Three shapes, by where a string goes:
//   - textValue: one field of a key=value line (status, list, watch,
//     acquire): as is when plain, else quoted (strconv.Quote) when it has a
//     space, a double quote, '=', or a character above; "-" when empty.
//   - lineValue: a value that is a whole line (elect): as is, unless it has
//     a character above, leading or trailing white space, or begins with a
//     double quote or "client_id=" (which a leader without a value prints):
//     then quoted. One value is always one line, and a line that begins
//     with '"' reads back with strconv.Unquote.
//   - safe: prose (error messages and what they echo): the characters
//     above escaped in place, nothing quoted.

// unsafeRune reports a rune a terminal would act on or hide: C0 and C1
// controls, DEL, and anything not printable (format characters such as
// bidi overrides, unassigned code points, invalid UTF-8).
func unsafeRune(r rune) bool {
	return r != ' ' && !unicode.IsPrint(r)
}

// safe escapes s's unsafe characters in place, as %q would.
func safe(s string) string {
	if !hasUnsafe(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			q := strconv.Quote(s[i : i+1]) // "\xff"
			b.WriteString(q[1 : len(q)-1])
		case unsafeRune(r):
			q := strconv.QuoteRune(r) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// safeText is safe for text of several lines: each line's unsafe
// characters are escaped, the newlines between them kept. It is the last
// guard of what lockctl prints; the strings in it are escaped when they
// are put in (a newline inside one would otherwise pass here).
func safeText(s string) string {
	if !hasUnsafe(strings.ReplaceAll(s, "\n", "")) {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = safe(l)
	}
	return strings.Join(lines, "\n")
}

func hasUnsafe(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || unsafeRune(r) {
			return true
		}
		i += n
	}
	return false
}

// textValue shows a stored string (a value, a client id, a lock name) as
// one field of a key=value line: as it is when it has no spaces, quotes,
// '=' or unsafe characters, else quoted; "-" when empty.
func textValue(v string) string {
	if v == "" {
		return "-"
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r == ' ' || r == '"' || r == '=' || unsafeRune(r) }) {
		return strconv.Quote(v)
	}
	return v
}

// lineValue shows a stored string that is a whole line of output (an
// election's value): as it is, or quoted when it has unsafe characters,
// leading or trailing white space, or begins with a double quote or with
// "client_id=" (the line of a leader without a value).
func lineValue(v string) string {
	if !utf8.ValidString(v) || hasUnsafe(v) || strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "client_id=") ||
		strings.TrimSpace(v) != v {
		return strconv.Quote(v)
	}
	return v
}
