package translate

import (
	"fmt"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// Resources are the Envoy resources for one node, each list sorted by name.
type Resources struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
	// ScopedRoutes pick each endpoint's mesh routes by host.
	ScopedRoutes []*route.ScopedRouteConfiguration
	Clusters     []*cluster.Cluster
	// Assignments list each backend's replicas: Envoy's endpoints (EDS);
	// with mTLS, also each node's own replicas of each backend
	// (wire.InboundAssignmentName).
	Assignments []*endpoint.ClusterLoadAssignment
}

// Translate builds the node's resources from dp, an IR that passed
// Validate (ir.Lower makes only such), after checking the node; t, if not
// nil, is the mesh's mTLS.
func Translate(m *ir.DataPlane, node wire.ProxyNode, t *MTLS) (*Resources, error) {
	shared, err := Shared(m, t)
	if err != nil {
		return nil, err
	}
	own, err := ForNode(m, node, t, ClustersByName(shared.Clusters))
	if err != nil {
		return nil, err
	}
	shared.Listeners = own.Listeners
	shared.Clusters = MergeClusters(shared.Clusters, own.Clusters)
	// Of every node's assignments, those this node's clusters ask for.
	asked := AskedAssignments(shared.Clusters)
	shared.Assignments = slices.DeleteFunc(shared.Assignments, func(cla *endpoint.ClusterLoadAssignment) bool {
		return !asked[cla.GetClusterName()]
	})
	return shared, nil
}

// AskedAreBuilt checks, as the snapshot cache's Consistent does, that
// every assignment clusters ask for is in built, naming the first cluster
// that asks for one it lacks.
func AskedAreBuilt(clusters []*cluster.Cluster, built map[string]Encoded) error {
	for _, c := range clusters {
		if name := AskedAssignment(c); name != "" {
			if _, ok := built[name]; !ok {
				return fmt.Errorf("snapshot is inconsistent: cluster %q has no assignment %q", c.GetName(), name)
			}
		}
	}
	return nil
}

// AskedAssignments are the names of the assignments (EDS) clusters ask for.
func AskedAssignments(clusters []*cluster.Cluster) map[string]bool {
	out := make(map[string]bool, len(clusters))
	for _, c := range clusters {
		if name := AskedAssignment(c); name != "" {
			out[name] = true
		}
	}
	return out
}

// AskedAssignment is the assignment c asks for: "" unless it is an EDS
// cluster.
func AskedAssignment(c *cluster.Cluster) string {
	if c.GetType() != cluster.Cluster_EDS {
		return ""
	}
	if name := c.GetEdsClusterConfig().GetServiceName(); name != "" {
		return name
	}
	return c.GetName()
}

// MergeClusters is a node's clusters: the shared ones, each replaced by the
// node's own of the same name (its view of a backend it runs replicas of),
// and the node's others, sorted by name.
func MergeClusters(shared, own []*cluster.Cluster) []*cluster.Cluster {
	mine := make(map[string]bool, len(own))
	for _, c := range own {
		mine[c.GetName()] = true
	}
	out := make([]*cluster.Cluster, 0, len(shared)+len(own))
	for _, c := range shared {
		if !mine[c.GetName()] {
			out = append(out, c)
		}
	}
	out = append(out, own...)
	sortByName(out, (*cluster.Cluster).GetName)
	return out
}

// Shared builds the resources every node shares (routes, clusters,
// assignments), t being the mesh's mTLS or nil; ForNode builds the rest,
// node by node.
func Shared(m *ir.DataPlane, t *MTLS) (*Resources, error) {
	clusters, err := BuildClusters(m)
	if err != nil {
		return nil, err
	}
	assignments := BuildAssignments(m)
	if t != nil {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if err := secureClusters(m, sockets(t), clusters); err != nil {
			return nil, err
		}
		// Each node's inbound cluster asks for its own; every node's are
		// here, so one publish updates them all.
		assignments = append(assignments, inboundAssignments(m)...)
		assignments = append(assignments, nodeViewAssignments(m)...)
		sortByName(assignments, (*endpoint.ClusterLoadAssignment).GetClusterName)
	}
	routes, scopes := BuildRoutes(m)
	return &Resources{
		Routes:       routes,
		ScopedRoutes: scopes,
		Clusters:     clusters,
		Assignments:  assignments,
	}, nil
}
