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
