package translate

import (
	"fmt"
	"net/netip"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/servemesh/servemesh/controlplane/model"
)

// Names of the per-node listeners and their route configurations.
const (
	PublicListenerName = "public"
	MeshListenerName   = "mesh"
	PublicRouteName    = "public"
	MeshRouteName      = "mesh"
)

// Node holds one node's settings that shape its listeners.
type Node struct {
	// ID is the Envoy node id.
	ID string `json:"id"`
	// PublicAddress and PublicPort are where routed endpoints are served.
	PublicAddress string `json:"public_address"`
	PublicPort    uint32 `json:"public_port"`
	// MeshAddress and MeshPort are the loopback listener where local replicas
	// reach any endpoint by `Host: <endpoint name>`.
	MeshAddress string `json:"mesh_address"`
	MeshPort    uint32 `json:"mesh_port"`
}

// Validate checks the node's settings.
func (n Node) Validate() error {
	if n.ID == "" {
		return fmt.Errorf("node id is empty: set the Envoy node id")
	}
	for _, a := range []struct {
		field, addr string
		port        uint32
	}{{"public", n.PublicAddress, n.PublicPort}, {"mesh", n.MeshAddress, n.MeshPort}} {
		if _, err := netip.ParseAddr(a.addr); err != nil {
			return fmt.Errorf("node %q: %s_address %q is not an IP address", n.ID, a.field, a.addr)
		}
		if a.port == 0 || a.port > 65535 {
			return fmt.Errorf("node %q: %s_port %d is not a port between 1 and 65535", n.ID, a.field, a.port)
		}
	}
	if n.PublicPort == n.MeshPort && n.PublicAddress == n.MeshAddress {
		return fmt.Errorf("node %q: public and mesh listeners both use %s:%d; give them different ports", n.ID, n.MeshAddress, n.MeshPort)
	}
	return nil
}

// Resources are the Envoy resources for one node, each list sorted by name.
type Resources struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
	Clusters  []*cluster.Cluster
	Endpoints []*endpoint.ClusterLoadAssignment
}

// Translate validates the model and the node and builds the node's resources.
// An invalid model yields the model's *model.ValidationError and no resources.
func Translate(m *model.Model, node Node) (*Resources, error) {
	shared, err := Shared(m)
	if err != nil {
		return nil, err
	}
	listeners, err := BuildListeners(node)
	if err != nil {
		return nil, err
	}
	shared.Listeners = listeners
	return shared, nil
}

// Shared builds the resources every node shares (routes, clusters,
// endpoints); only listeners differ between nodes.
func Shared(m *model.Model) (*Resources, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &Resources{
		Routes:    BuildRoutes(m),
		Clusters:  BuildClusters(m),
		Endpoints: BuildEndpoints(m),
	}, nil
}
