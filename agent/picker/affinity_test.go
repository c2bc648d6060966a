package picker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/metadata"

	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestRewriteModel: the body's model becomes the name its draw falls on
// by weight; other fields keep their values, the prompt its bytes (no
// HTML escaping); a body that is not a JSON object naming its model in a
// string is left as it is.
func TestRewriteModel(t *testing.T) {
	rw := wire.ModelRewrite{Field: "model", Targets: []wire.RewriteTarget{{Name: "a-v1", Weight: 0.9}, {Name: "a-v2", Weight: 0.1}}}
	body := []byte(`{"model":"a","messages":[{"role":"user","content":"<b>hi</b> & more"}],"stream":true}`)
	for _, c := range []struct {
		draw float64
		want string
	}{{0, "a-v1"}, {0.89, "a-v1"}, {0.9, "a-v2"}, {0.999, "a-v2"}} {
		out, from, to, ok := rewriteModel(body, rw, c.draw)
		var got struct {
			Model    string          `json:"model"`
			Messages json.RawMessage `json:"messages"`
			Stream   bool            `json:"stream"`
		}
		if !ok || from != "a" || to != c.want || json.Unmarshal(out, &got) != nil || got.Model != c.want || !got.Stream ||
			string(got.Messages) != `[{"role":"user","content":"<b>hi</b> & more"}]` {
			t.Errorf("draw %v: %s (%q to %q, %v), want the model %s and the rest as it was", c.draw, out, from, to, ok, c.want)
		}
	}
	for _, bad := range []string{`not json`, `{"prompt":"hi"}`, `{"model":7}`, `["model"]`} {
		if out, _, _, ok := rewriteModel([]byte(bad), rw, 0); ok || string(out) != bad {
			t.Errorf("rewriteModel(%s) = %s, %v: want it left as it is", bad, out, ok)
		}
	}
}

// TestPickerRewritesAModel: asked by a model route with a rewrite, the
// calling node's picker rewrites the body's model, nine in ten to one name
// and one in ten to the other (over 2,000 requests, within 3 points),
// and counts each rewrite; it sets no affinity header (the route has no
// prompt affinity).
func TestPickerRewritesAModel(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	s := NewServer(p, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	client, ctx := pickerClientOf(t, s)
	rw, err := wire.ModelRewrite{Field: "model", Targets: []wire.RewriteTarget{{Name: "a-v1", Weight: 0.9}, {Name: "a-v2", Weight: 0.1}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	const n = 2000
	for range n {
		resp := askPrompt(ctx, t, client, &extproc.HttpHeaders{}, `{"model":"a","prompt":"a prompt long enough to have a prefix of its own, if the route asked for one, which it does not: `+
			`it only rewrites the model, nothing else, and sets no header"}`, wire.ModelRewriteHeader, rw)[1]
		common := resp.GetRequestBody().GetResponse()
		if len(common.GetHeaderMutation().GetSetHeaders()) > 0 {
			t.Fatalf("a rewrite-only route got headers set: %v", common.GetHeaderMutation())
		}
		var body struct{ Model string }
		if err := json.Unmarshal(common.GetBodyMutation().GetBody(), &body); err != nil {
			t.Fatalf("no body rewritten: %v (%v)", resp, err)
		}
		got[body.Model]++
	}
	if share := float64(got["a-v2"]) / n; len(got) != 2 || math.Abs(share-0.1) > 0.03 {
		t.Fatalf("rewritten to %v: want a-v2 a tenth (within 3 points)", got)
	}
	if c := promtest.ToFloat64(s.rewrites.WithLabelValues("a", "a-v2")); c != float64(got["a-v2"]) {
		t.Fatalf("counted %v rewrites to a-v2, made %d", c, got["a-v2"])
	}
}

// TestACallerPlacesANewPromptWhereFewestWait: a calling node's picker
// places a prompt new to it on the node where fewer of its requests wait
// for an answer, when the prompt's own first node has more waiting (the
// real engine's benchmark: unshared prompts, each placed by how many
// prompts each node held, queued behind each other's prefills while the
// other engine was idle); the request's answer ends its wait.
func TestACallerPlacesANewPromptWhereFewestWait(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	client, ctx := pickerClient(t, p)
	route, err := wire.AffinityRoute{Backends: []wire.AffinityBackend{{Name: "llama", Nodes: []wire.AffinityNode{
		{Inbound: "10.0.0.1:21000", Replicas: 1}, {Inbound: "10.0.0.2:21000", Replicas: 1}}}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(i int) string {
		return fmt.Sprintf(`{"messages":[{"role":"system","content":%q}]}`, strings.Repeat(fmt.Sprintf("Prompt %d alone. ", i), 20))
	}
	nodeOf := func(resps []*extproc.ProcessingResponse) string {
		for _, resp := range resps {
			if v := resp.GetDynamicMetadata().GetFields()[wire.PickerNamespace].GetStructValue().GetFields()[wire.PromptNodeKey]; v != nil {
				return v.GetStringValue()
			}
		}
		return ""
	}
	// A request waiting for its answer on its node: the stream stays open.
	stream, err := client.Process(metadata.AppendToOutgoingContext(ctx, wire.PickerPromptHeader, "1", wire.AffinityRouteHeader, route))
	if err != nil {
		t.Fatal(err)
	}
	var waiting []*extproc.ProcessingResponse
	for _, req := range []*extproc.ProcessingRequest{
		{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{}}},
		{Request: &extproc.ProcessingRequest_RequestBody{RequestBody: &extproc.HttpBody{Body: []byte(prompt(0)), EndOfStream: true}}},
	} {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, resp)
	}
	busy := nodeOf(waiting)
	if busy == "" {
		t.Fatal("the first prompt was placed on no node")
	}
	for i := range 10 {
		if got := nodeOf(askPrompt(ctx, t, client, &extproc.HttpHeaders{}, prompt(i+1), wire.AffinityRouteHeader, route)); got == busy || got == "" {
			t.Fatalf("new prompt %d went to %q, where a request waits, not to the idle node", i+1, got)
		}
	}
	// Its answer begins: nothing waits, and new prompts go to their
	// first nodes again, the keys' counts deciding: the busy node, with
	// one prompt against ten.
	if err := stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extproc.HttpHeaders{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := nodeOf(askPrompt(ctx, t, client, &extproc.HttpHeaders{}, prompt(100), wire.AffinityRouteHeader, route)); got != busy {
		t.Fatalf("with nothing waiting, a new prompt went to %q; want %q, the node holding fewer prompts", got, busy)
	}
}

// TestANodePlacesANewPromptOnAnIdleReplica: a node's picker sends a
// prompt new to it to its place among the replicas (as many prompts on
// each) only while that replica is no busier than the cheapest; a prompt
// placed before keeps its replica though it is busier (its cache).
func TestANodePlacesANewPromptOnAnIdleReplica(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	blocks := func(i int) []uint64 {
		return prefix.Blocks([]byte(strings.Repeat(fmt.Sprintf("prompt %d. ", i), 8*prefix.BlockBytes)), prefix.BlockBytes)
	}
	held := pickNow(t, p, request{blocks: blocks(0)})
	p.done(held, 50*time.Millisecond, http.StatusOK)
	busy := pickNow(t, p, request{}) // one in flight, on a replica of its own
	for i := range 12 {
		c := pickNow(t, p, request{blocks: blocks(i + 1)})
		p.done(c, 50*time.Millisecond, http.StatusOK)
		if c.replica == busy.replica {
			t.Fatalf("new prompt %d went to %s, which has a request in flight, with another idle", i+1, c.replica.tag)
		}
	}
	if held.replica == busy.replica {
		t.Fatalf("the first prompt's replica %s took the unprompted request; want the idle ones", held.replica.tag)
	}
	p.mu.Lock()
	held.replica.InFlight++ // its replica busier than the others
	p.mu.Unlock()
	if again := pickNow(t, p, request{blocks: blocks(0)}); again.replica != held.replica {
		t.Fatalf("a placed prompt went to %s, not its replica %s (one request in flight there)", again.replica.tag, held.replica.tag)
	}
}
