package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

type fixture struct {
	st  *store.Memory
	c   *controller.Controller
	srv *httptest.Server
}

func newFixture(t testing.TB, token string) *fixture {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.NewMemory()
	c := controller.New(controller.Options{Logger: log, Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	tokens := Tokens{}
	if token != "" {
		tokens[token] = ScopeExec
	}
	srv := httptest.NewServer(newConformance(t).wrap(tokens.Authenticate(Handler(c, log, Sources{}))))
	t.Cleanup(srv.Close)
	return &fixture{st: st, c: c, srv: srv}
}

func (f *fixture) rev(t testing.TB) store.Revision {
	t.Helper()
	_, rev, err := f.st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func raw(t *testing.T, method, url, body, token string) (int, string) {
	t.Helper()
	return rawWith(t, method, url, body, token, http.Header{"Content-Type": {"application/json"}})
}

// rawWith is raw with the given request headers.
func rawWith(t *testing.T, method, url, body, token string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var e ErrorBody
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return resp.StatusCode, e.Error + " leader=" + e.Leader
	}
	return resp.StatusCode, string(b)
}

func TestClientRoundTripAndStatusCodes(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	cl := NewClient(f.srv.URL, "")
	v1 := meshspec.Backend{Name: "v1", Replicas: []meshspec.Replica{{Address: "10.0.0.1:9001"}}}
	if changed, err := cl.CreateBackend(ctx, meshspec.BackendSpecOf(v1)); err != nil || !changed {
		t.Fatalf("create: %v %v", changed, err)
	}
	if changed, err := cl.CreateBackend(ctx, meshspec.BackendSpecOf(v1)); err != nil || changed {
		t.Fatalf("repeat create: %v %v", changed, err)
	}
	if _, err := cl.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetShadow(ctx, "api", "v1", 0.1); err != nil {
		t.Fatal(err)
	}
	e, err := cl.GetEndpoint(ctx, "api")
	if err != nil || e.Shadows["v1"] != 0.1 {
		t.Fatalf("get endpoint: %+v %v", e, err)
	}
	res, err := cl.Apply(ctx, meshspec.SpecOf(&meshspec.Model{Backends: []meshspec.Backend{v1}}), ApplyOptions{DryRun: true})
	if err != nil || strings.Join(res.Changes, ",") != "delete endpoint api" {
		t.Fatalf("dry-run apply: %+v %v", res, err)
	}
	for _, tc := range []struct {
		call   func() error
		status int
		kind   string
	}{
		{func() error { _, err := cl.GetBackend(ctx, "ghost"); return err }, 404, "not_found"},
		{func() error { _, err := cl.DeleteBackend(ctx, "v1"); return err }, 409, "conflict"},
		{func() error { _, err := cl.SetTraffic(ctx, "api", map[string]float64{"v1": 0.5}); return err }, 400, "invalid"},
		{func() error { _, err := cl.SetTraffic(ctx, "ghost", map[string]float64{"v1": 1}); return err }, 404, "not_found"},
	} {
		var apiErr *Error
		if err := tc.call(); !errors.As(err, &apiErr) || apiErr.Status != tc.status || apiErr.Body.Kind != tc.kind {
			t.Errorf("got %v, want HTTP %d %s", err, tc.status, tc.kind)
		}
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	f := newFixture(t, "")
	u := f.srv.URL
	before := f.rev(t)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"malformed JSON", "POST", "/v1/backends", `{"name": "a",`, 400, "malformed JSON"},
		{"wrong type", "POST", "/v1/backends", `{"name": 7}`, 400, `field "name" must be a string`},
		{"unknown field", "POST", "/v1/backends", `{"name": "a", "replica": []}`, 400, `unknown field "/replica"`},
		{"empty body", "POST", "/v1/endpoints", ``, 400, "the body is empty"},
		{"two values", "POST", "/v1/backends", `{"name": "a"} {"name": "b"}`, 400, "malformed JSON"},
		{"odd name", "POST", "/v1/backends", `{"name": "a/../b"}`, 400, "not a valid name"},
		{"unicode name", "POST", "/v1/backends", `{"name": "bäckend"}`, 400, "not a valid name"},
		{"newline name", "POST", "/v1/backends", `{"name": "a\nb"}`, 400, "not a valid name"},
		{"huge body", "POST", "/v1/backends", `{"name": "` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "over 1048576 bytes"},
		{"traffic without traffic", "PUT", "/v1/endpoints/x/traffic", `{}`, 400, `needs "traffic"`},
		{"shadow without proportion", "PUT", "/v1/endpoints/x/shadows/y", `{}`, 400, `needs "proportion"`},
		{"weights as strings", "PUT", "/v1/endpoints/x/traffic", `{"traffic": {"a": "1"}}`, 400, "must be a number"},
		{"unknown path", "GET", "/v1/nothing", ``, 404, "not found"},
		{"wrong method", "DELETE", "/v1/apply", ``, 405, "Method Not Allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := raw(t, tc.method, u+tc.path, tc.body, "")
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("HTTP %d %s, want %d mentioning %q", status, body, tc.status, tc.want)
			}
		})
	}
	if after := f.rev(t); after != before {
		t.Fatalf("bad input changed the store: revision %d -> %d", before, after)
	}
}

func TestTokenIsRequiredAndWithoutItNothingChanges(t *testing.T) {
	f := newFixture(t, "s3cret")
	u := f.srv.URL
	for _, token := range []string{"", "wrong"} {
		if status, body := raw(t, "POST", u+"/v1/backends", `{"name": "a"}`, token); status != 401 || !strings.Contains(body, "Authorization: Bearer <token>") {
			t.Fatalf("token %q: HTTP %d %s, want 401", token, status, body)
		}
		if status, _ := raw(t, "GET", u+"/v1/backends", ``, token); status != 401 {
			t.Fatalf("token %q: a read got HTTP %d, want 401", token, status)
		}
	}
	if f.rev(t) != 0 {
		t.Fatal("an unauthenticated call changed the store")
	}
	if changed, err := NewClient(u, "s3cret").CreateBackend(context.Background(), meshspec.BackendSpec{Name: "a"}); err != nil || !changed {
		t.Fatalf("with the token: %v %v", changed, err)
	}
	// The scheme is case-insensitive (RFC 9110), the token is not.
	for header, want := range map[string]int{"bearer s3cret": 200, "BEARER s3cret": 200, "Bearer S3CRET": 401, "Basic s3cret": 401, "s3cret": 401} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, u+"/v1/backends", nil)
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization: %q answered %d, want %d", header, resp.StatusCode, want)
		}
	}
}

func TestFollowerAnswers503AndTheClientFollowsTheLeader(t *testing.T) {
	leader := newFixture(t, "")
	follower := newFixture(t, "")
	follower.c.Follow(strings.TrimPrefix(leader.srv.URL, "http://"))

	status, body := raw(t, "POST", follower.srv.URL+"/v1/backends", `{"name": "a"}`, "")
	if status != 503 || !strings.Contains(body, "leader="+strings.TrimPrefix(leader.srv.URL, "http://")) {
		t.Fatalf("write to a follower: HTTP %d %s", status, body)
	}
	changed, err := NewClient(follower.srv.URL+","+leader.srv.URL, "").CreateBackend(context.Background(), meshspec.BackendSpec{Name: "a"})
	if err != nil || !changed {
		t.Fatalf("client via follower: %v %v", changed, err)
	}
	if _, err := leader.c.GetBackend("a"); err != nil {
		t.Fatal("the write did not reach the leader")
	}
	if follower.rev(t) != 0 {
		t.Fatal("the follower's own store was written")
	}
	// A leader the client was not given gets nothing, token included.
	only := NewClient(follower.srv.URL, "s3cret")
	only.FailoverWait = 0
	if _, err := only.CreateBackend(context.Background(), meshspec.BackendSpec{Name: "b"}); err == nil || !strings.Contains(err.Error(), "not among the controllers") {
		t.Fatalf("a write via a follower naming an unknown leader: %v", err)
	}
	if _, err := leader.c.GetBackend("b"); err == nil {
		t.Fatal("the write reached a leader the client was not given")
	}
}

// TestClientRidesThroughAFailover: writes that were never delivered (no
// controller listening, a follower with no leader yet) are sent again,
// across the given controllers, until one leads, within FailoverWait.
func TestClientRidesThroughAFailover(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // connection refused
	successor := newFixture(t, "")
	successor.c.Follow("") // no leader known: the old one just died
	go func() {
		time.Sleep(300 * time.Millisecond)
		if err := successor.c.Lead(context.Background(), strings.TrimPrefix(successor.srv.URL, "http://")); err != nil {
			t.Error(err)
		}
	}()
	c := NewClient(dead.URL+","+successor.srv.URL, "")
	c.FailoverWait = 10 * time.Second
	if changed, err := c.CreateBackend(context.Background(), meshspec.BackendSpec{Name: "a"}); err != nil || !changed {
		t.Fatalf("a write during a failover: %v, %v", changed, err)
	}
	// Without a wait, a call tries each controller once and says why it failed.
	c.FailoverWait = 0
	dead2 := NewClient(dead.URL, "")
	dead2.FailoverWait = 0
	if _, err := dead2.ListBackends(context.Background()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a call to no controller: %v", err)
	}
	// Errors that reached the leader are not sent again.
	var refused *Error
	if _, err := c.CreateBackend(context.Background(), meshspec.BackendSpec{Name: "bad name"}); !errors.As(err, &refused) || refused.Status != http.StatusBadRequest {
		t.Fatalf("an invalid write: %v", err)
	}
}

// TestTokenScopes: a read token reads and changes nothing, a write token
// changes what runs no command, and creating or changing a backend's
// command needs the exec scope (anyone who could call the API could run any
// command on every node).
func TestTokenScopes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.NewMemory()
	c := controller.New(controller.Options{Logger: log, Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	tokens := Tokens{"r-token": ScopeRead, "w-token": ScopeWrite, "x-token": ScopeExec}
	srv := httptest.NewServer(newConformance(t).wrap(tokens.Authenticate(Handler(c, log, Sources{}))))
	defer srv.Close()
	process := `{"name": "p", "process": {"command": "/bin/true"}}`
	applyProcess := `{"backends": [{"name": "p2", "process": {"command": "/bin/sh"}}]}`
	for _, tc := range []struct {
		token, method, path, body string
		want                      int
	}{
		{"r-token", "GET", "/v1/backends", "", 200},
		{"r-token", "POST", "/v1/backends", `{"name": "a"}`, 403},
		{"w-token", "POST", "/v1/backends", `{"name": "a"}`, 201},
		{"w-token", "POST", "/v1/backends", process, 403},
		{"w-token", "POST", "/v1/apply", applyProcess, 403},
		{"x-token", "POST", "/v1/backends", process, 201},
		{"w-token", "POST", "/v1/apply", `{"backends": [{"name": "a"}, {"name": "p", "process": {"command": "/bin/true"}}]}`, 200}, // its command is unchanged
		{"x-token", "POST", "/v1/apply", applyProcess, 200},
		{"", "GET", "/v1/backends", "", 401},
		{"nope", "GET", "/v1/leader", "", 401},
	} {
		status, body := raw(t, tc.method, srv.URL+tc.path, tc.body, tc.token)
		if status != tc.want {
			t.Errorf("%s %s %s with %q: HTTP %d %s, want %d", tc.method, tc.path, tc.body, tc.token, status, body, tc.want)
		}
	}
}

// TestTokenlessAPIRefusesBrowsers: an API without tokens trusts whoever
// reaches it, so what a web page can send must not reach it: a cross-origin
// POST with Content-Type text/plain and a foreign Host created a process
// backend (CSRF, DNS rebinding). Bodies are JSON (YAML for apply) only,
// with tokens too.
func TestTokenlessAPIRefusesBrowsers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tokens := range []Tokens{{}, {"x-token": ScopeExec}} {
		st := store.NewMemory()
		c := controller.New(controller.Options{Logger: log, Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
		if err := c.Lead(context.Background(), "self"); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(newConformance(t).wrap(tokens.Authenticate(Handler(c, log, Sources{}))))
		token := ""
		if len(tokens) > 0 {
			token = "x-token"
		}
		process := `{"name": "p", "process": {"command": "/bin/sh"}}`
		js := "application/json"
		for _, tc := range []struct {
			name   string
			header http.Header
			path   string
			body   string
			want   int
		}{
			{"text/plain (a form a page may post)", http.Header{"Content-Type": {"text/plain"}}, "/v1/backends", process, 415},
			{"no content type", http.Header{}, "/v1/backends", process, 415},
			{"a form", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "/v1/backends", process, 415},
			{"YAML outside apply", http.Header{"Content-Type": {"application/yaml"}}, "/v1/backends", "name: a", 415},
			{"YAML apply", http.Header{"Content-Type": {"application/yaml"}}, "/v1/apply", "backends: [{name: ya}]", 200},
			{"JSON with a charset", http.Header{"Content-Type": {js + "; charset=utf-8"}}, "/v1/backends", `{"name": "a"}`, 201},
		} {
			if status, body := rawWith(t, "POST", srv.URL+tc.path, tc.body, token, tc.header); status != tc.want {
				t.Errorf("tokens=%d %s: HTTP %d %s, want %d", len(tokens), tc.name, status, body, tc.want)
			}
		}
		if len(tokens) == 0 {
			for _, tc := range []struct {
				name   string
				header http.Header
			}{
				{"an Origin header", http.Header{"Content-Type": {js}, "Origin": {"http://evil.example"}}},
				{"a foreign Host on loopback", http.Header{"Content-Type": {js}, "Host": {"evil.example"}}},
			} {
				req, _ := http.NewRequestWithContext(context.Background(), "POST", srv.URL+"/v1/backends", strings.NewReader(process))
				req.Header = tc.header
				if h := tc.header.Get("Host"); h != "" {
					req.Host = h
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("%s: HTTP %d, want 403", tc.name, resp.StatusCode)
				}
			}
			if status, _ := rawWith(t, "GET", srv.URL+"/v1/backends", "", "", http.Header{"Origin": {"http://evil.example"}}); status != http.StatusForbidden {
				t.Errorf("a read from a page: HTTP %d, want 403", status)
			}
			// Another page on this machine (another port) is refused; the
			// API's own console, of its origin, is not (issue 34: its split
			// form could never work without tokens).
			other := "http://127.0.0.1:1" + strings.TrimPrefix(srv.URL, "http://127.0.0.1:")
			if status, _ := rawWith(t, "GET", srv.URL+"/v1/backends", "", "", http.Header{"Origin": {other}}); status != http.StatusForbidden {
				t.Errorf("a read from a page on another port: HTTP %d, want 403", status)
			}
			if status, body := rawWith(t, "GET", srv.URL+"/v1/backends", "", "", http.Header{"Origin": {srv.URL}}); status != http.StatusOK {
				t.Errorf("a read from the API's own origin (its console): HTTP %d %s, want 200", status, body)
			}
		}
		if _, err := c.GetBackend("p"); err == nil {
			t.Errorf("tokens=%d: a refused request created the process backend", len(tokens))
		}
		srv.Close()
	}
}

// TestTokenFilesAreTheOwnersAlone: a token file other users may read is
// refused, naming the fix (it was read whatever its mode).
func TestTokenFilesAreTheOwnersAlone(t *testing.T) {
	dir := t.TempDir()
	for mode, want := range map[os.FileMode]string{0o600: "", 0o400: "", 0o644: "chmod 600", 0o640: "chmod 600", 0o606: "chmod 600"} {
		path := filepath.Join(dir, fmt.Sprintf("token-%o", mode))
		if err := os.WriteFile(path, []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		token, err := ReadTokenFile(path)
		if want == "" && (err != nil || token != "secret") {
			t.Errorf("mode %o: %q, %v", mode, token, err)
		}
		if want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("mode %o: %q, %v; want refused naming %q", mode, token, err, want)
		}
		if err := (Tokens{}).Add(path, ScopeRead); (err == nil) != (want == "") {
			t.Errorf("mode %o: Tokens.Add: %v", mode, err)
		}
	}
}

// TestEnvValuesNeedTheExecScope: a process's environment often holds the
// model server's secrets; read and write tokens saw its values.
func TestEnvValuesNeedTheExecScope(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	tokens := Tokens{"r-token": ScopeRead, "w-token": ScopeWrite, "x-token": ScopeExec}
	srv := httptest.NewServer(newConformance(t).wrap(tokens.Authenticate(Handler(c, log, Sources{}))))
	defer srv.Close()
	if status, body := raw(t, "POST", srv.URL+"/v1/backends", `{"name": "p", "process": {"command": "/srv/model", "env": {"API_KEY": "s3cret"}}}`, "x-token"); status != 201 {
		t.Fatalf("create: HTTP %d %s", status, body)
	}
	for token, wantSecret := range map[string]bool{"r-token": false, "w-token": false, "x-token": true} {
		for _, path := range []string{"/v1/backends", "/v1/backends/p"} {
			status, body := raw(t, "GET", srv.URL+path, "", token)
			if status != 200 || strings.Contains(body, "s3cret") != wantSecret || strings.Contains(body, "API_KEY") != true {
				t.Errorf("GET %s with %s: HTTP %d %s; want the value shown: %v (the name always)", path, token, status, body, wantSecret)
			}
		}
	}
}

// TestLogTailsNeedTheExecScope: a crash-looping replica's status note
// quotes its log, which may print its secrets; read and write tokens saw
// it (issue 34). Now they get the note without the log lines.
func TestLogTailsNeedTheExecScope(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	note := wire.ExitedNote + " 3 times; the last: exit status 1" + wire.LogTailNote + "API_KEY=s3cret"
	src := Sources{Status: func() StatusReport {
		return StatusReport{Backends: []BackendStatus{{Name: "p", Replicas: []ReplicaStatus{{Tag: "p#000001", Note: note}}}}}
	}}
	tokens := Tokens{"r-token": ScopeRead, "w-token": ScopeWrite, "x-token": ScopeExec}
	srv := httptest.NewServer(tokens.Authenticate(Handler(c, log, src)))
	defer srv.Close()
	for token, wantTail := range map[string]bool{"r-token": false, "w-token": false, "x-token": true} {
		status, body := raw(t, "GET", srv.URL+"/v1/status", "", token)
		if status != 200 || strings.Contains(body, "s3cret") != wantTail || !strings.Contains(body, "exit status 1") {
			t.Errorf("GET /v1/status with %s: HTTP %d %s; want the log shown: %v (the exit always)", token, status, body, wantTail)
		}
	}
}

// TestUsersCannotSetWhatServemeshSets: placements are the controller's, a
// replica's node and inbound listener the catalog's; a static backend
// naming a node made that node's inbound listener refer to a secret that
// never exists, and Envoy refused it. Users write a meshspec.Spec, which has
// no such fields: the API refuses them by name and changes nothing.
func TestUsersCannotSetWhatServemeshSets(t *testing.T) {
	f := newFixture(t, "")
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/backends", `{"name": "a", "process": {"command": "/srv/x"}, "placements": [{"tag": "a#000000", "node": "n1", "state": "running"}]}`, "/placements"},
		{"/v1/backends", `{"name": "a", "replicas": [{"address": "10.0.0.1:80", "node": "n1"}]}`, "/replicas/0/node"},
		{"/v1/apply", `{"backends": [{"name": "a", "replicas": [{"address": "10.0.0.1:80", "node": "n1", "inbound": "10.0.0.1:21000"}]}]}`, "/backends/0/replicas/0/"},
	} {
		status, body := raw(t, "POST", f.srv.URL+tc.path, tc.body, "")
		if status != 400 || !strings.Contains(body, tc.field) || !strings.Contains(body, "servemesh's to set") {
			t.Errorf("POST %s %s: HTTP %d %s; want 400 naming %s", tc.path, tc.body, status, body, tc.field)
		}
	}
	if status, body := raw(t, "GET", f.srv.URL+"/v1/backends", "", ""); status != 200 || strings.TrimSpace(body) != "[]" {
		t.Fatalf("refused writes stored something: %s", body)
	}
}

// TestProfilesNeedTheExecScope: Go's profiles are the exec scope's alone.
func TestProfilesNeedTheExecScope(t *testing.T) {
	tokens := Tokens{"r-token": ScopeRead, "w-token": ScopeWrite, "x-token": ScopeExec}
	srv := httptest.NewServer(tokens.Authenticate(DebugHandler()))
	defer srv.Close()
	for token, want := range map[string]int{"": 401, "r-token": 403, "w-token": 403, "x-token": 200} {
		if status, body := raw(t, "GET", srv.URL+"/debug/pprof/heap", "", token); status != want {
			t.Errorf("GET /debug/pprof/heap with %q: HTTP %d %.200s; want %d", token, status, body, want)
		}
	}
}

// TestXDSCacheViewIsReadByAnyToken: the xDS cache's debug view answers
// any token with what the view gives, and no one without one.
func TestXDSCacheViewIsReadByAnyToken(t *testing.T) {
	tokens := Tokens{"r-token": ScopeRead, "x-token": ScopeExec}
	view := map[string]any{"on": true, "keys": []map[string]string{{"kind": "translate/backend", "name": "a"}}}
	mux := http.NewServeMux()
	mux.Handle("GET "+XDSCachePath, XDSCacheHandler(func() any { return view }))
	srv := httptest.NewServer(tokens.Authenticate(mux))
	defer srv.Close()
	for token, want := range map[string]int{"": 401, "r-token": 200, "x-token": 200} {
		status, body := raw(t, "GET", srv.URL+XDSCachePath, "", token)
		if status != want {
			t.Errorf("GET %s with %q: HTTP %d %.200s; want %d", XDSCachePath, token, status, body, want)
		}
		if want == 200 && !strings.Contains(body, `"translate/backend"`) {
			t.Errorf("GET %s: %s; want the view", XDSCachePath, body)
		}
	}
}

// TestPatchIsAJSONMergePatch: PATCH /v1/backends/{name} takes an RFC 7386
// merge patch (as application/merge-patch+json or application/json): null
// removes a field, an object merges, any config field can be named; the
// previous release's bodies keep working; a bad patch names its field and
// changes nothing.
func TestPatchIsAJSONMergePatch(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	cl := NewClient(f.srv.URL, "")
	if _, err := cl.CreateBackend(ctx, meshspec.BackendSpec{Name: "b", Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.1:80"}},
		Config: meshspec.BackendConfig{MaxConcurrentQueries: 8, HoldTimeoutS: 5, Outlier: &meshspec.OutlierDetection{Consecutive5xx: 3}}}); err != nil {
		t.Fatal(err)
	}
	mergePatch := http.Header{"Content-Type": {"application/merge-patch+json"}}
	url := f.srv.URL + "/v1/backends/b"
	for _, step := range []struct {
		body   string
		header http.Header
		check  func(meshspec.BackendConfig) bool
	}{
		{`{"hold_timeout_s": null, "max_held": 7}`, mergePatch, func(c meshspec.BackendConfig) bool {
			return c.HoldTimeoutS == 0 && c.MaxHeld == 7 && c.MaxConcurrentQueries == 8
		}},
		{`{"outlier": {"interval_s": 2}}`, mergePatch, func(c meshspec.BackendConfig) bool {
			return c.Outlier != nil && c.Outlier.Consecutive5xx == 3 && c.Outlier.IntervalS == 2
		}},
		{`{"outlier": null}`, nil, func(c meshspec.BackendConfig) bool { return c.Outlier == nil }},
		{`{"max_concurrent_queries": 4}`, nil, func(c meshspec.BackendConfig) bool { return c.MaxConcurrentQueries == 4 }},
	} {
		header := step.header
		if header == nil {
			header = http.Header{"Content-Type": {"application/json"}}
		}
		if status, body := rawWith(t, http.MethodPatch, url, step.body, "", header); status != http.StatusOK {
			t.Fatalf("PATCH %s: HTTP %d %s", step.body, status, body)
		}
		got, err := cl.GetBackend(ctx, "b")
		if err != nil || !step.check(got.Config) {
			t.Fatalf("after PATCH %s: %+v, %v", step.body, got.Config, err)
		}
	}
	before := f.rev(t)
	for body, want := range map[string]string{
		`{"max_concurent_queries": 4}`:     `unknown field "/max_concurent_queries"`,
		`{"max_concurrent_queries": -1}`:   "max_concurrent_queries",
		`{"outlier": {"interval_s": "x"}}`: "outlier.interval_s",
		`{}`:                               "sets no field",
	} {
		if status, got := rawWith(t, http.MethodPatch, url, body, "", mergePatch); status != http.StatusBadRequest || !strings.Contains(got, want) {
			t.Errorf("PATCH %s: HTTP %d %s; want 400 naming %q", body, status, got, want)
		}
	}
	if status, got := rawWith(t, http.MethodPatch, url, `{"max_held": 1}`, "", http.Header{"Content-Type": {"text/plain"}}); status != http.StatusUnsupportedMediaType ||
		!strings.Contains(got, "application/merge-patch+json") {
		t.Errorf("a text/plain patch: HTTP %d %s", status, got)
	}
	if after := f.rev(t); after != before {
		t.Fatalf("refused patches changed the store: revision %d -> %d", before, after)
	}
}

// TestApplyDryRunThatIsNotABoolean: ?dry_run=yes was read as false, so a
// user who asked only to see the change had it applied.
func TestApplyDryRunThatIsNotABoolean(t *testing.T) {
	f := newFixture(t, "")
	before := f.rev(t)
	body := `{"backends":[{"name":"v1","replicas":[{"address":"10.0.0.1:80"}]}]}`
	for _, v := range []string{"yes", "1x", "dry"} {
		code, out := raw(t, "POST", f.srv.URL+"/v1/apply?dry_run="+v, body, "")
		if code != http.StatusBadRequest || !strings.Contains(out, "dry_run") || !strings.Contains(out, "nothing was applied") {
			t.Errorf("dry_run=%s: %d %s; want 400 naming dry_run", v, code, out)
		}
	}
	if after := f.rev(t); after != before {
		t.Fatalf("a refused dry run changed the state: revision %d, then %d", before, after)
	}
	if code, out := raw(t, "POST", f.srv.URL+"/v1/apply?dry_run=true", body, ""); code != http.StatusOK || !strings.Contains(out, `"dry_run":true`) {
		t.Errorf("dry_run=true: %d %s", code, out)
	}
	if after := f.rev(t); after != before {
		t.Fatalf("a dry run changed the state")
	}
}

// TestSpecIsWhatApplyTakesBack: GET /v1/spec answers every kind of
// setting users declared, the mesh's included, and applying it back
// changes nothing.
func TestSpecIsWhatApplyTakesBack(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	cl := NewClient(f.srv.URL, "")
	v1 := meshspec.Backend{Name: "v1", Replicas: []meshspec.Replica{{Address: "10.0.0.1:9001"}}, Config: meshspec.BackendConfig{MaxConcurrentQueries: 4}}
	if _, err := cl.CreateBackend(ctx, meshspec.BackendSpecOf(v1)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}, Shadows: map[string]float64{"v1": 0.1},
		Retry: &meshspec.RetryPolicy{On: []string{"503"}, Attempts: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetTracing(ctx, &meshspec.Tracing{Collector: "127.0.0.1:4317"}); err != nil {
		t.Fatal(err)
	}
	spec, err := cl.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mesh == nil || spec.Mesh.Tracing == nil || spec.Mesh.Tracing.Collector != "127.0.0.1:4317" || len(spec.Backends) != 1 ||
		spec.Backends[0].Config.MaxConcurrentQueries != 4 || len(spec.Endpoints) != 1 || spec.Endpoints[0].Retry == nil {
		t.Fatalf("GET %s: %+v", SpecPath, spec)
	}
	if res, err := cl.Apply(ctx, spec, ApplyOptions{DryRun: true}); err != nil || len(res.Changes) != 0 {
		t.Fatalf("applying the spec back: %+v, %v; want no change", res.Changes, err)
	}
}
