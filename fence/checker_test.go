package fence

import (
	"errors"
	"sync"
	"testing"
)

func TestCheckerCheck(t *testing.T) {
	c := NewChecker(nil)
	steps := []struct {
		key     string
		token   uint64
		highest uint64 // 0: want admitted
	}{
		{"a", 5, 0},
		{"a", 5, 0}, // equal: same holder writing again
		{"a", 6, 0},
		{"a", 5, 6},
		{"b", 1, 0}, // keys are independent
		{"a", 7, 0},
	}
	for _, s := range steps {
		err := c.Check(s.key, Write{Token: s.token})
		if s.highest == 0 {
			if err != nil {
				t.Fatalf("Check(%s, %d) = %v, want admitted", s.key, s.token, err)
			}
			continue
		}
		wantStale(t, err, s.highest)
	}
	if h, _ := c.Highest("a"); h != 7 {
		t.Fatalf("Highest(a) = %d, want 7", h)
	}
}

func TestCheckerDo(t *testing.T) {
	c := NewChecker(nil)
	ran := false
	if err := c.Do("k", Write{Token: 3}, func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do(3) = %v, ran %v", err, ran)
	}
	ran = false
	err := c.Do("k", Write{Token: 2}, func() error { ran = true; return nil })
	wantStale(t, err, 3)
	if ran {
		t.Fatal("fn ran for a stale token")
	}
	boom := errors.New("boom")
	if err := c.Do("k", Write{Token: 4}, func() error { return boom }); err != boom {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if h, _ := c.Highest("k"); h != 4 {
		t.Fatalf("a failed fn still admitted its token: Highest = %d, want 4", h)
	}
	if len(c.locks.m) != 0 {
		t.Fatalf("key locks left behind: %d", len(c.locks.m))
	}
}

// TestCheckerDoOrdersWrites: with Do, the writes fn makes land in token
// order however the callers race: the last write is the highest token's.
func TestCheckerDoOrdersWrites(t *testing.T) {
	c := NewChecker(nil)
	for round := 0; round < 50; round++ {
		var (
			mu      sync.Mutex
			applied []uint64
			wg      sync.WaitGroup
		)
		key := "k" + uitoa(uint64(round))
		for tok := uint64(1); tok <= 6; tok++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.Do(key, Write{Token: tok, Lock: "L"}, func() error {
					mu.Lock()
					applied = append(applied, tok)
					mu.Unlock()
					return nil
				})
			}()
		}
		wg.Wait()
		for i := 1; i < len(applied); i++ {
			if applied[i] < applied[i-1] {
				t.Fatalf("round %d: writes applied out of token order: %v", round, applied)
			}
		}
		if applied[len(applied)-1] != 6 {
			t.Fatalf("round %d: last write %v, want token 6", round, applied)
		}
	}
	if len(c.locks.m) != 0 {
		t.Fatalf("key locks left behind: %d", len(c.locks.m))
	}
}
