package httpapi

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

type recordingObserver struct {
	mu       sync.Mutex
	outcomes []string
	refused  []string
}

func (o *recordingObserver) AcquireDone(outcome string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, outcome)
}
func (o *recordingObserver) WebSocketConns(int)                         {}
func (o *recordingObserver) WebSocketRequestDone(string, time.Duration) {}
func (o *recordingObserver) takeRefusals() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.refused
	o.refused = nil
	return out
}

func (o *recordingObserver) Refused(code, op string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused = append(o.refused, code+"/"+op)
}

func (o *recordingObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.outcomes
	o.outcomes = nil
	return out
}

// TestAcquireOutcomes: each HTTP acquire this member serves is recorded
// once under the outcome docs/METRICS.md names; one it redirects to the
// leader is left for the leader to record.
func TestAcquireOutcomes(t *testing.T) {
	f := newFake()
	obs := &recordingObserver{}
	h := New(Config{Backend: f, Observer: obs})
	steps := []struct {
		body string
		want string
	}{
		{`{"client_id":"a","ttl_ms":60000}`, "granted"},
		{`{"client_id":"b","ttl_ms":60000}`, "lock_held"},
		{`{"client_id":"b","ttl_ms":1}`, "invalid_argument"},
		{`{"client_id":"b",`, "invalid_argument"},
	}
	for _, s := range steps {
		do(t, h, "POST", "/api/v1/locks/o/acquire", s.body)
		if got := obs.take(); !slices.Equal(got, []string{s.want}) {
			t.Errorf("%s: recorded %v, want [%s]", s.body, got, s.want)
		}
	}
	f.mu.Lock()
	f.ready, f.leader = false, "http://leader.example:7070"
	f.mu.Unlock()
	if r := do(t, h, "POST", "/api/v1/locks/o/acquire", `{"client_id":"c"}`); r.status != 307 {
		t.Fatalf("follower: %d %s", r.status, r.raw)
	}
	if got := obs.take(); len(got) != 0 {
		t.Errorf("redirect recorded as %v", got)
	}
}

// TestWatchesPerConnectionBounded: past maxWatchesPerConn watches, a
// connection's next watch is refused with resource_exhausted, and the
// refusal is counted under op watch.
func TestWatchesPerConnectionBounded(t *testing.T) {
	obs := &recordingObserver{}
	srv := httptest.NewServer(New(Config{Backend: newFake(), Observer: obs}))
	defer srv.Close()
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"many","session_ttl_ms":60000}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello: %+v", m)
	}
	for i := range maxWatchesPerConn {
		id := uint64(i + 2)
		c.send(fmt.Sprintf(`{"id":%d,"op":"watch","prefix":"none/"}`, id))
		m := c.recv()
		for m.ID != id { // pushes of the watches (none for an empty prefix)
			m = c.recv()
		}
		if m.Type != api.TypeOK {
			t.Fatalf("watch %d: %+v", i+1, m)
		}
	}
	if got := obs.takeRefusals(); len(got) != 0 {
		t.Fatalf("refusals before the limit: %v", got)
	}
	c.send(`{"id":9999,"op":"watch","prefix":"none/"}`)
	m := c.recv()
	for m.ID != 9999 { // pushes of the earlier watches
		m = c.recv()
	}
	if m.Type != api.TypeError || m.Error.Code != api.CodeResourceExhausted {
		t.Fatalf("watch past the limit: %+v", m)
	}
	if got := obs.takeRefusals(); !slices.Equal(got, []string{"resource_exhausted/watch"}) {
		t.Fatalf("refusals %v", got)
	}
}
