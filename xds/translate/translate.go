package translate

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/wire"
)

// Resources are the Envoy resources for one node, each list sorted by name.
type Resources struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
	Clusters  []*cluster.Cluster
	// Assignments list each backend's replicas: Envoy's endpoints (EDS);
	// with mTLS, also each node's own replicas of each backend
	// (wire.InboundAssignmentName).
	Assignments []*endpoint.ClusterLoadAssignment
}

// Translate validates the model and the node and builds the node's
// resources; t, if not nil, is the mesh's mTLS. An invalid model yields the
// model's *model.ValidationError and no resources.
func Translate(m *model.Model, node wire.ProxyNode, t *MTLS) (*Resources, error) {
	shared, err := Shared(m, t)
	if err != nil {
		return nil, err
	}
	own, err := ForNode(m, node, t)
	if err != nil {
		return nil, err
	}
	shared.Listeners = own.Listeners
	shared.Clusters = append(shared.Clusters, own.Clusters...)
	// Of the nodes' own assignments, only this node's.
	own.Assignments = shared.Assignments[:0]
	for _, cla := range shared.Assignments {
		if wire.NodeAsksFor(node.ID, cla.GetClusterName()) {
			own.Assignments = append(own.Assignments, cla)
		}
	}
	shared.Assignments = own.Assignments
	sortByName(shared.Clusters, func(c *cluster.Cluster) string { return c.GetName() })
	return shared, nil
}

// Shared builds the resources every node shares (routes, clusters,
// assignments), t being the mesh's mTLS or nil; ForNode builds the rest,
// node by node.
func Shared(m *model.Model, t *MTLS) (*Resources, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	clusters := BuildClusters(m)
	assignments := BuildAssignments(m)
	if t != nil {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if err := secureClusters(m, t, clusters); err != nil {
			return nil, err
		}
		// Each node's inbound cluster asks for its own; every node's are
		// here, so one publish updates them all.
		assignments = append(assignments, inboundAssignments(m)...)
		sortByName(assignments, (*endpoint.ClusterLoadAssignment).GetClusterName)
	}
	return &Resources{
		Routes:      BuildRoutes(m),
		Clusters:    clusters,
		Assignments: assignments,
	}, nil
}
