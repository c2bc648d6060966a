//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestMultiplexingWorkload: model loads per 1,000 requests of eight
// models on four stand-in servers holding two each (a load takes 30 ms),
// open loop at 40 requests a second through both nodes of the default
// mesh: the backend with max_models_per_replica (and prompt_affinity, so
// a model keeps its node) against the same servers picked by least
// requests. bench/inference -workload multiplexing reports medians.
func TestMultiplexingWorkload(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "mxw")
	server := func(name string) *meshspec.ProcessSpec {
		return modelServer(name, "--slots", "4", "--service", "5ms", "--models-per-replica", "2", "--model-load", "30ms")
	}
	mesh.createBackends(t,
		meshspec.Backend{Name: "mx-aware", Process: server("mx-aware"), Config: meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.25,
			LoadAware: &meshspec.LoadAware{PromptAffinity: true, MaxModelsPerReplica: 2, MetricsPath: "/metrics"}}},
		meshspec.Backend{Name: "mx-lr", Process: server("mx-lr"), Config: meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.25}})
	for _, name := range []string{"mx-aware", "mx-lr"} {
		if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: name, Route: "/" + name, Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}}); err != nil {
			t.Fatal(err)
		}
		mesh.waitPassing(t, name, 4, "http://"+mesh.n1.public+"/"+name)
	}
	d := loadSeconds(t, "MULTIPLEX_LOAD_S", 5)
	perThousand := map[string]float64{}
	for _, c := range []struct{ backend, picker string }{{"mx-aware", "multiplexed"}, {"mx-lr", "least-request"}} {
		urls := []string{"http://" + mesh.n1.public + "/" + c.backend, "http://" + mesh.n2.public + "/" + c.backend}
		var mu sync.Mutex
		loads, answered, failed, first := 0, 0, 0, ""
		client := loadClient()
		atRate(40, d, func(i int) {
			model := fmt.Sprintf("adapter-%d", rand.IntN(8)) //nolint:gosec // a workload's mix, not a secret
			_, a, _, err := timedPost(client, urls[i%2], `{"prompt":"hi"}`, "serve_multiplexed_model_id", model)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if failed++; first == "" {
					first = err.Error()
				}
			case a.LoadedModel:
				loads, answered = loads+1, answered+1
			default:
				answered++
			}
		})
		perThousand[c.picker] = 1000 * float64(loads) / float64(max(answered, 1))
		t.Logf("BENCH multiplex picker=%s seconds=%.0f requests=%d loads=%d loads_per_1000=%.0f failed=%d", c.picker, d.Seconds(), answered, loads, perThousand[c.picker], failed)
		if failed > 0 || answered == 0 {
			t.Fatalf("%s: %d requests failed (first: %s), %d answered", c.backend, failed, first, answered)
		}
	}
	if aware, lr := perThousand["multiplexed"], perThousand["least-request"]; aware > 0.75*lr {
		t.Errorf("multiplexed picking loaded a model for %.0f of 1,000 requests, least requests for %.0f: want under three quarters of it", aware, lr)
	}
}
