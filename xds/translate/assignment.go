package translate

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// BuildAssignments builds one ClusterLoadAssignment per backend served by
// EDS, sorted by name, listing its replicas (sorted by address) with their
// health, then the node's activator (withActivator). A backend with no
// replicas gets the activator alone. A backend whose replicas are named by DNS has its
// assignment in its cluster instead (BuildClusters).
func BuildAssignments(m *ir.DataPlane) []*endpoint.ClusterLoadAssignment {
	backends := sortedBackends(m)
	out := make([]*endpoint.ClusterLoadAssignment, 0, len(backends))
	for _, b := range backends {
		if b.Reach != ir.ReachDNS {
			out = append(out, withActivator(BuildAssignment(b), wire.ActivatorSocket))
		}
	}
	return out
}

// BuildAssignment builds one backend's ClusterLoadAssignment: its replicas,
// which Envoy calls endpoints.
func BuildAssignment(b ir.Backend) *endpoint.ClusterLoadAssignment {
	cla := assignment(wire.ClusterName(b.Name), nil)
	if len(b.Replicas) == 0 {
		return cla
	}
	if b.ViaInbound() {
		return inboundAssignment(b)
	}
	locality := &endpoint.LocalityLbEndpoints{}
	for _, r := range byAddress(b.Replicas) {
		host, port := replicaHost(r.Address)
		locality.LbEndpoints = append(locality.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(host, port),
			}},
			HealthStatus: healthStatus(r.Health),
		})
	}
	cla.Endpoints = []*endpoint.LocalityLbEndpoints{locality}
	return cla
}

// byAddress is a copy of rs in the order an assignment lists them: by
// address, replicas of one address in rs's order.
func byAddress(rs []ir.Replica) []ir.Replica {
	out := slices.Clone(rs)
	slices.SortStableFunc(out, func(a, b ir.Replica) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// replicaHost is a replica's address as its endpoint names it: the IP in
// its canonical form (a host name as written) and the port.
func replicaHost(address string) (string, uint32) {
	host, portText, _ := net.SplitHostPort(address) // checked by Validate
	port, _ := strconv.ParseUint(portText, 10, 16)
	if ip, err := netip.ParseAddr(host); err == nil {
		var canonical [64]byte
		if c := ip.AppendTo(canonical[:0]); string(c) != host { // most are: no copy
			host = string(c)
		}
	}
	return host, uint32(port)
}

// overprovisioning is every assignment's overprovisioning factor, in
// percent. Envoy sends a share of the requests to DEGRADED endpoints (the
// replicas of unknown health) once fewer than 100/factor of them are
// healthy: with its default of 140, as soon as fewer than 71% are. With
// this factor, only while none is (up to 100,000 endpoints).
const overprovisioning = 100 * 100_000

// assignment is a ClusterLoadAssignment of one locality (nil: none) with
// servemesh's policy.
func assignment(name string, locality *endpoint.LocalityLbEndpoints) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name,
		Policy: &endpoint.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(overprovisioning)}}
	if locality != nil {
		cla.Endpoints = []*endpoint.LocalityLbEndpoints{locality}
	}
	return cla
}

func healthStatus(h ir.Health) core.HealthStatus {
	switch h {
	case ir.Unhealthy:
		return core.HealthStatus_UNHEALTHY
	case ir.Draining:
		return core.HealthStatus_DRAINING
	case ir.Unknown:
		// Envoy calls DEGRADED endpoints only when too few are healthy
		// (see overprovisioning); its own UNKNOWN means healthy.
		return core.HealthStatus_DEGRADED
	default:
		return core.HealthStatus_HEALTHY
	}
}

// encodeAssignments encodes each of assignments under its cluster name.
func encodeAssignments(assignments []*endpoint.ClusterLoadAssignment) ([]Encoded, error) {
	out := make([]Encoded, 0, len(assignments))
	for _, cla := range assignments {
		e, err := encode(cla.GetClusterName(), cla)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}
