package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/api/openapi"
)

// TestOpenAPIConformance drives a live 3-member cluster (tokens on, small
// quotas) through every endpoint of the OpenAPI document and most of its
// replies, and validates every request and every reply against the
// document with kin-openapi (openapi3filter, routed by gorillamux), and
// every WebSocket frame against the document's frame schemas. A request the
// scenario breaks on purpose must break the document too. It fails on any
// mismatch, and when a documented operation, error code, WebSocket op,
// frame type or loss reason was never seen, but for the exceptions listed
// in notExercised.
func TestOpenAPIConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	chk := newAPIChecker(t)

	dir := t.TempDir()
	tokens := map[string]string{"admin": "admin-secret-0123456789", "worker": "worker-secret-0123456789", "other": "other-secret-0123456789",
		"reader": "reader-secret-0123456789", "jobs": "jobs-secret-0123456789"}
	authFile := filepath.Join(dir, "tokens.json")
	writeJSONFile(t, authFile, map[string]any{"tokens": []map[string]any{
		{"name": "admin", "token": tokens["admin"], "permissions": []map[string]string{{"prefix": "", "access": "admin"}}},
		{"name": "worker", "token": tokens["worker"], "permissions": []map[string]string{{"prefix": "", "access": "lock"}}},
		{"name": "other", "token": tokens["other"], "permissions": []map[string]string{{"prefix": "", "access": "lock"}}},
		{"name": "reader", "token": tokens["reader"], "permissions": []map[string]string{{"prefix": "", "access": "read"}}},
		{"name": "jobs", "token": tokens["jobs"], "permissions": []map[string]string{{"prefix": "jobs/", "access": "lock"}}},
	}})
	const sessionQuota = 5
	pc := startCluster(t, 3, "--auth-file", authFile, "--peer-token", tokens["admin"],
		"--max-locks-per-session", strconv.Itoa(sessionQuota), "--max-restore-bytes", "262144")
	admin, worker, other, reader, jobs := tokens["admin"], tokens["worker"], tokens["other"], tokens["reader"], tokens["jobs"]

	s := &scenario{t: t, chk: chk, pc: pc}
	s.findLeader()

	t.Run("operations", func(t *testing.T) {
		for _, id := range pc.order {
			u := pc.procs[id].url()
			r := chk.do(t, call{method: "GET", url: u + openapi.Path, want: 200})
			if !bytes.Equal(r.raw, openapi.JSON()) {
				t.Errorf("%s serves a document that differs from the embedded one", id)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s serves the document as %q", id, ct)
			}
			chk.do(t, call{method: "GET", url: u + "/healthz", want: 200})
			chk.do(t, call{method: "GET", url: u + "/readyz", want: 200})
			chk.do(t, call{method: "GET", url: u + "/api/v1/status", want: 200})
			chk.do(t, call{method: "GET", url: u + "/metrics", want: 200})
			chk.do(t, call{method: "GET", url: u + "/api/v1/cluster", token: reader, want: 200})
		}
		// Every operation that documents 401 answers it without a token,
		// and every one that documents 413 answers it to a body over 64 KiB
		// (but the restore, whose limit is its own), the document's example
		// bodies standing in for real ones.
		big := []byte(`{"pad":"` + strings.Repeat("x", 70<<10) + `"}`)
		for _, op := range chk.operations() {
			if op.Responses.Status(401) != nil {
				chk.do(t, call{method: op.method, url: s.L() + op.concrete(), rawBody: op.example(), ctype: op.ctype(),
					want: 401, code: api.CodeUnauthenticated})
			}
			if op.Responses.Status(413) != nil && op.path != "/api/v1/snapshot/restore" {
				chk.do(t, call{method: op.method, url: s.L() + op.concrete(), token: admin, rawBody: big,
					want: 413, code: api.CodePayloadTooLarge, docInvalid: true})
			}
		}
	})

	t.Run("locks", func(t *testing.T) {
		L, F := s.L(), s.F()
		acq := func(name string) string { return "/api/v1/locks/" + name + "/acquire" }
		g := chk.do(t, call{method: "POST", url: L + acq("oa%2Fbasic"), token: worker,
			body: map[string]any{"client_id": "w1", "ttl_ms": 30000}, want: 200})
		tok := g.uint("fencing_token")
		r := chk.do(t, call{method: "POST", url: L + acq("oa%2Fbasic"), token: worker,
			body: map[string]any{"client_id": "w2"}, want: 409, code: api.CodeLockHeld})
		if r.str("holder") != "w1" {
			t.Errorf("lock_held reply names holder %q, want w1: %s", r.str("holder"), r.raw)
		}
		if r := chk.do(t, call{method: "POST", url: L + acq("oa%2Fbasic"), token: worker,
			body: map[string]any{"client_id": "w1", "ttl_ms": 30000}, want: 200}); r.uint("fencing_token") != tok {
			t.Errorf("a holder's retried acquire got token %d, want %d", r.uint("fencing_token"), tok)
		}
		// A follower redirects; following the redirect with the same body
		// returns the same grant.
		red := chk.do(t, call{method: "POST", url: F + acq("oa%2Fbasic"), token: worker,
			body: map[string]any{"client_id": "w1", "ttl_ms": 30000}, want: 307, code: api.CodeNotLeader})
		if r := chk.do(t, call{method: "POST", url: red.header.Get("Location"), token: worker,
			body: map[string]any{"client_id": "w1", "ttl_ms": 30000}, want: 200}); r.uint("fencing_token") != tok {
			t.Errorf("acquire after the redirect got token %d, want %d", r.uint("fencing_token"), tok)
		}
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fbasic", token: reader, want: 200})
		chk.do(t, call{method: "GET", url: F + "/api/v1/locks/oa%2Fbasic", token: reader, want: 307})
		if r := chk.do(t, call{method: "GET", url: F + "/api/v1/locks/oa%2Fbasic?stale=true", token: reader, want: 200}); r.body["stale"] != true {
			t.Errorf("stale read does not say stale: %s", r.raw)
		}
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fnever-used", token: reader, want: 200})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/renew", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok, "ttl_ms": 20000}, want: 200})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/renew", token: worker,
			body: map[string]any{"client_id": "w2", "fencing_token": tok}, want: 409, code: api.CodeNotHolder})
		chk.do(t, call{method: "POST", url: F + "/api/v1/locks/oa%2Fbasic/renew", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok}, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/value", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok, "value": "v1"}, want: 200})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/value", token: worker,
			body: map[string]any{"client_id": "w2", "fencing_token": tok, "value": "v2"}, want: 409, code: api.CodeNotHolder})
		chk.do(t, call{method: "POST", url: F + "/api/v1/locks/oa%2Fbasic/value", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok, "value": "v1"}, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/value", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok, "value": strings.Repeat("v", api.MaxValueBytes+1)},
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/release", token: worker,
			body: map[string]any{"client_id": "w2", "fencing_token": tok}, want: 409, code: api.CodeNotHolder})
		chk.do(t, call{method: "POST", url: F + "/api/v1/locks/oa%2Fbasic/release", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok}, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/release", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok}, want: 200})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fbasic/release", token: worker,
			body: map[string]any{"client_id": "w1", "fencing_token": tok}, want: 200}) // a retried release

		// Waits: one that times out, one granted when the holder releases.
		h := chk.do(t, call{method: "POST", url: L + acq("oa%2Fwait"), token: worker, body: map[string]any{"client_id": "a1"}, want: 200})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fwait"), token: worker,
			body: map[string]any{"client_id": "a2", "wait_timeout_ms": 300}, want: 409, code: api.CodeWaitTimeout})
		done := make(chan reply, 1)
		go func() {
			done <- chk.do(t, call{method: "POST", url: L + acq("oa%2Fwait"), token: worker,
				body: map[string]any{"client_id": "a2", "wait_timeout_ms": 10000}})
		}()
		s.waitFor("a2 to queue on oa/wait", func() bool {
			return chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fwait", token: reader}).num("waiters") == 1
		})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fwait/release", token: worker,
			body: map[string]any{"client_id": "a1", "fencing_token": h.uint("fencing_token")}, want: 200})
		if r := <-done; r.status != 200 || r.str("client_id") != "a2" {
			t.Errorf("the waiter was not granted on release: %d %s", r.status, r.raw)
		}

		// A withdrawn wait (SPEC 18): the waiting acquire is answered 409
		// cancelled; a multi-acquire's by its names.
		cw := chk.do(t, call{method: "POST", url: L + acq("oa%2Fcancel"), token: worker, body: map[string]any{"client_id": "c1"}, want: 200})
		cdone := make(chan reply, 2)
		go func() {
			cdone <- chk.do(t, call{method: "POST", url: L + acq("oa%2Fcancel"), token: worker,
				body: map[string]any{"client_id": "c2", "wait_timeout_ms": 10000}})
		}()
		go func() {
			cdone <- chk.do(t, call{method: "POST", url: L + "/api/v1/acquire", token: worker,
				body: map[string]any{"client_id": "c3", "locks": []string{"oa/cancel", "oa/cancel2"}, "wait_timeout_ms": 10000}})
		}()
		s.waitFor("c2 and c3 to queue on oa/cancel", func() bool {
			return chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fcancel", token: reader}).num("waiters") == 2
		})
		chk.do(t, call{method: "POST", url: F + "/api/v1/locks/oa%2Fcancel/cancel", token: worker, body: map[string]any{"client_id": "c2"}, want: 307})
		if r := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fcancel/cancel", token: worker,
			body: map[string]any{"client_id": "c2"}, want: 200}); r.body["cancelled"] != true {
			t.Errorf("cancel: %s", r.raw)
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/cancel", token: reader,
			body: map[string]any{"client_id": "c3", "locks": []string{"oa/cancel2", "oa/cancel"}}, want: 403, code: api.CodePermissionDenied})
		if r := chk.do(t, call{method: "POST", url: L + "/api/v1/cancel", token: worker,
			body: map[string]any{"client_id": "c3", "locks": []string{"oa/cancel2", "oa/cancel"}}, want: 200}); r.body["cancelled"] != true {
			t.Errorf("multi cancel: %s", r.raw)
		}
		for range 2 {
			if r := <-cdone; r.status != 409 || r.code() != api.CodeCancelled {
				t.Errorf("a withdrawn acquire: %d %s", r.status, r.raw)
			}
		}
		if r := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fcancel/cancel", token: worker,
			body: map[string]any{"client_id": "c2"}, want: 200}); r.body["cancelled"] != false {
			t.Errorf("a second cancel: %s", r.raw)
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/cancel", token: worker,
			body: map[string]any{"client_id": "c3", "locks": []string{"oa/cancel"}}, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: F + "/api/v1/cancel", token: worker,
			body: map[string]any{"client_id": "c3", "locks": []string{"oa/cancel2", "oa/cancel"}}, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fcancel/release", token: worker,
			body: map[string]any{"client_id": "c1", "fencing_token": cw.uint("fencing_token")}, want: 200})

		// Lock names with a raw '/', and the %2F form of the same name.
		j := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/jobs/nightly/acquire", token: jobs,
			body: map[string]any{"client_id": "cron", "ttl_ms": 60000}, want: 200})
		if j.str("lock") != "jobs/nightly" {
			t.Errorf("raw-slash acquire named lock %q", j.str("lock"))
		}
		for _, p := range []string{"/api/v1/locks/jobs%2Fnightly", "/api/v1/locks/jobs/nightly"} {
			if r := chk.do(t, call{method: "GET", url: L + p, token: reader, want: 200}); r.str("client_id") != "cron" {
				t.Errorf("GET %s: %s", p, r.raw)
			}
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/jobs/nightly/release", token: jobs,
			body: map[string]any{"client_id": "cron", "fencing_token": j.uint("fencing_token")}, want: 200})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/acquire", token: reader, want: 405}) // the lock named "acquire"

		// Access.
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fx"), body: map[string]any{"client_id": "c"}, want: 401, code: api.CodeUnauthenticated})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fx"), token: reader, body: map[string]any{"client_id": "c"}, want: 403, code: api.CodePermissionDenied})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fx"), token: jobs, body: map[string]any{"client_id": "c"}, want: 403, code: api.CodePermissionDenied})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fx"), token: worker, body: map[string]any{"client_id": "c"},
			header: map[string]string{"Origin": "http://evil.example"}, want: 403, code: api.CodePermissionDenied})

		// Requests the limits refuse: the document refuses them too.
		bad := []map[string]any{
			{"client_id": "c", "ttl_ms": 5},
			{"client_id": "c", "ttl_ms": api.MaxTTLms + 1},
			{"client_id": "c", "wait_timeout_ms": api.MaxWaitTimeoutMs + 1},
			{"client_id": "c", "ttl": 1000},
			{"CLIENT_ID": "c"},
			{"client_id": ""},
			{"client_id": strings.Repeat("c", api.MaxClientID+1)},
			{"client_id": "c\u0007"},
			{"ttl_ms": 1000},
			{"client_id": "c", "mode": "both"},
			{"client_id": "c", "mode": "shared", "limit": 3},
			{"client_id": "c", "limit": 0},
			{"client_id": "c", "limit": api.MaxLimit + 1},
			{"client_id": "c", "lock_delay_ms": api.MaxLockDelayMs + 1},
			{"client_id": "c", "session_id": "has space"},
			{"client_id": "c", "value": strings.Repeat("v", api.MaxValueBytes+1)},
		}
		for _, b := range bad {
			chk.do(t, call{method: "POST", url: L + acq("oa%2Fbad"), token: worker, body: b, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		}
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fbad"), token: worker, rawBody: []byte{}, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fbad"), token: worker, rawBody: []byte(`{"client_id":"c"}`), ctype: "text/plain",
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + acq("bad%20name"), token: worker, body: map[string]any{"client_id": "c"},
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + acq(strings.Repeat("n", api.MaxLockName+1)), token: worker, body: map[string]any{"client_id": "c"},
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		// What JSON Schema cannot say: a member given twice.
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fbad"), token: worker, rawBody: []byte(`{"client_id":"c","client_id":"d"}`),
			want: 400, code: api.CodeInvalidArgument})
		chk.do(t, call{method: "POST", url: L + acq("oa%2Fbad"), token: worker,
			rawBody: []byte(`{"client_id":"` + strings.Repeat("c", 70<<10) + `"}`), want: 413, code: api.CodePayloadTooLarge, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks//acquire", token: worker, body: map[string]any{"client_id": "c"},
			want: 400, code: api.CodeInvalidArgument, offDoc: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/", token: reader, want: 400, code: api.CodeInvalidArgument, offDoc: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/nothing-here", token: reader, want: 404, code: api.CodeNotFound, offDoc: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fbasic?index=abc", token: reader, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fbasic?index=1&wait=soon", token: reader, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		// Above 10m: a pattern cannot bound a duration, so only the server refuses.
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fbasic?index=1&wait=11m", token: reader, want: 400, code: api.CodeInvalidArgument})

		// 405 on every documented path, with the documented methods in Allow.
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks/x/acquire", token: reader, want: 405, code: api.CodeMethodNotAllowed})
		for _, path := range chk.paths() {
			concrete := strings.NewReplacer("{name}", "oa%2Fany", "{id}", "n9").Replace(path)
			chk.do(t, call{method: "PATCH", url: L + concrete, token: admin, want: 405, code: api.CodeMethodNotAllowed})
		}
	})

	t.Run("kinds", func(t *testing.T) {
		L := s.L()
		acq := func(name string, body map[string]any, want int, code string) reply {
			return chk.do(t, call{method: "POST", url: L + "/api/v1/locks/" + name + "/acquire", token: worker, body: body, want: want, code: code})
		}
		// Semaphores and limit_mismatch.
		acq("oa%2Fsem", map[string]any{"client_id": "s1", "limit": 3}, 200, "")
		acq("oa%2Fsem", map[string]any{"client_id": "s2"}, 200, "")
		acq("oa%2Fsem", map[string]any{"client_id": "s3", "limit": 2}, 409, api.CodeLimitMismatch)
		acq("oa%2Fsem", map[string]any{"client_id": "s4", "mode": "shared"}, 409, api.CodeLimitMismatch)
		if r := chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fsem", token: reader, want: 200}); r.num("limit") != 3 || len(r.list("holders")) != 2 {
			t.Errorf("semaphore status: %s", r.raw)
		}
		// Shared holders.
		acq("oa%2Frw", map[string]any{"client_id": "r1", "mode": "shared"}, 200, "")
		acq("oa%2Frw", map[string]any{"client_id": "r2", "mode": "shared", "value": "reader two"}, 200, "")
		acq("oa%2Frw", map[string]any{"client_id": "x1"}, 409, api.CodeLockHeld)
		if r := chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Frw", token: reader, want: 200}); r.str("mode") != "shared" {
			t.Errorf("shared status: %s", r.raw)
		}
		// Lock-delay: after the expiry nobody is granted until it ends.
		acq("oa%2Fdelay", map[string]any{"client_id": "d1", "ttl_ms": 200, "lock_delay_ms": 3000}, 200, "")
		s.waitFor("oa/delay to expire into its lock-delay", func() bool {
			return chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fdelay", token: reader}).str("delayed_until") != ""
		})
		if r := acq("oa%2Fdelay", map[string]any{"client_id": "d2"}, 409, api.CodeLockHeld); r.str("holder") != "" {
			t.Errorf("a lock in its lock-delay names holder %q", r.str("holder"))
		}
		// A multi-acquire refused by a lock that is free but not for a
		// newcomer names it, and no holder.
		if r := chk.do(t, call{method: "POST", url: L + "/api/v1/acquire", token: worker,
			body: map[string]any{"client_id": "d3", "locks": []string{"oa/delay", "oa/delay-2"}}, want: 409, code: api.CodeLockHeld}); r.str("lock") != "oa/delay" || r.str("holder") != "" {
			t.Errorf("a multi-acquire refused by a lock-delay: %s", r.raw)
		} else {
			t.Logf("multi-acquire refused by a lock-delay: %s", r.raw)
		}
		// Multi-acquire.
		multi := func(body map[string]any, want int, code string, invalid bool) reply {
			return chk.do(t, call{method: "POST", url: L + "/api/v1/acquire", token: worker, body: body, want: want, code: code, docInvalid: invalid})
		}
		m := multi(map[string]any{"client_id": "m1", "locks": []string{"oa/m2", "oa/m1"}, "ttl_ms": 30000}, 200, "", false)
		if gs := m.list("grants"); len(gs) != 2 {
			t.Errorf("multi-acquire grants: %s", m.raw)
		}
		if r := multi(map[string]any{"client_id": "m2", "locks": []string{"oa/m1", "oa/m3"}}, 409, api.CodeLockHeld, false); r.str("lock") != "oa/m1" || r.str("holder") != "m1" {
			t.Errorf("refused multi-acquire names %q held by %q: %s", r.str("lock"), r.str("holder"), r.raw)
		}
		multi(map[string]any{"client_id": "m2", "locks": []string{"oa/m1", "oa/m3"}, "wait_timeout_ms": 300}, 409, api.CodeWaitTimeout, false)
		multi(map[string]any{"client_id": "m2", "locks": []string{"oa/sem", "oa/m3"}}, 409, api.CodeLimitMismatch, false)
		multi(map[string]any{"client_id": "m2", "locks": []string{"oa/m3"}}, 400, api.CodeInvalidArgument, true)
		multi(map[string]any{"client_id": "m2", "locks": []string{"oa/m3", "oa/m3"}}, 400, api.CodeInvalidArgument, true)
		multi(map[string]any{"client_id": "m2", "locks": []string{"oa/m3", "oa/m4"}, "limit": 1}, 400, api.CodeInvalidArgument, true)
		chk.do(t, call{method: "POST", url: s.F() + "/api/v1/acquire", token: worker,
			body: map[string]any{"client_id": "m2", "locks": []string{"oa/m3", "oa/m4"}}, want: 307})
		for _, g := range m.list("grants") {
			gm := g.(map[string]any)
			chk.do(t, call{method: "POST", url: L + "/api/v1/locks/" + url.PathEscape(gm["lock"].(string)) + "/release", token: worker,
				body: map[string]any{"client_id": "m1", "fencing_token": gm["fencing_token"]}, want: 200})
		}
		// Revocation.
		v := acq("oa%2Frev", map[string]any{"client_id": "v1"}, 200, "")
		chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/oa%2Frev?fencing_token=999999999", token: admin, want: 409, code: api.CodeNotHolder})
		chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/oa%2Frev?fencing_token=0", token: admin, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/oa%2Frev", token: worker, want: 403, code: api.CodePermissionDenied})
		chk.do(t, call{method: "DELETE", url: s.F() + "/api/v1/locks/oa%2Frev", token: admin, want: 307})
		r := chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/oa%2Frev?fencing_token=" + strconv.FormatUint(v.uint("fencing_token"), 10), token: admin, want: 200})
		if toks := r.list("revoked"); len(toks) != 1 {
			t.Errorf("revoke: %s", r.raw)
		}
		if r := chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/oa%2Frev", token: admin, want: 200}); r.body["revoked"] == nil || len(r.list("revoked")) != 0 {
			t.Errorf("revoking a lock with no holder: %s", r.raw)
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Frev/release", token: worker,
			body: map[string]any{"client_id": "v1", "fencing_token": v.uint("fencing_token")}, want: 409, code: api.CodeNotHolder})

		// Lists and pages.
		after, pages := "", 0
		for {
			q := "?prefix=oa/&limit=2"
			if after != "" {
				q += "&after=" + url.QueryEscape(after)
			}
			r := chk.do(t, call{method: "GET", url: L + "/api/v1/locks" + q, token: reader, want: 200})
			pages++
			after = r.str("next")
			if after == "" || pages > 20 {
				break
			}
		}
		if pages < 2 {
			t.Errorf("listing oa/ two at a time took %d page(s)", pages)
		}
		chk.do(t, call{method: "GET", url: s.F() + "/api/v1/locks?prefix=oa/", token: reader, want: 307})
		chk.do(t, call{method: "GET", url: s.F() + "/api/v1/locks?stale=true", token: reader, want: 200})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks?limit=0", token: reader, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks?prefix=bad%20prefix", token: reader, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "GET", url: L + "/api/v1/locks?prefix=oa/", token: jobs, want: 403, code: api.CodePermissionDenied})

		// Blocking queries: one answered by a change, one by its wait.
		b := acq("oa%2Fblock", map[string]any{"client_id": "b1", "ttl_ms": 30000}, 200, "")
		st := chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fblock", token: reader, want: 200})
		idx := st.uint("index")
		got := make(chan reply, 1)
		go func() {
			got <- chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fblock?index=" + strconv.FormatUint(idx, 10) + "&wait=20s", token: reader})
		}()
		time.Sleep(300 * time.Millisecond)
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fblock/renew", token: worker,
			body: map[string]any{"client_id": "b1", "fencing_token": b.uint("fencing_token")}, want: 200})
		if r := <-got; r.status != 200 || r.uint("index") <= idx {
			t.Errorf("blocking query after a renew: %d %s (index was %d)", r.status, r.raw, idx)
		}
		start := time.Now()
		st = chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fblock", token: reader, want: 200})
		if r := chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fblock?index=" + strconv.FormatUint(st.uint("index"), 10) + "&wait=300ms",
			token: reader, want: 200}); r.uint("index") != st.uint("index") || time.Since(start) < 250*time.Millisecond {
			t.Errorf("a blocking query whose wait ended: %s after %v", r.raw, time.Since(start))
		}
		chk.do(t, call{method: "GET", url: s.F() + "/api/v1/locks/oa%2Fblock?index=1&wait=1s&stale=true", token: reader, want: 200})
	})

	t.Run("sessions", func(t *testing.T) {
		L, F := s.L(), s.F()
		sess := chk.do(t, call{method: "POST", url: L + "/api/v1/sessions", token: worker,
			body: map[string]any{"client_id": "sw", "ttl_ms": 10000}, want: 200})
		sid := sess.str("session_id")
		sp := "/api/v1/sessions/" + url.PathEscape(sid)
		chk.do(t, call{method: "POST", url: L + "/api/v1/sessions", token: worker, body: map[string]any{"client_id": "sw", "ttl_ms": 10},
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: F + "/api/v1/sessions", token: worker, body: map[string]any{"client_id": "sw"}, want: 307})
		chk.do(t, call{method: "POST", url: L + sp + "/keepalive", token: worker, want: 200})
		chk.do(t, call{method: "POST", url: F + sp + "/keepalive", token: worker, want: 307})
		chk.do(t, call{method: "POST", url: L + sp + "/keepalive", token: other, want: 403, code: api.CodePermissionDenied})
		chk.do(t, call{method: "POST", url: L + "/api/v1/sessions//keepalive", token: worker, want: 400, code: api.CodeInvalidArgument, offDoc: true})
		g := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs1/acquire", token: worker,
			body: map[string]any{"client_id": "sw", "session_id": sid}, want: 200})
		if _, ok := g.body["expires_at"]; ok {
			t.Errorf("a session lock without ttl_ms has expires_at: %s", g.raw)
		}
		if r := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs1/renew", token: worker,
			body: map[string]any{"client_id": "sw", "fencing_token": g.uint("fencing_token")}, want: 200}); r.str("expires_at") != "" {
			t.Errorf("renewing a lock without a TTL gives expires_at: %s", r.raw)
		}
		m := chk.do(t, call{method: "POST", url: L + "/api/v1/acquire", token: worker,
			body: map[string]any{"client_id": "sw", "session_id": sid, "locks": []string{"oa/s2", "oa/s3"}}, want: 200})
		for _, gr := range m.list("grants") {
			if e := gr.(map[string]any)["expires_at"]; e != "" {
				t.Errorf("a multi-grant without a TTL has expires_at %v", e)
			}
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs1/acquire", token: other,
			body: map[string]any{"client_id": "sx", "session_id": sid}, want: 403, code: api.CodePermissionDenied})
		// The session quota: it holds 3 locks; 2 more fit, the next is refused.
		for i := 4; i <= sessionQuota; i++ {
			chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs" + strconv.Itoa(i) + "/acquire", token: worker,
				body: map[string]any{"client_id": "sw", "session_id": sid}, want: 200})
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs-over/acquire", token: worker,
			body: map[string]any{"client_id": "sw", "session_id": sid}, want: 429, code: api.CodeResourceExhausted})
		chk.do(t, call{method: "DELETE", url: F + sp, token: worker, want: 307})
		chk.do(t, call{method: "DELETE", url: L + sp, token: worker, want: 200})
		chk.do(t, call{method: "POST", url: L + sp + "/keepalive", token: worker, want: 404, code: api.CodeSessionExpired})
		chk.do(t, call{method: "DELETE", url: L + sp, token: worker, want: 404, code: api.CodeSessionExpired})
		chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fs-after/acquire", token: worker,
			body: map[string]any{"client_id": "sw", "session_id": sid}, want: 404, code: api.CodeSessionExpired})
		chk.do(t, call{method: "POST", url: L + "/api/v1/acquire", token: worker,
			body: map[string]any{"client_id": "sw", "session_id": sid, "locks": []string{"oa/s8", "oa/s9"}}, want: 404, code: api.CodeSessionExpired})
		if r := chk.do(t, call{method: "GET", url: L + "/api/v1/locks/oa%2Fs1", token: reader, want: 200}); r.body["held"] != false {
			t.Errorf("a deleted session's lock is still held: %s", r.raw)
		}
	})

	t.Run("websocket", func(t *testing.T) { s.websocketScenario(t, worker, admin, reader) })

	t.Run("cluster", func(t *testing.T) {
		L, F := s.L(), s.F()
		cs := chk.do(t, call{method: "GET", url: L + "/api/v1/cluster", token: reader, want: 200})
		var fm map[string]any
		for _, m := range cs.list("members") {
			if mm := m.(map[string]any); mm["id"] == s.follower {
				fm = mm
			}
		}
		readd := map[string]any{"id": fm["id"], "raft_addr": fm["raft_addr"], "http_addr": fm["http_addr"]}
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/members", token: admin, body: readd, want: 200})
		chk.do(t, call{method: "POST", url: F + "/api/v1/cluster/members", token: admin, body: readd, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/members", token: worker, body: readd, want: 403, code: api.CodePermissionDenied})
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/members", token: admin,
			body: map[string]any{"id": "n9", "raft_addr": "no-port", "http_addr": "http://127.0.0.1:1"}, want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/members", token: admin,
			body: map[string]any{"id": "n9", "raft_addr": "127.0.0.1:1", "http_addr": "ftp://127.0.0.1:1"}, want: 400, code: api.CodeInvalidArgument})
		chk.do(t, call{method: "DELETE", url: L + "/api/v1/cluster/members/n9", token: admin, want: 404, code: api.CodeNotFound})
		chk.do(t, call{method: "DELETE", url: F + "/api/v1/cluster/members/n9", token: admin, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/transfer-leadership", token: admin, body: map[string]any{"to": s.leader}, want: 200})
		chk.do(t, call{method: "POST", url: F + "/api/v1/cluster/transfer-leadership", token: admin, rawBody: []byte{}, want: 307})
		chk.do(t, call{method: "POST", url: L + "/api/v1/cluster/transfer-leadership", token: admin, body: map[string]any{"leader": "n2"},
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})

		// A fourth member joins (lockd --join), then is removed.
		s.joinAndRemove(t, admin, reader)

		// Removing the leader hands leadership over first: 503, then a new leader.
		old := s.leader
		chk.do(t, call{method: "DELETE", url: s.L() + "/api/v1/cluster/members/" + old, token: admin, want: 503, code: api.CodeNoLeader})
		s.waitFor("a new leader after removing the old one was refused", func() bool { s.findLeader(); return s.leader != old })
		// And an explicit transfer to a named member.
		to := s.follower
		chk.do(t, call{method: "POST", url: s.L() + "/api/v1/cluster/transfer-leadership", token: admin, body: map[string]any{"to": to}, want: 200})
		s.waitFor("leadership to reach "+to, func() bool { s.findLeader(); return s.leader == to })
	})

	t.Run("snapshot", func(t *testing.T) {
		L, F := s.L(), s.F()
		chk.do(t, call{method: "GET", url: F + "/api/v1/snapshot", token: admin, want: 307})
		chk.do(t, call{method: "GET", url: L + "/api/v1/snapshot", token: worker, want: 403, code: api.CodePermissionDenied})
		snap := chk.do(t, call{method: "GET", url: L + "/api/v1/snapshot", token: admin, want: 200})
		if len(snap.raw) == 0 {
			t.Fatal("empty backup")
		}
		oct := "application/octet-stream"
		r := chk.do(t, call{method: "POST", url: L + "/api/v1/snapshot/restore", token: admin, rawBody: snap.raw, ctype: oct, want: 400, code: api.CodeInvalidArgument})
		if !strings.Contains(r.msg(), api.MsgRestoreNotEmpty) {
			t.Errorf("restore into a cluster with state: %s", r.raw)
		}
		chk.do(t, call{method: "POST", url: L + "/api/v1/snapshot/restore?force=true", token: admin, rawBody: []byte("not a backup"), ctype: oct, want: 400, code: api.CodeInvalidArgument})
		chk.do(t, call{method: "POST", url: L + "/api/v1/snapshot/restore?force=true", token: admin, rawBody: snap.raw, ctype: "application/json",
			want: 400, code: api.CodeInvalidArgument, docInvalid: true})
		chk.do(t, call{method: "POST", url: L + "/api/v1/snapshot/restore?force=true", token: admin, rawBody: bytes.Repeat([]byte{1}, 300<<10), ctype: oct,
			want: 413, code: api.CodePayloadTooLarge})
		chk.do(t, call{method: "POST", url: F + "/api/v1/snapshot/restore?force=true", token: admin, rawBody: snap.raw, ctype: oct, want: 307})
		last := chk.do(t, call{method: "GET", url: L + "/api/v1/status", want: 200}).uint("last_token")
		minTok := last + 1000
		chk.do(t, call{method: "POST", url: L + "/api/v1/snapshot/restore?force=true&min_token=" + strconv.FormatUint(minTok, 10), token: admin,
			rawBody: snap.raw, ctype: oct, want: 200})
		g := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/oa%2Fafter-restore/acquire", token: worker, body: map[string]any{"client_id": "z"}, want: 200})
		if g.uint("fencing_token") <= minTok {
			t.Errorf("token after a restore with min_token %d: %d", minTok, g.uint("fencing_token"))
		}
	})

	// Admission control (SPEC 15): on a member whose limit is one
	// outstanding proposal, concurrent acquires are refused 503
	// overloaded with Retry-After, and a release still goes through.
	t.Run("overload", func(t *testing.T) {
		oc := startCluster(t, 1, "--auth-file", authFile, "--peer-token", admin, "--admission-min", "1", "--admission-max", "1")
		u := oc.procs[oc.order[0]].url()
		const n = 48
		replies := make(chan reply, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies <- chk.do(t, call{method: "POST", url: u + "/api/v1/locks/ov%2F" + strconv.Itoa(i) + "/acquire", token: worker,
					body: map[string]any{"client_id": "ov" + strconv.Itoa(i), "ttl_ms": 60000}})
			}()
		}
		wg.Wait()
		close(replies)
		granted, overloaded := []reply{}, 0
		for r := range replies {
			switch {
			case r.status == 200:
				granted = append(granted, r)
			case r.status == 503 && r.code() == api.CodeOverloaded:
				if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
					t.Errorf("overloaded without Retry-After: %q", r.header.Get("Retry-After"))
				}
				overloaded++
			default:
				t.Errorf("acquire under overload: %d %s", r.status, r.raw)
			}
		}
		if overloaded == 0 || len(granted) == 0 {
			t.Fatalf("%d granted, %d overloaded of %d concurrent acquires with an admission limit of 1", len(granted), overloaded, n)
		}
		g := granted[0]
		chk.do(t, call{method: "POST", url: u + "/api/v1/locks/" + url.PathEscape(g.str("lock")) + "/release", token: worker,
			body: map[string]any{"client_id": g.str("client_id"), "fencing_token": g.uint("fencing_token")}, want: 200})
	})

	t.Run("no-quorum", func(t *testing.T) { s.noQuorum(t, worker, reader, admin) })

	chk.coverage(t)
}

// notExercised lists what the scenario does not provoke, with the reason.
var notExercised = map[string]string{
	"code internal":  "a member failure; nothing in a healthy cluster answers 500",
	"ws type resync": "a watcher must fall 256 changes or 1024 frames behind; covered by internal/httpapi's watch tests",
}

// scenario carries the cluster and who leads it.
type scenario struct {
	t                *testing.T
	chk              *apiChecker
	pc               *procCluster
	leader, follower string
}

func (s *scenario) L() string { return s.pc.procs[s.leader].url() }
func (s *scenario) F() string { return s.pc.procs[s.follower].url() }

// findLeader asks every running member's /api/v1/status (open, no token)
// until they agree on a leader that is ready.
func (s *scenario) findLeader() {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		votes, up := map[string]int{}, s.pc.up()
		for _, id := range up {
			r := s.chk.do(s.t, call{method: "GET", url: s.pc.procs[id].url() + "/api/v1/status"})
			if l := r.str("leader_id"); l != "" {
				votes[l]++
			}
		}
		for l, n := range votes {
			if n == len(up) && s.pc.procs[l] != nil && s.pc.procs[l].cmd != nil &&
				s.chk.do(s.t, call{method: "GET", url: s.pc.procs[l].url() + "/readyz"}).status == 200 {
				s.leader = l
				for _, id := range up {
					if id != l {
						s.follower = id
					}
				}
				if s.chk.do(s.t, call{method: "GET", url: s.F() + "/readyz"}).status == 200 {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatal("the members do not agree on a ready leader")
}

func (s *scenario) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// joinAndRemove starts a fourth member with --join, waits until it votes,
// and removes it.
func (s *scenario) joinAndRemove(t *testing.T, admin, reader string) {
	base := filepath.Dir(s.pc.procs[s.pc.order[0]].dir)
	n1 := s.pc.procs[s.pc.order[0]]
	p := &proc{id: "n4", dir: filepath.Join(base, "n4"), httpAddr: freePort(t), raftAddr: freePort(t),
		log: filepath.Join(base, "n4.log"), extra: n1.extra}
	s.pc.procs["n4"] = p
	s.pc.order = append(s.pc.order, "n4")
	s.pc.start("n4", "--join", s.L())
	s.waitFor("n4 to join as a voter", func() bool {
		for _, m := range s.chk.do(t, call{method: "GET", url: s.L() + "/api/v1/cluster", token: reader}).list("members") {
			if mm := m.(map[string]any); mm["id"] == "n4" && mm["voter"] == true && mm["http_addr"] != "" {
				return true
			}
		}
		return false
	})
	s.pc.waitReady("n4", 20*time.Second)
	chk := s.chk
	chk.do(t, call{method: "GET", url: p.url() + openapi.Path, want: 200})
	chk.do(t, call{method: "DELETE", url: s.L() + "/api/v1/cluster/members/n4", token: admin, want: 200})
	s.pc.kill("n4")
	s.pc.order = slices.DeleteFunc(s.pc.order, func(id string) bool { return id == "n4" })
}

// noQuorum stops two members and checks what the third answers without a
// leader: 503 no_leader with Retry-After, readyz 503, a WebSocket told
// no_leader; then lets them go on.
func (s *scenario) noQuorum(t *testing.T, worker, reader, admin string) {
	chk := s.chk
	var stopped []string
	survivor := ""
	for _, id := range s.pc.up() {
		if len(stopped) < 2 {
			stopped = append(stopped, id)
		} else {
			survivor = id
		}
	}
	if !slices.Contains(stopped, s.leader) {
		stopped[0], survivor = s.leader, stopped[0]
	}
	for _, id := range stopped {
		s.pc.signal(id, syscall.SIGSTOP)
	}
	defer func() {
		for _, id := range stopped {
			s.pc.signal(id, syscall.SIGCONT)
		}
		for _, id := range s.pc.up() {
			s.pc.waitReady(id, 30*time.Second)
		}
		s.findLeader()
	}()
	u := s.pc.procs[survivor].url()
	s.waitFor(survivor+" to know no leader", func() bool {
		return chk.do(t, call{method: "GET", url: u + "/readyz"}).status == 503
	})
	chk.do(t, call{method: "GET", url: u + "/readyz", want: 503})
	chk.do(t, call{method: "POST", url: u + "/api/v1/locks/oa%2Fnq/acquire", token: worker, body: map[string]any{"client_id": "q"},
		want: 503, code: api.CodeNoLeader})
	chk.do(t, call{method: "GET", url: u + "/api/v1/locks/oa%2Fnq", token: reader, want: 503, code: api.CodeNoLeader})
	chk.do(t, call{method: "GET", url: u + "/api/v1/locks/oa%2Fnq?stale=true", token: reader, want: 200})
	chk.do(t, call{method: "GET", url: u + "/api/v1/cluster", token: reader, want: 200})
	chk.do(t, call{method: "GET", url: u + "/api/v1/status", want: 200})
	// Every operation that documents 503 and needs the leader answers it.
	for _, op := range chk.operations() {
		if op.Responses.Status(503) == nil || op.path == "/api/v1/cluster" {
			continue
		}
		chk.do(t, call{method: op.method, url: u + op.concrete(), token: admin, rawBody: op.example(), ctype: op.ctype(), want: 503})
	}
	ws := s.dial(t, u, worker)
	if f := ws.await(t, "the no_leader push", func(f frame) bool { return f.typ() == api.TypeError }); f.code() != api.CodeNoLeader {
		t.Errorf("a WebSocket on a member without a leader got %v", f)
	}
	ws.awaitClosed(t)
}

// websocketScenario exercises every op, reply and push of the WebSocket.
func (s *scenario) websocketScenario(t *testing.T, worker, admin, reader string) {
	chk := s.chk
	L := s.L()
	// The handshake's own failures, and a follower's answer.
	chk.do(t, call{method: "GET", url: L + "/api/v1/ws", token: worker, want: 426})
	chk.do(t, call{method: "GET", url: L + "/api/v1/ws", want: 401, code: api.CodeUnauthenticated})
	fw := s.dial(t, s.F(), worker)
	if f := fw.await(t, "not_leader", func(f frame) bool { return f.typ() == api.TypeError }); f.code() != api.CodeNotLeader || f.str("leader") != L {
		t.Errorf("a follower's WebSocket said %v, want not_leader naming %s", f, L)
	}
	fw.awaitClosed(t)

	// A request before hello, and a frame over 64 KiB.
	w0 := s.dial(t, L, worker)
	w0.send(t, map[string]any{"id": 1, "op": "keepalive"})
	if f := w0.await(t, "the reply to a request before hello", byID(1)); f.code() != api.CodeInvalidArgument {
		t.Errorf("keepalive before hello: %v", f)
	}
	w0.sendRaw(t, []byte(`{"id":2,"op":"hello","client_id":"`+strings.Repeat("x", 70<<10)+`"}`))
	if f := w0.await(t, "payload_too_large", func(f frame) bool { return f.code() == api.CodePayloadTooLarge }); f["id"] != nil {
		t.Errorf("payload_too_large carries an id: %v", f)
	}
	w0.awaitClosed(t)

	// A read token's connection: hello opens no session; it watches, and
	// every other op is refused.
	ro := s.dial(t, L, reader)
	ro.send(t, map[string]any{"id": 1, "op": "hello", "client_id": "dashboard", "session_ttl_ms": 10000})
	if f := ro.await(t, "the read-only hello", byID(1)); f.typ() != api.TypeHello || f["read_only"] != true || f["session_id"] != nil {
		t.Errorf("a read token's hello: %v", f)
	}
	ro.send(t, map[string]any{"id": 2, "op": "watch", "prefix": "ws/"})
	if f := ro.await(t, "the read-only watch", byID(2)); f.typ() != api.TypeOK {
		t.Errorf("a read token's watch: %v", f)
	}
	ro.send(t, map[string]any{"id": 3, "op": "acquire", "lock": "ws/ro"})
	if f := ro.await(t, "the read-only acquire", byID(3)); f.code() != api.CodePermissionDenied {
		t.Errorf("a read token's acquire: %v", f)
	}

	// A lock held over HTTP, for the waits below.
	h := chk.do(t, call{method: "POST", url: L + "/api/v1/locks/ws%2Fheld/acquire", token: worker,
		body: map[string]any{"client_id": "http-holder", "ttl_ms": 60000}, want: 200})

	w := s.dial(t, L, worker)
	w.send(t, map[string]any{"id": 1, "op": "hello", "client_id": "ws1", "session_ttl_ms": 10000})
	hello := w.await(t, "hello", byID(1))
	sid := hello.str("session_id")
	if hello.typ() != api.TypeHello || sid == "" {
		t.Fatalf("hello: %v", hello)
	}
	w.send(t, map[string]any{"id": 2, "op": "acquire", "lock": "ws/a", "ttl_ms": 10000})
	a := w.await(t, "granted ws/a", byID(2))
	w.send(t, map[string]any{"id": 3, "op": "acquire", "lock": "ws/held"})
	if f := w.await(t, "lock_held", byID(3)); f.code() != api.CodeLockHeld {
		t.Errorf("a try of a held lock: %v", f)
	}
	w.send(t, map[string]any{"id": 4, "op": "acquire", "lock": "ws/held", "wait_timeout_ms": 300})
	if f := w.await(t, "wait_timeout", byID(4)); f.code() != api.CodeWaitTimeout {
		t.Errorf("a wait that ends: %v", f)
	}
	w.send(t, map[string]any{"id": 5, "op": "acquire", "lock": "ws/held", "wait_timeout_ms": 10000})
	s.waitFor("the WebSocket acquire to queue", func() bool {
		return chk.do(t, call{method: "GET", url: L + "/api/v1/locks/ws%2Fheld", token: reader}).num("waiters") == 1
	})
	chk.do(t, call{method: "POST", url: L + "/api/v1/locks/ws%2Fheld/release", token: worker,
		body: map[string]any{"client_id": "http-holder", "fencing_token": h.uint("fencing_token")}, want: 200})
	held := w.await(t, "granted ws/held after the wait", byID(5))
	if held.typ() != api.TypeGranted {
		t.Errorf("the queued acquire: %v", held)
	}
	w.send(t, map[string]any{"id": 6, "op": "renew", "lock": "ws/a", "fencing_token": a.num("fencing_token"), "ttl_ms": 10000})
	if f := w.await(t, "renew ok", byID(6)); f.typ() != api.TypeOK || f.str("expires_at") == "" {
		t.Errorf("renew: %v", f)
	}
	w.send(t, map[string]any{"id": 7, "op": "value", "lock": "ws/a", "fencing_token": a.num("fencing_token"), "value": "hello"})
	w.await(t, "value ok", byID(7))
	w.send(t, map[string]any{"id": 8, "op": "keepalive"})
	if f := w.await(t, "keepalive ok", byID(8)); f.str("session_id") != sid {
		t.Errorf("keepalive: %v", f)
	}
	w.send(t, map[string]any{"id": 9, "op": "watch", "lock": "ws/a"})
	wl := w.await(t, "watch ok", byID(9))
	first := w.await(t, "the watched lock's first state", func(f frame) bool { return f.typ() == api.TypeChanged && f.num("watch_id") == wl.num("watch_id") })
	if f := w.await(t, "the watch synced", func(f frame) bool { return f.typ() == api.TypeSynced && f.num("watch_id") == wl.num("watch_id") }); f.num("index") < first.num("index") {
		t.Errorf("synced at %v, below the first state's index %v", f.num("index"), first.num("index"))
	}
	w.send(t, map[string]any{"id": 10, "op": "watch", "prefix": "ws/"})
	wp := w.await(t, "prefix watch ok", byID(10))
	w.await(t, "the prefix watch synced", func(f frame) bool { return f.typ() == api.TypeSynced && f.num("watch_id") == wp.num("watch_id") })
	w.send(t, map[string]any{"id": 11, "op": "release", "lock": "ws/held", "fencing_token": held.num("fencing_token")})
	w.await(t, "release ok", byID(11))
	w.await(t, "the release seen by the prefix watch", func(f frame) bool {
		return f.typ() == api.TypeChanged && f.num("watch_id") == wp.num("watch_id") && f.str("lock") == "ws/held" && f.status()["held"] == false
	})
	w.send(t, map[string]any{"id": 12, "op": "unwatch", "watch_id": wl.num("watch_id")})
	w.await(t, "unwatch ok", byID(12))
	w.send(t, map[string]any{"id": 13, "op": "unwatch", "watch_id": 999})
	if f := w.await(t, "unwatch of an unknown watch", byID(13)); f.code() != api.CodeNotFound {
		t.Errorf("unwatch 999: %v", f)
	}
	w.send(t, map[string]any{"id": 14, "op": "acquire", "locks": []string{"ws/m2", "ws/m1"}, "ttl_ms": 10000})
	if f := w.await(t, "the multi-acquire's grant", byID(14)); len(f.list("grants")) != 2 {
		t.Errorf("multi-acquire: %v", f)
	}
	w.send(t, map[string]any{"id": 15, "op": "acquire", "lock": "ws/short", "ttl_ms": 200})
	short := w.await(t, "granted ws/short", byID(15))
	w.await(t, "lost expired", func(f frame) bool {
		return f.typ() == api.TypeLost && f.str("reason") == api.ReasonExpired && f.num("fencing_token") == short.num("fencing_token")
	})
	chk.do(t, call{method: "DELETE", url: L + "/api/v1/locks/ws%2Fa", token: admin, want: 200})
	w.await(t, "lost revoked", func(f frame) bool {
		return f.typ() == api.TypeLost && f.str("reason") == api.ReasonRevoked && f.str("lock") == "ws/a"
	})
	w.sendRaw(t, []byte(`{"id":16,"op":"steal","lock":"ws/a"}`))
	if f := w.await(t, "an unknown op", byID(16)); f.code() != api.CodeInvalidArgument {
		t.Errorf("unknown op: %v", f)
	}
	w.sendRaw(t, []byte(`{"id":17,"op":"keepalive","Lock":"x"}`))
	if f := w.await(t, "a member name in the wrong case", byID(17)); f.code() != api.CodeInvalidArgument {
		t.Errorf("a frame with \"Lock\": %v", f)
	}
	// Ending the session: every lock lost, then the session_expired push and close.
	chk.do(t, call{method: "DELETE", url: L + "/api/v1/sessions/" + url.PathEscape(sid), token: worker, want: 200})
	for _, l := range []string{"ws/m1", "ws/m2"} {
		w.await(t, "lost session_expired "+l, func(f frame) bool {
			return f.typ() == api.TypeLost && f.str("reason") == api.ReasonSessionExpired && f.str("lock") == l
		})
	}
	w.await(t, "the session_expired push", func(f frame) bool {
		return f.typ() == api.TypeError && f.code() == api.CodeSessionExpired && f["id"] == nil
	})
	w.awaitClosed(t)
}

// --- validation against the document ---

// call is one HTTP request of the scenario and what it expects.
type call struct {
	method, url string // url as sent (escaped)
	token       string
	body        any    // sent as JSON
	rawBody     []byte // sent as is (with ctype)
	ctype       string
	header      map[string]string
	want        int    // the status expected (0: any the document allows)
	code        string // the error code expected
	// docInvalid: the request breaks the document on purpose, and the
	// document must say so. offDoc: the path is not in the document at
	// all (unknown, or an empty name or id).
	docInvalid, offDoc bool
}

type reply struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r reply) str(k string) string { s, _ := r.body[k].(string); return s }
func (r reply) msg() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}
func (r reply) code() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}
func (r reply) num(k string) float64 { f, _ := r.body[k].(float64); return f }
func (r reply) uint(k string) uint64 { return uint64(r.num(k)) }
func (r reply) list(k string) []any  { l, _ := r.body[k].([]any); return l }

type apiChecker struct {
	root   *testing.T // for errors found on goroutines that may outlive a subtest
	doc    *openapi3.T
	router routers.Router
	client *http.Client

	mu        sync.Mutex
	seen      map[string]map[int]int // "METHOD /path" -> status -> count
	codes     map[string]bool
	wsOps     map[string]bool
	wsTypes   map[string]bool
	wsReasons map[string]bool
}

func newAPIChecker(t *testing.T) *apiChecker {
	doc, err := openapi3.NewLoader().LoadFromData(openapi.JSON())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &apiChecker{root: t, doc: doc, router: router,
		client: &http.Client{Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		seen:   map[string]map[int]int{}, codes: map[string]bool{}, wsOps: map[string]bool{}, wsTypes: map[string]bool{}, wsReasons: map[string]bool{}}
}

// paths lists the document's paths.
func (c *apiChecker) paths() []string {
	var out []string
	for p := range c.doc.Paths.Map() {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// canonicalPath turns a lock name with raw slashes into its %2F form, as
// the server reads it (internal/httpapi/router.go): below /api/v1/locks/,
// a last segment acquire, release, renew or value is that action on
// everything before it; anything else is the whole name.
func canonicalPath(escaped string) string {
	const prefix = "/api/v1/locks/"
	rest, ok := strings.CutPrefix(escaped, prefix)
	if !ok || !strings.Contains(rest, "/") {
		return escaped
	}
	name, action := rest, ""
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		switch rest[i+1:] {
		case "acquire", "release", "renew", "value", "cancel", "holders":
			name, action = rest[:i], rest[i:]
		}
	}
	return prefix + strings.ReplaceAll(name, "/", "%2F") + action
}

// validationRequest is a copy of the request for kin-openapi, its path in
// canonical form.
func validationRequest(method, rawURL string, hdr http.Header, body []byte) (*http.Request, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	cu := *u
	cp := canonicalPath(u.EscapedPath())
	cu.RawPath = cp
	cu.Path, _ = url.PathUnescape(cp)
	req, err := http.NewRequest(method, cu.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr.Clone()
	return req, nil
}

func (c *apiChecker) options() *openapi3filter.Options {
	return &openapi3filter.Options{
		IncludeResponseStatus:             true,
		RejectWhenRequestBodyNotSpecified: true,
		AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
			a := in.RequestValidationInput.Request.Header.Get("Authorization")
			if !strings.HasPrefix(a, "Bearer ") {
				return errors.New("no bearer token")
			}
			return nil
		},
	}
}

// route finds the document's operation for a request; the path
// parameters come back decoded (the document's schemas describe values).
func (c *apiChecker) route(req *http.Request) (*routers.Route, map[string]string, error) {
	rt, params, err := c.router.FindRoute(req)
	if err != nil {
		return nil, nil, err
	}
	for k, v := range params {
		if dv, derr := url.PathUnescape(v); derr == nil {
			params[k] = dv
		}
	}
	return rt, params, nil
}

func opKey(rt *routers.Route) string { return rt.Method + " " + rt.Path }

// docOperation is one operation of the document.
type docOperation struct {
	method, path string
	*openapi3.Operation
}

func (c *apiChecker) operations() []docOperation {
	var out []docOperation
	for _, path := range c.paths() {
		for method, op := range c.doc.Paths.Value(path).Operations() {
			out = append(out, docOperation{method, path, op})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path+out[i].method < out[j].path+out[j].method })
	return out
}

// concrete is the operation's path with its parameters filled in.
func (o docOperation) concrete() string {
	return strings.NewReplacer("{name}", "oa%2Fsweep", "{id}", "n9").Replace(o.path)
}

// example is a request body for the operation: its documented example
// (a member on loopback for addMember), or nil when it takes none.
func (o docOperation) example() []byte {
	if o.RequestBody == nil {
		return nil
	}
	if o.path == "/api/v1/cluster/members" {
		return []byte(`{"id":"n9","raft_addr":"127.0.0.1:1","http_addr":"http://127.0.0.1:1"}`)
	}
	if mt := o.RequestBody.Value.Content.Get("application/json"); mt != nil {
		ex := mt.Example
		if ex == nil {
			for _, name := range slices.Sorted(maps.Keys(mt.Examples)) {
				ex = mt.Examples[name].Value.Value
				break
			}
		}
		b, _ := json.Marshal(ex)
		return b
	}
	return []byte("not a backup")
}

func (o docOperation) ctype() string {
	if o.RequestBody == nil {
		return ""
	}
	if o.RequestBody.Value.Content.Get("application/json") != nil {
		return "application/json"
	}
	return "application/octet-stream"
}

// do sends one request, validating it and its reply against the document.
func (c *apiChecker) do(t *testing.T, k call) reply {
	t.Helper()
	var body []byte
	hdr := http.Header{}
	switch {
	case k.rawBody != nil:
		body = k.rawBody
		if k.ctype == "" {
			k.ctype = "application/json"
		}
	case k.body != nil:
		body, _ = json.Marshal(k.body)
		if k.ctype == "" {
			k.ctype = "application/json"
		}
	}
	if len(body) > 0 || k.rawBody != nil {
		hdr.Set("Content-Type", k.ctype)
	}
	if k.token != "" {
		hdr.Set("Authorization", "Bearer "+k.token)
	}
	for h, v := range k.header {
		hdr.Set(h, v)
	}
	what := k.method + " " + k.url

	// The request against the document.
	vreq, err := validationRequest(k.method, k.url, hdr, body)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	rt, params, rerr := c.route(vreq)
	switch {
	case errors.Is(rerr, routers.ErrPathNotFound):
		if !k.offDoc {
			t.Errorf("%s: the path is not in the document", what)
		}
	case errors.Is(rerr, routers.ErrMethodNotAllowed):
	case rerr != nil:
		t.Errorf("%s: routing: %v", what, rerr)
	default:
		if k.offDoc {
			t.Errorf("%s: expected a path outside the document, got %s", what, opKey(rt))
		}
		in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: rt, Options: c.options()}
		verr := openapi3filter.ValidateRequest(context.Background(), in)
		if k.docInvalid && verr == nil {
			t.Errorf("%s %s: the document accepts a request the server must refuse", what, body)
		}
		if !k.docInvalid && verr != nil {
			t.Errorf("%s %.300s: the request breaks the document: %v", what, body, verr)
		}
	}

	// Send it.
	req, err := http.NewRequest(k.method, k.url, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	req.Header = hdr
	resp, err := c.client.Do(req)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return reply{}
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := reply{status: resp.StatusCode, header: resp.Header, raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(raw, &r.body)
	}
	desc := fmt.Sprintf("%s → %d %.400s", what, r.status, raw)
	if k.want != 0 && r.status != k.want {
		t.Errorf("%s: want status %d", desc, k.want)
	}
	code := ""
	if e, ok := r.body["error"].(map[string]any); ok {
		code, _ = e["code"].(string)
	}
	if k.code != "" && code != k.code {
		t.Errorf("%s: want error code %s", desc, k.code)
	}
	if code != "" {
		c.mu.Lock()
		c.codes[code] = true
		c.mu.Unlock()
		if st := api.Status(code); st != r.status && !(code == api.CodeNotLeader && r.status == http.StatusTemporaryRedirect) {
			t.Errorf("%s: code %s goes with status %d", desc, code, st)
		}
	}

	// The reply against the document.
	switch {
	case errors.Is(rerr, routers.ErrMethodNotAllowed):
		if r.status != http.StatusMethodNotAllowed {
			t.Errorf("%s: a method the document does not have must be 405", desc)
		}
		c.checkResponse(t, desc, c.doc.Components.Responses["MethodNotAllowed"].Value, r)
		c.checkAllow(t, desc, vreq, r.header.Get("Allow"))
	case rerr != nil:
		c.checkSchema(t, desc, "ErrorReply", r.body)
	default:
		c.record(opKey(rt), r.status)
		if r.status == http.StatusTemporaryRedirect {
			// openapi3filter does not validate redirects: check them here.
			ref := rt.Operation.Responses.Status(r.status)
			if ref == nil {
				t.Errorf("%s: status not documented", desc)
				break
			}
			c.checkResponse(t, desc, ref.Value, r)
			loc, _ := url.Parse(r.header.Get("Location"))
			if loc == nil || loc.RequestURI() != req.URL.RequestURI() || "http://"+loc.Host != r.header.Get(api.HeaderLeader) {
				t.Errorf("%s: Location %q is not this request on the leader %q", desc, r.header.Get("Location"), r.header.Get(api.HeaderLeader))
			}
			break
		}
		in := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: rt},
			Status:                 r.status, Header: r.header, Body: io.NopCloser(bytes.NewReader(raw)), Options: c.options(),
		}
		if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
			t.Errorf("%s: the reply breaks the document: %v", desc, err)
		}
	}
	return r
}

// checkResponse validates a reply against a response object by hand:
// required headers, and the body against its media type's schema.
func (c *apiChecker) checkResponse(t *testing.T, desc string, resp *openapi3.Response, r reply) {
	t.Helper()
	for name, h := range resp.Headers {
		v := r.header.Get(name)
		if h.Value.Required && v == "" {
			t.Errorf("%s: header %s missing", desc, name)
			continue
		}
		if v != "" && h.Value.Schema != nil {
			var val any = v
			if h.Value.Schema.Value.Type.Is("integer") {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Errorf("%s: header %s=%q is not an integer", desc, name, v)
				}
				val = float64(n)
			}
			if err := h.Value.Schema.Value.VisitJSON(val, openapi3.EnableJSONSchema2020()); err != nil {
				t.Errorf("%s: header %s: %v", desc, name, err)
			}
		}
	}
	mt := resp.Content.Get(r.header.Get("Content-Type"))
	if mt == nil {
		t.Errorf("%s: content type %q not documented", desc, r.header.Get("Content-Type"))
		return
	}
	var v any
	if err := json.Unmarshal(r.raw, &v); err != nil {
		t.Errorf("%s: body is not JSON: %v", desc, err)
		return
	}
	if err := mt.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: the reply breaks the document: %v", desc, err)
	}
}

// checkSchema validates a value against a schema of the document's
// components.
func (c *apiChecker) checkSchema(t *testing.T, desc, schema string, v any) {
	t.Helper()
	var doc any
	b, _ := json.Marshal(v)
	_ = json.Unmarshal(b, &doc)
	if err := c.doc.Components.Schemas[schema].Value.VisitJSON(doc, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: breaks %s: %v", desc, schema, err)
	}
}

// checkAllow compares a 405's Allow header with the methods the document
// gives the path (HEAD comes with GET).
func (c *apiChecker) checkAllow(t *testing.T, desc string, req *http.Request, allow string) {
	t.Helper()
	probe := req.Clone(context.Background())
	var want []string
	for _, m := range []string{"GET", "POST", "DELETE", "PUT", "PATCH"} {
		probe.Method = m
		if _, _, err := c.router.FindRoute(probe); err == nil {
			want = append(want, m)
			if m == "GET" {
				want = append(want, "HEAD")
			}
		}
	}
	sort.Strings(want)
	if got := strings.Join(want, ", "); got != allow {
		t.Errorf("%s: Allow %q, the document has %q", desc, allow, got)
	}
}

func (c *apiChecker) record(op string, status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[op] == nil {
		c.seen[op] = map[int]int{}
	}
	c.seen[op][status]++
}

// coverage fails for a documented operation never exercised, and for an
// error code, WebSocket op, frame type or loss reason never seen, but for
// the exceptions in notExercised; it logs which documented replies were
// seen.
func (c *apiChecker) coverage(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	missing := func(what string) {
		if why, ok := notExercised[what]; ok {
			t.Logf("not exercised: %s (%s)", what, why)
			return
		}
		t.Errorf("never exercised: %s", what)
	}
	ops, seenOps, documented, seenReplies := 0, 0, 0, 0
	for _, path := range c.paths() {
		for method, op := range c.doc.Paths.Value(path).Operations() {
			key := method + " " + path
			ops++
			if len(c.seen[key]) == 0 {
				missing("operation " + key)
			} else {
				seenOps++
			}
			var got, not []string
			for st := range op.Responses.Map() {
				n, _ := strconv.Atoi(st)
				documented++
				if c.seen[key][n] > 0 {
					got = append(got, st)
					seenReplies++
				} else {
					not = append(not, st)
				}
			}
			sort.Strings(got)
			sort.Strings(not)
			t.Logf("%-45s replies seen %v, not seen %v", key, got, not)
			for st := range c.seen[key] {
				if op.Responses.Status(st) == nil {
					t.Errorf("%s answered %d, which the document does not list", key, st)
				}
			}
		}
	}
	t.Logf("coverage: %d of %d operations exercised; %d of %d documented replies seen", seenOps, ops, seenReplies, documented)
	codes := c.doc.Components.Schemas["ErrorCode"].Value.Enum
	for _, code := range codes {
		if !c.codes[code.(string)] {
			missing("code " + code.(string))
		}
	}
	for _, op := range []string{api.OpHello, api.OpAcquire, api.OpRelease, api.OpRenew, api.OpKeepalive, api.OpValue, api.OpWatch, api.OpUnwatch} {
		if !c.wsOps[op] {
			missing("ws op " + op)
		}
	}
	for _, typ := range []string{api.TypeHello, api.TypeGranted, api.TypeOK, api.TypeError, api.TypeLost, api.TypeChanged, api.TypeSynced, api.TypeResync} {
		if !c.wsTypes[typ] {
			missing("ws type " + typ)
		}
	}
	for _, r := range []string{api.ReasonExpired, api.ReasonSessionExpired, api.ReasonRevoked} {
		if !c.wsReasons[r] {
			missing("ws lost reason " + r)
		}
	}
}

// --- WebSocket ---

type frame map[string]any

func (f frame) typ() string { s, _ := f["type"].(string); return s }
func (f frame) str(k string) string {
	s, _ := f[k].(string)
	return s
}
func (f frame) num(k string) float64 { n, _ := f[k].(float64); return n }
func (f frame) list(k string) []any  { l, _ := f[k].([]any); return l }
func (f frame) status() map[string]any {
	s, _ := f["status"].(map[string]any)
	return s
}
func (f frame) code() string {
	e, _ := f["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func byID(id float64) func(frame) bool { return func(f frame) bool { return f.num("id") == id } }

type wsClient struct {
	chk     *apiChecker
	c       *websocket.Conn
	frames  chan frame
	backlog []frame
}

// validatingTransport checks the WebSocket handshake against the document.
type validatingTransport struct {
	t   *testing.T
	chk *apiChecker
}

func (v validatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	vreq, err := validationRequest(req.Method, req.URL.String(), req.Header, nil)
	if err != nil {
		return nil, err
	}
	rt, params, rerr := v.chk.route(vreq)
	if rerr != nil {
		v.t.Errorf("WebSocket handshake %s: %v", req.URL, rerr)
		return http.DefaultTransport.RoundTrip(req)
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: rt, Options: v.chk.options()}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		v.t.Errorf("WebSocket handshake request breaks the document: %v", err)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	v.chk.record(opKey(rt), resp.StatusCode)
	body := []byte(nil)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(body)), Options: v.chk.options()}
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		v.t.Errorf("WebSocket handshake reply %d breaks the document: %v", resp.StatusCode, err)
	}
	return resp, nil
}

func (s *scenario) dial(t *testing.T, base, token string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+token)
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/api/v1/ws", &websocket.DialOptions{
		HTTPHeader: hdr, HTTPClient: &http.Client{Transport: validatingTransport{t: t, chk: s.chk}}})
	if err != nil {
		t.Fatalf("dial %s: %v", base, err)
	}
	c.SetReadLimit(1 << 20)
	w := &wsClient{chk: s.chk, c: c, frames: make(chan frame, 1024)}
	go func() {
		defer close(w.frames)
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				s.chk.root.Errorf("a server frame is not JSON: %s", b)
				continue
			}
			if err := s.chk.doc.Components.Schemas["WSServerFrame"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
				s.chk.root.Errorf("a server frame breaks WSServerFrame: %s: %v", b, err)
			}
			f, _ := v.(map[string]any)
			s.chk.mu.Lock()
			s.chk.wsTypes[frame(f).typ()] = true
			if r := frame(f).str("reason"); r != "" {
				s.chk.wsReasons[r] = true
			}
			if code := frame(f).code(); code != "" {
				s.chk.codes[code] = true
			}
			s.chk.mu.Unlock()
			w.frames <- f
		}
	}()
	t.Cleanup(func() { c.CloseNow() })
	return w
}

// send validates a frame against WSClientFrame and sends it.
func (w *wsClient) send(t *testing.T, f map[string]any) {
	t.Helper()
	b, _ := json.Marshal(f)
	var v any
	_ = json.Unmarshal(b, &v)
	if err := w.chk.doc.Components.Schemas["WSClientFrame"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("a client frame breaks WSClientFrame: %s: %v", b, err)
	}
	w.chk.mu.Lock()
	w.chk.wsOps[f["op"].(string)] = true
	w.chk.mu.Unlock()
	w.write(t, b)
}

// sendRaw sends a frame the document does not allow (and checks that it
// does not).
func (w *wsClient) sendRaw(t *testing.T, b []byte) {
	t.Helper()
	var v any
	if json.Unmarshal(b, &v) == nil {
		if err := w.chk.doc.Components.Schemas["WSClientFrame"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err == nil && len(b) <= api.MaxBodyBytes {
			t.Errorf("WSClientFrame accepts a frame the server refuses: %.200s", b)
		}
	}
	w.write(t, b)
}

func (w *wsClient) write(t *testing.T, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// await returns the first frame (kept back from earlier awaits, or new)
// that matches.
func (w *wsClient) await(t *testing.T, what string, match func(frame) bool) frame {
	t.Helper()
	for i, f := range w.backlog {
		if match(f) {
			w.backlog = slices.Delete(w.backlog, i, i+1)
			return f
		}
	}
	timeout := time.After(15 * time.Second)
	for {
		select {
		case f, ok := <-w.frames:
			if !ok {
				t.Fatalf("the connection closed while waiting for %s (unmatched: %v)", what, w.backlog)
			}
			if match(f) {
				return f
			}
			w.backlog = append(w.backlog, f)
		case <-timeout:
			t.Fatalf("timed out waiting for %s (unmatched: %v)", what, w.backlog)
		}
	}
}

// awaitClosed waits until the server closed the connection.
func (w *wsClient) awaitClosed(t *testing.T) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-w.frames:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the server did not close the connection")
		}
	}
}

func writeJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	b, _ := json.MarshalIndent(v, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
