package admission

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1_700_000_000, 0)} }
func admitN(t *testing.T, c *Controller, class Class, n int, client string) []*Ticket {
	t.Helper()
	var out []*Ticket
	for i := 0; i < n; i++ {
		tk, r := c.Admit(class, fmt.Sprintf("%s%d", client, i), "")
		if r != nil {
			t.Fatalf("%s %d refused: %v", class, i, r)
		}
		out = append(out, tk)
	}
	return out
}

// A quiet member admits MinLimit proposals; beyond, new work is refused
// with a delay, while work that keeps a promise still gets in.
func TestNewWorkRefusedKeepAdmitted(t *testing.T) {
	ck := newClock()
	c := New(Config{Now: ck.now, MinLimit: 100, KeepFactor: 3})
	held := admitN(t, c, Acquire, 100, "c")
	_, r := c.Admit(Acquire, "late", "")
	if r == nil || r.Code != CodeOverloaded || r.RetryAfter <= 0 {
		t.Fatalf("the 101st new proposal: %+v", r)
	}
	keep := admitN(t, c, Keep, 200, "k") // up to 3×100 outstanding
	if _, r := c.Admit(Keep, "k", ""); r == nil || r.Code != CodeOverloaded {
		t.Fatalf("keep beyond KeepFactor×limit: %+v", r)
	}
	for _, tk := range append(held, keep...) {
		tk.Done()
		tk.Done() // twice is harmless
	}
	if st := c.Stats(); st.Outstanding != 0 || st.Refused["overloaded/acquire"] != 1 || st.Refused["overloaded/keep"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, r := c.Admit(Acquire, "again", ""); r != nil {
		t.Fatalf("after the backlog drained: %v", r)
	}
}

// The limit follows the measured commit rate: at 10k commits/s and a 200ms
// target, 2000 proposals may be outstanding; when commits slow, it shrinks.
func TestLimitFollowsCommitRate(t *testing.T) {
	ck := newClock()
	c := New(Config{Now: ck.now, MinLimit: 100, MaxLimit: 100_000, Target: 200 * time.Millisecond})
	// 5 s at 10k/s: 1000 per 100 ms window.
	for w := 0; w < 50; w++ {
		for b := 0; b < 10; b++ {
			for _, tk := range admitN(t, c, Acquire, 100, "c") {
				tk.Done()
			}
		}
		ck.add(100 * time.Millisecond)
	}
	if l := c.Stats().Limit; l < 1800 || l > 2100 {
		t.Fatalf("limit %d at 10k/s, want about 2000", l)
	}
	held := admitN(t, c, Acquire, 1900, "c")
	// Commits slow to 300/s for 3 s.
	for w := 0; w < 30; w++ {
		for i := 0; i < 30; i++ {
			held[0].Done()
			held = held[1:]
		}
		ck.add(100 * time.Millisecond)
	}
	st := c.Stats()
	if st.Limit > 150 || st.Rate > 600 {
		t.Fatalf("limit %d (rate %.0f/s) after commits slowed to 300/s, want the minimum, 100", st.Limit, st.Rate)
	}
	_, r := c.Admit(Acquire, "new", "")
	if r == nil || r.RetryAfter < 2*time.Second {
		t.Fatalf("with 1000 outstanding at 300/s a refusal should ask for about 3 s: %+v", r)
	}
}

// One client, or one token, cannot take the whole member: 429.
func TestBudgets(t *testing.T) {
	ck := newClock()
	c := New(Config{Now: ck.now, MinLimit: 400, ClientShare: 0.25, TokenShare: 0.5})
	for i := 0; i < 100; i++ {
		if _, r := c.Admit(Acquire, "greedy", ""); r != nil {
			t.Fatalf("client's %d: %v", i, r)
		}
	}
	_, r := c.Admit(Acquire, "greedy", "")
	if r == nil || r.Code != CodeResourceExhausted || r.RetryAfter <= 0 {
		t.Fatalf("client past its share: %+v", r)
	}
	if _, r := c.Admit(Acquire, "modest", ""); r != nil {
		t.Fatalf("another client: %v", r)
	}
	for i := 0; i < 200; i++ {
		if _, r := c.Admit(Acquire, fmt.Sprintf("t%d", i), "tenant"); r != nil {
			t.Fatalf("token's %d: %v", i, r)
		}
	}
	if _, r := c.Admit(Acquire, "tx", "tenant"); r == nil || r.Code != CodeResourceExhausted {
		t.Fatalf("token past its share: %+v", r)
	}
	// Work that keeps a promise has no budget.
	if _, r := c.Admit(Keep, "greedy", "tenant"); r != nil {
		t.Fatalf("keep: %v", r)
	}
}

func TestReadsBounded(t *testing.T) {
	c := New(Config{MaxReads: 3})
	ts := admitN(t, c, Read, 3, "r")
	if _, r := c.Admit(Read, "r", ""); r == nil || r.Code != CodeOverloaded {
		t.Fatalf("fourth read: %+v", r)
	}
	ts[0].Done()
	if _, r := c.Admit(Read, "r", ""); r != nil {
		t.Fatal(r)
	}
	// Reads do not count as proposals.
	if st := c.Stats(); st.Outstanding != 0 || st.Reads != 3 {
		t.Fatalf("%+v", st)
	}
}
