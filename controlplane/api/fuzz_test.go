package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzAPIRequests sends arbitrary bodies to every route that takes one: the
// answer is never a 5xx, and one that is not a 2xx changes nothing.
func FuzzAPIRequests(f *testing.F) {
	for _, s := range []string{`{"name": "a"}`, `{"name": "a", "replicas": [{"address": "127.0.0.1:9001"}]}`,
		`{"name": "e", "route": "/e", "traffic": {"a": 1}}`, `{"num_replicas": 2000000}`, `{"traffic": {"a": 1}}`,
		`{"proportion": 0.5}`, `{"backends": [{"name": "a"}]}`, `{`, ``, `{"NAME": "a"}`} {
		for route := range 6 {
			f.Add(uint8(route), s)
		}
	}
	fx := newFixture(f, "")
	routes := []struct{ method, path string }{
		{http.MethodPost, "/v1/backends"}, {http.MethodPost, "/v1/endpoints"}, {http.MethodPatch, "/v1/backends/a"},
		{http.MethodPut, "/v1/endpoints/e/traffic"}, {http.MethodPut, "/v1/endpoints/e/shadows/a"}, {http.MethodPost, "/v1/apply"},
	}
	handler := fx.srv.Config.Handler
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := routes[int(route)%len(routes)]
		before := fx.rev(t)
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), r.method, r.path, strings.NewReader(body)))
		switch {
		case w.Code >= 500:
			t.Fatalf("%s %s %q: HTTP %d %s", r.method, r.path, body, w.Code, w.Body)
		case w.Code >= 300 && fx.rev(t) != before:
			t.Fatalf("%s %s %q: HTTP %d, and the store changed", r.method, r.path, body, w.Code)
		}
	})
}
