package httpapi

import (
	"net/http"
	"slices"

	"github.com/lockd/lockd/api/openapi"
)

// openapiDocument is GET /api/v1/openapi.json: the OpenAPI 3.1 document of
// this API (package api/openapi), served by every member, leader or
// follower, with no token (it carries no data).
func (h *Handler) openapiDocument(w http.ResponseWriter, r *http.Request) {
	openapi.ServeHTTP(w, r)
}

// Routes lists the API's routes as "METHOD pattern", sorted: what the
// OpenAPI document must describe (its tests compare the two). The
// dashboard and the profiler, mounted on the mux, are not among them.
func (h *Handler) Routes() []string {
	var out []string
	add := func(x *route) {
		for m := range x.methods {
			out = append(out, m+" "+x.pattern)
		}
	}
	for _, x := range h.routes.routes {
		add(x)
	}
	for _, x := range h.routes.locks {
		add(x)
	}
	slices.Sort(out)
	return out
}
