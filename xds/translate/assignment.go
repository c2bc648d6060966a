package translate

import (
	"net"
	"net/netip"
	"sort"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/wire"
)

// BuildAssignments builds one ClusterLoadAssignment per backend served by
// EDS, sorted by name, listing its replicas (sorted by address) with their
// health. A backend with no replicas gets an empty assignment, so its
// cluster still warms. A backend whose replicas are named by DNS has its
// assignment in its cluster instead (BuildClusters).
func BuildAssignments(m *model.Model) []*endpoint.ClusterLoadAssignment {
	backends := sortedBackends(m)
	out := make([]*endpoint.ClusterLoadAssignment, 0, len(backends))
	for _, b := range backends {
		if !b.ResolvedByDNS() {
			out = append(out, BuildAssignment(b))
		}
	}
	return out
}

// BuildAssignment builds one backend's ClusterLoadAssignment: its replicas,
// which Envoy calls endpoints.
func BuildAssignment(b model.Backend) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: wire.ClusterName(b.Name)}
	if len(b.Replicas) == 0 {
		return cla
	}
	if viaInbound(b) {
		return inboundAssignment(b)
	}
	replicas := append([]model.Replica(nil), b.Replicas...)
	sort.Slice(replicas, func(i, j int) bool { return replicas[i].Address < replicas[j].Address })
	locality := &endpoint.LocalityLbEndpoints{}
	for _, r := range replicas {
		host, portText, _ := net.SplitHostPort(r.Address) // checked by Validate
		port, _ := strconv.ParseUint(portText, 10, 16)
		if ip, err := netip.ParseAddr(host); err == nil {
			host = ip.String()
		}
		locality.LbEndpoints = append(locality.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(host, uint32(port)),
			}},
			HealthStatus: healthStatus(r.EffectiveHealth()),
		})
	}
	cla.Endpoints = []*endpoint.LocalityLbEndpoints{locality}
	return cla
}

func healthStatus(h model.Health) core.HealthStatus {
	switch h {
	case model.HealthUnhealthy:
		return core.HealthStatus_UNHEALTHY
	case model.HealthDraining:
		return core.HealthStatus_DRAINING
	default:
		return core.HealthStatus_HEALTHY
	}
}
