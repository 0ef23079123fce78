package httpapi

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// A WebSocket connection's replies and pushes come from many goroutines
// (one per request in flight, the push loop). One writer goroutine sends
// them, and it coalesces the frames that are ready into one write to the
// socket: under load, many replies cost one syscall (and one TLS record)
// instead of one each.
//
// coder/websocket flushes every frame to the net.Conn it hijacked, so the
// coalescing happens below it: the hijacked connection is wrapped in a
// corkConn, which buffers writes while corked and sends them in one write
// when uncorked.

// wsFrame is one queued frame, or (flushed set) a marker closed once
// everything queued before it has been written. A frame is written as its
// parts in order: a watch frame's status is shared by every connection
// that sends it (notify.Change.Encoded), and only its small head is the
// connection's own.
type wsFrame struct {
	parts   [][]byte
	size    int
	flushed chan struct{}
}

// maxQueuedBytes bounds what waits for a client that does not read: past
// it the connection is closed rather than let memory grow. Replies alone
// stay far below it (at most maxInflight requests in flight, each a small
// reply); watch frames stop adding to the queue at watchQueueBytes.
const maxQueuedBytes = 32 << 20

// writeTimeout bounds one coalesced write to a client.
const writeTimeout = 10 * time.Second

type wsWriter struct {
	c    *websocket.Conn
	cork *corkConn // nil when the connection could not be wrapped

	mu      sync.Mutex
	q       []wsFrame
	queued  int // bytes of the frames in q and being written
	closed  bool
	signal  chan struct{}
	done    chan struct{}
	onError func()
	// drained is closed (and replaced) whenever the writer has caught up
	// (nothing queued after a write): watches held back for a slow reader
	// resume.
	drained chan struct{}
}

// caughtUp returns a channel closed the next time the writer has written
// everything queued.
func (w *wsWriter) caughtUp() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drained
}

// backlog is the number of bytes queued or being written.
func (w *wsWriter) backlog() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queued
}

func newWSWriter(c *websocket.Conn, cork *corkConn, onError func()) *wsWriter {
	w := &wsWriter{c: c, cork: cork, signal: make(chan struct{}, 1), done: make(chan struct{}), onError: onError,
		drained: make(chan struct{})}
	go w.run()
	return w
}

// send queues one frame; it never blocks. It reports false when the frame
// was dropped (writer closed, or the client stopped reading).
func (w *wsWriter) send(b []byte) bool { return w.sendParts(0, b) }

// sendParts queues one frame made of parts. With limit > 0 the frame is
// not queued when limit bytes or more already wait (a watch frame: its
// watcher resyncs instead), and false is returned; past maxQueuedBytes the
// connection is closed.
func (w *wsWriter) sendParts(limit int, parts ...[]byte) bool {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	w.mu.Lock()
	if w.closed || (limit > 0 && w.queued >= limit) {
		w.mu.Unlock()
		return false
	}
	if w.queued+size > maxQueuedBytes {
		w.mu.Unlock()
		w.onError()
		return false
	}
	w.q = append(w.q, wsFrame{parts: parts, size: size})
	w.queued += size
	w.mu.Unlock()
	w.wake()
	return true
}

func (w *wsWriter) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// flush waits (at most writeTimeout) until everything queued so far has
// been written: a last message before the connection is ended must get
// out first.
func (w *wsWriter) flush() {
	m := wsFrame{flushed: make(chan struct{})}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.q = append(w.q, m)
	w.mu.Unlock()
	w.wake()
	select {
	case <-m.flushed:
	case <-w.done:
	case <-time.After(writeTimeout):
	}
}

// close stops taking frames, sends what is queued, and waits for that.
func (w *wsWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
	<-w.done
}

func (w *wsWriter) run() {
	defer close(w.done)
	failed := false
	for {
		<-w.signal
		w.mu.Lock()
		batch, closed := w.q, w.closed
		w.q = nil
		w.mu.Unlock()
		if !failed && len(batch) > 0 {
			if err := w.write(batch); err != nil {
				failed = true
				w.onError()
			}
		}
		w.mu.Lock()
		for _, f := range batch {
			w.queued -= f.size
		}
		w.mu.Unlock()
		for _, f := range batch {
			if f.flushed != nil {
				close(f.flushed)
			}
		}
		if closed {
			return
		}
		w.mu.Lock()
		if len(w.q) == 0 {
			close(w.drained)
			w.drained = make(chan struct{})
		}
		w.mu.Unlock()
	}
}

func (w *wsWriter) write(batch []wsFrame) error {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if w.cork != nil {
		w.cork.corkOn()
	}
	for _, f := range batch {
		if f.parts == nil {
			continue
		}
		if err := writeParts(ctx, w.c, f.parts); err != nil {
			if w.cork != nil {
				w.cork.corkOff()
			}
			return err
		}
	}
	if w.cork != nil {
		return w.cork.corkOff()
	}
	return nil
}

// writeParts writes one text message made of parts.
func writeParts(ctx context.Context, c *websocket.Conn, parts [][]byte) error {
	if len(parts) == 1 {
		return c.Write(ctx, websocket.MessageText, parts[0])
	}
	wr, err := c.Writer(ctx, websocket.MessageText)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := wr.Write(p); err != nil {
			wr.Close()
			return err
		}
	}
	return wr.Close()
}

// corkConn holds back writes while corked and sends them in one write.
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *corkConn) corkOn() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// corkOff sends what was held back, within writeTimeout.
func (c *corkConn) corkOff() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if len(c.buf) == 0 {
		return nil
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.Conn.Write(c.buf)
	_ = c.Conn.SetWriteDeadline(time.Time{})
	if cap(c.buf) > 1<<20 {
		c.buf = nil // do not keep a burst's buffer for the connection's life
	} else {
		c.buf = c.buf[:0]
	}
	return err
}

// corkingWriter hands coder/websocket a hijacked connection wrapped in a
// corkConn.
type corkingWriter struct {
	http.ResponseWriter
	cork *corkConn
}

func (w *corkingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.cork = &corkConn{Conn: conn}
	return w.cork, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(w.cork)), nil
}

func (w *corkingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
