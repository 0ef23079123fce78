package locktable_test

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	lt "github.com/lockd/lockd/internal/locktable"
)

// maxDecodedString is the decoder's per-string bound (codec.go maxString).
const maxDecodedString = 1 << 16

// TestValidateAgreesWithDecoder: Validate accepts a command exactly when
// its encoding decodes back to it. Encode writes anything; a committed entry
// that does not decode panics every member on every restart, so the
// proposer relies on Validate to refuse what the decoder would.
func TestValidateAgreesWithDecoder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawCommand(t, "c", true)
		verr := c.Validate()
		got, derr := lt.DecodeCommand(c.Encode())
		switch {
		case verr == nil && derr != nil:
			t.Fatalf("Validate accepted a command that does not decode: %v", derr)
		case verr == nil && !commandsEqual(got, c):
			t.Fatalf("Validate accepted a command that decodes differently:\n got  %s\n want %s", brief(got), brief(c))
		case verr != nil && derr == nil:
			t.Fatalf("Validate refused a command that decodes: %v", verr)
		case verr != nil && !errors.Is(verr, lt.ErrInvalidCommand):
			t.Fatalf("error %v does not wrap ErrInvalidCommand", verr)
		}
	})
}

// TestValidateCoversEveryStringField sets each string field of Command, in
// turn, one byte over the decoder's bound: Validate must refuse each. A field
// added to Command without a check in Validate fails here.
func TestValidateCoversEveryStringField(t *testing.T) {
	typ := reflect.TypeOf(lt.Command{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		long := strings.Repeat("x", maxDecodedString+1)
		c := lt.Command{Op: lt.OpAcquire}
		v := reflect.ValueOf(&c).Elem().Field(i)
		switch {
		case f.Type.Kind() == reflect.String:
			v.SetString(long)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.String:
			v.Set(reflect.ValueOf([]string{long}).Convert(f.Type))
		default:
			continue
		}
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepts a %d-byte %s", len(long), f.Name)
		}
		if _, err := lt.DecodeCommand(c.Encode()); err == nil {
			t.Errorf("%s of %d bytes decodes; the bound moved: update Validate and this test", f.Name, len(long))
		}
		v.SetZero()
	}
	// The poison pill of the add-member endpoint: 65,000 bytes of 0xFF in a
	// JSON string decode to about 190 KB of U+FFFD.
	c := lt.Command{Op: lt.OpSetMember, MemberID: "n9", RaftAddr: "127.0.0.1:7071",
		HTTPAddr: strings.Repeat("\uFFFD", 65000)}
	if err := c.Validate(); err == nil {
		t.Fatal("Validate accepts a 195 KB http_addr")
	}
}

func TestValidateBatches(t *testing.T) {
	one := rmMember("x", 0)
	many := func(n int) []lt.Command {
		b := make([]lt.Command, n)
		for i := range b {
			b[i] = one
		}
		return b
	}
	for _, tc := range []struct {
		name string
		c    lt.Command
		ok   bool
	}{
		{"batch of 4096", lt.Command{Op: lt.OpBatch, Batch: many(4096)}, true},
		{"batch of 4097", lt.Command{Op: lt.OpBatch, Batch: many(4097)}, false},
		{"nested batch", lt.Command{Op: lt.OpBatch, Batch: []lt.Command{{Op: lt.OpBatch, Batch: many(1)}}}, false},
		{"empty nested batch", lt.Command{Op: lt.OpBatch, Batch: []lt.Command{{Op: lt.OpBatch}}}, true},
		{"batch on another op", lt.Command{Op: lt.OpAcquire, Batch: many(1)}, false},
		{"long string inside a batch", lt.Command{Op: lt.OpBatch, Batch: []lt.Command{
			acq(strings.Repeat("a", maxDecodedString+1), "c", 1000, 0, t0)}}, false},
		{"longest string", lt.Command{Op: lt.OpSetMember, MemberID: strings.Repeat("m", maxDecodedString)}, true},
		{"unknown op", lt.Command{Op: 0}, false},
		{"op beyond the known", lt.Command{Op: 200}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate: %v, want ok=%v", err, tc.ok)
			}
			_, derr := lt.DecodeCommand(tc.c.Encode())
			if (derr == nil) != tc.ok {
				t.Fatalf("DecodeCommand: %v, want ok=%v (Validate and the decoder disagree)", derr, tc.ok)
			}
		})
	}
}

// drawCommand draws a command of any op (unknown ones too), with strings
// that are usually short and sometimes right at the decoder's bound, and
// (top level only) sometimes a batch.
func drawCommand(t *rapid.T, label string, top bool) lt.Command {
	c := lt.Command{
		Op:        lt.Op(rapid.IntRange(0, 13).Draw(t, label+".op")),
		Now:       rapid.Int64().Draw(t, label+".now"),
		Lock:      drawString(t, label+".lock"),
		ClientID:  drawString(t, label+".client"),
		SessionID: drawString(t, label+".session"),
		Token:     rapid.Uint64().Draw(t, label+".token"),
		TTLms:     rapid.Int64().Draw(t, label+".ttl"),
		WaitMs:    rapid.Int64().Draw(t, label+".wait"),
		MemberID:  drawString(t, label+".member"),
		RaftAddr:  drawString(t, label+".raft"),
		HTTPAddr:  drawString(t, label+".http"),
	}
	switch n := rapid.IntRange(0, 9).Draw(t, label+".batchKind"); {
	case n < 6:
	case n < 8 || !top: // a few commands, nested ones when drawn below the top
		k := rapid.IntRange(1, 3).Draw(t, label+".batchLen")
		for i := 0; i < k; i++ {
			c.Batch = append(c.Batch, drawCommand(t, label+".sub", false))
		}
	default: // around the batch bound
		k := rapid.SampledFrom([]int{4095, 4096, 4097}).Draw(t, label+".bigBatch")
		c.Batch = make([]lt.Command, k)
		for i := range c.Batch {
			c.Batch[i] = rmMember("x", 0)
		}
	}
	return c
}

func drawString(t *rapid.T, label string) string {
	switch rapid.IntRange(0, 9).Draw(t, label+".kind") {
	case 0:
		n := rapid.IntRange(maxDecodedString-1, maxDecodedString+1).Draw(t, label+".len")
		return strings.Repeat("\xff", n)
	case 1, 2, 3:
		return ""
	default:
		return rapid.StringN(0, 16, -1).Draw(t, label)
	}
}

// brief prints a command without its long strings.
func brief(c lt.Command) string {
	s := func(v string) string {
		if len(v) > 32 {
			return v[:8] + "...(" + strconv.Itoa(len(v)) + " bytes)"
		}
		return v
	}
	return c.Op.String() + " lock=" + s(c.Lock) + " client=" + s(c.ClientID) + " session=" + s(c.SessionID) +
		" member=" + s(c.MemberID) + " raft=" + s(c.RaftAddr) + " http=" + s(c.HTTPAddr) +
		" batch=" + strconv.Itoa(len(c.Batch))
}
