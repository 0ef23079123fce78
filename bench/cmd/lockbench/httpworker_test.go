package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestHTTPWorkerBacksOffOnOverloaded (SPEC 15): the plain-HTTP worker
// waits out a 503 overloaded (its Retry-After) and sends the request
// again, as the Go client does, instead of counting an error.
func TestHTTPWorkerBacksOffOnOverloaded(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"overloaded","message":"retry after 1s"}}`)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"overloaded","message":"busy"}}`)
		default:
			io.WriteString(w, `{"acquired":true,"fencing_token":7}`)
		}
	}))
	defer srv.Close()
	w := &lockdHTTPWorker{hc: srv.Client(), base: srv.URL, id: "w"}
	start := time.Now()
	if err := w.lock(t.Context(), "x"); err != nil {
		t.Fatalf("lock through two overloaded refusals: %v", err)
	}
	if took := time.Since(start); took < time.Second || calls.Load() != 3 || w.token != 7 {
		t.Fatalf("after %v, %d requests, token %d: want the Retry-After waited and a third request granted", took, calls.Load(), w.token)
	}
}
