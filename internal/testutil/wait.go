package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond every 10 ms until it holds, and fails the test when d
// passes first.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that goroutines may write concurrently:
// the log sink of a process (exec copies its output from goroutines of its
// own) or of a client.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
