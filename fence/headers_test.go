package fence

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestParseToken(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"42", 42, true},
		{"007", 7, true},
		{"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false}, // overflow
		{"", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"0x10", 0, false},
		{"1_000", 0, false},
		{"1e3", 0, false},
		{"١", 0, false}, // Arabic-Indic digit one
		{"abc", 0, false},
		{strings.Repeat("0", 64) + "", 0, true},
		{strings.Repeat("0", 65), 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseToken(tc.in)
			if !tc.ok {
				var he *HeaderError
				if !errors.Is(err, ErrInvalidHeader) || !errors.As(err, &he) || he.Header != HeaderToken {
					t.Fatalf("ParseToken(%q) = %d, %v; want a HeaderError naming %s", tc.in, got, err, HeaderToken)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseToken(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name      string
		h         http.Header
		want      Headers
		badHeader string // "" when valid
	}{
		{"token only", hdr(HeaderToken, "5"), Headers{Token: 5}, ""},
		{"all three", hdr(HeaderToken, "5", HeaderLock, "jobs/nightly", HeaderProof, "p"),
			Headers{Token: 5, Lock: "jobs/nightly", Proof: "p"}, ""},
		{"header names are case-insensitive", http.Header{"Fencing-Token": {"9"}}, Headers{Token: 9}, ""},
		{"missing token", hdr(HeaderLock, "x"), Headers{}, HeaderToken},
		{"malformed token", hdr(HeaderToken, "five"), Headers{}, HeaderToken},
		{"token twice", hdr(HeaderToken, "5", HeaderToken, "6"), Headers{}, HeaderToken},
		{"empty lock", hdr(HeaderToken, "5", HeaderLock, ""), Headers{}, HeaderLock},
		{"bad lock byte", hdr(HeaderToken, "5", HeaderLock, "a b"), Headers{}, HeaderLock},
		{"lock too long", hdr(HeaderToken, "5", HeaderLock, strings.Repeat("a", 257)), Headers{}, HeaderLock},
		{"lock at limit", hdr(HeaderToken, "5", HeaderLock, strings.Repeat("a", 256)),
			Headers{Token: 5, Lock: strings.Repeat("a", 256)}, ""},
		{"proof twice", hdr(HeaderToken, "5", HeaderProof, "a", HeaderProof, "b"), Headers{}, HeaderProof},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHeaders(tc.h)
			if tc.badHeader != "" {
				var he *HeaderError
				if !errors.As(err, &he) || he.Header != tc.badHeader {
					t.Fatalf("err = %v, want a HeaderError naming %s", err, tc.badHeader)
				}
				if !strings.Contains(err.Error(), tc.badHeader) {
					t.Fatalf("message %q does not name %s", err, tc.badHeader)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseHeaders = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
