package fence

import (
	"strings"
	"testing"
)

// TestGuardsLongestPrefixWins: of the guards whose prefix starts a key, the
// longest decides, whatever order they were given in.
func TestGuardsLongestPrefixWins(t *testing.T) {
	g, err := NewGuards(
		Guard{Prefix: "", Lock: "catch-all"},
		Guard{Prefix: "billing/ledger/eu", Lock: "billing/ledger-eu"},
		Guard{Prefix: "billing/", Lock: "billing/all"},
		Guard{Prefix: "billing/ledger", Lock: "billing/ledger"},
		Guard{Prefix: "billing/", Lock: "billing/all"}, // repeated as is: fine
	)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"billing/ledger":       "billing/ledger",
		"billing/ledger-2024":  "billing/ledger",
		"billing/ledger/eu/de": "billing/ledger-eu",
		"billing/invoices":     "billing/all",
		"billing":              "catch-all",
		"other":                "catch-all",
	} {
		if got := g.Lock(key); got != want {
			t.Errorf("Lock(%q) = %q, want %q", key, got, want)
		}
	}
	if n := len(g.List()); n != 4 {
		t.Fatalf("List has %d guards, want 4", n)
	}
	var none *Guards
	if got := none.Lock("x"); got != "" {
		t.Fatalf("nil Guards guards x with %q", got)
	}
	if g, _ := NewGuards(Guard{Prefix: "a/", Lock: "A"}); g.Lock("b") != "" {
		t.Fatal("a key no guard matches is guarded")
	}
}

func TestNewGuardsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		gs   []Guard
		want string
	}{
		{"one prefix, two locks", []Guard{{"p/", "A"}, {"p/", "B"}}, "two locks"},
		{"empty lock", []Guard{{"p/", ""}}, "empty"},
		{"bad lock name", []Guard{{"p/", "no spaces"}}, "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewGuards(tc.gs...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestParseGuard(t *testing.T) {
	for in, want := range map[string]Guard{
		"ledger=billing/ledger": {"ledger", "billing/ledger"},
		"=everything":           {"", "everything"},
		"a=b=L":                 {"a=b", "L"}, // a lock has no "=": the last one splits
	} {
		if got, err := ParseGuard(in); err != nil || got != want {
			t.Errorf("ParseGuard(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"ledger", "ledger=", "ledger=bad lock", ""} {
		if g, err := ParseGuard(bad); err == nil {
			t.Errorf("ParseGuard(%q) = %+v, want an error", bad, g)
		}
	}
}
