package modelgen

import (
	"fmt"

	"github.com/servemesh/servemesh/meshspec"
)

// Model returns a valid model of endpoints endpoints, each with backends
// backends of replicas replicas, weighted unevenly, the last backend also
// shadowing 10% of the endpoint's traffic.
func Model(endpoints, backends, replicas int) *meshspec.Model {
	m := &meshspec.Model{}
	for e := range endpoints {
		ep := meshspec.Endpoint{
			Name:    fmt.Sprintf("ep-%d", e),
			Route:   fmt.Sprintf("/ep-%d", e),
			Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{},
			Shadows: map[string]float64{},
		}
		remaining := 1.0
		for b := range backends {
			name := fmt.Sprintf("ep-%d-v%d", e, b)
			backend := meshspec.Backend{Name: name, Config: meshspec.BackendConfig{MaxConcurrentQueries: 8}}
			for r := range replicas {
				n := e*backends*replicas + b*replicas + r
				backend.Replicas = append(backend.Replicas, meshspec.Replica{
					Address: fmt.Sprintf("10.%d.%d.%d:8080", (n>>16)&0xff, (n>>8)&0xff, n&0xff),
				})
			}
			m.Backends = append(m.Backends, backend)
			w := remaining / 2
			if b == backends-1 {
				w = remaining
			}
			ep.Traffic[name] = w
			remaining -= w
		}
		ep.Shadows[fmt.Sprintf("ep-%d-v%d", e, backends-1)] = 0.1
		m.Endpoints = append(m.Endpoints, ep)
	}
	return m
}
