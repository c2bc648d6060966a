package catalog

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/wire"
)

// nodeReaders bounds the concurrent reads of Nodes.
const nodeReaders = 4

// Nodes returns a function that lists the live nodes from Consul's health
// view: each agent registers its node as an instance of the node's own
// service (wire.NodeService, tagged wire.AgentTag), which only that node's
// Consul token may write, so no node can claim another. A registration
// that is unreadable, or whose meta names another node than its service,
// is left out, and log (if not nil, and safe to call from several
// goroutines at once) is told of each. It reads the
// catalog's list of agent services, then at most nodeReaders of them at a
// time.
func Nodes(client *api.Client, log func(msg string, args ...any)) func(ctx context.Context) ([]wire.NodeInfo, error) {
	return func(ctx context.Context) ([]wire.NodeInfo, error) {
		services, _, err := client.Catalog().Services((&api.QueryOptions{
			Filter: fmt.Sprintf("%q in ServiceTags", wire.AgentTag)}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("list servemesh agents: %w", err)
		}
		var (
			mu   sync.Mutex
			wg   sync.WaitGroup
			out  []wire.NodeInfo
			errs []error
			sem  = make(chan struct{}, nodeReaders)
		)
		for name := range services {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				nodes, err := readNode(ctx, client, name, log)
				mu.Lock()
				defer mu.Unlock()
				out = append(out, nodes...)
				if err != nil {
					errs = append(errs, err)
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			return nil, errs[0]
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		return out, nil
	}
}

// readNode reads the passing agent registrations of one node's service.
func readNode(ctx context.Context, client *api.Client, service string, log func(msg string, args ...any)) ([]wire.NodeInfo, error) {
	entries, _, err := client.Health().Service(service, wire.AgentTag, true, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read servemesh agent %s: %w", service, err)
	}
	var out []wire.NodeInfo
	for _, e := range entries {
		n, err := wire.NodeInfoFromMeta(e.Service.Address, e.Service.Meta)
		if err == nil && wire.NodeService(n.ID) != e.Service.Service {
			err = fmt.Errorf("it claims node %q under service %s", n.ID, e.Service.Service)
		}
		if err != nil {
			if log != nil {
				log("an agent registration is unreadable or claims another node; that node gets no replicas", "service_id", e.Service.ID, "err", err)
			}
			continue
		}
		out = append(out, n)
	}
	return out, nil
}
