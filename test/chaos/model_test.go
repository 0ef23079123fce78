package chaos

import (
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// lockState is the model's view of one lock. Every field is comparable, so
// porcupine can compare and cache states.
type lockState struct {
	Held   bool
	Client string
	// Token is 0 when the grant was made by an acquire whose reply was lost:
	// the next op that shows the token fixes it.
	Token uint64
	// Bound: the grant does not end on its own (TTL, session) before this
	// history time. 0: it may end at any moment.
	Bound int64
	// MaxTok is the highest token this lock is known to have had.
	MaxTok uint64
	// Released lists ";client/token" of releases that took effect: a
	// retried release of one of them is answered "released" again.
	Released string
	// After: a grant ended on its own (TTL, session) in this linearization,
	// which happened no earlier than that grant's Bound; every op placed
	// after it took effect later still, so its reply cannot come before
	// After. Without this, an expiry placed before an op whose outcome is
	// unknown (Return +inf) could serve every later op, however early.
	After int64
}

func (s lockState) String() string {
	after := ""
	if s.After > 0 {
		after = ", later ops return ≥" + ms(s.After)
	}
	if !s.Held {
		return fmt.Sprintf("free (max token %d%s)", s.MaxTok, after)
	}
	tok := "?"
	if s.Token != 0 {
		tok = strconv.FormatUint(s.Token, 10)
	}
	return fmt.Sprintf("held by %s token %s until ≥%s (max token %d%s)", s.Client, tok, ms(s.Bound), s.MaxTok, after)
}

// learn fixes an unknown token, or checks a known one.
func (s lockState) learn(tok uint64) (lockState, bool) {
	switch {
	case s.Token == tok:
		return s, true
	case s.Token == 0 && tok > s.MaxTok:
		s.Token, s.MaxTok = tok, tok
		return s, true
	}
	return s, false
}

func (s lockState) grantTo(client string, tok uint64, bound int64) lockState {
	s.Held, s.Client, s.Token, s.Bound = true, client, tok, bound
	s.MaxTok = max(s.MaxTok, tok)
	return s
}

func (s lockState) free() lockState {
	s.Held, s.Client, s.Token, s.Bound = false, "", 0, 0
	return s
}

func releaseKey(client string, tok uint64) string {
	return ";" + client + "/" + strconv.FormatUint(tok, 10)
}

func (s lockState) hasReleased(client string, tok uint64) bool {
	return strings.Contains(s.Released+";", releaseKey(client, tok)+";")
}

// holds reports whether the op's client holds the op's token in s (an
// unknown token counts if the op's token could be it).
func (s lockState) holds(op Op) bool {
	return s.Held && s.Client == op.ClientID && (s.Token == op.Token || s.Token == 0 && op.Token > s.MaxTok)
}

// step returns every state the lock can be in after op, from state s. Time
// only enters through expiry: before any op, a grant whose Bound has passed
// by the op's reply may have ended on its own (a TTL, a session). For an op
// whose outcome is unknown, Return is +inf; the expiry then happened at or
// after Bound, which every later op's reply must not precede (After).
func step(s lockState, op Op) []lockState {
	if op.Return < s.After {
		return nil // it returned before an expiry placed ahead of it could happen
	}
	pre := []lockState{s}
	if s.Held && s.Bound <= op.Return {
		q := s.free()
		q.After = max(q.After, s.Bound)
		pre = append(pre, q)
	}
	var out []lockState
	for _, p := range pre {
		out = append(out, apply(p, op)...)
	}
	return out
}

func apply(p lockState, op Op) []lockState {
	definite := op.Outcome == Ok || op.Outcome == Fail
	switch op.Kind {
	case KindRead:
		if !op.Held {
			if p.Held {
				return nil
			}
			return []lockState{p}
		}
		if !p.Held || p.Client != op.Holder {
			return nil
		}
		if q, ok := p.learn(op.OutToken); ok {
			return []lockState{q}
		}
		return nil

	case KindAcquire:
		switch {
		case op.Outcome == Ok:
			if p.Held {
				if p.Client != op.ClientID {
					return nil
				}
				// The holder asked again: same grant, expiry refreshed.
				q, ok := p.learn(op.OutToken)
				if !ok {
					return nil
				}
				q.Bound = max(q.Bound, op.ExpiryLB)
				return []lockState{q}
			}
			if op.OutToken <= p.MaxTok {
				return nil
			}
			return []lockState{p.grantTo(op.ClientID, op.OutToken, op.ExpiryLB)}
		case definite && op.Code == "lock_held":
			if !p.Held || p.Client == op.ClientID || op.Holder != "" && op.Holder != p.Client {
				return nil
			}
			return []lockState{p}
		case definite && (op.Code == "wait_timeout" || op.Code == "cancelled"):
			// The wait ended ungranted (timed out, or withdrawn by a
			// cancel): at that moment the client was a waiter, not the
			// holder.
			if p.Held && p.Client == op.ClientID {
				return nil
			}
			return []lockState{p}
		default: // unknown: no effect, or a grant whose token we did not see
			out := []lockState{p}
			switch {
			case !p.Held:
				out = append(out, p.grantTo(op.ClientID, 0, op.ExpiryLB))
			case p.Client == op.ClientID:
				q := p
				q.Bound = max(q.Bound, op.ExpiryLB)
				out = append(out, q)
			}
			return out
		}

	case KindRelease:
		released := func() lockState {
			q := p.free()
			q.MaxTok = max(q.MaxTok, op.Token)
			q.Released += releaseKey(op.ClientID, op.Token)
			return q
		}
		switch {
		case op.Outcome == Ok:
			var out []lockState
			if p.holds(op) {
				out = append(out, released())
			}
			if p.hasReleased(op.ClientID, op.Token) {
				out = append(out, p) // a retry of a release that took effect
			}
			return out
		case definite && op.Code == "not_holder":
			if p.Held && p.Client == op.ClientID && p.Token == op.Token {
				return nil
			}
			return []lockState{p}
		default:
			out := []lockState{p}
			if p.holds(op) {
				out = append(out, released())
			}
			return out
		}

	case KindRenew:
		renewed := func() lockState {
			q := p
			q.Token = op.Token
			q.MaxTok = max(q.MaxTok, op.Token)
			q.Bound = max(q.Bound, op.ExpiryLB)
			return q
		}
		switch {
		case op.Outcome == Ok:
			if !p.holds(op) {
				return nil
			}
			return []lockState{renewed()}
		case definite && op.Code == "not_holder":
			if p.Held && p.Client == op.ClientID && p.Token == op.Token {
				return nil
			}
			return []lockState{p}
		default:
			out := []lockState{p}
			if p.holds(op) {
				out = append(out, renewed())
			}
			return out
		}
	}
	return nil
}

// lockModel is the porcupine model of one lock, partitioned by lock name:
// locks are independent (SPEC semantics 3).
func lockModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			idx := map[string]int{}
			var parts [][]porcupine.Operation
			for _, op := range history {
				name := op.Input.(Op).Lock
				i, ok := idx[name]
				if !ok {
					i = len(parts)
					idx[name] = i
					parts = append(parts, nil)
				}
				parts[i] = append(parts[i], op)
			}
			return parts
		},
		Init: func() []any { return []any{lockState{}} },
		Step: func(state, input, _ any) []any {
			next := step(state.(lockState), input.(Op))
			out := make([]any, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Hash: func(state any) uint64 {
			s := state.(lockState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%t|%s|%d|%d|%d|%s|%d", s.Held, s.Client, s.Token, s.Bound, s.MaxTok, s.Released, s.After)
			return h.Sum64()
		},
		DescribeOperation: func(input, _ any) string { return input.(Op).String() },
		DescribeState:     func(state any) string { return state.(lockState).String() },
	}
	return nm.ToModel()
}

// modelOutcome maps an op to what the model may assume about it. Refusals
// with a SPEC code are definite; "fail" without a code means nothing was
// sent (dropped from the history); any other reply (500, a stray status)
// may have come after the command was proposed, so it counts as unknown.
func modelOutcome(op Op) (Outcome, bool) {
	switch {
	case op.Outcome == Ok, op.Outcome == Unknown:
		return op.Outcome, true
	case op.Code == "lock_held", op.Code == "wait_timeout", op.Code == "not_holder", op.Code == "limit_mismatch", op.Code == "cancelled":
		return Fail, true
	case op.Code == "", op.Code == "overloaded", op.Code == "resource_exhausted":
		// Not sent, or refused before anything was proposed (admission
		// control, a quota): no effect.
		return Fail, false
	}
	return Unknown, true
}

// porcupineOps turns the lock ops of a history into porcupine operations.
// An op with an unknown outcome may take effect at any time after it was
// sent: its return is put after the end of the history.
func porcupineOps(h History) []porcupine.Operation {
	var end int64
	for _, op := range h.Ops {
		end = max(end, op.Return)
	}
	workers := map[string]int{}
	var out []porcupine.Operation
	for _, op := range h.Ops {
		if isKind(op.Lock) {
			// Lock kinds are checked by checkKinds, not by this model of
			// an exclusive lock (see there why).
			continue
		}
		switch op.Kind {
		case KindAcquire, KindRelease, KindRenew:
		case KindRead:
			if op.Outcome != Ok {
				continue // a read that failed tells nothing and changed nothing
			}
		default:
			continue
		}
		oc, keep := modelOutcome(op)
		if !keep {
			continue
		}
		op.Outcome = oc
		ret := op.Return
		if oc == Unknown {
			ret = end + 1
			op.Return = math.MaxInt64
		}
		if ret <= op.Invoke {
			ret = op.Invoke + 1
		}
		w, ok := workers[op.Worker]
		if !ok {
			w = len(workers)
			workers[op.Worker] = w
		}
		out = append(out, porcupine.Operation{ClientId: w, Input: op, Call: op.Invoke, Output: op, Return: ret, Metadata: op.ID})
	}
	return out
}
