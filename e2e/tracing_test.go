//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/devjaeger"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestTracingFollowsEveryHop: on the default mesh (mTLS, two nodes), with
// node 1 cordoned so every replica runs on node 2 and each request crosses
// its inbound hop, the mesh's tracing (set by the CLI) sends every Envoy's
// spans to a real Jaeger v2. An endpoint splits between two backends and
// mirrors every request to a third. Each request sent to node 1 with a
// W3C traceparent is one trace in Jaeger, read back from its query API:
// node 1's span (named for the endpoint, tagged with it and the split) is
// the child of the client's span; its upstream span (to the backend the
// split chose) is the parent of node 2's inbound span (tagged with the
// backend), whose upstream span is the parent the replica saw in its
// traceparent; the shadow copy is node 1's "mirror" span, child of the
// request's, parent of node 2's inbound span of the shadow backend tagged
// as a shadow of the endpoint. A request without a trace context is
// traced too (100%); one whose context says "not sampled" is not, nor is
// a request to an endpoint whose own sampling is 0.
func TestTracingFollowsEveryHop(t *testing.T) {
	ctx := context.Background()
	jaeger, err := devjaeger.Start(ctx, t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer jaeger.Stop()
	mesh := startTwoNodeMeshWith(t, "trc", nil, nil)
	if _, err := mesh.c.NodeAction(ctx, mesh.n1.id, api.Cordon); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"tv1", "tv2", "tsh"} {
		mesh.createBackends(t, meshspec.Backend{Name: b, Process: demoProcess(b, false), Config: meshspec.BackendConfig{NumReplicas: 1}})
	}
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	if code, out, errOut := cli(t, env, "tracing", "set", "--collector", jaeger.OTLP, "--sampling", "100"); code != 0 {
		t.Fatalf("tracing set: exit %d, %s %s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "endpoint", "create", "quiet", "--route", "/quiet", "--backend", "tv1", "--trace-sampling", "0"); code != 0 {
		t.Fatalf("endpoint create quiet: exit %d, %s %s", code, out, errOut)
	}
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "traced", Route: "/traced",
		Traffic: map[string]float64{"tv1": 0.5, "tv2": 0.5}, Shadows: map[string]float64{"tsh": 1}}); err != nil {
		t.Fatal(err)
	}
	client := httpClient()
	send := func(path, traceparent string) (status int, backend, seen string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+mesh.n1.public+path, nil)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", ""
		}
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(demoreplica.BackendHeader), resp.Header.Get(demoreplica.TraceparentHeader)
	}
	for _, path := range []string{"/traced", "/quiet"} {
		testutil.WaitFor(t, 60*time.Second, path+" to answer on n1", func() bool { s, _, _ := send(path, ""); return s == http.StatusOK })
	}

	type sent struct{ traceID, parent, backend, seen string }
	var traced []sent
	for range 8 {
		id, parent := randomHex(t, 16), randomHex(t, 8)
		status, backend, seen := send("/traced", "00-"+id+"-"+parent+"-01")
		if status != http.StatusOK || !strings.HasPrefix(seen, "00-"+id+"-") || !strings.HasSuffix(seen, "-01") {
			t.Fatalf("a traced request: %d, the replica saw traceparent %q; want 200 and trace %s, sampled", status, seen, id)
		}
		traced = append(traced, sent{id, parent, backend, seen})
	}
	// Without a trace context: Envoy starts the trace (100%).
	status, backend, seen := send("/traced", "")
	if parts := strings.Split(seen, "-"); status != http.StatusOK || len(parts) != 4 || parts[3] != "01" {
		t.Fatalf("a request without a trace context: %d, the replica saw %q; want a sampled traceparent", status, seen)
	}
	traced = append(traced, sent{strings.Split(seen, "-")[1], "", backend, seen})
	unsampled := randomHex(t, 16)
	if status, _, seen := send("/traced", "00-"+unsampled+"-"+randomHex(t, 8)+"-00"); status != http.StatusOK || !strings.HasSuffix(seen, "-00") {
		t.Fatalf("an unsampled request: %d, the replica saw %q; want the decision kept (-00)", status, seen)
	}
	_, _, quietSeen := send("/quiet", "")
	if parts := strings.Split(quietSeen, "-"); len(parts) != 4 || parts[3] != "00" {
		t.Fatalf("a request to the endpoint sampling 0%%: the replica saw %q; want an unsampled traceparent", quietSeen)
	}

	n1, n2 := wire.TraceService(mesh.n1.id), wire.TraceService(mesh.n2.id)
	backends := map[string]bool{}
	for _, s := range traced {
		var tr *devjaeger.Trace
		deadline := time.Now().Add(30 * time.Second)
		for tr, err = jaeger.Trace(ctx, s.traceID); err != nil || len(tr.Spans) < 7; tr, err = jaeger.Trace(ctx, s.traceID) {
			if time.Now().After(deadline) {
				if err != nil {
					t.Fatalf("trace %s (the replica saw %s) is not in Jaeger after 30 s: %v", s.traceID, s.seen, err)
				}
				t.Fatalf("trace %s has %d spans after 30 s; want 7:\n%s", s.traceID, len(tr.Spans), describeTrace(tr))
			}
			time.Sleep(200 * time.Millisecond)
		}
		checkTrace(t, tr, s.parent, s.seen, n1, n2, s.backend)
		backends[s.backend] = true
	}
	if len(backends) != 2 {
		t.Errorf("9 requests split 50/50 all went to %v; want both backends in the traces", backends)
	}
	// The last traced request is in Jaeger, so the earlier untraced ones
	// would be by now, had they been sent.
	for _, id := range []string{unsampled, strings.Split(quietSeen, "-")[1]} {
		if tr, err := jaeger.Trace(ctx, id); err == nil {
			t.Errorf("an unsampled request's trace %s is in Jaeger: %d spans", id, len(tr.Spans))
		}
	}
}

// checkTrace checks one request's trace: parent is the client's span
// ("" if it sent none), seen the traceparent its replica got, n1 and n2
// the nodes' services, backend the backend that answered.
func checkTrace(t *testing.T, tr *devjaeger.Trace, parent, seen, n1, n2, backend string) {
	t.Helper()
	if len(tr.Spans) != 7 {
		t.Errorf("trace %s has %d spans; want 7 (the caller's: the request, its upstream try, its mirror; each inbound hop's: the request, its upstream try):\n%s", tr.TraceID, len(tr.Spans), describeTrace(tr))
		return
	}
	byID := map[string]devjaeger.Span{}
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
	}
	parentOf := func(s devjaeger.Span) string {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				return r.SpanID
			}
		}
		return ""
	}
	find := func(what, service, operation string, tags map[string]string) devjaeger.Span {
		t.Helper()
		for _, s := range tr.Spans {
			if tr.Processes[s.ProcessID].ServiceName != service || s.OperationName != operation {
				continue
			}
			ok := true
			for k, v := range tags {
				if got, _ := s.Tag(k); got != v {
					ok = false
				}
			}
			if ok {
				return s
			}
		}
		t.Fatalf("trace %s: no %s: a span %q of %s tagged %v:\n%s", tr.TraceID, what, operation, service, tags, describeTrace(tr))
		return devjaeger.Span{}
	}
	childOf := func(what string, s devjaeger.Span, want devjaeger.Span) {
		t.Helper()
		if parentOf(s) != want.SpanID {
			t.Errorf("trace %s: %s (%s %q) is the child of %q; want %q (%q)", tr.TraceID, what, s.SpanID, s.OperationName, parentOf(s), want.SpanID, want.OperationName)
		}
	}
	caller := find("caller's span", n1, "traced", map[string]string{wire.TagEndpoint: "traced", wire.TagSplit: "tv1=0.5,tv2=0.5", wire.TagNode: strings.TrimPrefix(n1, "servemesh-envoy-")})
	if parent != "" && parentOf(caller) != parent {
		t.Errorf("trace %s: the caller's span is the child of %q; want the client's %q", tr.TraceID, parentOf(caller), parent)
	}
	upstream := find("caller's upstream span", n1, "router "+backend+" egress", map[string]string{"upstream_cluster": backend})
	childOf("the caller's upstream span", upstream, caller)
	inbound := find("inbound hop's span", n2, "inbound "+backend, map[string]string{wire.TagBackend: backend})
	childOf("the inbound hop's span", inbound, upstream)
	toReplica := find("inbound hop's upstream span", n2, "router _inbound_"+backend+" egress", nil)
	childOf("the inbound hop's upstream span", toReplica, inbound)
	if !strings.Contains(seen, "-"+toReplica.SpanID+"-") {
		t.Errorf("trace %s: the replica saw traceparent %q; want its parent the inbound hop's upstream span %s", tr.TraceID, seen, toReplica.SpanID)
	}
	mirror := find("shadow's span", n1, "mirror", map[string]string{"upstream_cluster": "tsh"})
	childOf("the shadow's span", mirror, caller)
	shadowInbound := find("shadow's inbound span", n2, "inbound tsh", map[string]string{wire.TagBackend: "tsh", wire.TagShadowOf: "traced"})
	childOf("the shadow's inbound span", shadowInbound, mirror)
	childOf("the shadow's replica span", find("shadow's upstream span", n2, "router _inbound_tsh egress", nil), shadowInbound)
	if _, marked := inbound.Tag(wire.TagShadowOf); marked {
		t.Errorf("trace %s: the request's own inbound span is marked a shadow", tr.TraceID)
	}
}

func describeTrace(tr *devjaeger.Trace) string {
	var b strings.Builder
	for _, s := range tr.Spans {
		var tags []string
		for _, tg := range s.Tags {
			if strings.HasPrefix(tg.Key, "servemesh.") || tg.Key == "upstream_cluster" {
				tags = append(tags, fmt.Sprintf("%s=%v", tg.Key, tg.Value))
			}
		}
		slices.Sort(tags)
		fmt.Fprintf(&b, "  %s %q of %s, refs %v, %s\n", s.SpanID, s.OperationName, tr.Processes[s.ProcessID].ServiceName, s.References, strings.Join(tags, " "))
	}
	return b.String()
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
