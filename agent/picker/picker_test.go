package picker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/agent/picker/scoring"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// testPicker follows three ready replicas of backend llama (at most 2 in
// flight each), with time standing still unless the test moves it.
func testPicker(t *testing.T, la *meshspec.LoadAware) (*Picker, *time.Time) {
	t.Helper()
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "llama", Config: meshspec.BackendConfig{MaxConcurrentQueries: 2, LoadAware: la}}}}
	view := nodeview.New(m, "n1")
	p := New(func() *nodeview.View { return view })
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	for i, tag := range []string{"llama#000001", "llama#000002", "llama#000003"} {
		p.Track(tag, "llama", fmt.Sprintf("127.0.0.1:900%d", i+1))
		p.SetReady(tag, true)
	}
	return p, &now
}

// TestPickerPrefersTheFastAndIdle: the picker sends a request to the
// replica expected to answer first (time to first byte times pending
// requests plus one), so a replica three times slower gets a request only
// once the others have three times its queue.
func TestPickerPrefersTheFastAndIdle(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	p.mu.Lock()
	p.replicas["llama#000001"].TTFB = 300 * time.Millisecond
	p.replicas["llama#000002"].TTFB = 100 * time.Millisecond
	p.replicas["llama#000003"].TTFB = 100 * time.Millisecond
	p.mu.Unlock()
	var got []string
	for range 4 {
		c := pickNow(t, p, request{})
		got = append(got, c.replica.addr)
	}
	want := []string{"127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9002", "127.0.0.1:9003"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("picked %v, want %v: the slow replica costs 0.3 s idle, the fast 0.2 s with one in flight", got, want)
	}
	// Both fast replicas now have 2 in flight: saturated
	// (max_concurrent_queries 2); the slow idle one is the only free one.
	if c := pickNow(t, p, request{priority: -1}); c.replica == nil || c.replica.addr != "127.0.0.1:9001" {
		t.Errorf("picked %+v, want the only replica not saturated", c)
	}
}

// TestPickerShedsSheddableRequestsOnlyWhenAllAreSaturated: with every
// replica at max_concurrent_queries, a sheddable request is shed and a
// critical one waits, for the first replica that frees.
func TestPickerShedsSheddableRequestsOnlyWhenAllAreSaturated(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	for range 5 {
		if c := pickNow(t, p, request{priority: -1}); c.shed || c.replica == nil {
			t.Fatalf("shed %+v before the replicas were saturated", c)
		}
	}
	last := pickNow(t, p, request{priority: -1})
	if last.replica == nil {
		t.Fatal("the sixth request found no room: 3 replicas × 2")
	}
	if c := pickNow(t, p, request{priority: -1}); !c.shed {
		t.Errorf("a sheddable request with every replica saturated got %+v, want shed", c)
	}
	c, w := p.pick("llama", request{})
	if w == nil {
		t.Fatalf("a critical request got %+v at once, want it to wait", c)
	}
	p.done(last, 10*time.Millisecond, http.StatusOK)
	if c := p.wait(context.Background(), w, time.Second); c.replica != last.replica {
		t.Fatalf("the waiting critical request got %+v once a replica freed, want that one", c)
	}
	p.done(last, 10*time.Millisecond, http.StatusOK)
	if c := pickNow(t, p, request{priority: -1}); c.shed || c.replica != last.replica {
		t.Errorf("after one answer, a sheddable request got %+v, want the replica with room", c)
	}
}

// TestPickerReadsTheServersLoad: with a metrics path, a replica whose
// server reports a full queue or KV cache is saturated, and one with a
// long queue costs more, though the node has nothing in flight to it. The
// KV cache is read by vLLM's current gauge name, or by the one it
// deprecated where a server exports only that (9002's).
func TestPickerReadsTheServersLoad(t *testing.T) {
	metrics := map[string]string{
		"127.0.0.1:9001": "vllm:num_requests_waiting{model_name=\"a\"} 7\nvllm:kv_cache_usage_perc{model_name=\"a\"} 0.2\n",
		"127.0.0.1:9002": "vllm:num_requests_waiting{model_name=\"a\"} 0\nvllm:gpu_cache_usage_perc{model_name=\"a\"} 0.99\n",
		"127.0.0.1:9003": "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"a\"} 2\nvllm:num_requests_waiting{model_name=\"b\"} 1\n",
	}
	la := &meshspec.LoadAware{MetricsPath: "/metrics", QueueMetric: "vllm:num_requests_waiting", KVCacheMetric: meshspec.VLLMKVCacheMetric, QueueLimit: 5}
	p, now := testPicker(t, la)
	for addr, text := range metrics {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(text)) }))
		t.Cleanup(srv.Close)
		load, err := readServerLoad(context.Background(), scrapeTarget{url: srv.URL + "/metrics", queue: la.QueueMetric, kvCache: la.KVCacheMetric})
		if err != nil {
			t.Fatal(err)
		}
		load.At = *now
		p.mu.Lock()
		for _, r := range p.replicas {
			if r.addr == addr {
				r.Server = load.Server
			}
		}
		p.mu.Unlock()
	}
	if got := p.replicas["llama#000003"].Server.Waiting; got != 3 {
		t.Errorf("waiting %v, want 3: a gauge's series summed", got)
	}
	c := pickNow(t, p, request{priority: -1})
	if c.replica == nil || c.replica.addr != "127.0.0.1:9003" {
		t.Fatalf("picked %+v, want 9003: 9001's queue is at its limit (7 ≥ 5), 9002's KV cache past 0.95", c)
	}
	*now = now.Add(scoring.Stale)
	if !strings.Contains(p.Report("llama"), "named_metrics.waiting=0,") {
		t.Errorf("stale figures still count: %s", p.Report("llama"))
	}
}

// TestPickerReportsTheNodesCapacity: the load report's rps over
// utilization is the node's weighted capacity: replicas ×
// max_concurrent_queries over their time to first byte, squared.
func TestPickerReportsTheNodesCapacity(t *testing.T) {
	p, now := testPicker(t, &meshspec.LoadAware{})
	for range 40 {
		c := pickNow(t, p, request{})
		*now = now.Add(50 * time.Millisecond)
		p.done(c, 100*time.Millisecond, http.StatusOK)
	}
	report := p.Report("llama")
	var util, rps float64
	var inFlight int
	if _, err := fmt.Sscanf(report, "TEXT application_utilization=%g,rps_fractional=%g,named_metrics.in_flight=%d", &util, &rps, &inFlight); err != nil {
		t.Fatalf("%q: %v", report, err)
	}
	if capacity := rps / util; capacity < 599 || capacity > 601 {
		t.Errorf("capacity %v (report %q), want 600: 3 replicas × 2 at a time / (0.1 s)²", capacity, report)
	}
	if rps < 19 || rps > 21 || inFlight != 0 {
		t.Errorf("rps %v in flight %d, want 20 (one answer every 50 ms) and 0", rps, inFlight)
	}
	// Every replica saturated (2 in flight each): a tenth of the capacity.
	for range 6 {
		pickNow(t, p, request{})
	}
	if _, err := fmt.Sscanf(p.Report("llama"), "TEXT application_utilization=%g,rps_fractional=%g", &util, &rps); err != nil {
		t.Fatal(err)
	}
	if capacity := rps / util; capacity < 59 || capacity > 61 {
		t.Errorf("saturated, capacity %v, want 60: a tenth", capacity)
	}
}

// TestAFastReplicaCannotTakeTheMesh: a replica controls its time to first
// byte; answering at once used to grow its node's weight quadratically
// without bound (issue 34). Now it counts for at most ten times a replica
// answering in 10 ms, and slower ones are still discounted by the square.
func TestAFastReplicaCannotTakeTheMesh(t *testing.T) {
	capacity := func(ttfb time.Duration) float64 {
		p, now := testPicker(t, &meshspec.LoadAware{})
		for range 40 {
			c := pickNow(t, p, request{})
			*now = now.Add(50 * time.Millisecond)
			p.done(c, ttfb, http.StatusOK)
		}
		var util, rps float64
		if _, err := fmt.Sscanf(p.Report("llama"), "TEXT application_utilization=%g,rps_fractional=%g", &util, &rps); err != nil {
			t.Fatal(err)
		}
		return rps / util
	}
	instant, tenMs, twentyMs, sixtyMs := capacity(time.Microsecond), capacity(10*time.Millisecond), capacity(20*time.Millisecond), capacity(60*time.Millisecond)
	if r := instant / tenMs; r > 10.01 {
		t.Errorf("a replica answering in 1 µs counts %.0f times one answering in 10 ms; want at most 10", r)
	}
	if r := twentyMs / sixtyMs; r < 8.9 || r > 9.1 {
		t.Errorf("a replica three times slower counts %.2f times less; want 9 (the square)", r)
	}
}

// TestPickerSendsAPromptToTheReplicaHoldingItsPrefix: requests that share
// a long prompt prefix go to the replica that served it, while its
// requests pending stay under four times the others' (scoring.PrefixWeight);
// two prefixes settle on two replicas; a prompt-less request is picked by
// load alone.
func TestPickerSendsAPromptToTheReplicaHoldingItsPrefix(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	p.mu.Lock()
	for _, r := range p.replicas {
		r.TTFB = 100 * time.Millisecond
	}
	p.mu.Unlock()
	prompt := func(system, user string) []uint64 {
		return prefix.Blocks([]byte(`{"messages":[{"role":"system","content":"`+strings.Repeat(system, 40*prefix.BlockBytes)+`"},{"role":"user","content":"`+user+`"}]}`), prefix.BlockBytes)
	}
	first := pickNow(t, p, request{blocks: prompt("a", "hello")})
	p.done(first, 100*time.Millisecond, http.StatusOK)
	second := pickNow(t, p, request{blocks: prompt("a", "another question")})
	if second.replica != first.replica {
		t.Fatalf("the second request with the same system prompt went to %s, the first to %s", second.replica.tag, first.replica.tag)
	}
	other := pickNow(t, p, request{blocks: prompt("b", "hello")})
	if other.replica == first.replica {
		t.Fatalf("a request of another prefix went to the busy replica %s holding a prefix it does not share", other.replica.tag)
	}
	third := pickNow(t, p, request{blocks: prompt("b", "more")})
	if third.replica != other.replica {
		t.Fatalf("the second request of prefix b went to %s, not %s which holds it", third.replica.tag, other.replica.tag)
	}
	if none := pickNow(t, p, request{}); none.replica == first.replica || none.replica == other.replica {
		t.Fatalf("a request with no prompt went to %s, which has requests in flight, while llama#000003 is idle", none.replica.tag)
	}
}

// TestPickerNamesAPromptsPrefixForTheCallingNode: asked by an outbound
// listener (PickerPromptHeader), the picker passes the headers and sets,
// on the body, the header the route hashes to pick the node: the same
// for two prompts that share their first AffinityBlocks blocks, none for
// a prompt shorter than that.
func TestPickerNamesAPromptsPrefixForTheCallingNode(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	client, ctx := pickerClient(t, p)
	ask := func(body string) string {
		t.Helper()
		for _, resp := range askPrompt(ctx, t, client, &extproc.HttpHeaders{}, body) {
			if resp.GetDynamicMetadata() != nil {
				t.Fatalf("the calling node's picker picked a replica: %v", resp)
			}
			for _, h := range resp.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == wire.PromptAffinityHeader {
					return string(h.GetHeader().GetRawValue())
				}
			}
		}
		return ""
	}
	system := strings.Repeat("You are a helpful assistant. ", 20)
	a := ask(`{"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"one"}]}`)
	b := ask(`{"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"two"}]}`)
	c := ask(`{"messages":[{"role":"system","content":"` + strings.Repeat("Answer in French. ", 30) + `"}]}`)
	if a == "" || a != b || c == "" || c == a {
		t.Fatalf("prefixes %q, %q and %q: want the first two the same, the third another", a, b, c)
	}
	if short := ask(`{"prompt":"hi"}`); short != "" {
		t.Fatalf("a short prompt got prefix %q, want none", short)
	}
}

// TestPickerKeepsAConversationOnItsReplica: the requests of one
// conversation go to the replica that served it while that one is ready
// and not saturated, even when another is idler; then to another, which
// keeps it from then on.
func TestPickerKeepsAConversationOnItsReplica(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{SessionHeader: "x-session-id"})
	first := pickNow(t, p, request{session: "chat-1"})
	second := pickNow(t, p, request{session: "chat-1"}) // one in flight there, the others idle
	if second.replica != first.replica {
		t.Fatalf("the conversation's second request went to %s, its first to %s", second.replica.tag, first.replica.tag)
	}
	third := pickNow(t, p, request{session: "chat-1"}) // saturated now (2 in flight): another
	if third.replica == first.replica {
		t.Fatalf("the conversation stayed on %s, saturated", first.replica.tag)
	}
	p.done(first, 10*time.Millisecond, http.StatusOK)
	p.done(first, 10*time.Millisecond, http.StatusOK)
	if fourth := pickNow(t, p, request{session: "chat-1"}); fourth.replica != third.replica {
		t.Fatalf("after moving to %s the conversation went to %s", third.replica.tag, fourth.replica.tag)
	}
	if other := pickNow(t, p, request{session: "chat-2"}); other.replica == nil {
		t.Fatal("another conversation got no replica")
	}
}

// TestPickerSendsAModelWhereItIsLoaded: for a backend whose replicas load
// models on demand (max_models_per_replica 1), each model's requests go
// to the replica the picker sent it to, so it stays loaded; a new model
// goes to a replica with room, not one whose model it would drop.
func TestPickerSendsAModelWhereItIsLoaded(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{MaxModelsPerReplica: 1})
	a := pickNow(t, p, request{model: "a"})
	p.done(a, 10*time.Millisecond, http.StatusOK)
	b := pickNow(t, p, request{model: "b"})
	p.done(b, 10*time.Millisecond, http.StatusOK)
	if b.replica == a.replica {
		t.Fatalf("model b went to %s, which holds a, while two replicas had room", b.replica.tag)
	}
	for range 3 {
		if again := pickNow(t, p, request{model: "a"}); again.replica != a.replica {
			t.Fatalf("model a went to %s, not %s which has it loaded", again.replica.tag, a.replica.tag)
		} else {
			p.done(again, 10*time.Millisecond, http.StatusOK)
		}
	}
	if got := bodyModel([]byte(`{"model":"m-1","prompt":"x"}`)); got != "m-1" {
		t.Fatalf("body model %q", got)
	}
}

// TestPickerKeepsAModelWhereItsLoadWasSlow: the answer that waited for
// its replica to load its model does not make that replica look slow (its
// time to first byte is the load's, which ModelMiss prices already), so
// the model's next requests stay where it is loaded rather than go to a
// replica that must drop another model for it, and back: on a real engine
// whose load took 40 times an answer, each request loaded a model.
func TestPickerKeepsAModelWhereItsLoadWasSlow(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{MaxModelsPerReplica: 1})
	a := pickNow(t, p, request{model: "a"})
	p.done(a, 50*time.Millisecond, http.StatusOK)
	b := pickNow(t, p, request{model: "b"})
	p.done(b, 2*time.Second, http.StatusOK) // b loaded first
	alternateModels(t, p, a, b, 50*time.Millisecond)
}

// alternateModels asks for models a and b in turn, four times, each
// answered after ttfb: each must go to the replica that took it first (a,
// b).
func alternateModels(t *testing.T, p *Picker, a, b choice, ttfb time.Duration) {
	t.Helper()
	for i := range 4 {
		model, want := []string{"a", "b"}[i%2], []choice{a, b}[i%2]
		again := pickNow(t, p, request{model: model})
		if again.replica != want.replica {
			t.Fatalf("request %d, model %s: went to %s, not %s which holds it", i, model, again.replica.tag, want.replica.tag)
		}
		p.done(again, ttfb, http.StatusOK)
	}
}

// TestAModelKeepsItsReplicaThoughAnotherLooksFaster: a replica's time to
// first byte swings with its engine's other work and the machine's, so a
// replica holding the request's model takes it while its requests pending
// stay within HomeLoad times the cheapest's (as a prompt's home does),
// whatever the times say: on a real engine under load, one slow answer
// (a smoothed 207 ms against another replica's 20 ms) outweighed a model
// load, and the models changed replicas twice, each move a load.
func TestAModelKeepsItsReplicaThoughAnotherLooksFaster(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{MaxModelsPerReplica: 1})
	a := pickNow(t, p, request{model: "a"})
	p.done(a, 20*time.Millisecond, http.StatusOK)
	b := pickNow(t, p, request{model: "b"})
	p.done(b, 20*time.Millisecond, http.StatusOK)
	p.mu.Lock()
	a.replica.TTFB, b.replica.TTFB = 207*time.Millisecond, 20*time.Millisecond
	p.mu.Unlock()
	alternateModels(t, p, a, b, 20*time.Millisecond)
	// With a request in flight, the holder still takes the next (its
	// pending plus one within HomeLoad times an idle replica's).
	busy := []choice{pickNow(t, p, request{model: "a"}), pickNow(t, p, request{model: "a"})}
	if busy[1].replica != a.replica {
		t.Fatalf("the second request in flight for a went to %s, not its holder %s", busy[1].replica.tag, a.replica.tag)
	}
}

// TestPickerDoesNotFavourAReplicaThatFailsFast: a replica whose server
// answers 5xx at once (an engine out of memory slots, a broken model)
// would look the fastest by its time to first byte and take ever more
// requests, the black hole a load balancer by latency falls into. Its
// failures count as slow answers instead, and a prompt's home that keeps
// failing gives the prompt up; once it answers again it wins its share
// back.
func TestPickerDoesNotFavourAReplicaThatFailsFast(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	failing := "127.0.0.1:9001"
	served := map[string]int{}
	for range 30 {
		c := pickNow(t, p, request{})
		served[c.replica.addr]++
		if c.replica.addr == failing {
			p.done(c, time.Millisecond, http.StatusServiceUnavailable)
		} else {
			p.done(c, 100*time.Millisecond, http.StatusOK)
		}
	}
	if served[failing] > 3 {
		t.Fatalf("a replica failing at once got %d of 30 requests (%v); want few: failures are not fast answers", served[failing], served)
	}
	// A long prompt's home fails twice in a row: its next request goes
	// elsewhere, and stays there.
	p, _ = testPicker(t, &meshspec.LoadAware{})
	blocks := prefix.Blocks([]byte(strings.Repeat("a system prompt shared by many requests. ", 40)), prefix.BlockBytes)
	home := pickNow(t, p, request{blocks: blocks})
	p.done(home, time.Millisecond, http.StatusInternalServerError)
	again := pickNow(t, p, request{blocks: blocks})
	if again.replica != home.replica {
		t.Fatalf("after one failure the prompt left its home %s for %s; want it kept (one failure is chance)", home.replica.tag, again.replica.tag)
	}
	p.done(again, time.Millisecond, http.StatusInternalServerError)
	moved := pickNow(t, p, request{blocks: blocks})
	if moved.replica == home.replica {
		t.Fatalf("the prompt stayed on %s after two failures in a row", home.replica.tag)
	}
	p.done(moved, 100*time.Millisecond, http.StatusOK)
}

// pickNow is the picker's choice for req to backend llama, which must not
// wait.
func pickNow(t *testing.T, p *Picker, req request) choice {
	t.Helper()
	c, w := p.pick("llama", req)
	if w != nil {
		t.Fatalf("request %+v waits, want a choice at once", req)
	}
	return c
}

// TestPickerLearnsLoadedModelsFromTheServer: a replica whose server names
// a model among its adapters (vLLM's lora_requests_info; here the
// stand-in's) gets that model's requests, though the picker never sent it
// one.
func TestPickerLearnsLoadedModelsFromTheServer(t *testing.T) {
	server := &demoreplica.ModelServer{Backend: "llama", Slots: 1, ModelsPerReplica: 2}
	srv := httptest.NewServer(server)
	t.Cleanup(srv.Close)
	for _, model := range []string{"a", "b"} { // loaded from outside the picker's view
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"`+model+`","prompt":"hi"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	la := &meshspec.LoadAware{MetricsPath: "/metrics", MaxModelsPerReplica: 2}
	p, now := testPicker(t, la)
	*now = time.Now()
	p.Track("llama#000004", "llama", strings.TrimPrefix(srv.URL, "http://"))
	p.SetReady("llama#000004", true)
	p.scrapeOnce(context.Background())
	for _, model := range []string{"b", "a"} {
		if c := pickNow(t, p, request{model: model}); c.replica == nil || c.replica.tag != "llama#000004" {
			t.Errorf("model %s went to %+v, want the replica whose server has it loaded", model, c.replica)
		}
	}
	if c := pickNow(t, p, request{model: "z"}); c.replica == nil || c.replica.tag == "llama#000004" {
		t.Errorf("model z went to %+v, want a replica with room for it", c.replica)
	}
}

// TestPickerSpreadsNewPrompts: prompts no replica holds go to their
// places among the replicas, as many on each (placement.Table), not all
// to the cheapest: nine prompts over three idle replicas, three each.
func TestPickerSpreadsNewPrompts(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	got := map[string]int{}
	for i := range 9 {
		blocks := prefix.Blocks([]byte(strings.Repeat(fmt.Sprintf("tenant %d. ", i), 8*prefix.BlockBytes)), prefix.BlockBytes)
		c := pickNow(t, p, request{blocks: blocks})
		p.done(c, 50*time.Millisecond, http.StatusOK)
		got[c.replica.tag]++
	}
	if len(got) != 3 || got["llama#000001"] != 3 || got["llama#000002"] != 3 {
		t.Fatalf("nine new prompts by replica: %v, want three on each", got)
	}
}

// TestPickerPlacesPromptsOnNodes: asked by an outbound listener whose
// route lists its backend's nodes (wire.AffinityRouteHeader), the picker
// names a node for each request in dynamic metadata (PromptNodeKey):
// twelve prompts, each seen a few times, six on each of two nodes, each
// prompt on one; a request naming its conversation (the route's header)
// keeps one node whatever its prompt.
func TestPickerPlacesPromptsOnNodes(t *testing.T) {
	p, now := testPicker(t, &meshspec.LoadAware{})
	client, ctx := pickerClient(t, p)
	route, err := wire.AffinityRoute{Headers: []string{"x-session-id"}, Backends: []wire.AffinityBackend{{Name: "llama", Nodes: []wire.AffinityNode{
		{Inbound: "10.0.0.1:21000", Replicas: 2}, {Inbound: "10.0.0.2:21000", Replicas: 2}}}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ask := func(session, body string) string {
		t.Helper()
		headers := &extproc.HttpHeaders{Headers: &core.HeaderMap{}}
		if session != "" {
			headers.Headers.Headers = []*core.HeaderValue{{Key: "x-session-id", RawValue: []byte(session)}}
		}
		node := ""
		for _, resp := range askPrompt(ctx, t, client, headers, body, wire.AffinityRouteHeader, route) {
			if v := resp.GetDynamicMetadata().GetFields()[wire.PickerNamespace].GetStructValue().GetFields()[wire.PromptNodeKey]; v != nil {
				node = v.GetStringValue()
			}
		}
		return node
	}
	prompt := func(tenant, question int) string {
		return fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, strings.Repeat(fmt.Sprintf("Tenant %d answers. ", tenant), 20), question)
	}
	var nodes map[int]string
	for round := range 3 {
		nodes = map[int]string{}
		for tenant := range 12 {
			nodes[tenant] = ask("", prompt(tenant, round))
			*now = now.Add(time.Second) // one a second: none spills
		}
	}
	count := map[string]int{}
	for _, n := range nodes {
		count[n]++
	}
	if count["10.0.0.1:21000"] != 6 || count["10.0.0.2:21000"] != 6 {
		t.Fatalf("twelve prompts' nodes %v, want six on each", count)
	}
	first := ask("conversation-1", prompt(0, 0))
	for i := range 5 {
		*now = now.Add(time.Second)
		if got := ask("conversation-1", prompt(100+i, i)); got != first || got == "" {
			t.Fatalf("turn %d of a conversation went to %q, its first to %q", i, got, first)
		}
	}
}

// TestAPromptKeepsItsHomeThoughItWasSlowFirst: a prompt's first request,
// a full prefill, makes its replica's time to first byte ten times the
// others'; its next requests still go there (its home), the replicas'
// requests pending deciding (scoring.KeepsHome, tested there), not their
// times; a saturated home takes none.
func TestAPromptKeepsItsHomeThoughItWasSlowFirst(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	p.mu.Lock()
	for _, r := range p.replicas {
		r.TTFB = 5 * time.Millisecond
	}
	p.mu.Unlock()
	blocks := prefix.Blocks([]byte(strings.Repeat("a long system prompt. ", 4*prefix.BlockBytes)), prefix.BlockBytes)
	first := pickNow(t, p, request{blocks: blocks})
	p.done(first, 50*time.Millisecond, http.StatusOK)
	for i := range 3 {
		c := pickNow(t, p, request{blocks: blocks})
		if c.replica != first.replica {
			t.Fatalf("request %d of the prompt went to %s, not its home %s (slower by its first, cold, request)", i, c.replica.tag, first.replica.tag)
		}
		p.done(c, 5*time.Millisecond, http.StatusOK)
	}
	// Two in flight at home (max_concurrent_queries 2: saturated): the
	// next goes elsewhere.
	pickNow(t, p, request{blocks: blocks})
	pickNow(t, p, request{blocks: blocks})
	if c := pickNow(t, p, request{blocks: blocks}); c.replica == first.replica {
		t.Fatalf("a saturated home took the prompt's request")
	}
}

// TestScorerNamesAreTheStatesNames: load_aware.weights is validated
// against meshspec.ScorerNames, which must name the pipeline's scorers.
func TestScorerNamesAreTheStatesNames(t *testing.T) {
	if got, want := scoring.ScorerNames(), meshspec.ScorerNames; !slices.Equal(got, want) {
		t.Fatalf("the pipeline's scorers %v, the state's names %v", got, want)
	}
}
