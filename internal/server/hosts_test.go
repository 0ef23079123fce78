package server_test

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/server"
	"github.com/lockd/lockd/internal/testutil"
)

// TestHostCheckWiring (SPEC 19): a member serves its advertised name, its
// listen address, localhost and the names of AllowedHosts — the API, the
// dashboard and the metrics alike — and refuses any other Host with 403.
func TestHostCheckWiring(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.HTTPAdvertise = "http://lockd-n1.cluster.test:7070"
		cfg.AllowedHosts = []string{"scrape.example"}
	}})
	m := c.WaitLeader(10 * time.Second)
	get := func(path, host string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+path, nil)
		req.Host = host
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/api/v1/locks/x", "/ui/", "/metrics", "/healthz"} {
		for _, host := range []string{m.HTTPAddr, "lockd-n1.cluster.test:7070", "localhost", "scrape.example:9100"} {
			if code := get(path, host); code != 200 {
				t.Errorf("GET %s Host %s: %d, want 200", path, host, code)
			}
		}
		for _, host := range []string{"evil.example", "lockd-n1.cluster.test.evil.example", "cluster.test"} {
			if code := get(path, host); code != 403 {
				t.Errorf("GET %s Host %s: %d, want 403", path, host, code)
			}
		}
	}
}

// TestHostCheckConfig: --allowed-hosts entries are host names or "*".
func TestHostCheckConfig(t *testing.T) {
	for _, bad := range []string{"lockd.example:7070", "http://lockd.example", "a b"} {
		cfg := server.Config{AllowedHosts: []string{bad}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--allowed-hosts") {
			t.Errorf("AllowedHosts %q: %v, want an --allowed-hosts error", bad, err)
		}
	}
	cfg := server.Config{AllowedHosts: []string{"*", "lockd.example"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestHostCheckWildcardListen: a member listening on every interface
// answers to its machine's host name.
func TestHostCheckWildcardListen(t *testing.T) {
	hn, err := os.Hostname()
	if err != nil || hn == "" {
		t.Skip("no host name")
	}
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	port := addr[strings.LastIndexByte(addr, ':'):]
	c := testutil.NewCluster(t, 1, testutil.Options{Modify: func(cfg *server.Config) {
		cfg.HTTPAddr = "0.0.0.0" + port
	}})
	c.WaitLeader(10 * time.Second)
	req, _ := http.NewRequest("GET", "http://127.0.0.1"+port+"/healthz", nil)
	req.Host = hn + port
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("Host %s on a member listening on 0.0.0.0: %d", req.Host, resp.StatusCode)
	}
}
