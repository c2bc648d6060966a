package catalog

import (
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/wire"
)

// Nodes returns a function that lists the live nodes from Consul's health
// view: the agents registered as wire.AgentService whose heartbeat check
// passes. A registration it cannot read is left out, and log (if not nil)
// is told once per call.
func Nodes(client *api.Client, log func(msg string, args ...any)) func(ctx context.Context) ([]wire.NodeInfo, error) {
	return func(ctx context.Context) ([]wire.NodeInfo, error) {
		entries, _, err := client.Health().Service(wire.AgentService, "", true, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("list servemesh agents: %w", err)
		}
		out := make([]wire.NodeInfo, 0, len(entries))
		for _, e := range entries {
			n, err := wire.NodeInfoFromMeta(e.Service.Address, e.Service.Meta)
			if err != nil {
				if log != nil {
					log("an agent registration is unreadable; its node gets no replicas", "service_id", e.Service.ID, "err", err)
				}
				continue
			}
			out = append(out, n)
		}
		return out, nil
	}
}
