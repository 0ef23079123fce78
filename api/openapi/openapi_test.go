package openapi_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/api/openapi"
	"github.com/lockd/lockd/internal/httpapi"
)

// load parses the embedded document with kin-openapi and validates it
// (structure, references, schemas, and every example against its schema).
func load(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.JSON())
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return doc
}

func TestDocumentIsValidOpenAPI31(t *testing.T) {
	doc := load(t)
	if doc.OpenAPI != "3.1.0" || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
	for _, op := range operations(doc) {
		o := doc.Paths.Value(op.path).GetOperation(op.method)
		if o.OperationID == "" || o.Summary == "" {
			t.Errorf("%s: needs an operationId and a summary", op)
		}
		if o.Responses.Status(200) == nil && o.Responses.Status(101) == nil {
			t.Errorf("%s: no success reply", op)
		}
		if o.RequestBody != nil {
			for ct, mt := range o.RequestBody.Value.Content {
				if ct == "application/json" && mt.Example == nil && len(mt.Examples) == 0 {
					t.Errorf("%s: the request body has no example", op)
				}
			}
		}
		if mt := o.Responses.Status(200); mt != nil {
			if c := mt.Value.Content.Get("application/json"); c != nil && c.Example == nil && len(c.Examples) == 0 && op.path != openapi.Path {
				t.Errorf("%s: the 200 reply has no example", op)
			}
		}
	}
}

// TestServeHTTP checks what every member serves at /api/v1/openapi.json.
func TestServeHTTP(t *testing.T) {
	h := httpapi.New(httpapi.Config{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", openapi.Path, nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != string(openapi.JSON()) {
		t.Fatalf("GET %s: %d %q", openapi.Path, rec.Code, rec.Header().Get("Content-Type"))
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", openapi.Path, nil))
	if rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST %s: %d Allow %q", openapi.Path, rec.Code, rec.Header().Get("Allow"))
	}
	var v map[string]any
	if err := json.Unmarshal(openapi.JSON(), &v); err != nil {
		t.Fatal(err)
	}
}

type operation struct{ method, path string }

func (o operation) String() string { return o.method + " " + o.path }

func operations(doc *openapi3.T) []operation {
	var out []operation
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, operation{method, path})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// TestRoutesMatchHandler: the document has exactly the routes the handler
// registers (the dashboard and pprof, on the mux, are not modelled).
func TestRoutesMatchHandler(t *testing.T) {
	doc := load(t)
	var documented []string
	for _, op := range operations(doc) {
		documented = append(documented, op.String())
	}
	routes := httpapi.New(httpapi.Config{Metrics: http.NotFoundHandler()}).Routes()
	if !slices.Equal(documented, routes) {
		t.Fatalf("document and handler differ:\n only in the document: %v\n only in the handler: %v",
			minus(documented, routes), minus(routes, documented))
	}
}

func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// props lists a schema's property names, through allOf.
func props(s *openapi3.Schema) []string {
	var out []string
	for p := range s.Properties {
		out = append(out, p)
	}
	for _, sub := range s.AllOf {
		out = append(out, props(sub.Value)...)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// unionProps lists the property names of several schemas of the document.
func unionProps(doc *openapi3.T, names ...string) []string {
	var out []string
	for _, n := range names {
		s := doc.Components.Schemas[n]
		if s == nil {
			panic("no schema " + n)
		}
		if len(s.Value.OneOf) > 0 {
			for _, v := range s.Value.OneOf {
				out = append(out, props(v.Value)...)
			}
		}
		out = append(out, props(s.Value)...)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// jsonFields lists the JSON member names of a Go wire type.
func jsonFields(v any, except ...string) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" && !slices.Contains(except, name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestSchemasMatchWireTypes: every schema of a wire type has exactly the
// fields of its Go type in package api, so neither can change alone.
func TestSchemasMatchWireTypes(t *testing.T) {
	doc := load(t)
	cases := []struct {
		schemas []string
		goType  any
		except  []string // Go fields the server never sends, and why
	}{
		{[]string{"AcquireRequest"}, api.AcquireRequest{}, nil},
		{[]string{"AcquireGranted", "AcquireRefused", "MultiAcquireGranted"}, api.AcquireReply{}, nil},
		{[]string{"MultiAcquireRequest"}, api.MultiAcquireRequest{}, nil},
		{[]string{"Grant"}, api.Grant{}, nil},
		{[]string{"ReleaseRequest"}, api.ReleaseRequest{}, nil},
		{[]string{"ReleaseReply"}, api.ReleaseReply{}, nil},
		{[]string{"RenewRequest"}, api.RenewRequest{}, nil},
		{[]string{"RenewReply"}, api.RenewReply{}, nil},
		{[]string{"ValueRequest"}, api.ValueRequest{}, nil},
		{[]string{"ValueReply"}, api.ValueReply{}, nil},
		{[]string{"RevokeReply"}, api.RevokeReply{}, nil},
		// session_id: a session id is a capability, never shown in status.
		{[]string{"LockStatus"}, api.LockStatus{}, []string{"session_id"}},
		{[]string{"HolderStatus"}, api.HolderStatus{}, nil},
		{[]string{"LockList"}, api.LockList{}, nil},
		{[]string{"SessionRequest"}, api.SessionRequest{}, nil},
		{[]string{"SessionCreated", "SessionKeptAlive"}, api.SessionReply{}, nil},
		{[]string{"Member"}, api.Member{}, nil},
		{[]string{"ClusterStatus"}, api.ClusterStatus{}, nil},
		{[]string{"AddMemberRequest"}, api.AddMemberRequest{}, nil},
		{[]string{"TransferRequest"}, api.TransferRequest{}, nil},
		{[]string{"NodeStatus"}, api.NodeStatus{}, nil},
		{[]string{"Error"}, api.Error{}, nil},
		{[]string{"ErrorReply"}, api.ErrorReply{}, nil},
		{[]string{"WSClientFrame"}, api.WSRequest{}, nil},
		{[]string{"WSServerFrame"}, api.WSMessage{}, nil},
	}
	for _, c := range cases {
		got, want := unionProps(doc, c.schemas...), jsonFields(c.goType, c.except...)
		if !slices.Equal(got, want) {
			t.Errorf("%v vs %T: only in the document %v, only in Go %v", c.schemas, c.goType, minus(got, want), minus(want, got))
		}
	}
	// Requests reject unknown fields, and so does the document.
	for name, s := range doc.Components.Schemas {
		if (strings.HasSuffix(name, "Request") || strings.HasPrefix(name, "WS")) && s.Value.Type.Is("object") {
			if ap := s.Value.AdditionalProperties.Has; ap == nil || *ap {
				t.Errorf("schema %s must say additionalProperties: false", name)
			}
		}
	}
}

func num(f *float64) float64 {
	if f == nil {
		return -1
	}
	return *f
}

func maxLen(s *openapi3.Schema) int {
	if s.MaxLength == nil {
		return -1
	}
	return int(*s.MaxLength)
}

// TestLimitsMatchConstants: the document's bounds are the constants of
// package api (the SPEC's limits).
func TestLimitsMatchConstants(t *testing.T) {
	doc := load(t)
	sc := func(n string) *openapi3.Schema { return doc.Components.Schemas[n].Value }
	prop := func(schema, p string) *openapi3.Schema { return sc(schema).Properties[p].Value }
	param := func(n string) *openapi3.Schema { return doc.Components.Parameters[n].Value.Schema.Value }
	check := func(what string, got, want float64) {
		if got != want {
			t.Errorf("%s is %v in the document, %v in package api", what, got, want)
		}
	}
	check("LockName maxLength", float64(maxLen(sc("LockName"))), api.MaxLockName)
	check("LockPrefix maxLength", float64(maxLen(sc("LockPrefix"))), api.MaxLockName)
	check("ClientID maxLength", float64(maxLen(sc("ClientID"))), api.MaxClientID)
	check("SessionID maxLength", float64(maxLen(sc("SessionID"))), api.MaxClientID)
	check("SessionIDValue maxLength", float64(maxLen(sc("SessionIDValue"))), api.MaxClientID)
	check("TTL minimum", num(sc("TTL").Min), api.MinTTLms)
	check("TTL maximum", num(sc("TTL").Max), api.MaxTTLms)
	check("WaitTimeout maximum", num(sc("WaitTimeout").Max), api.MaxWaitTimeoutMs)
	check("SessionTTL minimum", num(sc("SessionTTL").Min), api.MinSessionTTLms)
	check("SessionTTL maximum", num(sc("SessionTTL").Max), api.MaxSessionTTLms)
	check("Limit maximum", num(sc("Limit").Max), api.MaxLimit)
	check("LockDelay maximum", num(sc("LockDelay").Max), api.MaxLockDelayMs)
	check("Value maxLength", float64(maxLen(sc("Value"))), api.MaxValueBytes)
	locks := prop("MultiAcquireRequest", "locks")
	check("locks minItems", float64(locks.MinItems), api.MinMultiLocks)
	check("locks maxItems", float64(*locks.MaxItems), api.MaxMultiLocks)
	ws := prop("WSAcquireMany", "locks")
	check("WS locks minItems", float64(ws.MinItems), api.MinMultiLocks)
	check("WS locks maxItems", float64(*ws.MaxItems), api.MaxMultiLocks)
	check("list limit maximum", num(param("ListLimit").Max), api.MaxListLimit)
	check("list limit default", param("ListLimit").Default.(float64), api.DefaultListLimit)
	check("raft_addr maxLength", float64(maxLen(prop("AddMemberRequest", "raft_addr"))), api.MaxMemberAddr)
	check("http_addr maxLength", float64(maxLen(prop("AddMemberRequest", "http_addr"))), api.MaxMemberAddr)
	check("session ttl_ms default", doc.Components.Schemas["SessionRequest"].Value.Properties["ttl_ms"].Value.Default.(float64), api.DefaultSessionTTL)
	if d := param("Wait").Default; d != api.DefaultWait.String() && d != "5m" {
		t.Errorf("wait default %v, package api says %v", d, api.DefaultWait)
	}
	if !regexp.MustCompile(sc("Timestamp").Pattern).MatchString(api.FormatTime(1735830245000)) {
		t.Errorf("Timestamp's pattern refuses %s", api.FormatTime(1735830245000))
	}
	modes := func(n string) []string {
		var out []string
		for _, e := range sc(n).Enum {
			out = append(out, e.(string))
		}
		return out
	}
	if m := modes("Mode"); !slices.Equal(m, []string{api.ModeExclusive, api.ModeShared}) {
		t.Errorf("Mode enum %v", m)
	}
	if m := modes("StatusMode"); !slices.Equal(m, []string{api.ModeNone, api.ModeExclusive, api.ModeShared}) {
		t.Errorf("StatusMode enum %v", m)
	}
}

// constants returns the string constants of a file of package api whose
// names start with prefix: name → value.
func constants(t *testing.T, file, prefix string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, prefix) || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					out[n.Name] = v
				}
			}
		}
	}
	return out
}

// fencestoreOnly are codes of package api that the lock service never
// answers.
var fencestoreOnly = []string{api.CodeStaleToken}

// errorCodes returns the codes a reply schema allows in error.code
// (const or enum; allOf intersects, oneOf and anyOf unite), and whether it
// says anything about them at all.
func errorCodes(s *openapi3.Schema) ([]string, bool) {
	var set []string
	constrained := false
	add := func(sub []string, ok bool) {
		switch {
		case !ok:
		case !constrained:
			set, constrained = sub, true
		default:
			set = slices.DeleteFunc(set, func(c string) bool { return !slices.Contains(sub, c) })
		}
	}
	if e := s.Properties["error"]; e != nil {
		add(codeValues(e.Value))
	}
	for _, sub := range s.AllOf {
		add(errorCodes(sub.Value))
	}
	var union []string
	unionOK := false
	for _, subs := range []openapi3.SchemaRefs{s.OneOf, s.AnyOf} {
		for _, sub := range subs {
			if c, ok := errorCodes(sub.Value); ok {
				union, unionOK = append(union, c...), true
			}
		}
	}
	add(union, unionOK)
	return set, constrained
}

func codeValues(s *openapi3.Schema) ([]string, bool) {
	var set []string
	constrained := false
	add := func(sub []string, ok bool) {
		switch {
		case !ok:
		case !constrained:
			set, constrained = sub, true
		default:
			set = slices.DeleteFunc(set, func(c string) bool { return !slices.Contains(sub, c) })
		}
	}
	if c := s.Properties["code"]; c != nil {
		switch {
		case c.Value.Const != nil:
			add([]string{c.Value.Const.(string)}, true)
		case len(c.Value.Enum) > 0:
			var e []string
			for _, v := range c.Value.Enum {
				e = append(e, v.(string))
			}
			add(e, true)
		}
	}
	for _, sub := range s.AllOf {
		add(codeValues(sub.Value))
	}
	return set, constrained
}

// TestErrorCodes: the document's codes are package api's, and every error
// reply allows only codes that go with its status (api.Status).
func TestErrorCodes(t *testing.T) {
	doc := load(t)
	var want []string
	for _, v := range constants(t, "../api.go", "Code") {
		if !slices.Contains(fencestoreOnly, v) {
			want = append(want, v)
		}
	}
	var got []string
	for _, e := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		got = append(got, e.(string))
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum %v, package api %v", got, want)
	}
	checked := 0
	for _, op := range operations(doc) {
		for st, ref := range doc.Paths.Value(op.path).GetOperation(op.method).Responses.Map() {
			status, _ := strconv.Atoi(st)
			for ct, mt := range ref.Value.Content {
				if ct != "application/json" || mt.Schema == nil {
					continue
				}
				codes, _ := errorCodes(mt.Schema.Value)
				if status >= 400 && len(codes) == 0 && op.path != "/readyz" {
					t.Errorf("%s %d: an error reply without an error code", op, status)
				}
				for _, code := range codes {
					checked++
					if s := api.Status(code); s != status && !(code == api.CodeNotLeader && status == http.StatusTemporaryRedirect) {
						t.Errorf("%s %d allows code %s, which goes with %d", op, status, code, s)
					}
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d error codes checked", checked)
	}
}

// --- docs/API.md ---

var (
	endpointHeading = regexp.MustCompile("^### `(GET|POST|DELETE|PUT|PATCH) (/[^`]*)`$")
	replyLine       = regexp.MustCompile("^- `([0-9]{3})`")
	fieldRow        = regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	wsOpHeading     = regexp.MustCompile("^#### `([a-z]+)`$")
	codeRow         = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9]{3}|—) \\|")
)

type section struct {
	title string
	lines []string
}

// sections splits markdown at headings of level depth or above.
func sections(lines []string, depth int) []section {
	var out []section
	for _, l := range lines {
		level := len(l) - len(strings.TrimLeft(l, "#"))
		if level > 0 && level <= depth && strings.HasPrefix(l[level:], " ") {
			out = append(out, section{title: l})
			continue
		}
		if len(out) > 0 {
			out[len(out)-1].lines = append(out[len(out)-1].lines, l)
		}
	}
	return out
}

func readAPIDoc(t *testing.T) (string, []string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b), strings.Split(string(b), "\n")
}

// TestAPIDocMatchesDocument keeps docs/API.md and the OpenAPI document from
// drifting apart: both list the same endpoints; each endpoint's section
// lists exactly the document's replies (bullets that start with the
// status in backquotes) and request fields and query parameters (table
// rows); the error-code table gives each code its status.
func TestAPIDocMatchesDocument(t *testing.T) {
	doc := load(t)
	_, lines := readAPIDoc(t)
	inDoc := map[string]section{}
	for _, s := range sections(lines, 3) {
		if m := endpointHeading.FindStringSubmatch(s.title); m != nil {
			inDoc[m[1]+" "+m[2]] = s
		}
	}
	var documented, described []string
	for _, op := range operations(doc) {
		documented = append(documented, op.String())
	}
	for k := range inDoc {
		described = append(described, k)
	}
	sort.Strings(described)
	if !slices.Equal(documented, described) {
		t.Errorf("endpoints only in openapi.json: %v; only in docs/API.md: %v", minus(documented, described), minus(described, documented))
	}
	for _, op := range operations(doc) {
		s, ok := inDoc[op.String()]
		if !ok {
			continue
		}
		o := doc.Paths.Value(op.path).GetOperation(op.method)
		var want, got []string
		for st := range o.Responses.Map() {
			want = append(want, st)
		}
		var fields []string
		for _, l := range s.lines {
			if m := replyLine.FindStringSubmatch(l); m != nil {
				got = append(got, m[1])
			}
			if m := fieldRow.FindStringSubmatch(l); m != nil {
				fields = append(fields, m[1])
			}
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("%s: replies %v in openapi.json, %v in docs/API.md", op, want, got)
		}
		var wantFields []string
		for _, p := range o.Parameters {
			if p.Value.In == "query" {
				wantFields = append(wantFields, p.Value.Name)
			}
		}
		if o.RequestBody != nil {
			if mt := o.RequestBody.Value.Content.Get("application/json"); mt != nil {
				wantFields = append(wantFields, props(mt.Schema.Value)...)
			}
		}
		sort.Strings(wantFields)
		sort.Strings(fields)
		if !slices.Equal(slices.Compact(wantFields), slices.Compact(fields)) {
			t.Errorf("%s: fields and parameters %v in openapi.json, %v in docs/API.md", op, wantFields, fields)
		}
	}
	// Error codes and their statuses.
	codes := map[string]string{}
	for _, l := range lines {
		if m := codeRow.FindStringSubmatch(l); m != nil {
			codes[m[1]] = m[2]
		}
	}
	for _, e := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		code := e.(string)
		st, ok := codes[code]
		switch {
		case !ok:
			t.Errorf("docs/API.md's code table lacks %s", code)
		case code == api.CodeNotLeader:
			if st != "307" {
				t.Errorf("docs/API.md gives not_leader status %s, want 307 (a follower's redirect)", st)
			}
		case st != strconv.Itoa(api.Status(code)):
			t.Errorf("docs/API.md gives %s status %s, package api %d", code, st, api.Status(code))
		}
	}
}

// TestAPIDocWebSocket: docs/API.md describes every WebSocket op (a level-4
// heading naming the op, whose table rows are the op's fields in the
// document's WSClientFrame), every reply and push type, and every loss
// reason of package api.
func TestAPIDocWebSocket(t *testing.T) {
	doc := load(t)
	text, lines := readAPIDoc(t)
	ops := constants(t, "../ws.go", "Op")
	types := constants(t, "../ws.go", "Type")
	reasons := constants(t, "../ws.go", "Reason")
	if len(ops) < 8 || len(types) < 7 || len(reasons) < 3 {
		t.Fatalf("found %d ops, %d types, %d reasons in api/ws.go", len(ops), len(types), len(reasons))
	}
	// The document's frame schemas name the same ops and types.
	opsInDoc, typesInDoc := map[string][]string{}, map[string]bool{}
	for _, v := range doc.Components.Schemas["WSClientFrame"].Value.OneOf {
		op := v.Value.Properties["op"].Value.Const.(string)
		for _, p := range props(v.Value) {
			if p != "id" && p != "op" {
				opsInDoc[op] = append(opsInDoc[op], p)
			}
		}
		if opsInDoc[op] == nil {
			opsInDoc[op] = []string{}
		}
	}
	for _, v := range doc.Components.Schemas["WSServerFrame"].Value.OneOf {
		typesInDoc[v.Value.Properties["type"].Value.Const.(string)] = true
	}
	for name, op := range ops {
		if _, ok := opsInDoc[op]; !ok {
			t.Errorf("WSClientFrame has no frame for %s (%q)", name, op)
		}
	}
	for name, typ := range types {
		if !typesInDoc[typ] {
			t.Errorf("WSServerFrame has no frame for %s (%q)", name, typ)
		}
		if !strings.Contains(text, `"type":"`+typ+`"`) {
			t.Errorf("docs/API.md never shows a %q frame (%s)", typ, name)
		}
	}
	lost := doc.Components.Schemas["WSLost"].Value.Properties["reason"].Value.Enum
	for name, r := range reasons {
		if !strings.Contains(text, `"reason":"`+r+`"`) {
			t.Errorf("docs/API.md never shows the loss reason %q (%s)", r, name)
		}
		if !slices.Contains(lost, any(r)) {
			t.Errorf("WSLost's reasons lack %q", r)
		}
	}
	// One section per op, its table rows the op's fields.
	wsFields := map[string][]string{}
	inWS := false
	for _, s := range sections(lines, 4) {
		if strings.HasPrefix(s.title, "## ") {
			inWS = strings.Contains(s.title, "WebSocket")
		}
		m := wsOpHeading.FindStringSubmatch(s.title)
		if !inWS || m == nil {
			continue
		}
		wsFields[m[1]] = []string{}
		for _, l := range s.lines {
			if f := fieldRow.FindStringSubmatch(l); f != nil {
				wsFields[m[1]] = append(wsFields[m[1]], f[1])
			}
		}
	}
	for name, op := range ops {
		got, ok := wsFields[op]
		if !ok {
			t.Errorf("docs/API.md has no WebSocket section #### `%s` (%s)", op, name)
			continue
		}
		if !strings.Contains(text, `"op":"`+op+`"`) {
			t.Errorf("docs/API.md never shows an %q frame", op)
		}
		want := slices.Clone(opsInDoc[op])
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(slices.Compact(want), got) {
			t.Errorf("WebSocket op %s: fields %v in openapi.json, %v in docs/API.md", op, want, got)
		}
	}
	for op := range wsFields {
		if !slices.Contains(slices.Collect(mapValues(ops)), op) {
			t.Errorf("docs/API.md describes WebSocket op %q, which api/ws.go does not have", op)
		}
	}
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
