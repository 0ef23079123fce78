package locktable

import (
	"fmt"
	"testing"
	"unsafe"
)

// TestIDCacheSharesCopies: a second copy of an id comes back as the first
// (one string in memory), any id comes back equal, and the cache holds at
// most its slots whatever ids pass through it.
func TestIDCacheSharesCopies(t *testing.T) {
	var c idCache
	if c.intern("") != "" {
		t.Fatal("empty id changed")
	}
	first := c.intern(fmt.Sprintf("client-%d", 7))
	second := c.intern(fmt.Sprintf("client-%d", 7))
	if second != first || unsafe.StringData(second) != unsafe.StringData(first) {
		t.Fatal("a second copy of an id was not replaced by the cached one")
	}
	for i := range 3 * idCacheSlots {
		id := fmt.Sprintf("id-%d", i)
		if got := c.intern(id); got != id {
			t.Fatalf("intern(%q) = %q", id, got)
		}
	}
	if len(c.slots) != idCacheSlots {
		t.Fatalf("%d slots", len(c.slots))
	}
}

// TestTableSharesHolderIDs: holders granted by separate commands of one
// client share one copy of its id.
func TestTableSharesHolderIDs(t *testing.T) {
	tb := New()
	for i := range 3 {
		c := Command{Op: OpAcquire, Now: 1, Lock: fmt.Sprintf("l%d", i), ClientID: fmt.Sprintf("c%d", 1), TTLms: 1000}
		if r := tb.Apply(c); r.Code != OK {
			t.Fatal(r.Code)
		}
	}
	a, _ := tb.locks.get("l0")
	b, _ := tb.locks.get("l2")
	if unsafe.StringData(a.Holders[0].ClientID) != unsafe.StringData(b.Holders[0].ClientID) {
		t.Fatal("two holders of one client keep two copies of its id")
	}
}
