package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/testutil"
)

// TestAddMemberRefusesBadAddresses: the leader's AddMember checks both
// addresses itself before it changes the configuration or proposes them, so
// neither a raft_addr that is not host:port (which had the leader wait for a
// member that can never catch up) nor an http_addr the log decoder cannot
// read back (the poison pill) gets anywhere, whoever calls it.
func TestAddMemberRefusesBadAddresses(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	for name, req := range map[string]api.AddMemberRequest{
		"raft_addr garbage": {ID: "n9", RaftAddr: "nonsense", HTTPAddr: "http://127.0.0.1:1"},
		"http_addr poison":  {ID: "n9", RaftAddr: "127.0.0.1:1", HTTPAddr: strings.Repeat("\uFFFD", 65000)},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			err := l.Srv.AddMember(ctx, req)
			if err == nil || !strings.Contains(err.Error(), "invalid_argument") {
				t.Fatalf("AddMember: %v, want invalid_argument", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("refusing took %v", d)
			}
		})
	}
	var members []locktable.Member
	l.Srv.View(func(tb *locktable.Table) { members = tb.Members() })
	for _, m := range members {
		if m.ID == "n9" {
			t.Fatalf("a refused member was published: %+v", m)
		}
	}
}
