package agent

import (
	"context"
	"fmt"
	"strconv"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/controller"
)

// NodeService is the Consul service every agent registers its node under.
const NodeService = "servemesh-agent"

// Node metadata keys of the agent's registration.
const (
	metaNode     = "node"
	metaCPUs     = "cpus"
	metaMemoryMB = "memory_mb"
	metaStatus   = "status_addr"
)

// LoadPath is where an agent serves its Load as JSON, on its status address.
const LoadPath = "/v1/load"

// Node describes the node an agent runs on.
type Node struct {
	ID       string
	Address  string // the IP replicas listen on
	CPUs     float64
	MemoryMB int
	// StatusAddr is where the agent serves /metrics, /v1/load and /v1/envoy.
	StatusAddr string
}

func nodeServiceID(node string) string { return NodeService + "-" + node }

// ListNodes returns a NodeLister that reads live agents from Consul's health
// view: a node whose agent stopped heartbeating is not listed.
func ListNodes(client *api.Client) controller.NodeLister {
	return func(ctx context.Context) ([]controller.Node, error) {
		entries, _, err := client.Health().Service(NodeService, "", true, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("list servemesh agents: %w", err)
		}
		out := make([]controller.Node, 0, len(entries))
		for _, e := range entries {
			cpus, _ := strconv.ParseFloat(e.Service.Meta[metaCPUs], 64)
			mem, _ := strconv.Atoi(e.Service.Meta[metaMemoryMB])
			if id := e.Service.Meta[metaNode]; id != "" {
				out = append(out, controller.Node{ID: id, CPUs: cpus, MemoryMB: mem, StatusAddr: e.Service.Meta[metaStatus]})
			}
		}
		return out, nil
	}
}
