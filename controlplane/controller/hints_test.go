package controller

import (
	"context"
	"testing"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
)

// TestUnknownNamesAreToldTheFix: an operation naming a backend or
// endpoint that does not exist says the nearest name and the names there
// are, and changes nothing (issue 40: `traffic set model model-v9=...`
// said only "create the backend first", `backend get model-v9` a bare 404).
func TestUnknownNamesAreToldTheFix(t *testing.T) {
	ctx := context.Background()
	c, _ := newLeader(t, store.NewMemory())
	for _, name := range []string{"model-v1", "model-v2"} {
		changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend(name)))
		mustChange(t, changed, err)
	}
	changed, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "model", Route: "/model", Traffic: map[string]float64{"model-v1": 1}})
	mustChange(t, changed, err)
	_, before := c.State()

	_, err = c.SetTraffic(ctx, "model", map[string]float64{"model-v1": 0.5, "model-v9": 0.5})
	mustKind(t, err, Invalid, `backend "model-v9" that is not registered (create it first); did you mean "model-v1"? backends: model-v1, model-v2`)
	_, err = c.SetTraffic(ctx, "mdoel", map[string]float64{"model-v1": 1})
	mustKind(t, err, NotFound, `endpoint "mdoel" that is not registered; did you mean "model"? endpoints: model`)
	_, err = c.SetShadow(ctx, "model", "model-v3", 0.2)
	mustKind(t, err, Invalid, `did you mean "model-v1"? backends: model-v1, model-v2`)
	_, err = c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "other", Route: "/other", Traffic: map[string]float64{"ghost": 1}})
	mustKind(t, err, Invalid, `backend "ghost" that is not registered (create it first); backends: model-v1, model-v2`)
	_, err = c.GetBackend("model-v9")
	mustKind(t, err, NotFound, `backend "model-v9" is not registered; did you mean "model-v1"? backends: model-v1, model-v2`)
	_, err = c.GetEndpoint("embeddings")
	mustKind(t, err, NotFound, `endpoint "embeddings" is not registered; endpoints: model`)

	if _, after := c.State(); after != before {
		t.Fatalf("refused operations changed the state: revision %v -> %v", before, after)
	}
}

// TestSetModelTraffic: one model's split of an endpoint routed by model
// is set alone (its shadows kept); a model it does not route, an endpoint
// not routed by model, or a backend not registered is refused naming the
// fix, changing nothing.
func TestSetModelTraffic(t *testing.T) {
	ctx := context.Background()
	c, _ := newLeader(t, store.NewMemory())
	for _, name := range []string{"mistral", "mistral-v2", "llama"} {
		changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend(name)))
		mustChange(t, changed, err)
	}
	chat := meshspec.Endpoint{Name: "chat", Route: "/v1/chat", Methods: []string{"POST"}, ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
		"mistral-7b": {Traffic: map[string]float64{"mistral": 1}, Shadows: map[string]float64{"mistral-v2": 0.1}},
		"llama-3":    {Traffic: map[string]float64{"llama": 1}},
	}}}
	changed, err := c.CreateEndpoint(ctx, chat)
	mustChange(t, changed, err)
	changed, err = c.SetModelTraffic(ctx, "chat", "mistral-7b", map[string]float64{"mistral": 0.5, "mistral-v2": 0.5})
	mustChange(t, changed, err)
	e, _ := c.GetEndpoint("chat")
	if p := e.ModelRouting.Models["mistral-7b"]; p.Traffic["mistral-v2"] != 0.5 || p.Shadows["mistral-v2"] != 0.1 || e.ModelRouting.Models["llama-3"].Traffic["llama"] != 1 {
		t.Fatalf("after setting mistral-7b's split: %+v", e.ModelRouting.Models)
	}
	_, before := c.State()
	_, err = c.SetModelTraffic(ctx, "chat", "mistral-8b", map[string]float64{"mistral": 1})
	mustKind(t, err, Invalid, `endpoint "chat" routes no model "mistral-8b"; did you mean "mistral-7b"? models: llama-3, mistral-7b`)
	_, err = c.SetModelTraffic(ctx, "chat", "llama-3", map[string]float64{"lama": 1})
	mustKind(t, err, Invalid, `backend "lama" that is not registered (create it first); did you mean "llama"?`)
	_, err = c.SetModelTraffic(ctx, "chat", "llama-3", map[string]float64{"llama": 90, "mistral": 10})
	mustKind(t, err, Invalid, "here weights are fractions that sum to 1: write llama: 0.9, mistral: 0.1")
	if _, after := c.State(); after != before {
		t.Fatalf("refused changes changed the state")
	}
	changed, err = c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "plain", Route: "/plain", Traffic: map[string]float64{"llama": 1}})
	mustChange(t, changed, err)
	_, before = c.State()
	_, err = c.SetModelTraffic(ctx, "plain", "llama-3", map[string]float64{"llama": 1})
	mustKind(t, err, Invalid, `endpoint "plain" is not routed by model`)
	if _, after := c.State(); after != before {
		t.Fatalf("refused changes changed the state")
	}
}
