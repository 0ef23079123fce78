package httpapi

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/auth"
	"github.com/lockd/lockd/internal/notify"
)

// Credentials on a WebSocket (SPEC 20). A connection is authenticated at
// its upgrade but may outlive many token file reloads, so every request on
// it is checked against the rules in force when it is served, as an HTTP
// request would be: a token removed since is 401 unauthenticated, a lock or
// prefix the token lost access to is 403 permission_denied. The session
// goes on (it ends only as sessions do: its keepalives, refused too, stop).
// When the rules change, the connection's watches are checked at once, and
// each one the token may no longer read ends with an error frame naming it.
//
// The check is cheap: the connection keeps the identity it last looked up
// and the token store's generation it was valid for; while no reload
// happened, a request costs one atomic load.
//
// A connection whose token has read access only — no lock access on any
// prefix — is read-only: its hello opens no session (SPEC "Watches": a read
// token may open a WebSocket for watches and status), and it serves watch
// and unwatch; every other op is 403.

// readOnlySubscription is the event subscription key of read-only
// connections: no client id is it (client ids are printable), so it brings
// no event, only the end of the leadership (see hello).
const readOnlySubscription = "\x00read-only"

// wsAuth is a connection's credentials.
type wsAuth struct {
	store *auth.Store
	// gate orders requests with re-checks: a request is served under the
	// read lock, the re-check after a reload under the write lock. So a
	// request authorized by the old rules has finished (and its watch is
	// registered) before the re-check looks at the watches, and every
	// request after it is authorized by the new rules.
	gate sync.RWMutex

	mu  sync.Mutex
	id  auth.Identity // as last looked up; kept when the token is refused, to look it up again after the next reload
	gen uint64        // the store generation id and err hold for
	err error         // the token was refused at gen
}

// current returns the connection's identity under the rules in force, or
// a 401 error when its token is no longer valid.
func (a *wsAuth) current() (auth.Identity, error) {
	gen := a.store.Generation()
	a.mu.Lock()
	defer a.mu.Unlock()
	if gen != a.gen {
		id, err := a.store.Refresh(a.id)
		if err == nil {
			a.id = id
		}
		a.gen, a.err = gen, err
	}
	if a.err != nil {
		return a.id, &apiError{code: api.CodeUnauthenticated, msg: fmt.Sprintf(
			"the token of this connection (%q) is no longer valid: the member's token file was reloaded without it", a.id.Name)}
	}
	return a.id, nil
}

// identity returns the connection's identity as of now (see wsAuth); with
// auth off, the anonymous identity.
func (wc *wsConn) identity() (auth.Identity, error) {
	if wc.auth == nil {
		return wc.id, nil
	}
	return wc.auth.current()
}

// enter holds the request gate while a request is served; call the
// function it returns when done.
func (wc *wsConn) enter() func() {
	if wc.auth == nil {
		return func() {}
	}
	wc.auth.gate.RLock()
	return wc.auth.gate.RUnlock
}

// allowLock checks the connection's token for lock access to one lock.
func (wc *wsConn) allowLock(name string) error {
	if wc.auth == nil {
		return nil
	}
	id, err := wc.identity()
	if err != nil {
		return err
	}
	if !id.Allows(auth.Lock, name) {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q lacks lock access to %q", id.Name, name)}
	}
	return nil
}

// allowRead checks the connection's token for read access to a lock, or
// to every lock under a prefix.
func (wc *wsConn) allowRead(name string, prefix bool) error {
	if wc.auth == nil {
		return nil
	}
	id, err := wc.identity()
	if err != nil {
		return err
	}
	return readDenied(id, name, prefix)
}

func readDenied(id auth.Identity, name string, prefix bool) error {
	if id.Allows(auth.Read, name) {
		return nil
	}
	if prefix {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q lacks read access to every lock under %q", id.Name, name)}
	}
	return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q lacks read access to %q", id.Name, name)}
}

// authorize is what every request after hello passes first: the token is
// still valid; a read-only connection serves watches only; and an op of the
// session (anything but watch and unwatch) comes from the identity that
// owns it, with lock access somewhere (keepalives need nothing more; the
// other ops check the locks they name themselves).
func (wc *wsConn) authorize(req api.WSRequest) error {
	if wc.auth == nil {
		return nil
	}
	id, err := wc.identity()
	if err != nil {
		return err
	}
	if req.Op == api.OpWatch || req.Op == api.OpUnwatch {
		return nil
	}
	if wc.isReadOnly() {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
			"this connection carries no session (token %q had read access only when it said hello): it serves watch and unwatch; %s needs a connection whose token has lock access", id.Name, req.Op)}
	}
	if id.Name != wc.id.Name && !id.IsAdmin() {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf(
			"the token of this connection is now identity %q; its session belongs to %q", id.Name, wc.id.Name)}
	}
	if !id.AllowsAny(auth.Lock) {
		return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("token %q no longer has lock access to any lock, which %s needs", id.Name, req.Op)}
	}
	return nil
}

// isReadOnly reports a connection whose hello opened no session.
func (wc *wsConn) isReadOnly() bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.readOnly
}

// authLoop checks the connection's watches whenever the token file is
// reloaded, until the connection ends.
func (wc *wsConn) authLoop() {
	for {
		changed := wc.auth.store.Changed()
		select {
		case <-wc.ctx.Done():
			return
		case <-changed:
		}
		wc.recheckWatches()
	}
}

// recheckWatches ends, each with an error frame, the watches the token may
// no longer read (all of them when the token is gone).
func (wc *wsConn) recheckWatches() {
	wc.auth.gate.Lock()
	defer wc.auth.gate.Unlock()
	id, err := wc.identity()
	var ended []*notify.Watch
	wc.mu.Lock()
	for wid, w := range wc.watches {
		name, prefix := w.Scope()
		why := err
		if why == nil {
			why = readDenied(id, name, prefix)
		}
		if why == nil {
			continue
		}
		delete(wc.watches, wid)
		ended = append(ended, w)
		code, msg := errorCode(why)
		what := fmt.Sprintf("lock %q", name)
		m := api.WSMessage{Type: api.TypeError, WatchID: wid, Lock: name}
		if prefix {
			what, m.Lock = fmt.Sprintf("prefix %q", name), ""
		}
		m.Error = &api.Error{Code: code, Message: fmt.Sprintf("watch %d of %s ended: %s", wid, what, msg)}
		// Sent under wc.mu, as sendIfWatching sends changes: no change of
		// this watch goes out after its end.
		wc.send(m)
	}
	wc.mu.Unlock()
	for _, w := range ended {
		wc.h.endWatch(w)
	}
}

// sendIfWatching sends m if watch id is still w, and reports whether it
// was; checked and sent under wc.mu, so nothing of a watch follows the
// frame that ended it (unwatch's reply, or recheckWatches' error).
func (wc *wsConn) sendIfWatching(id uint64, w *notify.Watch, m api.WSMessage) bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if wc.watches[id] != w {
		return false
	}
	wc.send(m)
	return true
}

// sendChangeIfWatching sends a watch's changed frame unless the watch
// ended (watching false) or the connection's queue holds watchBacklog
// bytes already (sent false: the watcher must resync). The frame's status
// is the change's one encoding, shared by every watcher it reaches.
func (wc *wsConn) sendChangeIfWatching(id uint64, w *notify.Watch, ch *notify.Change) (sent, watching bool) {
	status := ch.Encoded(encodeStatus)
	head := changedHead(id, ch.Status.Name, ch.Status.Index)
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if wc.watches[id] != w {
		return false, false
	}
	return wc.w.sendParts(watchBacklog, head, status, closeBrace), true
}

var closeBrace = []byte("}")

// changedHead is a changed frame up to its status: the watch's own part of
// it. index is always there, even 0 (a lock of a table nothing changed
// yet).
func changedHead(id uint64, lock string, index uint64) []byte {
	name, _ := json.Marshal(lock)
	return fmt.Appendf(nil, `{"type":%q,"watch_id":%d,"lock":%s,"index":%d,"status":`, api.TypeChanged, id, name, index)
}

// encodeStatus is a change's status as the API shows it, encoded once.
func encodeStatus(ch *notify.Change) []byte {
	statusEncodings.Add(1)
	b, _ := json.Marshal(statusOf(ch.Status))
	return b
}

// statusEncodings counts encodeStatus calls, so a test can tell one
// encoding shared by every reader from one per reader.
var statusEncodings atomic.Int64
