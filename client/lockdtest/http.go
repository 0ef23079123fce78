package lockdtest

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockd/lockd/api"
)

// member is one fake cluster member: an HTTP server on the shared state.
type member struct {
	c     *Cluster
	idx   int
	id    string
	srv   *httptest.Server
	conns map[*conn]struct{} // guarded by Cluster.mu
}

func sessionID(n int) string { return fmt.Sprintf("s%06d", n) }

func (m *member) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/ws", m.serveWS)
	mux.HandleFunc("POST /api/v1/locks/{name}/acquire", m.leaderOnly(m.acquire))
	mux.HandleFunc("POST /api/v1/locks/{name}/release", m.leaderOnly(m.release))
	mux.HandleFunc("POST /api/v1/locks/{name}/renew", m.leaderOnly(m.renew))
	mux.HandleFunc("POST /api/v1/locks/{name}/value", m.leaderOnly(m.setValue))
	mux.HandleFunc("POST /api/v1/acquire", m.leaderOnly(m.acquireMany))
	mux.HandleFunc("POST /api/v1/locks/{name}/cancel", m.leaderOnly(m.cancel))
	mux.HandleFunc("POST /api/v1/cancel", m.leaderOnly(m.cancelMany))
	mux.HandleFunc("GET /api/v1/locks/{name}", m.leaderOnly(m.status))
	mux.HandleFunc("DELETE /api/v1/locks/{name}", m.leaderOnly(m.revoke))
	mux.HandleFunc("GET /api/v1/locks", m.leaderOnly(m.list))
	mux.HandleFunc("POST /api/v1/sessions", m.leaderOnly(m.createSession))
	mux.HandleFunc("POST /api/v1/sessions/{id}/keepalive", m.leaderOnly(m.keepalive))
	mux.HandleFunc("DELETE /api/v1/sessions/{id}", m.leaderOnly(m.deleteSession))
	mux.HandleFunc("GET /api/v1/cluster", m.held(m.cluster))
	mux.HandleFunc("POST /api/v1/cluster/transfer-leadership", m.leaderOnly(m.transfer))
	mux.HandleFunc("POST /api/v1/cluster/members", m.leaderOnly(m.addMember))
	mux.HandleFunc("DELETE /api/v1/cluster/members/{id}", m.leaderOnly(m.removeMember))
	mux.HandleFunc("GET /api/v1/status", m.held(m.nodeStatus))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	return mux
}

// held wraps a handler: tracked for Close, hung while partitioned.
func (m *member) held(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !m.c.track() {
			writeErr(w, api.CodeInternal, "closing")
			return
		}
		defer m.c.wg.Done()
		if !m.c.hold(r) {
			return
		}
		h(w, r)
	}
}

// leaderOnly redirects to the leader, or answers no_leader, on a follower.
func (m *member) leaderOnly(h http.HandlerFunc) http.HandlerFunc {
	return m.held(func(w http.ResponseWriter, r *http.Request) {
		m.c.mu.Lock()
		leader, lurl := m.c.leader, m.c.leaderURLLocked()
		m.c.mu.Unlock()
		if leader == m.idx || (r.Method == http.MethodGet && r.URL.Query().Get("stale") == "true") {
			if r.Method == http.MethodPost {
				if code := m.c.refusal(httpOp(r.URL.Path)); code != "" {
					w.Header().Set("Retry-After", "1")
					writeErr(w, code, "refused for now; retry after 1s")
					return
				}
			}
			h(w, r)
			return
		}
		if leader < 0 {
			w.Header().Set("Retry-After", "1")
			writeErr(w, api.CodeNoLeader, "no leader known")
			return
		}
		w.Header().Set(api.HeaderLeader, lurl)
		w.Header().Set("Location", lurl+r.URL.RequestURI())
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code, msg string) {
	writeJSON(w, api.Status(code), api.ErrorReply{Error: api.Error{Code: code, Message: msg}})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, api.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && err != io.EOF {
		writeErr(w, api.CodeInvalidArgument, "body: "+err.Error())
		return false
	}
	return true
}

// httpOp is the WebSocket op an HTTP POST path does (see Overload).
func httpOp(path string) string {
	switch {
	case path == "/api/v1/acquire" || strings.HasSuffix(path, "/acquire"):
		return api.OpAcquire
	case path == "/api/v1/cancel" || strings.HasSuffix(path, "/cancel"):
		return api.OpCancel
	case strings.HasSuffix(path, "/release"):
		return api.OpRelease
	case strings.HasSuffix(path, "/renew"):
		return api.OpRenew
	}
	return ""
}

func (c *Cluster) refusal(op string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refusalLocked(op)
}

// cancel withdraws a client's queued wait on one lock.
func (m *member) cancel(w http.ResponseWriter, r *http.Request) {
	var req api.CancelRequest
	if !decode(w, r, &req) {
		return
	}
	if !validName(r.PathValue("name")) || req.ClientID == "" {
		writeErr(w, api.CodeInvalidArgument, "lock name or client_id invalid")
		return
	}
	m.c.mu.Lock()
	ok := m.c.cancelLocked([]string{r.PathValue("name")}, req.ClientID)
	m.c.mu.Unlock()
	writeJSON(w, 200, api.CancelReply{Cancelled: ok})
}

// cancelMany withdraws a client's queued multi-acquire, by all its names.
func (m *member) cancelMany(w http.ResponseWriter, r *http.Request) {
	var req api.CancelManyRequest
	if !decode(w, r, &req) {
		return
	}
	names, msg := lockSet(req.Locks)
	if msg == "" && req.ClientID == "" {
		msg = "client_id is required"
	}
	if msg != "" {
		writeErr(w, api.CodeInvalidArgument, msg)
		return
	}
	m.c.mu.Lock()
	ok := m.c.cancelLocked(names, req.ClientID)
	m.c.mu.Unlock()
	writeJSON(w, 200, api.CancelReply{Cancelled: ok})
}

func (m *member) acquire(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req api.AcquireRequest
	if !decode(w, r, &req) {
		return
	}
	if !validName(name) || req.ClientID == "" {
		writeErr(w, api.CodeInvalidArgument, "lock name or client_id invalid")
		return
	}
	ar := acquireReq{names: []string{name}, clientID: req.ClientID, sessionID: req.SessionID, ttl: httpTTL(req.TTLms, req.SessionID), wait: ms(req.WaitTimeoutMs)}
	if msg := kinds(&ar, req.Mode, req.Limit, req.LockDelayMs, req.Value); msg != "" {
		writeErr(w, api.CodeInvalidArgument, msg)
		return
	}
	m.runAcquire(w, r, ar)
}

// httpTTL is an HTTP acquire's TTL: as given, else 30s without a session
// and none with one.
func httpTTL(ttlMs *int64, sessionID string) time.Duration {
	if ttlMs != nil {
		return ms(ttlMs)
	}
	if sessionID != "" {
		return 0
	}
	return time.Duration(api.DefaultLockTTLms) * time.Millisecond
}

func (m *member) acquireMany(w http.ResponseWriter, r *http.Request) {
	var req api.MultiAcquireRequest
	if !decode(w, r, &req) {
		return
	}
	names, msg := lockSet(req.Locks)
	if msg == "" && req.ClientID == "" {
		msg = "client_id is required"
	}
	if msg != "" {
		writeErr(w, api.CodeInvalidArgument, msg)
		return
	}
	ar := acquireReq{names: names, clientID: req.ClientID, sessionID: req.SessionID, ttl: httpTTL(req.TTLms, req.SessionID), wait: ms(req.WaitTimeoutMs)}
	if msg := kinds(&ar, req.Mode, nil, req.LockDelayMs, req.Value); msg != "" {
		writeErr(w, api.CodeInvalidArgument, msg)
		return
	}
	m.runAcquire(w, r, ar)
}

// runAcquire runs an HTTP acquire, single or multi, waiting as asked.
func (m *member) runAcquire(w http.ResponseWriter, r *http.Request, ar acquireReq) {
	c := m.c
	ar.notify = make(chan acquireDone, 1)
	c.mu.Lock()
	if ar.sessionID != "" && c.sessions[ar.sessionID] == nil {
		c.mu.Unlock()
		writeErr(w, api.CodeSessionExpired, "session "+ar.sessionID+" is not alive")
		return
	}
	d := c.acquireLocked(ar)
	c.mu.Unlock()
	if d.hs == nil && d.code == "" {
		select {
		case d = <-ar.notify:
		case <-r.Context().Done():
			return
		case <-c.stop:
			return
		}
	}
	desc := strings.Join(ar.names, ",")
	if d.hs == nil {
		if d.code == api.CodeLimitMismatch {
			writeErr(w, d.code, "lock "+d.lock+" has another limit")
			return
		}
		writeJSON(w, http.StatusConflict, api.AcquireReply{Acquired: false, Lock: d.lock, Error: &api.Error{Code: d.code, Message: "lock " + desc + " not acquired"}, Holder: d.holder})
		return
	}
	if len(ar.names) > 1 {
		writeJSON(w, 200, api.AcquireReply{Acquired: true, ClientID: ar.clientID, Grants: grants(d.hs), Mode: d.hs[0].mode})
		return
	}
	h := d.hs[0]
	writeJSON(w, 200, api.AcquireReply{Acquired: true, Lock: h.name, ClientID: h.clientID, FencingToken: h.token, ExpiresAt: fmtTime(h.expires), FencingProof: h.proof, Mode: h.mode})
}

func (m *member) setValue(w http.ResponseWriter, r *http.Request) {
	var req api.ValueRequest
	if !decode(w, r, &req) {
		return
	}
	if msg := badValue(req.Value); msg != "" {
		writeErr(w, api.CodeInvalidArgument, msg)
		return
	}
	m.c.mu.Lock()
	ok := m.c.setValueLocked(r.PathValue("name"), req.ClientID, req.FencingToken, req.Value)
	m.c.mu.Unlock()
	if !ok {
		writeErr(w, api.CodeNotHolder, "client "+req.ClientID+" does not hold that token")
		return
	}
	writeJSON(w, 200, api.ValueReply{Updated: true, FencingToken: req.FencingToken})
}

func (m *member) revoke(w http.ResponseWriter, r *http.Request) {
	var token uint64
	if v := r.URL.Query().Get("fencing_token"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			writeErr(w, api.CodeInvalidArgument, "fencing_token must be a positive number")
			return
		}
		token = n
	}
	m.c.mu.Lock()
	revoked, ok := m.c.revokeLocked(r.PathValue("name"), token)
	m.c.mu.Unlock()
	if !ok {
		writeErr(w, api.CodeNotHolder, "no current grant of "+r.PathValue("name")+" has that token")
		return
	}
	writeJSON(w, 200, api.RevokeReply{Revoked: revoked})
}

func (m *member) release(w http.ResponseWriter, r *http.Request) {
	var req api.ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	m.c.mu.Lock()
	ok := m.c.releaseLocked(r.PathValue("name"), req.ClientID, req.FencingToken)
	m.c.mu.Unlock()
	if !ok {
		writeErr(w, api.CodeNotHolder, "client "+req.ClientID+" does not hold that token")
		return
	}
	writeJSON(w, 200, api.ReleaseReply{Released: true})
}

func (m *member) renew(w http.ResponseWriter, r *http.Request) {
	var req api.RenewRequest
	if !decode(w, r, &req) {
		return
	}
	m.c.mu.Lock()
	h, ok := m.c.renewLocked(r.PathValue("name"), req.ClientID, req.FencingToken, ms(req.TTLms))
	m.c.mu.Unlock()
	if !ok {
		writeErr(w, api.CodeNotHolder, "client "+req.ClientID+" does not hold that token")
		return
	}
	writeJSON(w, 200, api.RenewReply{Renewed: true, ExpiresAt: fmtTime(h.expires), FencingProof: h.proof})
}

func (m *member) status(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("index") {
		m.blockingStatus(w, r)
		return
	}
	m.c.mu.Lock()
	st := m.c.statusLocked(r.PathValue("name"))
	m.c.mu.Unlock()
	st.Stale = r.URL.Query().Get("stale") == "true" // as lockd marks such a read
	writeJSON(w, 200, st)
}

// list serves one page, as lockd does: after is exclusive, limit 1–10 000
// (default 1000), next is the last name of a page that has more after it.
func (m *member) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10_000 {
			writeErr(w, api.CodeInvalidArgument, "limit must be a number from 1 to 10000")
			return
		}
		limit = n
	}
	m.c.mu.Lock()
	l := m.c.listLocked(q.Get("prefix"))
	m.c.mu.Unlock()
	after := q.Get("after")
	i := sort.Search(len(l), func(i int) bool { return l[i].Lock > after })
	page := api.LockList{Locks: l[i:]}
	if len(page.Locks) > limit {
		page.Locks = page.Locks[:limit]
		page.Next = page.Locks[limit-1].Lock
	}
	writeJSON(w, 200, page)
}

func (m *member) createSession(w http.ResponseWriter, r *http.Request) {
	var req api.SessionRequest
	if !decode(w, r, &req) {
		return
	}
	ttl := time.Duration(api.DefaultSessionTTL) * time.Millisecond
	if req.TTLms != nil {
		ttl = ms(req.TTLms)
	}
	if req.ClientID == "" || ttl < api.MinSessionTTLms*time.Millisecond || ttl > api.MaxSessionTTLms*time.Millisecond {
		writeErr(w, api.CodeInvalidArgument, "client_id or ttl_ms invalid")
		return
	}
	c := m.c
	c.mu.Lock()
	c.nextSession++
	s := &session{id: sessionID(c.nextSession), clientID: req.ClientID, ttl: ttl, deadline: time.Now().Add(ttl)}
	c.sessions[s.id] = s
	c.mu.Unlock()
	writeJSON(w, 200, api.SessionReply{SessionID: s.id, TTLms: ttl.Milliseconds()})
}

func (m *member) keepalive(w http.ResponseWriter, r *http.Request) {
	c := m.c
	c.mu.Lock()
	s := c.sessions[r.PathValue("id")]
	if s != nil {
		s.deadline = time.Now().Add(s.ttl)
	}
	c.mu.Unlock()
	if s == nil {
		writeErr(w, api.CodeSessionExpired, "session "+r.PathValue("id")+" is not alive")
		return
	}
	writeJSON(w, 200, api.SessionReply{TTLms: s.ttl.Milliseconds()})
}

func (m *member) deleteSession(w http.ResponseWriter, r *http.Request) {
	c := m.c
	c.mu.Lock()
	s := c.sessions[r.PathValue("id")]
	if s != nil {
		c.deleteSessionLocked(s)
	}
	c.mu.Unlock()
	if s == nil {
		writeErr(w, api.CodeSessionExpired, "session "+r.PathValue("id")+" is not alive")
		return
	}
	writeJSON(w, 200, struct{}{})
}

func (m *member) cluster(w http.ResponseWriter, r *http.Request) {
	c := m.c
	c.mu.Lock()
	st := api.ClusterStatus{Term: 1, LeaderHTTP: c.leaderURLLocked()}
	if c.leader >= 0 {
		st.LeaderID = c.members[c.leader].id
	}
	for _, mm := range c.members {
		st.Members = append(st.Members, api.Member{ID: mm.id, RaftAddr: "fake:" + mm.id, HTTPAddr: c.URL(mm.idx), Voter: true})
	}
	for _, id := range slices.Sorted(maps.Keys(c.added)) {
		st.Members = append(st.Members, c.added[id])
	}
	c.mu.Unlock()
	writeJSON(w, 200, st)
}

// addMember records a member added from outside (it serves nothing: a
// member that never started).
func (m *member) addMember(w http.ResponseWriter, r *http.Request) {
	var req api.AddMemberRequest
	if !decode(w, r, &req) {
		return
	}
	if req.ID == "" || req.RaftAddr == "" || req.HTTPAddr == "" {
		writeErr(w, api.CodeInvalidArgument, "id, raft_addr and http_addr are required")
		return
	}
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, mm := range c.members {
		if mm.id == req.ID {
			writeErr(w, api.CodeInvalidArgument, "member "+req.ID+" is running in this fake; it cannot be added again")
			return
		}
	}
	u := req.HTTPAddr
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	c.added[req.ID] = api.Member{ID: req.ID, RaftAddr: req.RaftAddr, HTTPAddr: u, Voter: true}
	writeJSON(w, 200, struct{}{})
}

// removeMember forgets a member added from outside; removing one that
// does not exist is 404 not_found, as in lockd. (The fake's own members
// cannot be removed.)
func (m *member) removeMember(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.added[id]; ok {
		delete(c.added, id)
		writeJSON(w, 200, map[string]bool{"removed": true})
		return
	}
	for _, mm := range c.members {
		if mm.id == id {
			writeErr(w, api.CodeInvalidArgument, "member "+id+" is running in this fake; it cannot be removed")
			return
		}
	}
	writeErr(w, api.CodeNotFound, "no member "+id)
}

// nodeStatus serves GET /api/v1/status: this member's own view.
func (m *member) nodeStatus(w http.ResponseWriter, r *http.Request) {
	c := m.c
	c.mu.Lock()
	st := api.NodeStatus{ID: m.id, State: "Follower", Term: 1, CommitIndex: c.index, AppliedIndex: c.index,
		LastToken: c.lastToken, LogStore: "fake", Version: "lockdtest"}
	if c.leader >= 0 {
		st.LeaderID = c.members[c.leader].id
		if c.leader == m.idx {
			st.State = "Leader"
		}
	}
	c.mu.Unlock()
	writeJSON(w, 200, st)
}

func (m *member) transfer(w http.ResponseWriter, r *http.Request) {
	var req api.TransferRequest
	if !decode(w, r, &req) {
		return
	}
	c := m.c
	to := -1
	for _, mm := range c.members {
		if (req.To == "" && mm.idx != m.idx) || mm.id == req.To {
			to = mm.idx
			break
		}
	}
	if to < 0 {
		writeErr(w, api.CodeInvalidArgument, "no member "+req.To)
		return
	}
	writeJSON(w, 200, struct{}{})
	c.SetLeader(to)
}
