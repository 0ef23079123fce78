package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestPeerTokenStaysWithMembers: the member token (admin) goes only to
// members. An add-member request names an HTTP address of a stranger; the
// leader polls it while the "member" catches up, and the stranger
// redirects elsewhere. Neither the stranger nor the host it redirects to
// may see the token.
func TestPeerTokenStaysWithMembers(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	record := func(who string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if a := r.Header.Get("Authorization"); a != "" {
				mu.Lock()
				leaked = append(leaked, who+" got "+a)
				mu.Unlock()
			}
			if who == "stranger" {
				http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
				return
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
	target = httptest.NewServer(record("redirect target"))
	defer target.Close()
	stranger := httptest.NewServer(record("stranger"))
	defer stranger.Close()

	_, store := testutil.AuthFile(t, `{"tokens":[{"name":"ops","token":"admin-secret-0123456789","permissions":[{"prefix":"","access":"admin"}]}]}`)
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.Auth = store
		cfg.PeerToken = "admin-secret-0123456789"
		cfg.CatchUpTimeout = 800 * time.Millisecond
	}})
	l := c.WaitLeader(10 * time.Second)
	free, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"id":"n9","raft_addr":%q,"http_addr":%q}`, free, stranger.URL)
	req, _ := http.NewRequest(http.MethodPost, l.URL()+"/api/v1/cluster/members", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer admin-secret-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 200 {
		t.Fatalf("a member that never caught up was added: %s", raw)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) > 0 {
		t.Fatalf("the member token left the cluster: %v", leaked)
	}
}

var target *httptest.Server
