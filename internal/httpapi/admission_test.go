package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/admission"
)

func postJSON(t *testing.T, url string, body any) (*http.Response, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

func errCodeOf(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// SPEC 15: above what the cluster commits, new work is refused early —
// 503 overloaded with Retry-After, nothing proposed — while work that
// keeps a promise (a release) is still admitted; over WebSocket the error
// frame carries retry_after_ms. A client's budget is 429 with Retry-After.
func TestAdmissionRefusesNewWorkFirst(t *testing.T) {
	f := newFake()
	obs := &recordingObserver{}
	adm := admission.New(admission.Config{MinLimit: 4, MaxLimit: 4, KeepFactor: 2, ClientShare: -1, TokenShare: -1})
	srv := httptest.NewServer(New(Config{Backend: f, Observer: obs, Admission: adm}))
	defer srv.Close()
	lock := func(name, op string) string { return srv.URL + "/api/v1/locks/" + name + "/" + op }
	// A grant to release later, before the cluster stalls.
	r0, g := postJSON(t, lock("keep", "acquire"), map[string]any{"client_id": "holder", "ttl_ms": 60000})
	if r0.StatusCode != 200 {
		t.Fatalf("acquire: %d %v", r0.StatusCode, g)
	}
	tok := uint64(g["fencing_token"].(float64))

	f.gate = make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ { // the limit: four proposals outstanding
		wg.Add(1)
		go func() {
			defer wg.Done()
			postJSON(t, lock(fmt.Sprintf("l%d", i), "acquire"), map[string]any{"client_id": fmt.Sprintf("c%d", i), "ttl_ms": 60000})
		}()
	}
	waitFor(t, "four proposals outstanding", func() bool { return adm.Stats().Outstanding == 4 })
	before := f.proposed.Load()
	resp, body := postJSON(t, lock("l9", "acquire"), map[string]any{"client_id": "late", "ttl_ms": 60000})
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != 503 || errCodeOf(body) != api.CodeOverloaded || ra < 1 {
		t.Fatalf("new work past the limit: %d Retry-After %q %v", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if f.proposed.Load() != before {
		t.Fatal("a refused acquire was proposed")
	}
	// A release keeps a promise: admitted (it waits for the stalled cluster).
	wg.Add(1)
	go func() {
		defer wg.Done()
		if resp, body := postJSON(t, lock("keep", "release"), map[string]any{"client_id": "holder", "fencing_token": tok}); resp.StatusCode != 200 {
			t.Errorf("release under overload: %d %v", resp.StatusCode, body)
		}
	}()
	waitFor(t, "the release to be proposed", func() bool { return f.proposed.Load() == before+1 })

	// Over WebSocket: an error frame with retry_after_ms.
	c := dialWS(t, srv)
	c.send(`{"id":1,"op":"hello","client_id":"ws"}`) // a session is new work too: refused
	if m := c.recv(); m.Type != api.TypeError || m.Error.Code != api.CodeOverloaded || m.RetryAfterMs <= 0 {
		t.Fatalf("hello under overload: %+v", m)
	}
	close(f.gate)
	wg.Wait()
	c.send(`{"id":2,"op":"hello","client_id":"ws"}`)
	if m := c.recv(); m.Type != api.TypeHello {
		t.Fatalf("hello after the stall: %+v", m)
	}
	f.gate = make(chan struct{})
	for i := 0; i < 4; i++ {
		c.send(fmt.Sprintf(`{"id":%d,"op":"acquire","lock":"w%d","ttl_ms":60000}`, 10+i, i))
	}
	waitFor(t, "four proposals outstanding", func() bool { return adm.Stats().Outstanding == 4 })
	c.send(`{"id":20,"op":"acquire","lock":"w9","ttl_ms":60000}`)
	for {
		m := c.recv()
		if m.ID != 20 {
			continue
		}
		if m.Type != api.TypeError || m.Error.Code != api.CodeOverloaded || m.RetryAfterMs < 100 {
			t.Fatalf("WebSocket acquire under overload: %+v", m)
		}
		break
	}
	close(f.gate)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.refused) != 3 || obs.refused[0] != "overloaded/acquire" || obs.refused[1] != "overloaded/create_session" {
		t.Fatalf("refusals observed: %v", obs.refused)
	}
}

func TestAdmissionClientBudget(t *testing.T) {
	f := newFake()
	adm := admission.New(admission.Config{MinLimit: 64, MaxLimit: 64, ClientShare: 0.25})
	srv := httptest.NewServer(New(Config{Backend: f, Admission: adm}))
	defer srv.Close()
	f.gate = make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ { // max(16, 0.25 × 64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			postJSON(t, fmt.Sprintf("%s/api/v1/locks/b%d/acquire", srv.URL, i), map[string]any{"client_id": "greedy", "ttl_ms": 60000})
		}()
	}
	waitFor(t, "sixteen proposals outstanding", func() bool { return adm.Stats().Outstanding == 16 })
	resp, body := postJSON(t, srv.URL+"/api/v1/locks/b99/acquire", map[string]any{"client_id": "greedy", "ttl_ms": 60000})
	if resp.StatusCode != 429 || errCodeOf(body) != api.CodeResourceExhausted || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("past the client's budget: %d %q %v", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	close(f.gate)
	wg.Wait()
	if resp, _ := postJSON(t, srv.URL+"/api/v1/locks/b99/acquire", map[string]any{"client_id": "greedy", "ttl_ms": 60000}); resp.StatusCode != 200 {
		t.Fatalf("after the budget freed: %d", resp.StatusCode)
	}
}
