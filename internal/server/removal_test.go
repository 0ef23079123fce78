package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testutil"
)

// TestRemovedMemberStops: a member removed from the configuration learns
// it (from the members it knows, since the leader stops replicating to it
// as the removal commits) and stops, instead of answering no_leader
// forever. The others go on.
func TestRemovedMemberStops(t *testing.T) {
	c := testutil.NewCluster(t, 3, testutil.Options{})
	l := c.WaitLeader(10 * time.Second)
	victim := "n3"
	if l.ID == victim {
		victim = "n2"
	}
	gone := c.Members[victim].Srv
	r := testutil.Call(t.Context(), http.MethodDelete, l.URL()+"/api/v1/cluster/members/"+victim, nil)
	if r.Status != 200 {
		t.Fatalf("remove %s: %d %s", victim, r.Status, r.Raw)
	}
	select {
	case <-gone.Removed():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s was removed but did not notice within 20 s", victim)
	}
	if a := testutil.Post(lockURL(l, "after-removal", "acquire"), map[string]any{"client_id": "c"}); a.Status != 200 {
		t.Fatalf("the remaining members: %s", a.Raw)
	}
}
