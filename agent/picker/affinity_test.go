package picker

import (
	"encoding/json"
	"log/slog"
	"math"
	"testing"

	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

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
