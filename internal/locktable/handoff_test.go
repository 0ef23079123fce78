package locktable_test

import (
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

func handOff(lock, client string, releasing uint64, ttl, wait, now int64) lt.Command {
	c := acq(lock, client, ttl, wait, now)
	c.Token = releasing
	return c
}

// A hand-off releases the client's grant and acquires anew in one step:
// with nobody waiting, a new grant with a new token; with others queued,
// they come first and the client queues behind them.
func TestHandOff(t *testing.T) {
	t.Run("nobody waits: a new grant at once", func(t *testing.T) {
		h := newHarness(t)
		g := h.ok(acq("x", "c", 10_000, 0, t0))
		r := h.ok(handOff("x", "c", g.Token, 10_000, 5_000, t0+1))
		if !r.Released || !r.Granted || r.Token <= g.Token {
			t.Fatalf("hand-off: %+v", r)
		}
		if len(r.Events) != 2 || r.Events[0].Kind != lt.EvReleased || r.Events[0].Token != g.Token || r.Events[1].Kind != lt.EvGranted {
			t.Fatalf("events: %+v", r.Events)
		}
		if li := h.tb.Get("x"); li.Token != r.Token || len(li.Holders) != 1 {
			t.Fatalf("after: %+v", li)
		}
	})
	t.Run("others wait: FIFO across clients kept", func(t *testing.T) {
		h := newHarness(t)
		g := h.ok(acq("x", "c", 10_000, 0, t0))
		h.ok(acq("x", "other", 10_000, 60_000, t0+1))
		r := h.ok(handOff("x", "c", g.Token, 10_000, 60_000, t0+2))
		if !r.Released || r.Granted || !r.Queued {
			t.Fatalf("hand-off past a waiter: %+v", r)
		}
		li := h.tb.Get("x")
		ws := h.tb.Waiters("x")
		if li.ClientID != "other" || len(ws) != 1 || ws[0].ClientID != "c" {
			t.Fatalf("the waiter ahead was not served first: %+v, queue %+v", li, ws)
		}
	})
	t.Run("a try behind waiters is refused, the release stands", func(t *testing.T) {
		h := newHarness(t)
		g := h.ok(acq("x", "c", 10_000, 0, t0))
		h.ok(acq("x", "other", 10_000, 60_000, t0+1))
		r := h.do(handOff("x", "c", g.Token, 10_000, 0, t0+2))
		if !r.Released || r.Code != lt.CodeLockHeld || r.Holder != "other" {
			t.Fatalf("try: %+v", r)
		}
	})
	t.Run("a grant already gone: the acquire alone", func(t *testing.T) {
		h := newHarness(t)
		g := h.ok(acq("x", "c", 100, 0, t0))
		h.ok(expLock("x", g.Token, t0+100))
		r := h.ok(handOff("x", "c", g.Token, 10_000, 0, t0+200))
		if r.Released || !r.Granted || r.Token == g.Token {
			t.Fatalf("hand-off of an expired grant: %+v", r)
		}
	})
	t.Run("never a regrant of the released token", func(t *testing.T) {
		h := newHarness(t)
		g := h.ok(acq("x", "c", 10_000, 0, t0))
		r := h.ok(handOff("x", "c", g.Token, 10_000, 0, t0+1))
		// Retried with the token it released: the release is remembered,
		// the acquire finds the client holding the new grant (a retry).
		again := h.ok(handOff("x", "c", g.Token, 10_000, 0, t0+2))
		if !again.Granted || again.Token != r.Token {
			t.Fatalf("retried hand-off: %+v, first %+v", again, r)
		}
	})
	t.Run("another identity cannot release through it", func(t *testing.T) {
		h := newHarness(t)
		a := acq("x", "c", 10_000, 0, t0)
		a.Owner = "tenant-1"
		g := h.ok(a)
		c := handOff("x", "c", g.Token, 10_000, 0, t0+1)
		c.Owner = "tenant-2"
		r := h.do(c)
		if r.Released || r.Code != lt.CodeLockHeld {
			t.Fatalf("another identity's hand-off: %+v", r)
		}
		if li := h.tb.Get("x"); li.Token != g.Token {
			t.Fatalf("the grant changed: %+v", li)
		}
	})
}
