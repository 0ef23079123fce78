package lockdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/lockd/lockd/api"
)

// conn is one WebSocket connection to a member.
type conn struct {
	m      *member
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	out    chan api.WSMessage
	sess   *session // guarded by Cluster.mu
	once   sync.Once
	// watches by watch_id; guarded by Cluster.mu
	watches   map[uint64]*fwatch
	nextWatch uint64
}

// pushLocked queues a frame; a connection too slow to take it is dropped.
func (cn *conn) pushLocked(m api.WSMessage) {
	if cn.m.c.partitioned {
		// Lost on the way, decided now: the writer may run only after the
		// partition healed.
		return
	}
	select {
	case cn.out <- m:
	default:
		cn.kill()
	}
}

func (cn *conn) kill() { cn.cancel() }

func (m *member) serveWS(w http.ResponseWriter, r *http.Request) {
	c := m.c
	if !c.track() {
		http.Error(w, "closing", http.StatusServiceUnavailable)
		return
	}
	defer c.wg.Done()
	if !c.hold(r) {
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	c.mu.Lock()
	leader, lurl := c.leader, c.leaderURLLocked()
	c.mu.Unlock()
	if leader != m.idx {
		code := api.CodeNotLeader
		if leader < 0 {
			code = api.CodeNoLeader
		}
		data, _ := json.Marshal(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: code, Message: "this member is not the leader"}, Leader: lurl})
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		_ = ws.Write(ctx, websocket.MessageText, data)
		cancel()
		ws.Close(websocket.StatusTryAgainLater, "not the leader")
		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	cn := &conn{m: m, ws: ws, ctx: ctx, cancel: cancel, out: make(chan api.WSMessage, 1024)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cancel()
		ws.CloseNow()
		return
	}
	m.conns[cn] = struct{}{}
	c.mu.Unlock()

	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		cn.writer()
	}()
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			break
		}
		cn.handle(data)
	}
	cancel()
	wwg.Wait()
	ws.CloseNow()
	c.mu.Lock()
	delete(m.conns, cn)
	if s := cn.sess; s != nil && s.conn == cn {
		s.conn = nil
	}
	c.mu.Unlock()
}

func (cn *conn) writer() {
	c := cn.m.c
	for {
		select {
		case <-cn.ctx.Done():
			return
		case msg := <-cn.out:
			c.mu.Lock()
			drop := c.partitioned
			c.mu.Unlock()
			if drop {
				continue
			}
			data, _ := json.Marshal(msg)
			wctx, cancel := context.WithTimeout(cn.ctx, 2*time.Second)
			err := cn.ws.Write(wctx, websocket.MessageText, data)
			cancel()
			if err != nil {
				cn.kill()
				return
			}
		}
	}
}

func ms(v *int64) time.Duration {
	if v == nil {
		return 0
	}
	return time.Duration(*v) * time.Millisecond
}

// handle runs one client frame.
func (cn *conn) handle(data []byte) {
	c := cn.m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partitioned {
		var r struct {
			Op string `json:"op"`
		}
		_ = json.Unmarshal(data, &r)
		c.lost[r.Op]++
		return // lost on the way
	}
	if c.leader != cn.m.idx {
		cn.kill()
		return
	}
	var req api.WSRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	reply := func(m api.WSMessage) {
		if c.dropReplies[req.Op] {
			return
		}
		m.ID = req.ID
		cn.pushLocked(m)
	}
	fail := func(code, msg string) {
		reply(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: code, Message: msg}})
	}
	if err := dec.Decode(&req); err != nil {
		fail(api.CodeInvalidArgument, err.Error())
		return
	}
	c.requests[req.Op]++
	if code := c.refusalLocked(req.Op); code != "" {
		msg := "the member is overloaded; retry after 100ms"
		if code == api.CodeResourceExhausted {
			msg = "this client has its share of the member in flight; retry after 100ms"
		}
		reply(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: code, Message: msg}, RetryAfterMs: 100})
		return
	}
	now := time.Now()
	if req.Op == api.OpHello {
		if req.SessionID != "" {
			s := c.sessions[req.SessionID]
			if s == nil {
				fail(api.CodeSessionExpired, "session "+req.SessionID+" is not alive")
				return
			}
			if s.conn != nil && s.conn != cn {
				s.conn.kill()
			}
			s.conn, cn.sess = cn, s
			s.deadline = now.Add(s.ttl)
			c.resumed++
			reply(api.WSMessage{Type: api.TypeHello, SessionID: s.id, SessionTTLms: s.ttl.Milliseconds()})
			return
		}
		ttl := time.Duration(api.DefaultSessionTTL) * time.Millisecond
		if req.SessionTTLms != nil {
			ttl = ms(req.SessionTTLms)
		}
		if ttl < api.MinSessionTTLms*time.Millisecond || ttl > api.MaxSessionTTLms*time.Millisecond {
			fail(api.CodeInvalidArgument, "session_ttl_ms out of range")
			return
		}
		if req.ClientID == "" {
			fail(api.CodeInvalidArgument, "client_id is required")
			return
		}
		c.nextSession++
		s := &session{id: sessionID(c.nextSession), clientID: req.ClientID, ttl: ttl, deadline: now.Add(ttl), conn: cn}
		c.sessions[s.id] = s
		cn.sess = s
		c.fresh++
		reply(api.WSMessage{Type: api.TypeHello, SessionID: s.id, SessionTTLms: ttl.Milliseconds()})
		return
	}
	s := cn.sess
	if s == nil {
		fail(api.CodeInvalidArgument, "hello first")
		return
	}
	if c.sessions[s.id] != s {
		fail(api.CodeSessionExpired, "session "+s.id+" ended")
		return
	}
	switch req.Op {
	case api.OpKeepalive:
		s.deadline = now.Add(s.ttl)
		reply(api.WSMessage{Type: api.TypeOK, SessionTTLms: s.ttl.Milliseconds()})
	case api.OpAcquire:
		r := acquireReq{names: []string{req.Lock}, clientID: s.clientID, sessionID: s.id, ttl: ms(req.TTLms), wait: ms(req.WaitTimeoutMs), reqID: req.ID}
		if req.Locks != nil {
			names, msg := lockSet(req.Locks)
			if msg != "" || req.Lock != "" {
				fail(api.CodeInvalidArgument, msg+" (and no lock beside locks)")
				return
			}
			r.names = names
		} else if !validName(req.Lock) {
			fail(api.CodeInvalidArgument, "lock: bad name")
			return
		}
		if msg := kinds(&r, req.Mode, req.Limit, req.LockDelayMs, req.Value); msg != "" {
			fail(api.CodeInvalidArgument, msg)
			return
		}
		d := c.acquireLocked(r)
		switch {
		case d.hs != nil:
			cn.pushLocked(grantedMsg(req.ID, d.hs, len(r.names) > 1))
		case d.code != "":
			msg := "lock " + strings.Join(r.names, ",") + " not acquired"
			if d.code == api.CodeLockHeld {
				msg = "lock " + strings.Join(r.names, ",") + " is held by " + d.holder
			}
			reply(api.WSMessage{Type: api.TypeError, Error: &api.Error{Code: d.code, Message: msg}, Lock: d.lock, Holder: d.holder})
		}
	case api.OpValue:
		v := ""
		if req.Value != nil {
			v = *req.Value
		}
		if msg := badValue(v); msg != "" {
			fail(api.CodeInvalidArgument, msg)
			return
		}
		if !c.setValueLocked(req.Lock, s.clientID, req.FencingToken, v) {
			fail(api.CodeNotHolder, "not the holder of "+req.Lock)
			return
		}
		reply(api.WSMessage{Type: api.TypeOK, Lock: req.Lock, FencingToken: req.FencingToken})
	case api.OpWatch:
		cn.watchLocked(req, reply, fail)
	case api.OpUnwatch:
		cn.unwatchLocked(req, reply, fail)
	case api.OpRelease:
		if req.Handoff != nil {
			cn.handOffLocked(req, s, reply, fail)
			return
		}
		if !c.releaseLocked(req.Lock, s.clientID, req.FencingToken) {
			fail(api.CodeNotHolder, "not the holder of "+req.Lock)
			return
		}
		reply(api.WSMessage{Type: api.TypeOK})
	case api.OpRenew:
		h, ok := c.renewLocked(req.Lock, s.clientID, req.FencingToken, ms(req.TTLms))
		if !ok {
			fail(api.CodeNotHolder, "not the holder of "+req.Lock)
			return
		}
		reply(api.WSMessage{Type: api.TypeOK, Lock: req.Lock, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), FencingProof: h.proof})
	case api.OpCancel:
		names := []string{req.Lock}
		if req.Locks != nil {
			ns, msg := lockSet(req.Locks)
			if msg != "" || req.Lock != "" {
				fail(api.CodeInvalidArgument, msg+" (and no lock beside locks)")
				return
			}
			names = ns
		} else if !validName(req.Lock) {
			fail(api.CodeInvalidArgument, "lock: bad name")
			return
		}
		ok := c.cancelLocked(names, s.clientID)
		reply(api.WSMessage{Type: api.TypeOK, Lock: req.Lock, Cancelled: &ok})
	default:
		fail(api.CodeInvalidArgument, "unknown op "+req.Op)
	}
}

// handOffLocked is a release with a hand-off: the release, then the
// acquire it carries (its own id, the acquire's fields), in one step, as
// lockd does it. The acquire joins the queue behind every waiter there.
func (cn *conn) handOffLocked(req api.WSRequest, s *session, reply func(api.WSMessage), fail func(code, msg string)) {
	c := cn.m.c
	next := *req.Handoff
	if next.ID == 0 || next.ID == req.ID || (next.Op != "" && next.Op != api.OpAcquire) || (next.Lock != "" && next.Lock != req.Lock) ||
		len(next.Locks) > 0 || next.Handoff != nil || req.FencingToken == 0 {
		fail(api.CodeInvalidArgument, "handoff: a malformed hand-off")
		return
	}
	r := acquireReq{names: []string{req.Lock}, clientID: s.clientID, sessionID: s.id, ttl: ms(next.TTLms), wait: ms(next.WaitTimeoutMs), reqID: next.ID}
	if msg := kinds(&r, next.Mode, next.Limit, next.LockDelayMs, next.Value); msg != "" || !validName(req.Lock) {
		fail(api.CodeInvalidArgument, "handoff: "+msg)
		return
	}
	c.handoffs++
	if c.releaseLocked(req.Lock, s.clientID, req.FencingToken) {
		reply(api.WSMessage{Type: api.TypeOK})
	} else {
		fail(api.CodeNotHolder, "not the holder of "+req.Lock)
	}
	d := c.acquireLocked(r)
	switch {
	case d.hs != nil:
		cn.pushLocked(grantedMsg(next.ID, d.hs, false))
	case d.code != "":
		if c.dropReplies[api.OpAcquire] {
			return
		}
		cn.pushLocked(api.WSMessage{ID: next.ID, Type: api.TypeError, Error: &api.Error{Code: d.code, Message: "lock " + req.Lock + " not acquired"}, Lock: d.lock, Holder: d.holder})
	}
}
