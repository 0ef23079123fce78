package httpapi

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
)

// TestBigRepliesTakeTurns: a big read reply waits for room in the member's
// reply budget, is written once there is room, and a request that ends
// while it waits is answered 503 overloaded, not an empty 200; a small
// reply never waits.
func TestBigRepliesTakeTurns(t *testing.T) {
	h := &Handler{replyBudget: newReplyBudget()}
	if !h.replyBudget.TryAcquire(maxReplyBytes) {
		t.Fatal("the budget is not empty")
	}
	big := api.LockStatus{Lock: "l", Value: strings.Repeat("v", 100<<10)}
	size := statusBytes(big)

	rec := httptest.NewRecorder()
	h.writeRead(rec, httptest.NewRequest("GET", "/", nil), 100, api.LockStatus{Lock: "small"})
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"small"`) {
		t.Fatalf("a small reply waited or failed: %d %s", rec.Code, rec.Body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	rec = httptest.NewRecorder()
	h.writeRead(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx), size, big)
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "overloaded") {
		t.Fatalf("a big reply with no room: %d %.200s", rec.Code, rec.Body)
	}

	done := make(chan *httptest.ResponseRecorder)
	go func() {
		rec := httptest.NewRecorder()
		h.writeRead(rec, httptest.NewRequest("GET", "/", nil), size, big)
		done <- rec
	}()
	select {
	case <-done:
		t.Fatal("a big reply was written with the budget full")
	case <-time.After(100 * time.Millisecond):
	}
	h.replyBudget.Release(maxReplyBytes)
	select {
	case rec := <-done:
		if rec.Code != 200 || rec.Body.Len() < 100<<10 {
			t.Fatalf("the big reply once there was room: %d, %d bytes", rec.Code, rec.Body.Len())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the big reply never got room")
	}
}
