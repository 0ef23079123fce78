package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/lockd/lockd/api"
)

// recheck runs after the session was resumed on cs (a reconnect, possibly
// to a new leader). While the client was away, a "lost" push, or the answer
// to a release or renew, may have gone by unheard; so it asks the leader
// about each lock it believes it holds. A lock this client no longer holds
// with its token is lost (ErrNotHolder). A TTL lock whose expiry the leader
// reports earlier than the client knew (a renew whose answer was lost cut
// the TTL) has its local lease moved earlier by as much: both expiries are
// the server's own timestamps, so their difference holds whatever the
// clocks. Locks are checked one at a time, in name order, with
// linearizable status reads, for at most the session's TTL. A shared lock
// or a semaphore has several holders: the client looks for its own grant
// among them. A lock of an AcquireMany found lost takes the others of its
// call with it (see Lock.Lost).
func (c *Client) recheck(cs *wsConn) {
	c.mu.Lock()
	var ls []*Lock
	for _, l := range c.locks {
		if l.sess == cs.sess && l.err == nil {
			ls = append(ls, l)
		}
	}
	ttl := cs.sess.ttl
	c.mu.Unlock()
	slices.SortFunc(ls, func(a, b *Lock) int { return strings.Compare(a.name, b.name) })
	ctx, cancel := context.WithTimeout(c.ctx, ttl)
	defer cancel()
	for _, l := range ls {
		if l.Err() != nil {
			continue // lost meanwhile (with another lock of its AcquireMany, say)
		}
		if err := c.recheckLock(ctx, l); err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("lockd: could not check a lock after resuming the session", "lock", l.name, "token", l.token, "err", err)
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// holderWire is one holder in a lock status.
type holderWire struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	ExpiresAt    string `json:"expires_at"`
}

// statusWire is what recheck reads of a lock status: the "holders" list
// when the server sends one (shared locks and semaphores have several
// holders), else the single holder of the older fields.
type statusWire struct {
	Held bool `json:"held"`
	holderWire
	Holders      []holderWire `json:"holders"`
	HoldersTotal int          `json:"holders_total"`
}

func (c *Client) recheckLock(ctx context.Context, l *Lock) error {
	c.mu.Lock()
	known := l.expiresAt
	c.mu.Unlock()
	var st statusWire
	err := c.api.do(ctx, http.MethodGet, lockPath(l.name, ""), nil, &st)
	var se *ServerError
	if errors.As(err, &se) && se.API.Code == api.CodeNotFound {
		st, err = statusWire{}, nil // no state at all: free
	}
	if err != nil {
		return err
	}
	hs := st.Holders
	if len(hs) == 0 && st.Held {
		hs = []holderWire{st.holderWire}
	}
	var h *holderWire
	for i := range hs {
		if hs[i].ClientID == c.cfg.ClientID && hs[i].FencingToken == l.token {
			h = &hs[i]
		}
	}
	if h == nil && st.HoldersTotal > len(st.Holders) && l.token > 0 {
		// A status lists the 64 lowest tokens; a grant of a bigger
		// semaphore is found on the holders page that starts at it.
		var page struct {
			Holders []holderWire `json:"holders"`
		}
		q := "?limit=1&after=" + strconv.FormatUint(l.token-1, 10)
		if err := c.api.do(ctx, http.MethodGet, lockPath(l.name, "holders")+q, nil, &page); err != nil {
			return err
		}
		if len(page.Holders) == 1 && page.Holders[0].ClientID == c.cfg.ClientID && page.Holders[0].FencingToken == l.token {
			h = &page.Holders[0]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.err != nil {
		return nil
	}
	if h == nil {
		c.log.Warn("lockd: a lock was lost while disconnected", "lock", l.name, "token", l.token)
		l.loseLocked(fmt.Errorf("%w: lock %q token %d is not held by this client any more (checked after the session resumed)", ErrNotHolder, l.name, l.token))
		return nil
	}
	exp, err := api.ParseTime(h.ExpiresAt)
	if err == nil && l.ttl == 0 && !exp.IsZero() {
		// A TTL this client never set (another client with the same ID
		// renewed it): nothing tells when it was counted from.
		l.loseLocked(fmt.Errorf("%w: lock %q token %d has a TTL on the server that this client did not set, so its lease is unknown", ErrLeaseExpired, l.name, l.token))
		return nil
	}
	// Only against the expiry known when the read was sent: a renew
	// answered meanwhile has moved both.
	if err == nil && l.ttl > 0 && !exp.IsZero() && !known.IsZero() && l.expiresAt.Equal(known) && exp.Before(known) {
		l.deadline = l.deadline.Add(exp.Sub(known))
		l.expiresAt = exp
		c.kickLease()
	}
	return nil
}
