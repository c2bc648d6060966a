package wire

import "strings"

// Names of each node's two listeners and their route configurations.
const (
	PublicListener = "public"
	MeshListener   = "mesh"
	PublicRoutes   = "public"
	MeshRoutes     = "mesh"
)

// PublicVirtualHost names the public route configuration's one virtual
// host. Mesh virtual hosts are named after their endpoints, and model names
// start with a letter or digit, so the leading '_' keeps the two apart in
// Envoy's vhost.<name>.* stats.
const PublicVirtualHost = "_public"

// ControlPlaneCluster is the bootstrap's static cluster that reaches the
// xDS server; the leading '_' keeps it apart from backends' clusters.
const ControlPlaneCluster = "_servemesh_xds"

// ClusterName is the Envoy cluster (and endpoint assignment) of a backend.
func ClusterName(backend string) string { return backend }

// RouteStatPrefix is the stat prefix of every route that forwards an
// endpoint's requests, so Envoy counts them as
// vhost.<vhost>.route.<endpoint>.upstream_rq_*.
func RouteStatPrefix(endpoint string) string { return endpoint }

// ShadowRuntimeKey is the runtime key that overrides the mirrored fraction
// of an endpoint's requests to a shadow backend on one node.
func ShadowRuntimeKey(endpoint, backend string) string {
	return "servemesh.shadow." + endpoint + "." + backend
}

// The Envoy counters and gauges servemesh reads.
const (
	StatRequests = "upstream_rq_total"
	StatErrors   = "upstream_rq_5xx"
	StatActive   = "upstream_rq_active"
	StatPending  = "upstream_rq_pending_active"
)

// StatsFilter selects, in Envoy's /stats?filter=, every stat ParseStat reads.
const StatsFilter = `^(cluster\.[^_].*\.upstream_rq_(total|5xx|active|pending_active)|vhost\..*\.route\..*\.upstream_rq_(total|5xx))$`

// Stat is one Envoy stat name, read back into servemesh's terms.
type Stat struct {
	// Backend is set for a backend's cluster stats.
	Backend string
	// Endpoint and Listener (PublicListener or MeshListener) are set for an
	// endpoint's route stats.
	Endpoint, Listener string
	// Name is the counter or gauge: StatRequests, StatErrors, ...
	Name string
}

// ParseStat reads a stat of a backend's cluster
// (cluster.<backend>.<name>) or of an endpoint's routes
// (vhost.<vhost>.route.<endpoint>.<name>); ok is false for any other.
func ParseStat(stat string) (s Stat, ok bool) {
	if rest, found := strings.CutPrefix(stat, "cluster."); found {
		for _, name := range []string{StatRequests, StatErrors, StatActive, StatPending} {
			if backend, found := strings.CutSuffix(rest, "."+name); found && backend != "" && !strings.HasPrefix(backend, "_") {
				return Stat{Backend: backend, Name: name}, true
			}
		}
		return Stat{}, false
	}
	rest, found := strings.CutPrefix(stat, "vhost.")
	if !found {
		return Stat{}, false
	}
	vhost, route, found := strings.Cut(rest, ".route.")
	if !found || vhost == "" {
		return Stat{}, false
	}
	listener := MeshListener
	if vhost == PublicVirtualHost {
		listener = PublicListener
	}
	for _, name := range []string{StatRequests, StatErrors} {
		if endpoint, found := strings.CutSuffix(route, "."+name); found && endpoint != "" {
			return Stat{Endpoint: endpoint, Listener: listener, Name: name}, true
		}
	}
	return Stat{}, false
}
