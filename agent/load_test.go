package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/envoy"
)

func TestReadLoadParsesEnvoyStats(t *testing.T) {
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stats" || !strings.Contains(r.URL.Query().Get("filter"), "pending_active") {
			http.Error(w, "unexpected query", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(`{"stats": [
			{"name": "cluster.model.v1.upstream_rq_total", "value": 120},
			{"name": "cluster.model.v1.upstream_rq_5xx", "value": 3},
			{"name": "cluster.model.v1.upstream_rq_active", "value": 4},
			{"name": "cluster.model.v1.upstream_rq_pending_active", "value": 6},
			{"name": "vhost.public.route.predict.upstream_rq_total", "value": 100},
			{"name": "vhost.public.route.predict.upstream_rq_5xx", "value": 2},
			{"name": "vhost.predict.route.predict.upstream_rq_total", "value": 20},
			{"name": "http.public.downstream_rq_total", "value": 999}
		]}`))
	}))
	defer admin.Close()
	l, err := ReadLoad(context.Background(), envoy.Admin{Address: strings.TrimPrefix(admin.URL, "http://")}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Backends["model.v1"]; got != (BackendLoad{Active: 4, Pending: 6, Requests: 120, Errors: 3}) {
		t.Fatalf("backend model.v1: %+v", got)
	}
	if got := l.Routes["predict/public"]; got != (BackendLoad{Requests: 100, Errors: 2}) {
		t.Fatalf("route predict on the public listener: %+v", got)
	}
	if got := l.Routes["predict/mesh"]; got.Requests != 20 {
		t.Fatalf("route predict on the mesh listener: %+v", got)
	}
	if len(l.Backends) != 1 || len(l.Routes) != 2 || l.Node != "n1" {
		t.Fatalf("unexpected figures: %+v", l)
	}
}
