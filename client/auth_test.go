package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// backupServers is a follower that redirects every request to a leader,
// which records what it was sent.
type backupServers struct {
	follower, leader *httptest.Server
	followerHits     atomic.Int32

	mu      sync.Mutex
	bodies  [][]byte
	queries []string
	auths   []string
	expects []string
	backup  []byte
}

// newBackupServers starts the pair; with readBody the follower reads the
// whole request body before it redirects (as a proxy might), so the client
// must send the body again from the start.
func newBackupServers(t *testing.T, backup []byte, readBody bool) *backupServers {
	s := &backupServers{backup: backup}
	s.leader = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.mu.Unlock()
		switch r.Method + " " + r.URL.Path {
		case "GET /api/v1/snapshot":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(s.backup)
		case "POST /api/v1/snapshot/restore":
			s.mu.Lock()
			s.expects = append(s.expects, r.Header.Get("Expect"))
			s.mu.Unlock()
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("leader reading the body: %v", err)
			}
			s.mu.Lock()
			s.bodies = append(s.bodies, b)
			s.queries = append(s.queries, r.URL.RawQuery)
			s.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"restored":true}`)
		default:
			http.NotFound(w, r)
		}
	}))
	s.follower = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.followerHits.Add(1)
		// Like lockd: answer the redirect without reading the body (with
		// Expect: 100-continue the client then never sends it).
		if readBody {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		w.Header().Set(api.HeaderLeader, s.leader.URL)
		w.Header().Set("Location", s.leader.URL+r.URL.RequestURI())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTemporaryRedirect)
		_, _ = io.WriteString(w, `{"error":{"code":"not_leader","message":"follower"},"leader":"`+s.leader.URL+`"}`)
	}))
	t.Cleanup(func() {
		s.follower.Close()
		s.leader.Close()
	})
	return s
}

// onlyReader hides every method of a reader but Read.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// TestSnapshotRestoreFollowsRedirect: the backup reaches the leader whole
// after a follower's 307, from a file (read in place, offset kept) and from
// a plain reader (buffered); the token goes along; force is passed on.
func TestSnapshotRestoreFollowsRedirect(t *testing.T) {
	for _, readBody := range []bool{false, true} {
		t.Run(fmt.Sprintf("follower reads the body %v", readBody), func(t *testing.T) { testRestoreRedirect(t, readBody) })
	}
}

func testRestoreRedirect(t *testing.T, readBody bool) {
	backup := bytes.Repeat([]byte("lockd-backup-"), 50_000) // 650 kB
	s := newBackupServers(t, backup, readBody)
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{s.follower.URL}, Token: "admin-secret"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// A file whose first bytes are not part of the backup: restore sends
	// from the current offset.
	path := filepath.Join(t.TempDir(), "b.snap")
	if err := os.WriteFile(path, append([]byte("JUNK"), backup...), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(4, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if err := a.SnapshotRestore(ctx, f, false); err != nil {
		t.Fatal(err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 4 {
		t.Fatalf("file offset moved to %d", off)
	}
	// The leader is remembered now; start over from the follower.
	a2, _ := client.NewAPI(client.APIConfig{Endpoints: []string{s.follower.URL}, Token: "admin-secret"})
	if err := a2.SnapshotRestore(ctx, onlyReader{bytes.NewReader(backup)}, true); err != nil {
		t.Fatal(err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bodies) != 2 {
		t.Fatalf("leader got %d restores, want 2", len(s.bodies))
	}
	for i, b := range s.bodies {
		if !bytes.Equal(b, backup) {
			t.Fatalf("restore %d: leader got %d bytes, want the %d-byte backup", i, len(b), len(backup))
		}
		if s.expects[i] != "100-continue" {
			t.Errorf("restore %d: Expect %q", i, s.expects[i])
		}
	}
	if s.queries[0] != "" || s.queries[1] != "force=true" {
		t.Fatalf("queries %q", s.queries)
	}
	for _, h := range s.auths {
		if h != "Bearer admin-secret" {
			t.Fatalf("Authorization %q", h)
		}
	}
	if s.followerHits.Load() != 2 {
		t.Fatalf("follower hit %d times, want 2", s.followerHits.Load())
	}
}

// TestSnapshotRestoreMinToken: WithMinToken reaches the leader as
// min_token, next to force.
func TestSnapshotRestoreMinToken(t *testing.T) {
	s := newBackupServers(t, []byte("backup"), false)
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{s.follower.URL}, Token: "admin-secret"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SnapshotRestore(t.Context(), bytes.NewReader([]byte("backup")), true, client.WithMinToken(5000)); err != nil {
		t.Fatal(err)
	}
	if err := a.SnapshotRestore(t.Context(), bytes.NewReader([]byte("backup")), false, client.WithMinToken(0)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queries) != 2 || s.queries[0] != "force=true&min_token=5000" || s.queries[1] != "" {
		t.Fatalf("queries %q", s.queries)
	}
}

func TestSnapshotSaveFollowsRedirect(t *testing.T) {
	backup := bytes.Repeat([]byte{0, 1, 2, 0xff}, 100_000)
	s := newBackupServers(t, backup, false)
	a, err := client.NewAPI(client.APIConfig{Endpoints: []string{s.follower.URL}, Token: "admin-secret"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := a.SnapshotSave(t.Context(), &buf)
	if err != nil || n != int64(len(backup)) || !bytes.Equal(buf.Bytes(), backup) {
		t.Fatalf("SnapshotSave: n=%d (want %d), equal=%v, err=%v", n, len(backup), bytes.Equal(buf.Bytes(), backup), err)
	}
	if a.Leader() != s.leader.URL {
		t.Fatalf("leader %q", a.Leader())
	}
}

// TestAuthErrorsAreNotRetried: 401 and 403 map to their sentinels at once,
// over HTTP and on the WebSocket upgrade, with or without a JSON body.
func TestAuthErrorsAreNotRetried(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   error
	}{
		{401, `{"error":{"code":"unauthenticated","message":"a valid bearer token is required"}}`, client.ErrUnauthenticated},
		{403, `{"error":{"code":"permission_denied","message":"token \"x\" lacks lock access"}}`, client.ErrPermissionDenied},
		{401, `go away`, client.ErrUnauthenticated},
		{403, ``, client.ErrPermissionDenied},
	} {
		var hits atomic.Int32
		var auth atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			auth.Store(r.Header.Get("Authorization"))
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		}))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		a, _ := client.NewAPI(client.APIConfig{Endpoints: []string{srv.URL, srv.URL}, Token: "tok", MinBackoff: time.Millisecond})
		_, err := a.Acquire(ctx, "x", "c", 0, 0)
		var se *client.ServerError
		if !errors.Is(err, tc.want) || !errors.As(err, &se) || se.Status != tc.status || hits.Load() != 1 || auth.Load() != "Bearer tok" {
			t.Errorf("%d %q: API err %v (status %v), %d requests, Authorization %v", tc.status, tc.body, err, se, hits.Load(), auth.Load())
		}
		hits.Store(0)
		start := time.Now()
		c, err := client.New(ctx, client.Config{Endpoints: []string{srv.URL, srv.URL}, Token: "tok", MinBackoff: time.Millisecond})
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, tc.want) || hits.Load() != 1 || auth.Load() != "Bearer tok" || time.Since(start) > 5*time.Second {
			t.Errorf("%d %q: New err %v, %d requests, Authorization %v", tc.status, tc.body, err, hits.Load(), auth.Load())
		}
		cancel()
		srv.Close()
	}
}

func TestTransportConfigValidation(t *testing.T) {
	_, err := client.NewAPI(client.APIConfig{Endpoints: []string{"https://x"}, TLSConfig: &tls.Config{}, HTTPClient: &http.Client{}})
	if err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("TLSConfig with HTTPClient: %v", err)
	}
	if err := (client.Config{Endpoints: []string{"https://x"}, Token: "a\nb"}).Validate(); err == nil {
		t.Fatal("a token with a newline was accepted")
	}
	if err := (client.Config{Endpoints: []string{"https://x"}, TLSConfig: &tls.Config{}, Token: "t"}).Validate(); err != nil {
		t.Fatal(err)
	}
}
