package api

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

var update = flag.Bool("update", false, "rewrite openapi.json from the operations")

// TestOpenAPIFileIsTheServedOne: openapi.json, kept in the repository, is
// what the controller serves (go test -update rewrites it), and it is an
// OpenAPI 3.1 document every schema of which compiles.
func TestOpenAPIFileIsTheServedOne(t *testing.T) {
	doc, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "openapi.json", doc, *update)
	c := newConformance(t)
	for _, op := range operations() {
		for _, status := range append(op.successes(), op.errors...) {
			if _, err := c.schema(op, status); err != nil {
				t.Errorf("%s %s %d: %v", op.method, op.path, status, err)
			}
		}
	}
	f := newFixture(t, "")
	code, body := raw(t, http.MethodGet, f.srv.URL+OpenAPIPath, "", "")
	if code != http.StatusOK || body != string(doc) {
		t.Fatalf("GET %s: %d, %d bytes; want 200 and the description", OpenAPIPath, code, len(body))
	}
}

// conformance checks answers against the OpenAPI description: the status
// must be one the operation lists, and the body must match its schema.
type conformance struct {
	errorf   func(format string, args ...any)
	ops      map[string]operation // by "METHOD /pattern"
	mux      *http.ServeMux       // finds an answer's pattern
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	compiled map[string]*jsonschema.Schema
}

func newConformance(t testing.TB) *conformance {
	doc, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	if err := comp.AddResource("mem://openapi.json", parsed); err != nil {
		t.Fatal(err)
	}
	c := &conformance{errorf: t.Errorf, ops: map[string]operation{}, mux: http.NewServeMux(), compiler: comp,
		compiled: map[string]*jsonschema.Schema{}}
	for _, op := range operations() {
		key := op.method + " " + op.path
		c.ops[key] = op
		c.mux.Handle(key, http.NotFoundHandler())
	}
	return c
}

// schema is the compiled schema of op's answer with status.
func (c *conformance) schema(op operation, status int) (*jsonschema.Schema, error) {
	ptr := "#/paths/" + strings.ReplaceAll(strings.ReplaceAll(op.path, "~", "~0"), "/", "~1") + "/" + strings.ToLower(op.method) +
		"/responses/" + strconv.Itoa(status) + "/content/application~1json/schema"
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.compiled[ptr]; s != nil {
		return s, nil
	}
	s, err := c.compiler.Compile("mem://openapi.json" + ptr)
	if err != nil {
		return nil, err
	}
	c.compiled[ptr] = s
	return s, nil
}

// wrap checks every answer of next against the description.
func (c *conformance) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		c.check(r, rec)
	})
}

func (c *conformance) check(r *http.Request, rec *httptest.ResponseRecorder) {
	_, pattern := c.mux.Handler(r)
	op, ok := c.ops[pattern]
	if !ok {
		if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed && rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
			c.errorf("%s %s answered %d but is not in the description", r.Method, r.URL.Path, rec.Code)
		}
		return
	}
	if !containsInt(op.successes(), rec.Code) && !containsInt(op.errors, rec.Code) {
		c.errorf("%s %s answered %d, which the description does not list (%v and %v)", r.Method, r.URL.Path, rec.Code, op.successes(), op.errors)
		return
	}
	s, err := c.schema(op, rec.Code)
	if err != nil {
		c.errorf("%s %s %d: %v", r.Method, r.URL.Path, rec.Code, err)
		return
	}
	body, err := jsonschema.UnmarshalJSON(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		c.errorf("%s %s %d: the body is not JSON: %v", r.Method, r.URL.Path, rec.Code, err)
		return
	}
	if err := s.Validate(body); err != nil {
		c.errorf("%s %s %d: the body does not match the description: %v\n%s", r.Method, r.URL.Path, rec.Code, err, rec.Body.String())
	}
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestConformanceCatchesWhatTheDescriptionDoesNotSay: the checker the API
// tests run behind fails an answer with a status or a body the
// description does not have.
func TestConformanceCatchesWhatTheDescriptionDoesNotSay(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
	}{{http.StatusAccepted, `{"changed": true}`}, {http.StatusCreated, `{"changed": "yes"}`}, {http.StatusCreated, `{"changed": true, "extra": 1}`},
		{http.StatusConflict, `{"message": "no kind"}`}} {
		c := newConformance(t)
		var errs []string
		c.errorf = func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
		srv := httptest.NewServer(c.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		})))
		raw(t, http.MethodPost, srv.URL+"/v1/backends", `{"name": "b"}`, "")
		srv.Close()
		if len(errs) != 1 {
			t.Errorf("an answer %d %s: the checker said %q; want one error", tc.status, tc.body, errs)
		}
	}
}

// TestOperationsAreTheMuxRoutes: every operation with a handler is routed
// by Handler (of a controller that reports status), and answers as
// described.
func TestOperationsAreTheMuxRoutes(t *testing.T) {
	f := newFixture(t, "")
	srv := httptest.NewServer(newConformance(t).wrap(Handler(f.c, slog.New(slog.NewTextHandler(io.Discard, nil)), Sources{Status: func() StatusReport {
		m, _ := f.c.State()
		return NewStatusReport(StatusInputs{State: m, Health: func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{} }})
	}, Served: func(rev uint64, bs []meshspec.Backend) ServedReport {
		return NewServedReport(ServedInputs{Revision: rev, Backends: bs, Health: func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{} }})
	}, Agents: func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1", StatusAddr: "10.0.0.3:9100"}}, nil
	}, Logs: func(_ context.Context, reads []LogRead) []LogChunk { return make([]LogChunk, len(reads)) }})))
	t.Cleanup(srv.Close)
	for _, op := range operations() {
		if op.handle == nil {
			continue
		}
		path := strings.NewReplacer("{name}", "nothing-here", "{backend}", "b", "{action}", "pause").Replace(op.path)
		req, err := http.NewRequestWithContext(t.Context(), op.method, srv.URL+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusMethodNotAllowed || (resp.StatusCode == http.StatusNotFound && resp.Header.Get("Content-Type") != "application/json") {
			t.Errorf("%s %s is described but not routed: %d", op.method, path, resp.StatusCode)
		}
	}
}

// TestConsoleFilesNeedNoToken: with tokens, GET of the console's files
// passes without one (they are static; the script sends the token), while
// any other method there, and every other path, needs one.
func TestConsoleFilesNeedNoToken(t *testing.T) {
	reached := 0
	h := Tokens{"t0k3n-0123456789abcdef": ScopeExec}.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached++
		w.WriteHeader(http.StatusOK)
	}))
	for _, tc := range []struct {
		method, path string
		want         int
	}{{"GET", ConsolePath, 200}, {"GET", ConsolePath + "console.js", 200}, {"GET", "/ui", 200}, {"HEAD", ConsolePath, 200},
		{"POST", ConsolePath, 401}, {"GET", "/uix", 401}, {"GET", "/v1/status", 401}, {"GET", "/ui/../v1/status", 401}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequestWithContext(t.Context(), tc.method, tc.path, nil)
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s %s without a token: %d, want %d", tc.method, tc.path, rec.Code, tc.want)
		}
	}
	if reached != 4 {
		t.Errorf("%d requests reached the handler, want the 4 to the console", reached)
	}
}
