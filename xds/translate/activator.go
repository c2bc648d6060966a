package translate

import (
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/servemesh/servemesh/wire"
)

// Holding requests while a backend has no ready replica. Every EDS
// assignment lists, after the backend's replicas (priority 0), the node's
// activator (priority 1, on a unix socket in the Envoy's folder: the same
// relative path on every node). Envoy sends a priority nothing while a
// higher one can take the load, so the activator gets a backend's requests
// only while none of its replicas is healthy or of unknown health: it is
// DEGRADED, as replicas of unknown health are, so that those still come
// first. The activator holds each request until the backend has a ready
// replica, then answers it with wire.UnreachedHeader, on which the route
// retries it on a replica; or, past the backend's bound, with a 503 that
// says why. A replica whose process exits is marked critical by its agent
// at once, so its requests go to the activator within the time Consul and
// the controller take to publish it (the route's retries cover that).

// activatorPriority is the activator's priority in every assignment.
const activatorPriority = 1

// withActivator adds the activator listening on socket to cla, after its
// replicas.
func withActivator(cla *endpoint.ClusterLoadAssignment, socket string) *endpoint.ClusterLoadAssignment {
	if len(cla.Endpoints) == 0 {
		cla.Endpoints = []*endpoint.LocalityLbEndpoints{{}} // no replica: an empty priority 0
	}
	loc, ok := activatorLocalities[socket]
	if !ok {
		loc = activatorLocality(socket)
	}
	cla.Endpoints = append(cla.Endpoints, loc)
	return cla
}

// activatorLocalities are the activator's priority of every assignment,
// one per socket the activator listens on, shared by the assignments
// (which are read, never written).
var activatorLocalities = map[string]*endpoint.LocalityLbEndpoints{
	wire.ActivatorSocket:        activatorLocality(wire.ActivatorSocket),
	wire.ActivatorInboundSocket: activatorLocality(wire.ActivatorInboundSocket),
}

func activatorLocality(socket string) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{
		Priority: activatorPriority,
		LbEndpoints: []*endpoint.LbEndpoint{{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: socket}}},
			}},
			HealthStatus: core.HealthStatus_DEGRADED,
			Metadata:     localMetadata(),
		}},
	}
}

// backendHeader names the backend chosen on each request a node forwards.
func backendHeader(backend string) []*core.HeaderValueOption {
	return []*core.HeaderValueOption{{
		Header:       &core.HeaderValue{Key: wire.BackendHeader, Value: backend},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}
}
