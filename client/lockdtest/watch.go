package lockdtest

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lockd/lockd/api"
)

// Watches, as lockd serves them (SPEC "Watches"): a WebSocket watch of one
// lock or of a prefix gets its ok, then the current state (one changed
// frame for a single lock, free or not; one per lock with state under a
// prefix), then a synced frame at the fake's change counter, then one
// changed frame per change, in order; a blocking query
// (GET /api/v1/locks/{name}?index=N&wait=D) answers once the lock's index
// is above N, when wait ends, or early after a leader change. The fake
// counts every change of a lock as one index step (lockd may fold a
// release and the hand-off to the next waiter into one log entry; the
// fake shows the free state in between).

// fwatch is one WebSocket watch of a connection.
type fwatch struct {
	id     uint64
	lock   string
	prefix *string
	// missed: a change was dropped for it (DropWatchChanges); it is told
	// to resync when the drop ends.
	missed bool
}

func (w *fwatch) matches(name string) bool {
	if w.prefix != nil {
		return strings.HasPrefix(name, *w.prefix)
	}
	return w.lock == name
}

// changedLocked tells every watch of name about its new status. Called by
// touchLocked, after each change.
func (c *Cluster) changedLocked(name string) {
	close(c.changes)
	c.changes = make(chan struct{})
	var st *api.LockStatus
	for _, m := range c.members {
		for cn := range m.conns {
			for _, w := range cn.watches {
				if !w.matches(name) {
					continue
				}
				if c.dropWatch {
					w.missed = true
					continue
				}
				if st == nil {
					s := c.statusLocked(name)
					st = &s
				}
				cn.pushLocked(api.WSMessage{Type: api.TypeChanged, WatchID: w.id, Lock: name, Index: st.Index, Status: st})
			}
		}
	}
}

// watchLocked serves a WebSocket watch request.
func (cn *conn) watchLocked(req api.WSRequest, reply func(api.WSMessage), fail func(code, msg string)) {
	c := cn.m.c
	if (req.Lock == "") == (req.Prefix == nil) {
		fail(api.CodeInvalidArgument, "watch names either lock or prefix")
		return
	}
	if req.Prefix == nil && !validName(req.Lock) {
		fail(api.CodeInvalidArgument, "lock: bad name")
		return
	}
	if cn.watches == nil {
		cn.watches = make(map[uint64]*fwatch)
	}
	cn.nextWatch++
	w := &fwatch{id: cn.nextWatch, lock: req.Lock, prefix: req.Prefix}
	cn.watches[w.id] = w
	reply(api.WSMessage{Type: api.TypeOK, WatchID: w.id})
	var sts []api.LockStatus
	if w.prefix != nil {
		sts = c.listLocked(*w.prefix)
	} else {
		sts = []api.LockStatus{c.statusLocked(w.lock)}
	}
	for i := range sts {
		cn.pushLocked(api.WSMessage{Type: api.TypeChanged, WatchID: w.id, Lock: sts[i].Lock, Index: sts[i].Index, Status: &sts[i]})
	}
	// The state was read under the lock every change takes: it is as of
	// the change counter, and every later change is above it.
	cn.pushLocked(api.WSMessage{Type: api.TypeSynced, WatchID: w.id, Index: c.index})
}

// unwatchLocked serves a WebSocket unwatch request.
func (cn *conn) unwatchLocked(req api.WSRequest, reply func(api.WSMessage), fail func(code, msg string)) {
	if _, ok := cn.watches[req.WatchID]; !ok {
		fail(api.CodeNotFound, "no watch "+strconv.FormatUint(req.WatchID, 10)+" on this connection")
		return
	}
	delete(cn.watches, req.WatchID)
	reply(api.WSMessage{Type: api.TypeOK, WatchID: req.WatchID})
}

// DropWatchChanges makes the leader drop the changed frames of every watch
// (on), as lockd does for a watcher that fell behind, and, when it ends
// (off), tell each watch that missed a change to resync.
func (c *Cluster) DropWatchChanges(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropWatch = on
	if !on {
		for _, m := range c.members {
			for cn := range m.conns {
				for _, w := range cn.watches {
					if w.missed {
						w.missed = false
						cn.pushLocked(api.WSMessage{Type: api.TypeResync, WatchID: w.id})
					}
				}
			}
		}
	}
	c.logf("lockdtest: watch changes dropped=%v", on)
}

// Watches returns the number of WebSocket watches open on the members.
func (c *Cluster) Watches() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.members {
		for cn := range m.conns {
			n += len(cn.watches)
		}
	}
	return n
}

// blockingStatus serves GET /api/v1/locks/{name}?index=N&wait=D.
func (m *member) blockingStatus(w http.ResponseWriter, r *http.Request) {
	c := m.c
	q := r.URL.Query()
	index, err := strconv.ParseUint(q.Get("index"), 10, 64)
	if err != nil {
		writeErr(w, api.CodeInvalidArgument, "index must be an unsigned integer")
		return
	}
	wait := api.DefaultWait
	if q.Has("wait") {
		d, err := time.ParseDuration(q.Get("wait"))
		if err != nil || d < 0 || d > api.MaxWait {
			writeErr(w, api.CodeInvalidArgument, "wait must be a duration of at most 10m")
			return
		}
		wait = d
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	name := r.PathValue("name")
	c.mu.Lock()
	leader := c.leader
	c.mu.Unlock()
	for {
		c.mu.Lock()
		st := c.statusLocked(name)
		changes, moved := c.changes, c.leader != leader
		c.mu.Unlock()
		if st.Index > index || moved {
			writeJSON(w, 200, st)
			return
		}
		select {
		case <-changes:
		case <-t.C:
			writeJSON(w, 200, st)
			return
		case <-r.Context().Done():
			return
		case <-c.stop:
			return
		}
	}
}
