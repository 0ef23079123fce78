package httpapi

import (
	"net/http"
	"net/http/pprof"

	"github.com/lockd/lockd/internal/auth"
)

// mountPprof serves Go's profiler under /debug/pprof/ (lockd --pprof). It
// is off by default: a CPU profile costs the member CPU while it runs, and
// goroutine dumps name locks and clients. With authentication on, it needs
// an admin token, as cluster operations do.
func (h *Handler) mountPprof() {
	admin := func(f http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if _, ok := h.allow(w, r, auth.Admin, "", false); ok {
				f(w, r)
			}
		}
	}
	// pprof.Index serves the named profiles (heap, goroutine, allocs,
	// block, mutex, ...) below the prefix as well as the index page.
	h.mux.HandleFunc("GET /debug/pprof/", admin(pprof.Index))
	h.mux.HandleFunc("GET /debug/pprof/cmdline", admin(pprof.Cmdline))
	h.mux.HandleFunc("GET /debug/pprof/profile", admin(pprof.Profile))
	h.mux.HandleFunc("GET /debug/pprof/symbol", admin(pprof.Symbol))
	h.mux.HandleFunc("POST /debug/pprof/symbol", admin(pprof.Symbol))
	h.mux.HandleFunc("GET /debug/pprof/trace", admin(pprof.Trace))
}
