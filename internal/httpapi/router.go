package httpapi

import (
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/lockd/lockd/api"
)

// router matches the API's paths itself instead of leaving them to
// http.ServeMux, for what the SPEC asks and the mux cannot do:
//
//   - A known path with a wrong method is 405 method_not_allowed with an
//     Allow header and the JSON error body (the mux answers in plain text,
//     or not at all behind a catch-all).
//   - A lock name may hold a raw '/': /api/v1/locks/{name}/{action} takes
//     everything before the last segment as the name when that segment is
//     one of the registered actions (acquire, release, renew, value),
//     whatever the method; any other path below /api/v1/locks/ is the whole
//     name. A '/' sent as %2F stays inside the name either way.
//   - An empty segment is an empty name or id, 400 invalid_argument: the mux
//     would clean "/api/v1/locks//acquire" with a 301 to another path.
//
// Paths the router does not know fall through to the mux (health checks
// and API routes are here; the dashboard, pprof and the 404 catch-all are
// there).
type router struct {
	routes []*route
	// locks holds the routes below /api/v1/locks/{name}, by action ("" for
	// the lock itself).
	locks map[string]*route
}

// lockPrefix is where lock names start in a path.
const lockPrefix = "/api/v1/locks/"

type route struct {
	pattern string
	segs    []string // of pattern, split at '/'; "{x}" is a wildcard segment
	methods map[string]http.HandlerFunc
	// ownBody: the handler bounds its body itself (a restore streams a
	// backup far beyond the 64 KiB every other request is held to).
	ownBody bool
}

// handle registers fn for method on pattern: literal segments and "{x}"
// wildcards of one segment, read back with r.PathValue("x"). A pattern
// below /api/v1/locks/{name} matches a lock name that spans segments.
func (rt *router) handle(method, pattern string, fn http.HandlerFunc) *route {
	var r *route
	if rest, ok := strings.CutPrefix(pattern, lockPrefix+"{name}"); ok {
		action := strings.TrimPrefix(rest, "/")
		if rt.locks == nil {
			rt.locks = map[string]*route{}
		}
		if r = rt.locks[action]; r == nil {
			r = &route{pattern: pattern, methods: map[string]http.HandlerFunc{}}
			rt.locks[action] = r
		}
	} else {
		for _, x := range rt.routes {
			if x.pattern == pattern {
				r = x
			}
		}
		if r == nil {
			r = &route{pattern: pattern, segs: strings.Split(pattern, "/"), methods: map[string]http.HandlerFunc{}}
			rt.routes = append(rt.routes, r)
		}
	}
	r.methods[method] = fn
	return r
}

// serve answers r if its path is a known route and reports whether it did.
func (rt *router) serve(w http.ResponseWriter, r *http.Request) bool {
	path := r.URL.EscapedPath()
	if rest, ok := strings.CutPrefix(path, lockPrefix); ok && rt.locks != nil {
		name, action := rest, ""
		if i := strings.LastIndexByte(rest, '/'); i >= 0 {
			if a, err := url.PathUnescape(rest[i+1:]); err == nil && a != "" && rt.locks[a] != nil {
				name, action = rest[:i], a
			}
		}
		if x := rt.locks[action]; x != nil {
			rt.dispatch(w, r, x, map[string]string{"name": name})
			return true
		}
	}
	segs := strings.Split(path, "/")
	for _, x := range rt.routes {
		if vars, ok := x.match(segs); ok {
			rt.dispatch(w, r, x, vars)
			return true
		}
	}
	return false
}

// match reports whether the path's segments fit the route, with the
// (still escaped) values of its wildcards.
func (x *route) match(segs []string) (map[string]string, bool) {
	if len(segs) != len(x.segs) {
		return nil, false
	}
	var vars map[string]string
	for i, s := range x.segs {
		if len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' {
			if vars == nil {
				vars = map[string]string{}
			}
			vars[s[1:len(s)-1]] = segs[i]
			continue
		}
		if s != segs[i] {
			return nil, false
		}
	}
	return vars, true
}

func (rt *router) dispatch(w http.ResponseWriter, r *http.Request, x *route, vars map[string]string) {
	method := r.Method
	if method == http.MethodHead && x.methods[http.MethodGet] != nil {
		method = http.MethodGet // net/http sends no body for HEAD
	}
	fn := x.methods[method]
	if fn == nil {
		allow := x.allow()
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{code: api.CodeMethodNotAllowed,
			msg: fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, x.pattern, allow)})
		return
	}
	if err := sameSite(r, x.ownBody); err != nil {
		writeError(w, err)
		return
	}
	if !x.ownBody && r.ContentLength > api.MaxBodyBytes {
		writeError(w, &apiError{code: api.CodePayloadTooLarge, msg: fmt.Sprintf("request body is over %d KiB", api.MaxBodyBytes>>10)})
		return
	}
	for k, v := range vars {
		dv, err := url.PathUnescape(v)
		if err != nil {
			writeError(w, invalid("%s in the path is not validly %%-escaped: %v", k, err))
			return
		}
		if dv == "" {
			if k == "name" {
				writeError(w, invalid("lock name is empty"))
			} else {
				writeError(w, invalid("%s in the path is empty", k))
			}
			return
		}
		r.SetPathValue(k, dv)
	}
	fn(w, r)
}

// allow is the route's Allow header: its methods, HEAD with GET, sorted.
func (x *route) allow() string {
	var ms []string
	for m := range x.methods {
		ms = append(ms, m)
		if m == http.MethodGet {
			ms = append(ms, http.MethodHead)
		}
	}
	slices.Sort(ms)
	return strings.Join(ms, ", ")
}

// sameSite refuses a state-changing request a web page could make from
// another site (CSRF): lockd's default member listens on 127.0.0.1 without
// authentication, so any page its operator visits could otherwise post to
// it. A browser sends Origin (and Sec-Fetch-Site) with such requests, and
// an HTML form or a fetch that needs no CORS preflight can only send
// text/plain, form encodings or no type at all: so a body must be
// application/json (a restore's application/octet-stream), and a request
// from a foreign origin is refused whatever it carries. Clients that are
// not browsers send no Origin and are not affected.
func sameSite(r *http.Request, binaryBody bool) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return &apiError{code: api.CodePermissionDenied, msg: "cross-site request refused (Sec-Fetch-Site: " + site + ")"}
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return &apiError{code: api.CodePermissionDenied, msg: fmt.Sprintf("request from origin %q refused: state-changing requests are accepted from this member's own origin or from clients that send no Origin", o)}
		}
	}
	if r.ContentLength == 0 {
		return nil
	}
	want := "application/json"
	if binaryBody {
		want = "application/octet-stream"
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != want {
		hint := ""
		if want == "application/json" {
			hint = " (curl: -H 'Content-Type: application/json')"
		}
		return invalid("Content-Type must be %s, got %q%s", want, r.Header.Get("Content-Type"), hint)
	}
	return nil
}
