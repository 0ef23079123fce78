package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/testutil"
)

func httpJSON(t *testing.T, method, u string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, u, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
	}
	if resp.StatusCode != 200 {
		t.Logf("%s %s: %d %s", method, u, resp.StatusCode, data)
	}
	return len(data)
}

// TestPagesAreBoundedInBytes: a holders page and a list page end at about
// 1 MiB whatever their limit, with "next" where the following page starts,
// and paging still reaches every holder and every lock exactly once, in
// order. (Fifty readers of 10 000 holders with 4 KiB values each made a
// leader grow by 6.5 GiB.)
func TestPagesAreBoundedInBytes(t *testing.T) {
	c := testutil.NewCluster(t, 1, testutil.Options{})
	base := c.WaitLeader(10*time.Second).URL() + "/api/v1/locks/"
	value := strings.Repeat("v", 4000)
	limit, ttl := int64(1000), int64(600_000)
	const holders = 400
	for i := range holders {
		if httpJSON(t, "POST", base+"pg%2Fsem/acquire", api.AcquireRequest{ClientID: fmt.Sprintf("c%03d", i), Limit: &limit, TTLms: &ttl, Value: &value}, nil) == 0 {
			t.Fatal("no answer")
		}
	}
	var seen []uint64
	pages := 0
	for after := ""; ; pages++ {
		var page api.HoldersPage
		n := httpJSON(t, "GET", base+"pg%2Fsem/holders?limit=10000&after="+url.QueryEscape(after), nil, &page)
		if n > 1<<20+64<<10 {
			t.Fatalf("a holders page of %d bytes", n)
		}
		if page.HoldersTotal != holders {
			t.Fatalf("holders_total %d", page.HoldersTotal)
		}
		for _, h := range page.Holders {
			seen = append(seen, h.FencingToken)
		}
		if after = page.Next; after == "" {
			break
		}
	}
	if len(seen) != holders || pages < 1 {
		t.Fatalf("%d holders over %d pages, want %d over more than one", len(seen), pages+1, holders)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("tokens out of order or repeated: %d after %d", seen[i], seen[i-1])
		}
	}

	// Lists: 12 semaphores of 64 holders with 4 KiB values are ~3 MiB of
	// statuses.
	for s := range 12 {
		for i := range 64 {
			httpJSON(t, "POST", base+fmt.Sprintf("pl%%2F%02d/acquire", s), api.AcquireRequest{ClientID: fmt.Sprintf("c%03d", i), Limit: &limit, TTLms: &ttl, Value: &value}, nil)
		}
	}
	var names []string
	pages = 0
	for after := ""; ; pages++ {
		var list api.LockList
		n := httpJSON(t, "GET", strings.TrimSuffix(base, "/")+"?prefix=pl/&limit=1000&after="+url.QueryEscape(after), nil, &list)
		if n > 1<<20+300<<10 {
			t.Fatalf("a list page of %d bytes", n)
		}
		for _, st := range list.Locks {
			names = append(names, st.Lock)
			if len(st.Holders) != 64 {
				t.Fatalf("%s lists %d holders", st.Lock, len(st.Holders))
			}
		}
		if after = list.Next; after == "" {
			break
		}
	}
	if len(names) != 12 || pages < 2 {
		t.Fatalf("%d locks over %d pages, want 12 over at least 3", len(names), pages+1)
	}
	for i := range names {
		if want := fmt.Sprintf("pl/%02d", i); names[i] != want {
			t.Fatalf("list order: %v", names)
		}
	}
}
