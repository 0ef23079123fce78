// Package admission decides, before a request costs memory or a log
// entry, whether this member can commit it soon (SPEC 15). Work above what
// the cluster commits is refused early with a delay to retry after, instead
// of queueing until the leader's memory and scheduler drown in it (a burst
// of 100k waits made a leader grow by gigabytes and miss its heartbeats).
//
// The limit follows measurement, not a guessed constant: the controller
// counts the proposals it admitted that have not returned and measures the
// rate at which they return (commit), and admits new work only while what
// is outstanding would commit within the target delay at that rate
// (Little's law: outstanding = rate × delay). When the cluster commits
// faster, the limit grows with it; when the disk or the network slows, it
// shrinks, and the queueing delay of what is admitted stays near the
// target.
//
// Three classes, so that overload never costs a promise already made:
//   - Keep: work that keeps a promise (release, renew, value, cancel, a
//     session's end). It may use KeepFactor times the limit, so it is
//     admitted while new work is refused.
//   - Acquire: work that asks for a new promise (acquire, a session). Also
//     bounded per client and per token (Budget), so one client cannot take
//     the whole member: 429 resource_exhausted.
//   - Read: linearizable reads and watch starts, bounded by count.
//
// Keepalives are not admitted here: they are not proposals (a batched
// leadership confirmation answers thousands at once) and refusing one
// could cost a session.
package admission

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Class is a kind of work.
type Class uint8

// The classes.
const (
	Keep    Class = iota // keeps a promise: release, renew, value, cancel, session end
	Acquire              // asks for a new promise: acquire, session
	Read                 // linearizable read, list, watch start
)

func (c Class) String() string {
	switch c {
	case Keep:
		return "keep"
	case Acquire:
		return "acquire"
	default:
		return "read"
	}
}

// Refusal codes, as the API names them.
const (
	CodeOverloaded        = "overloaded"         // the member as a whole (503)
	CodeResourceExhausted = "resource_exhausted" // one client's or token's budget (429)
)

// Refusal says why work was refused and when to retry.
type Refusal struct {
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (r *Refusal) Error() string { return r.Code + ": " + r.Message }

// Config bounds admission. Zero values take the defaults.
type Config struct {
	// Target is the queueing delay new work may expect before it commits:
	// the limit is the measured commit rate times Target. Default 200ms.
	Target time.Duration
	// MinLimit and MaxLimit bound the limit of outstanding proposals
	// (default 256, one full log entry; and 8192).
	MinLimit, MaxLimit int
	// KeepFactor: work that keeps a promise may use this many times the
	// limit. Default 4.
	KeepFactor int
	// MaxReads bounds linearizable reads and watch starts in progress.
	// Default 1024.
	MaxReads int
	// ClientShare and TokenShare are the shares of the limit one client id
	// and one token may hold of new work (0: the default, 0.25 and 0.5; a
	// negative value turns the budget off).
	ClientShare, TokenShare float64
	// Now is the clock (tests).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Target <= 0 {
		c.Target = 200 * time.Millisecond
	}
	if c.MinLimit <= 0 {
		c.MinLimit = 256
	}
	if c.MaxLimit < c.MinLimit {
		c.MaxLimit = max(8192, c.MinLimit)
	}
	if c.KeepFactor <= 0 {
		c.KeepFactor = 4
	}
	if c.MaxReads <= 0 {
		c.MaxReads = 1024
	}
	if c.ClientShare == 0 {
		c.ClientShare = 0.25
	}
	if c.TokenShare == 0 {
		c.TokenShare = 0.5
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// rateWindow is how often the commit rate is re-estimated; halfLife how
// fast the estimate forgets.
const (
	rateWindow = 100 * time.Millisecond
	halfLife   = 500 * time.Millisecond
)

// Controller admits work. It is safe for concurrent use.
type Controller struct {
	cfg Config

	mu       sync.Mutex
	writes   int // Keep and Acquire tickets outstanding
	reads    int
	byClient map[string]int // Acquire tickets outstanding per client id
	byToken  map[string]int // per token (owner identity)
	// The commit rate: completions counted in the current window, folded
	// into an exponentially weighted rate when the window ends.
	windowStart time.Time
	completed   int
	rate        float64 // proposals returned per second
	refused     map[string]uint64
}

// New returns a controller.
func New(cfg Config) *Controller {
	cfg.defaults()
	return &Controller{cfg: cfg, byClient: map[string]int{}, byToken: map[string]int{},
		windowStart: cfg.Now(), refused: map[string]uint64{}}
}

// Ticket is admitted work; Done releases it once its proposal returned.
type Ticket struct {
	c             *Controller
	class         Class
	client, token string
}

// Admit admits one unit of work of class for client (its client id) and
// token (the auth identity's name; "" with auth off), or refuses it.
func (c *Controller) Admit(class Class, client, token string) (*Ticket, *Refusal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	c.roll(now)
	limit := c.limitLocked()
	switch class {
	case Read:
		if c.reads >= c.cfg.MaxReads {
			return nil, c.refuse(class, CodeOverloaded, fmt.Sprintf("this member has %d reads in progress, its limit", c.reads), c.drainLocked())
		}
		c.reads++
	case Keep:
		if c.writes >= limit*c.cfg.KeepFactor {
			return nil, c.refuse(class, CodeOverloaded, fmt.Sprintf("this member has %d proposals outstanding, %d times what it commits in %s", c.writes, c.cfg.KeepFactor, c.cfg.Target), c.drainLocked())
		}
		c.writes++
	default:
		if c.writes >= limit {
			return nil, c.refuse(class, CodeOverloaded, fmt.Sprintf("this member has %d proposals outstanding, what it commits in %s; new work waits", c.writes, c.cfg.Target), c.drainLocked())
		}
		if share := c.cfg.ClientShare; share > 0 && client != "" && float64(c.byClient[client]) >= math.Max(16, share*float64(limit)) {
			return nil, c.refuse(class, CodeResourceExhausted, fmt.Sprintf("client %q has %d acquires in flight, its share of this member", client, c.byClient[client]), c.drainLocked())
		}
		if share := c.cfg.TokenShare; share > 0 && token != "" && float64(c.byToken[token]) >= math.Max(16, share*float64(limit)) {
			return nil, c.refuse(class, CodeResourceExhausted, fmt.Sprintf("token %q has %d acquires in flight, its share of this member", token, c.byToken[token]), c.drainLocked())
		}
		c.writes++
		if client != "" {
			c.byClient[client]++
		}
		if token != "" {
			c.byToken[token]++
		}
	}
	return &Ticket{c: c, class: class, client: client, token: token}, nil
}

// Done releases the ticket: its proposal returned (committed, failed or
// abandoned) or its read finished. Calling it twice is harmless.
func (t *Ticket) Done() {
	if t == nil || t.c == nil {
		return
	}
	c := t.c
	t.c = nil
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roll(c.cfg.Now())
	switch t.class {
	case Read:
		c.reads--
		return
	case Acquire:
		if t.client != "" {
			if c.byClient[t.client]--; c.byClient[t.client] <= 0 {
				delete(c.byClient, t.client)
			}
		}
		if t.token != "" {
			if c.byToken[t.token]--; c.byToken[t.token] <= 0 {
				delete(c.byToken, t.token)
			}
		}
	}
	c.writes--
	c.completed++
}

// roll folds finished windows into the rate.
func (c *Controller) roll(now time.Time) {
	elapsed := now.Sub(c.windowStart)
	if elapsed < rateWindow {
		return
	}
	inst := float64(c.completed) / elapsed.Seconds()
	// Weight the new window by its length against the half-life, so a long
	// idle gap forgets the old rate and a busy stream of short windows
	// moves it smoothly.
	w := 1 - math.Exp2(-elapsed.Seconds()/halfLife.Seconds())
	c.rate += w * (inst - c.rate)
	c.completed, c.windowStart = 0, now
}

// limitLocked is how many proposals may be outstanding: what commits in
// Target at the measured rate, within [MinLimit, MaxLimit].
func (c *Controller) limitLocked() int {
	l := int(c.rate * c.cfg.Target.Seconds())
	return min(max(l, c.cfg.MinLimit), c.cfg.MaxLimit)
}

// drainLocked estimates when what is outstanding will have committed: the
// delay a refused client should wait.
func (c *Controller) drainLocked() time.Duration {
	rate := math.Max(c.rate, float64(c.cfg.MinLimit)/c.cfg.Target.Seconds()/4)
	d := time.Duration(float64(c.writes) / rate * float64(time.Second))
	return min(max(d, 100*time.Millisecond), 10*time.Second)
}

func (c *Controller) refuse(class Class, code, msg string, retry time.Duration) *Refusal {
	c.refused[code+"/"+class.String()]++
	return &Refusal{Code: code, Message: msg + "; retry after " + retry.Round(time.Millisecond).String(), RetryAfter: retry}
}

// Stats is what the controller measures, for metrics and tests.
type Stats struct {
	Outstanding int     // proposals admitted and not returned
	Reads       int     // reads in progress
	Limit       int     // outstanding proposals new work may join
	Rate        float64 // proposals returned per second (estimate)
	// Refused counts refusals by "code/class".
	Refused map[string]uint64
}

// Stats returns a snapshot.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roll(c.cfg.Now())
	r := make(map[string]uint64, len(c.refused))
	for k, v := range c.refused {
		r[k] = v
	}
	return Stats{Outstanding: c.writes, Reads: c.reads, Limit: c.limitLocked(), Rate: c.rate, Refused: r}
}
