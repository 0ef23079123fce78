package server

import (
	"io"
	"net/http"
	"runtime"
	"time"
)

// ConnLimits bound what a client can hold of a member's client API without
// even a token: connections, idle keep-alives, and slow requests.
type ConnLimits struct {
	// MaxConns and MaxConnsPerIP cap open client API connections, in total
	// and per remote IP (0: the defaults). Over a cap, a new connection is
	// closed as soon as it is accepted.
	MaxConns      int
	MaxConnsPerIP int
	// IdleTimeout closes a keep-alive connection with no request for this
	// long.
	IdleTimeout time.Duration
	// BodyTimeout bounds how long a request's body may take to arrive.
	BodyTimeout time.Duration
}

// Defaults: generous for one host running many clients through one
// address (benchmarks, a NAT), small enough that a member's descriptors
// cannot all be taken.
const (
	DefaultMaxConns      = 16384
	DefaultMaxConnsPerIP = 4096
	DefaultIdleTimeout   = 60 * time.Second
	DefaultBodyTimeout   = 30 * time.Second
	// headerTimeout bounds the request line and headers.
	headerTimeout = 10 * time.Second
	// maxRequestTime bounds writing a reply: the longest a request may wait
	// (a blocking query's 10 min; an acquire waits at most 600 s) plus slack.
	maxRequestTime = 11 * time.Minute
)

func (l *ConnLimits) setDefaults() {
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerIP == 0 {
		l.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
}

// limitRequests bounds each request in time. net/http's ReadTimeout and
// WriteTimeout cannot be used: a read deadline left on the connection
// while a long-poll waits makes the server's background read fail and
// cancel the request, and a write deadline would cut every long wait. So
// the body gets a read deadline that is lifted once it has been read, and
// the reply a write deadline past the longest wait the API allows. A
// WebSocket upgrade gets neither: the connection outlives the request and
// keeps its own pings and limits.
func limitRequests(next http.Handler, lim ConnLimits) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Header.Get("Upgrade") == "" {
			_ = rc.SetWriteDeadline(time.Now().Add(maxRequestTime))
		}
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			_ = rc.SetReadDeadline(time.Now().Add(lim.BodyTimeout))
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		if r.Header.Get("Upgrade") == "" {
			// A connection's pipelined requests never block on the network;
			// yield each to the back of the scheduler's global queue, where
			// the goroutines the network poller wakes (Raft's heartbeat
			// replies among them) wait while client work keeps every
			// processor busy (see httpapi's WebSocket read loop).
			runtime.Gosched()
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the body's read deadline once the body has been read
// to its end, so a request that then waits is not cancelled by it.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
