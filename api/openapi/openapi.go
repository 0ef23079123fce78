// Package openapi holds the OpenAPI 3.1 document of lockd's HTTP API, the
// complete machine-readable reference: every path, method, parameter,
// body, reply, error code and header, with examples, plus the JSON schemas
// of the WebSocket frames (WSClientFrame, WSServerFrame).
//
// Every member serves it at GET /api/v1/openapi.json. docs/API.md is the
// readable reference; the tests of this package check that the two name the
// same endpoints, replies, request fields and WebSocket ops, that the
// document's schemas have exactly the fields of the wire types in package
// api and the limits of its constants, and that it loads and validates with
// kin-openapi. The end-to-end suite (test/e2e) validates every request and
// reply of a live cluster against it.
//
// The package is plain data: it links nothing beyond the standard library
// into lockd (kin-openapi is used by tests only).
package openapi

import (
	_ "embed"
	"net/http"
	"slices"
	"strconv"
)

//go:embed openapi.json
var document []byte

// Path is where every member serves the document.
const Path = "/api/v1/openapi.json"

// JSON returns a copy of the document.
func JSON() []byte { return slices.Clone(document) }

// ServeHTTP writes the document: application/json, no token needed (it
// carries no data).
func ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(document)))
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(document)
}
