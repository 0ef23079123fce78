package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/lockd/lockd/api"
)

// A raw client of lockd's WebSocket API, for the overload, scale and
// amplify runs: unlike the Go client it hides nothing, so every refusal,
// Retry-After, pushed loss and connection cut the server produces is seen
// and counted. One reader goroutine per connection routes each frame with an
// id to the callback of the request that carries that id (every request is
// answered by exactly one such frame: its reply, or for a queued acquire
// the grant or the end of its wait), and every other frame (lost pushes,
// error frames without id, watch frames) to the connection's push handler.

// wsFrame is one frame from the server, decoded, with its raw bytes and the
// time it was read.
type wsFrame struct {
	api.WSMessage
	raw []byte
	at  time.Time
}

// errConnEnded is given to the callbacks of requests still unanswered when
// their connection ended.
var errConnEnded = errors.New("connection ended")

// apiErr is an error answer of the server (an error frame, or an HTTP
// error status), with its Retry-After when it carried one.
type apiErr struct {
	Code          string
	Msg           string
	Leader        string // with not_leader: where the leader is
	RetryAfter    time.Duration
	HasRetryAfter bool
}

func (e *apiErr) Error() string { return e.Code + ": " + e.Msg }

// frameErr returns the error a frame carries, or nil.
func frameErr(f wsFrame) *apiErr {
	if f.Type != api.TypeError {
		return nil
	}
	e := &apiErr{Code: "unknown", Leader: f.Leader}
	if f.Error != nil {
		e.Code, e.Msg = f.Error.Code, f.Error.Message
	}
	e.RetryAfter, e.HasRetryAfter = retryAfterOfFrame(f.raw)
	return e
}

// wsConn is one WebSocket connection to a lockd member.
type wsConn struct {
	c    *websocket.Conn
	base string // the member's HTTP URL

	mu      sync.Mutex
	next    uint64
	calls   map[uint64]func(wsFrame, error)
	ended   bool
	cut     string // how the server ended the connection ("" while open, or when we closed it)
	onPush  func(wsFrame)
	closing atomic.Bool
	done    chan struct{}

	session string
	ttlMs   int64
}

// wsURL turns a member's HTTP URL into its WebSocket endpoint.
func wsURL(base string) string {
	return "ws" + strings.TrimPrefix(base, "http") + "/api/v1/ws"
}

// dialOpts tune a connection; the zero value is a plain dial.
type dialOpts struct {
	// rcvBuf, when positive, sets the socket's receive buffer (SO_RCVBUF),
	// so a client that stops reading makes the server's writes block soon.
	rcvBuf int
	// readLimit bounds one frame (default 64 MiB: a status can be large).
	readLimit int64
}

// dialWS connects to base's WebSocket endpoint and starts the reader;
// onPush (may be nil) receives the frames that answer no request.
func dialWS(ctx context.Context, base string, onPush func(wsFrame), o dialOpts) (*wsConn, error) {
	var hc *http.Client
	if o.rcvBuf > 0 {
		d := &net.Dialer{Timeout: 10 * time.Second}
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetReadBuffer(o.rcvBuf)
				}
			}
			return c, err
		}}
		hc = &http.Client{Transport: tr}
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, wsURL(base), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			e := &apiErr{Code: fmt.Sprintf("http_%d", resp.StatusCode), Msg: err.Error()}
			e.RetryAfter, e.HasRetryAfter = parseRetryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
			return nil, e
		}
		return nil, err
	}
	limit := o.readLimit
	if limit == 0 {
		limit = 64 << 20
	}
	c.SetReadLimit(limit)
	wc := &wsConn{c: c, base: base, calls: map[uint64]func(wsFrame, error){}, onPush: onPush, done: make(chan struct{})}
	go wc.readLoop()
	return wc, nil
}

// readLoop routes frames until the connection ends, then fails every
// request still waiting.
func (wc *wsConn) readLoop() {
	defer close(wc.done)
	var endErr error
	for {
		_, b, err := wc.c.Read(context.Background())
		if err != nil {
			endErr = err
			break
		}
		f := wsFrame{raw: b, at: time.Now()}
		if err := json.Unmarshal(b, &f.WSMessage); err != nil {
			continue
		}
		if f.ID != 0 {
			wc.mu.Lock()
			cb := wc.calls[f.ID]
			delete(wc.calls, f.ID)
			wc.mu.Unlock()
			if cb != nil {
				cb(f, nil)
				continue
			}
		}
		if f.Type == api.TypeError && f.ID == 0 && f.Error != nil {
			wc.mu.Lock()
			if wc.cut == "" {
				wc.cut = cutOfErrorFrame(f.Error.Code, f.Error.Message)
			}
			wc.mu.Unlock()
		}
		if wc.onPush != nil {
			wc.onPush(f)
		}
	}
	wc.mu.Lock()
	wc.ended = true
	if wc.cut == "" && !wc.closing.Load() {
		wc.cut = cutOfReadError(endErr)
	}
	calls := wc.calls
	wc.calls = map[uint64]func(wsFrame, error){}
	wc.mu.Unlock()
	for _, cb := range calls {
		cb(wsFrame{}, errConnEnded)
	}
}

// cutOfErrorFrame names a connection-level error frame (no id): the
// server is about to end the connection.
func cutOfErrorFrame(code, msg string) string {
	if code == api.CodeInternal {
		return "internal: " + msg
	}
	return code
}

// cutOfReadError names how a connection ended that we did not close.
func cutOfReadError(err error) string {
	if s := websocket.CloseStatus(err); s != -1 {
		var ce websocket.CloseError
		reason := ""
		if errors.As(err, &ce) {
			reason = ce.Reason
		}
		return fmt.Sprintf("close %d %s", int(s), reason)
	}
	return "dropped (no close frame)"
}

// cutReason is how the server ended the connection, "" if it did not (yet).
func (wc *wsConn) cutReason() string {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.cut
}

// isEnded reports whether the reader has seen the end of the connection
// (it may still be telling the requests that were waiting).
func (wc *wsConn) isEnded() bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.ended
}

// send writes req with a fresh id and calls cb with the frame that answers
// it (or errConnEnded). cb runs on the reader goroutine: it must not block.
// send returns an error only when cb will never be called; when the write
// fails after the connection ended, cb gets errConnEnded and send returns
// nil.
func (wc *wsConn) send(ctx context.Context, req api.WSRequest, cb func(wsFrame, error)) (uint64, error) {
	wc.mu.Lock()
	if wc.ended {
		wc.mu.Unlock()
		return 0, errConnEnded
	}
	wc.next++
	id := wc.next
	if cb != nil {
		wc.calls[id] = cb
	}
	wc.mu.Unlock()
	req.ID = id
	b, err := json.Marshal(req)
	if err == nil {
		// The write is bounded by the connection's own timeout, not by
		// the request's context: coder/websocket closes the connection
		// when a write's context ends, and a request given up while the
		// server pushes back (it reads no further while a connection has
		// its most requests in flight) must not end the connection every
		// other request on it shares. The request's own bound ends its
		// wait in call.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = wc.c.Write(wctx, websocket.MessageText, b)
		cancel()
	}
	if err != nil {
		wc.mu.Lock()
		_, pending := wc.calls[id]
		delete(wc.calls, id)
		wc.mu.Unlock()
		if pending || cb == nil {
			return 0, err
		}
		// The reader ended and took the callback: it is told there.
	}
	return id, nil
}

// call sends req and waits for its answer. An error frame comes back as
// *apiErr; an unanswered request whose connection ended as errConnEnded.
func (wc *wsConn) call(ctx context.Context, req api.WSRequest) (wsFrame, error) {
	ch := make(chan wsFrame, 1)
	errc := make(chan error, 1)
	id, err := wc.send(ctx, req, func(f wsFrame, err error) {
		if err != nil {
			errc <- err
			return
		}
		ch <- f
	})
	if err != nil {
		return wsFrame{}, err
	}
	select {
	case f := <-ch:
		if e := frameErr(f); e != nil {
			return f, e
		}
		return f, nil
	case err := <-errc:
		return wsFrame{}, err
	case <-ctx.Done():
		wc.mu.Lock()
		delete(wc.calls, id)
		wc.mu.Unlock()
		return wsFrame{}, ctx.Err()
	}
}

// hello opens (sessionID "") or resumes a session on the connection.
func (wc *wsConn) hello(ctx context.Context, clientID string, ttlMs int64, sessionID string) error {
	f, err := wc.call(ctx, api.WSRequest{Op: api.OpHello, ClientID: clientID, SessionTTLms: &ttlMs, SessionID: sessionID})
	if err != nil {
		return err
	}
	if f.Type != api.TypeHello {
		return fmt.Errorf("hello answered %q", f.Type)
	}
	wc.session, wc.ttlMs = f.SessionID, f.SessionTTLms
	return nil
}

// close ends the connection from our side (not counted as a cut).
func (wc *wsConn) close() {
	wc.closing.Store(true)
	_ = wc.c.Close(websocket.StatusNormalClosure, "")
	select {
	case <-wc.done:
	case <-time.After(2 * time.Second):
		_ = wc.c.CloseNow()
		<-wc.done
	}
}

// abort drops a connection whose write failed and waits for its reader,
// so the session makes a new one (how it ended is recorded as usual).
func (wc *wsConn) abort() {
	_ = wc.c.CloseNow()
	<-wc.done
}

// closeNow drops the connection at once (not counted as a cut).
func (wc *wsConn) closeNow() {
	wc.closing.Store(true)
	_ = wc.c.CloseNow()
}
