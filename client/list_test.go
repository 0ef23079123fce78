package client_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockd/lockd/api"
)

// pagedServer serves GET /api/v1/locks over names as lockd does: sorted,
// after exclusive, at most limit (default 1000) a page, and never more than
// maxPage (a server may send smaller pages than asked for). It records the
// query of every request. badNext makes every page name "a" as next.
type pagedServer struct {
	*httptest.Server
	names   []string
	maxPage int
	badNext atomic.Bool

	mu      sync.Mutex
	queries []string
}

func newPagedServer(t *testing.T, names []string, maxPage int) *pagedServer {
	s := &pagedServer{names: names, maxPage: maxPage}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/locks" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		s.mu.Lock()
		s.queries = append(s.queries, r.URL.RawQuery)
		s.mu.Unlock()
		limit := 1000
		if v := q.Get("limit"); v != "" {
			limit, _ = strconv.Atoi(v)
		}
		limit = min(limit, s.maxPage)
		out := api.LockList{Locks: []api.LockStatus{}}
		for _, n := range s.names {
			if !strings.HasPrefix(n, q.Get("prefix")) || n <= q.Get("after") {
				continue
			}
			if len(out.Locks) == limit {
				out.Next = out.Locks[len(out.Locks)-1].Lock
				break
			}
			out.Locks = append(out.Locks, api.LockStatus{Lock: n, Held: true, ClientID: "w", FencingToken: 1})
		}
		if s.badNext.Load() {
			out.Next = "a"
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *pagedServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries...)
}

func lockNames(n int, prefix string) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s%04d", prefix, i))
	}
	return out
}

// TestListReadsEveryPage: List follows next until the last page.
func TestListReadsEveryPage(t *testing.T) {
	names := append(lockNames(7, "p/"), lockNames(2, "q/")...)
	s := newPagedServer(t, names, 3)
	a := newAPI(t, s.URL)
	got, err := a.List(t.Context(), "p/")
	if err != nil {
		t.Fatal(err)
	}
	var gotNames []string
	for _, l := range got {
		gotNames = append(gotNames, l.Lock)
	}
	if want := lockNames(7, "p/"); !slices.Equal(gotNames, want) {
		t.Fatalf("List: %q, want %q", gotNames, want)
	}
	if q := s.seen(); len(q) != 3 || !strings.Contains(q[1], "after=p%2F0002") || !strings.Contains(q[2], "after=p%2F0005") {
		t.Fatalf("queries %q: want three pages, each after the last name of the one before", q)
	}
}

// TestListPage: one page as asked for (prefix, after, limit), its next;
// a next that does not move forward is an error, not an endless List.
func TestListPage(t *testing.T) {
	s := newPagedServer(t, lockNames(7, "p/"), 1000)
	a := newAPI(t, s.URL)
	page, err := a.ListPage(t.Context(), "p/", "p/0002", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Locks) != 2 || page.Locks[0].Lock != "p/0003" || page.Locks[1].Lock != "p/0004" || page.Next != "p/0004" {
		t.Fatalf("page %+v", page)
	}
	if q := s.seen(); len(q) != 1 || q[0] != "after=p%2F0002&limit=2&prefix=p%2F" {
		t.Fatalf("queries %q", q)
	}
	last, err := a.ListPage(t.Context(), "p/", "p/0004", 0)
	if err != nil || len(last.Locks) != 2 || last.Next != "" {
		t.Fatalf("last page %+v, %v", last, err)
	}

	s.badNext.Store(true)
	if _, err := a.List(t.Context(), "p/"); err == nil || !strings.Contains(err.Error(), "not after") {
		t.Fatalf("List with a next that goes back: %v", err)
	}
}
