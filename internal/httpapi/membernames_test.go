package httpapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/lockd/lockd/api"
)

// tokenMemberNames is the member-name check written with encoding/json's
// tokenizer: slow, but plainly right. checkMemberNames must agree with it
// on every well-formed object.
func tokenMemberNames(b []byte, fields *fieldSet) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		if _, ok := fields.index[name]; !ok {
			for _, f := range fields.names {
				if strings.EqualFold(f, name) {
					return invalid("unknown field %q (field names are case-sensitive: %q)", name, f)
				}
			}
			return invalid("unknown field %q", name)
		}
		if seen[name] {
			return invalid("field %q is given twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
	}
	return nil
}

var memberNameSeeds = []string{
	`{}`,
	` { "id" : 1 , "op" : "acquire" } `,
	`{"id":1,"op":"acquire","lock":"a","ttl_ms":100}`,
	`{"id":1,"id":2}`,
	`{"ID":1}`,
	`{"Lock":"x"}`,
	`{"nope":1}`,
	`{"\u006cock":"escaped name"}`,
	`{"lock":"a \"quoted\" , } ] name","op":"x"}`,
	`{"locks":["a","b,}"],"op":"acquire","id":3}`,
	`{"value":{"nested":{"id":1,"id":1},"x":[1,{"y":"}"}]},"id":1}`,
	`{"op":null,"id":-1.5e3,"lock":true}`,
	`{"lock":"\\","op":"\\\""}`,
	`{"op":"a","op":"b"}`,
	`[1,2]`,
	`"s"`,
}

func TestCheckMemberNamesAgreesWithTheTokenizer(t *testing.T) {
	fields := jsonFields(reflect.TypeOf(api.WSRequest{}))
	for _, s := range memberNameSeeds {
		got, want := checkMemberNames([]byte(s), fields), tokenMemberNames([]byte(s), fields)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("%s: got %v, want %v", s, got, want)
		}
	}
	// The good thing happens too: the known names pass, a twice-given and
	// an unknown one do not.
	if err := checkMemberNames([]byte(`{"id":1,"op":"acquire","lock":"l"}`), fields); err != nil {
		t.Fatalf("a plain acquire refused: %v", err)
	}
	if err := checkMemberNames([]byte(`{"id":1,"lock":"l","id":2}`), fields); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a twice-given id: %v", err)
	}
	if err := checkMemberNames([]byte(`{"Lock":"l"}`), fields); err == nil || !strings.Contains(err.Error(), "case-sensitive") {
		t.Fatalf("a name in the wrong case: %v", err)
	}
}

func TestCheckMemberNamesAllocatesNothing(t *testing.T) {
	fields := jsonFields(reflect.TypeOf(api.WSRequest{}))
	b := []byte(`{"id":7,"op":"acquire","lock":"orders/17","ttl_ms":30000,"wait_timeout_ms":5000}`)
	if n := testing.AllocsPerRun(100, func() { _ = checkMemberNames(b, fields) }); n != 0 {
		t.Fatalf("%v allocations per accepted frame, want 0", n)
	}
}

func FuzzCheckMemberNames(f *testing.F) {
	for _, s := range memberNameSeeds {
		f.Add(s)
	}
	fields := jsonFields(reflect.TypeOf(api.WSRequest{}))
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		if !json.Valid(b) {
			return // checkMemberNames only sees objects already decoded once
		}
		got, want := checkMemberNames(b, fields), tokenMemberNames(b, fields)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Fatalf("%q: got %v, want %v", s, got, want)
		}
	})
}

func BenchmarkDecodeFrame(b *testing.B) {
	frame := []byte(`{"id":7,"op":"acquire","lock":"orders/17","ttl_ms":30000,"wait_timeout_ms":5000}`)
	b.ReportAllocs()
	for b.Loop() {
		var req api.WSRequest
		if err := decodeJSON("frame", frame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemberNames compares the scan with the tokenizer it replaced.
func BenchmarkMemberNames(b *testing.B) {
	fields := jsonFields(reflect.TypeOf(api.WSRequest{}))
	frame := []byte(`{"id":7,"op":"acquire","lock":"orders/17","ttl_ms":30000,"wait_timeout_ms":5000}`)
	for _, c := range []struct {
		name  string
		check func([]byte, *fieldSet) error
	}{{"scan", checkMemberNames}, {"tokens", tokenMemberNames}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.check(frame, fields); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
