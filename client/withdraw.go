package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/lockd/lockd/api"
)

// Withdrawing a wait whose caller gave up (SPEC 18). A wait left queued
// would be granted later to nobody (until the session ends, for a lock
// bound to it), and an election's candidate would lead for a moment; so
// the client sends a cancel for it. The cancel runs after the acquire on
// the server (one connection, one lock: requests take effect in the order
// they were sent), so exactly one of these happens:
//
//   - the wait was still queued: the cancel withdraws it (cancelled: true;
//     the acquire itself is answered cancelled);
//   - the acquire was already answered (a grant, a refusal) on the same
//     connection: that answer comes, and a grant is released at once;
//   - the acquire went out on an earlier connection, whose answer was lost:
//     the cancel finds nothing, and the client reads the locks' status to
//     release a grant that came while it was away.
//
// If no connection is up, the cancel goes out on the next one. All of this
// is bounded by Config.CloseTimeout; after that the op is given up, and a
// grant that still comes (with no op to answer) is released as unwanted.

// errWithdrawn ends an op whose caller left: nobody reads it.
var errWithdrawn = fmt.Errorf("%w by this client: its caller gave up", ErrCancelled)

// withdrawLocked gives op up for its caller and starts withdrawing its
// wait; it returns the write to do once c.mu is released (nil for none).
func (c *Client) withdrawLocked(op *acquireOp) func() {
	if op.abandoned {
		return nil
	}
	op.abandoned = true
	switch {
	case op.confirming:
		return nil // granted: confirmLease hands it to grantLocked, which releases it
	case op.sends == 0:
		c.finishLocked(op, nil, errWithdrawn) // never sent: nothing is queued
		return nil
	}
	c.goLocked(func() { c.withdrawDeadline(op) })
	cs, f := c.cancelFrameLocked(op)
	if f == nil {
		return nil // no connection now: the next one sends it
	}
	return func() { _ = c.write(cs, f) }
}

// cancelFrameLocked returns the cancel of op's wait for the live
// connection, nil when there is none or it went out on it already.
func (c *Client) cancelFrameLocked(op *acquireOp) (*wsConn, []byte) {
	cs := c.cur
	if cs == nil || op.sess != c.sess || c.sess.lost || (op.cancelID != 0 && op.cancelConn == cs) {
		return nil, nil
	}
	if op.cancelID != 0 {
		delete(c.cancels, op.cancelID)
	}
	op.cancelID, op.cancelConn = c.nextID(), cs
	c.cancels[op.cancelID] = op
	req := api.WSRequest{ID: op.cancelID, Op: api.OpCancel}
	if op.multi() {
		req.Locks = op.names
	} else {
		req.Lock = op.names[0]
	}
	data, _ := json.Marshal(&req)
	return cs, data
}

// onCancelReplyLocked takes the answer to op's cancel.
func (c *Client) onCancelReplyLocked(cs *wsConn, op *acquireOp, m *api.WSMessage) []func() {
	op.cancelID = 0
	select {
	case <-op.done:
		return nil
	default:
	}
	switch {
	case m.Type == api.TypeOK && m.Cancelled != nil && *m.Cancelled:
		c.finishLocked(op, nil, errWithdrawn)
	case m.Type == api.TypeOK:
		if op.conn != cs {
			// Sent on a connection that is gone: a grant may have come
			// while the client was away.
			c.goLocked(func() { c.settleWithdrawn(op) })
		}
		// Else the acquire's own answer comes on cs (a grant is released).
	case m.Type == api.TypeError && m.Error != nil:
		switch m.Error.Code {
		case api.CodeOverloaded:
			d := max(retryAfter(m), c.cfg.MinBackoff)
			c.goLocked(func() {
				if !sleep(c.ctx, d) {
					return
				}
				c.mu.Lock()
				var f []byte
				var cs *wsConn
				if c.ops[op.names[0]] == op && op.cancelID == 0 {
					cs, f = c.cancelFrameLocked(op)
				}
				c.mu.Unlock()
				if f != nil {
					_ = c.write(cs, f)
				}
			})
		case api.CodeNotLeader, api.CodeNoLeader:
			op.cancelConn = nil
			c.killLocked(cs, m.Error.Code) // the next connection sends it again
		case api.CodeSessionExpired:
			c.sessionLostLocked(op.sess, fmt.Errorf("%w: the server ended the session", ErrSessionExpired), false)
		default:
			c.log.Warn("lockd: withdrawing a wait was refused", "locks", op.names, "err", serverError(m.Error, 0))
			c.finishLocked(op, nil, errWithdrawn)
		}
	}
	return nil
}

// settleWithdrawn reads the locks of a withdrawn op whose acquire went out
// on a connection that is gone, and releases a grant this client holds on
// them (none of them is held or awaited by anything else of this client:
// the op is pending under every name until it is settled).
func (c *Client) settleWithdrawn(op *acquireOp) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.CloseTimeout)
	defer cancel()
	bo := newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		held, err := c.heldTokens(ctx, op.names)
		c.mu.Lock()
		select {
		case <-op.done:
			c.mu.Unlock()
			return
		default:
		}
		if err == nil {
			for name, token := range held {
				c.log.Info("lockd: a withdrawn wait was granted while the client was away; releasing it", "lock", name, "token", token)
				c.releaseLaterLocked(&Lock{c: c, name: name, token: token, sess: op.sess, lost: make(chan struct{})})
			}
			c.finishLocked(op, nil, errWithdrawn)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if !sleep(ctx, bo.next()) {
			return // withdrawDeadline gives it up
		}
	}
}

// heldTokens reads names and returns the token of each grant this client
// holds among them.
func (c *Client) heldTokens(ctx context.Context, names []string) (map[string]uint64, error) {
	held := map[string]uint64{}
	for _, name := range names {
		var st statusWire
		err := c.api.do(ctx, http.MethodGet, lockPath(name, ""), nil, &st)
		var se *ServerError
		if errors.As(err, &se) && se.API.Code == api.CodeNotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		hs := st.Holders
		if len(hs) == 0 && st.Held {
			hs = []holderWire{st.holderWire}
		}
		if st.HoldersTotal > len(st.Holders) {
			// A status lists the 64 lowest tokens: read every holder of a
			// bigger semaphore, page by page (a page ends at its limit or
			// at about 1 MiB, whichever comes first).
			hs = nil
			for after := ""; ; {
				var page struct {
					Holders []holderWire `json:"holders"`
					Next    string       `json:"next"`
				}
				path := lockPath(name, "holders") + "?limit=10000"
				if after != "" {
					path += "&after=" + url.QueryEscape(after)
				}
				if err := c.api.do(ctx, http.MethodGet, path, nil, &page); err != nil {
					return nil, err
				}
				hs = append(hs, page.Holders...)
				if after = page.Next; after == "" {
					break
				}
			}
		}
		for _, h := range hs {
			if h.ClientID == c.cfg.ClientID {
				held[name] = h.FencingToken
			}
		}
	}
	return held, nil
}

// withdrawDeadline gives op up once Config.CloseTimeout has passed
// without the withdrawal settling it; a grant that comes later finds no
// op and is released as unwanted.
func (c *Client) withdrawDeadline(op *acquireOp) {
	t := time.NewTimer(c.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-op.done:
		return
	case <-c.ctx.Done():
		return
	case <-t.C:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-op.done:
		return
	default:
	}
	c.log.Warn("lockd: could not settle a withdrawn wait in time; giving it up", "locks", op.names, "timeout", c.cfg.CloseTimeout)
	c.finishLocked(op, nil, errWithdrawn)
}
