//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/dev/devjaeger"
	"github.com/servemesh/servemesh/envoy"
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
	t.Parallel()
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
	// A connection keeps the listener it was accepted by: one n1 opened to
	// n2's inbound listener before n2 had the tracer would carry untraced
	// hops for as long as it lives. So nothing crosses before both have it.
	waitListenersTraced(t, mesh.n1.agentProc, mesh.n2.agentProc)
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
	// Until n1's Envoy has a healthy replica of each backend, a request
	// may be held by its activator first: a trace with more spans.
	testutil.WaitFor(t, 30*time.Second, "n1 to see a healthy replica of tv1, tv2 and tsh", func() bool {
		for _, b := range []string{"tv1", "tv2", "tsh"} {
			if v, ok := readEnvoyStat(mesh.n1.admin, "cluster."+b+".membership_healthy"); !ok || v != 1 {
				return false
			}
		}
		return true
	})

	type sent struct{ traceID, parent, backend, seen string }
	// At least 8, and until both backends of the 50/50 split took one:
	// 9 requests all went to one in 1 run of 256 (make race).
	var traced []sent
	took := map[string]bool{}
	for len(traced) < 8 || len(took) < 2 && len(traced) < 64 {
		id, parent := randomHex(t, 16), randomHex(t, 8)
		status, backend, seen := send("/traced", "00-"+id+"-"+parent+"-01")
		if status != http.StatusOK || !strings.HasPrefix(seen, "00-"+id+"-") || !strings.HasSuffix(seen, "-01") {
			t.Fatalf("a traced request: %d, the replica saw traceparent %q; want 200 and trace %s, sampled", status, seen, id)
		}
		traced = append(traced, sent{id, parent, backend, seen})
		took[backend] = true
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
		t.Errorf("%d requests split 50/50 all went to %v; want both backends in the traces", len(traced), backends)
	}
	// The last traced request is in Jaeger, so the earlier untraced ones
	// would be by now, had they been sent.
	for _, id := range []string{unsampled, strings.Split(quietSeen, "-")[1]} {
		if tr, err := jaeger.Trace(ctx, id); err == nil {
			t.Errorf("an unsampled request's trace %s is in Jaeger: %d spans", id, len(tr.Spans))
		}
	}
	t.Run("an endpoint sampling 1% traces about 1% of its requests", func(t *testing.T) { checkSampledShare(t, mesh, env, send) })
	t.Run("the controller traces its operations", func(t *testing.T) { checkControllerSpans(t, jaeger) })
	t.Run("the agents' picker and activator add their spans", func(t *testing.T) { checkAgentSpans(t, mesh, jaeger, send) })
	t.Run("a request of model traffic carries its gen_ai attributes", func(t *testing.T) { checkGenAISpans(t, mesh, jaeger) })
}

// checkSampledShare: of 2,000 requests without a trace context to an
// endpoint sampling 1%, Envoy starts a sampled trace for about 20 (the
// replica sees -01 in their traceparent), not for all of them: Envoy's
// route-level sampling is drawn in steps of 0.01%, so a share written in
// millionths was read a hundred times too large. 1 to 60 of 2,000 fails
// by chance about once in a billion.
func checkSampledShare(t *testing.T, mesh *twoNodeMesh, env []string, send func(path, traceparent string) (int, string, string)) {
	if code, out, errOut := cli(t, env, "endpoint", "create", "sparse", "--route", "/sparse", "--backend", "tv1", "--trace-sampling", "1"); code != 0 {
		t.Fatalf("endpoint create sparse: exit %d, %s %s", code, out, errOut)
	}
	testutil.WaitFor(t, 60*time.Second, "/sparse to answer on n1", func() bool { s, _, _ := send("/sparse", ""); return s == http.StatusOK })
	const n = 2000
	sampled := 0
	for range n {
		status, _, seen := send("/sparse", "")
		if status != http.StatusOK {
			t.Fatalf("a request to /sparse: %d", status)
		}
		if strings.HasSuffix(seen, "-01") {
			sampled++
		}
	}
	t.Logf("/sparse at 1%%: %d of %d requests sampled", sampled, n)
	if sampled < 1 || sampled > 60 {
		t.Errorf("/sparse at 1%%: %d of %d requests sampled; want about 20 (1 to 60)", sampled, n)
	}
}

// checkControllerSpans: the CLI's endpoint create (sent after the mesh's
// tracing was set, at 100%) is a trace of the controller's: the API call's
// span, its operation's under it, the checkpoint's under that with the
// revision it wrote.
func checkControllerSpans(t *testing.T, jaeger *devjaeger.Server) {
	var found []devjaeger.Trace
	testutil.WaitFor(t, 30*time.Second, "the controller's span of create_endpoint in Jaeger", func() bool {
		found, _ = jaeger.Find(t.Context(), wire.ControllerTraceService, "operation create_endpoint")
		return len(found) > 0
	})
	tr := &found[0]
	op := spanNamed(t, tr, "operation create_endpoint")
	call, ok := spanByID(tr, parentOf(op))
	if !ok || !strings.Contains(call.OperationName, "/v1/endpoints") {
		t.Fatalf("the operation's span is the child of %q; want the API call's span (its route, /v1/endpoints...):\n%s", call.OperationName, describeTrace(tr))
	}
	if kind, _ := call.Tag("span.kind"); kind != "server" {
		t.Errorf("the API call's span %q is of kind %q; want server", call.OperationName, kind)
	}
	checkpoint := spanNamed(t, tr, "checkpoint")
	if parentOf(checkpoint) != op.SpanID {
		t.Errorf("the checkpoint's span is the child of %s; want the operation's %s:\n%s", parentOf(checkpoint), op.SpanID, describeTrace(tr))
	}
	if rev, _ := checkpoint.Tag(wire.TagRevision); rev == "" || rev == "0" {
		t.Errorf("the checkpoint's span names revision %q; want the one it wrote", rev)
	}
	t.Logf("the controller's trace: %s > %s > checkpoint", call.OperationName, op.OperationName)
}

// checkAgentSpans: a request to a load-aware backend has the picker's span
// in its trace (the replica picked, why, and the request's pass through the
// picker's pipeline, its scorers weighed as the backend says), the child
// of the Envoy's; a
// request sent before its new backend's replica is ready has the
// activator's (released, and how long it was held).
func checkAgentSpans(t *testing.T, mesh *twoNodeMesh, jaeger *devjaeger.Server, send func(path, traceparent string) (int, string, string)) {
	mesh.createBackends(t, meshspec.Backend{Name: "tla", Process: demoProcess("tla", false),
		Config: meshspec.BackendConfig{NumReplicas: 1, LoadAware: &meshspec.LoadAware{Weights: map[string]float64{"prefix": 2}}}})
	if _, err := mesh.c.CreateEndpoint(t.Context(), meshspec.Endpoint{Name: "picked", Route: "/picked", Traffic: map[string]float64{"tla": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, "/picked to answer on n1", func() bool { s, _, _ := send("/picked", ""); return s == http.StatusOK })
	id := randomHex(t, 16)
	if status, _, _ := send("/picked", "00-"+id+"-"+randomHex(t, 8)+"-01"); status != http.StatusOK {
		t.Fatalf("a traced request to the load-aware backend: %d", status)
	}
	pick := agentSpan(t, jaeger, id, "pick tla")
	if outcome, _ := pick.span.Tag(wire.TagOutcome); outcome != "picked" {
		t.Errorf("the picker's span says outcome %q; want picked", outcome)
	}
	replica, _ := pick.span.Tag(wire.TagReplica)
	why, _ := pick.span.Tag(wire.TagWhy)
	if replica == "" || why == "" {
		t.Errorf("the picker's span names replica %q, why %q; want both", replica, why)
	}
	// The request's one pass through the picker's pipeline, step by step.
	if pass, _ := pick.span.Tag(wire.TagPickPass); pass != "ready 1 > free 1 > picked 0 (free)" {
		t.Errorf("the picker's span records the pass %q; want %q", pass, "ready 1 > free 1 > picked 0 (free)")
	}
	t.Logf("the picker's span: replica %s, why %q, under %q", replica, why, pick.parent)

	mesh.createBackends(t, meshspec.Backend{Name: "tfresh", Config: meshspec.BackendConfig{NumReplicas: 1}, Process: slowDemoProcess("tfresh")})
	if _, err := mesh.c.CreateEndpoint(t.Context(), meshspec.Endpoint{Name: "tfresh", Route: "/tfresh", Traffic: map[string]float64{"tfresh": 1}}); err != nil {
		t.Fatal(err)
	}
	id = randomHex(t, 16)
	testutil.WaitFor(t, 30*time.Second, "a request sent before tfresh's replica is ready to be held and answered", func() bool {
		s, _, _ := send("/tfresh", "00-"+id+"-"+randomHex(t, 8)+"-01")
		return s == http.StatusOK
	})
	hold := agentSpan(t, jaeger, id, "hold tfresh")
	if outcome, _ := hold.span.Tag(wire.TagOutcome); outcome != "released" {
		t.Errorf("the activator's span says outcome %q; want released", outcome)
	}
	held, _ := hold.span.Tag(wire.TagHeldMS)
	if held == "" || held == "0" {
		t.Errorf("the activator's span says held %q ms; want how long", held)
	}
	t.Logf("the activator's span: held %s ms, under %q", held, hold.parent)
}

// agentFound is an agent's span and the name of its parent, an Envoy's.
type agentFound struct {
	span   devjaeger.Span
	parent string
}

// agentSpan is the span named name in trace id, sent by an agent, whose
// parent is a span of a node's Envoy in the same trace.
func agentSpan(t *testing.T, jaeger *devjaeger.Server, id, name string) (found agentFound) {
	t.Helper()
	var tr *devjaeger.Trace
	deadline := time.Now().Add(30 * time.Second)
	for { // the Envoys send their spans in batches, every few seconds
		var err error
		if tr, err = jaeger.Trace(t.Context(), id); err == nil {
			if i := slices.IndexFunc(tr.Spans, func(s devjaeger.Span) bool { return s.OperationName == name }); i >= 0 {
				if _, ok := spanByID(tr, parentOf(tr.Spans[i])); ok {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			if tr == nil {
				t.Fatalf("trace %s is not in Jaeger after 30 s: %v", id, err)
			}
			break // the checks below say what is missing
		}
		time.Sleep(200 * time.Millisecond)
	}
	found.span = spanNamed(t, tr, name)
	if service := tr.Processes[found.span.ProcessID].ServiceName; !strings.HasPrefix(service, "servemesh-agent-") {
		t.Errorf("span %q is of service %q; want a node's agent", name, service)
	}
	parent, ok := spanByID(tr, parentOf(found.span))
	if !ok || !strings.HasPrefix(tr.Processes[parent.ProcessID].ServiceName, "servemesh-envoy-") {
		t.Fatalf("span %q's parent %q is not a span of a node's Envoy in its trace:\n%s", name, parentOf(found.span), describeTrace(tr))
	}
	found.parent = parent.OperationName
	return found
}

// checkGenAISpans: a chat request of model traffic (a load-aware
// backend of a stand-in model server, which states its usage) has, on the
// calling node's Envoy's span, the answer's model and tokens as
// OpenTelemetry's gen_ai.* attributes.
func checkGenAISpans(t *testing.T, mesh *twoNodeMesh, jaeger *devjaeger.Server) {
	mesh.createBackends(t, meshspec.Backend{Name: "tgen", Process: modelServer("tgen"),
		Config: meshspec.BackendConfig{NumReplicas: 1, LoadAware: &meshspec.LoadAware{}}})
	if _, err := mesh.c.CreateEndpoint(t.Context(), meshspec.Endpoint{Name: "gen", Route: "/gen", Methods: []string{"POST"},
		Traffic: map[string]float64{"tgen": 1}}); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"trace me"}],"max_tokens":7}`
	post := func(traceparent string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+mesh.n1.public+"/gen", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := httpClient().Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	testutil.WaitFor(t, 60*time.Second, "/gen to answer on n1", func() bool { return post("") == http.StatusOK })
	id := randomHex(t, 16)
	if status := post("00-" + id + "-" + randomHex(t, 8) + "-01"); status != http.StatusOK {
		t.Fatalf("a traced chat request: %d", status)
	}
	want := map[string]string{wire.TagGenAIModel: "m", wire.TagGenAIInputTokens: fmt.Sprint(demoreplica.PromptTokens([]byte(body))),
		wire.TagGenAIOutputTokens: "7"}
	var got map[string]string
	testutil.WaitFor(t, 30*time.Second, "the calling node's span of the chat request to carry its gen_ai attributes", func() bool {
		tr, err := jaeger.Trace(t.Context(), id)
		if err != nil {
			return false
		}
		for _, s := range tr.Spans {
			if v, ok := s.Tag(wire.TagGenAIModel); ok && v != "" {
				got = map[string]string{}
				for k := range want {
					got[k], _ = s.Tag(k)
				}
				return true
			}
		}
		return false
	})
	if !maps.Equal(got, want) {
		t.Errorf("the span's gen_ai attributes %v; want %v", got, want)
	}
}

// spanNamed is tr's first span named name.
func spanNamed(t *testing.T, tr *devjaeger.Trace, name string) devjaeger.Span {
	t.Helper()
	i := slices.IndexFunc(tr.Spans, func(s devjaeger.Span) bool { return s.OperationName == name })
	if i < 0 {
		t.Fatalf("trace %s has no span %q:\n%s", tr.TraceID, name, describeTrace(tr))
	}
	return tr.Spans[i]
}

func spanByID(tr *devjaeger.Trace, id string) (devjaeger.Span, bool) {
	i := slices.IndexFunc(tr.Spans, func(s devjaeger.Span) bool { return s.SpanID == id })
	if i < 0 {
		return devjaeger.Span{}, false
	}
	return tr.Spans[i], true
}

// parentOf is the span s is the child of ("" for a root).
func parentOf(s devjaeger.Span) string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
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
			if strings.HasPrefix(tg.Key, "servemesh.") || tg.Key == "upstream_cluster" || tg.Key == "span.kind" {
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

// TestSpansThatCannotBeSentAreAProblem: on the default mesh, with the
// mesh's collector an address nothing listens on, a node whose agent
// cannot send its spans (its picker's, for a load-aware backend with a
// replica there) is a problem in status naming the collector, and its
// node is marked in node describe; requests are served throughout.
func TestSpansThatCannotBeSentAreAProblem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nowhere := freeAddr(t) // nothing listens there
	mesh := startTwoNodeMeshWith(t, "trdown", nil, nil)
	mesh.createBackends(t, meshspec.Backend{Name: "trdown", Process: demoProcess("trdown", false),
		Config: meshspec.BackendConfig{NumReplicas: 2, LoadAware: &meshspec.LoadAware{}}})
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	if code, out, errOut := cli(t, env, "tracing", "set", "--collector", nowhere, "--sampling", "100"); code != 0 {
		t.Fatalf("tracing set: exit %d, %s %s", code, out, errOut)
	}
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "trdown", Route: "/trdown", Traffic: map[string]float64{"trdown": 1}}); err != nil {
		t.Fatal(err)
	}
	client := httpClient()
	get := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+mesh.n1.public+"/trdown", nil)
		if err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	var out string
	testutil.WaitFor(t, 90*time.Second, "status to name a node whose spans cannot be sent", func() bool {
		// Traced requests keep the pickers' spans coming.
		if resp, err := get(); err == nil {
			_ = resp.Body.Close()
		}
		_, out, _ = cli(t, env, "status")
		return strings.Contains(out, "its spans cannot be sent to the mesh's collector "+nowhere)
	})
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		if !strings.Contains(out, "node "+n.id+": its spans cannot be sent") {
			continue
		}
		if code, desc, errOut := cli(t, env, "node", "describe", n.id); code != 0 || !strings.Contains(desc, "its spans cannot be sent to the mesh's collector "+nowhere) {
			t.Errorf("node describe %s: exit %d, %s %s; want its spans' problem", n.id, code, desc, errOut)
		}
	}
	resp, err := get()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a request while spans cannot be sent: %v %v; want it served", resp, err)
	}
	_ = resp.Body.Close()
}

// waitListenersTraced waits until every listener each node's Envoy serves
// new connections with (its active ones) traces its requests.
func waitListenersTraced(t *testing.T, nodes ...*agentProc) {
	t.Helper()
	for _, n := range nodes {
		testutil.WaitFor(t, 30*time.Second, "every active listener of "+n.id+"'s Envoy to trace", func() bool {
			dump, err := envoy.Admin{Socket: n.admin}.Get(t.Context(), "/config_dump?resource=dynamic_listeners")
			if err != nil {
				return false
			}
			var listeners struct {
				Configs []struct {
					Name        string          `json:"name"`
					ActiveState json.RawMessage `json:"active_state"`
				} `json:"configs"`
			}
			if json.Unmarshal(dump, &listeners) != nil || len(listeners.Configs) == 0 {
				return false
			}
			active := 0
			for _, l := range listeners.Configs {
				if len(l.ActiveState) == 0 {
					continue
				}
				if active++; !strings.Contains(string(l.ActiveState), "envoy.tracers.opentelemetry") {
					return false
				}
			}
			return active > 0 // its public listener, at least
		})
	}
}
