package wire

import (
	"fmt"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// Names of each node's listeners and their route configurations.
const (
	PublicListener = "public"
	MeshListener   = "mesh"
	// InboundListener receives other nodes' requests for this node's
	// replicas over mTLS (mesh mTLS only).
	InboundListener = "inbound"
	// PublicRoutes names the public listener's scoped routes and
	// prefixes their route configurations (PublicRouteName).
	PublicRoutes = "public"
	// MeshRoutes names the mesh listener's scoped routes: one scope per
	// endpoint, chosen by the request's host, each with a route
	// configuration of its own (MeshRouteName), so a change to one
	// endpoint sends that endpoint's routes alone.
	MeshRoutes = "mesh"
)

// MeshRouteName is the name of an endpoint's mesh route configuration and
// of the scope that selects it.
func MeshRouteName(endpoint string) string { return MeshRoutes + "/" + endpoint }

// The public listener's scoped routes: a request's route key (its first
// path segment, PublicRouteKey), which the listener writes into
// PublicRouteKeyHeader as PublicRoutes + the path before any filter runs
// (PublicRouteKeyFormat), picks the scope of the endpoints whose routes
// start with that segment, and the scope names their route configuration
// (PublicRouteName), so a change to one endpoint sends the endpoints of its
// first segment alone. A public scope's key is two fragments (PublicRoutes
// and the segment), a mesh one's one (the host), so the two never meet.
const (
	PublicRouteKeyHeader = "x-servemesh-route-key"
	// PublicRouteKeyFormat is the header's value, in Envoy's formatter:
	// "public/api/v1" for "/api/v1?x"; fragments 0 and 1 of it split at
	// '/' are the key.
	PublicRouteKeyFormat = PublicRoutes + "%PATH(NQ)%"
	// PublicRootKey is the segment of the routes of "/", which also take
	// every request no other scope routes.
	PublicRootKey = ""
)

// PublicRouteKey is the route key of a route or of a request's path: its
// first segment, without a query or fragment ("/api/v1?x" and "/api" give
// "api"; "/" gives PublicRootKey).
func PublicRouteKey(path string) string {
	first, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if i := strings.IndexAny(first, "?#"); i >= 0 {
		first = first[:i]
	}
	return first
}

// PublicRouteName is the name of the public route configuration, and of
// the scope, of route key key ("public/api"; the root's is "public/"),
// and the route key header's value that picks it.
func PublicRouteName(key string) string { return PublicRoutes + "/" + key }

// IsPublicRouteName tells a public route configuration's name from a
// mesh one's.
func IsPublicRouteName(name string) bool { return strings.HasPrefix(name, PublicRoutes+"/") }

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

// Headers a node's inbound listener adds to an answer it made itself
// because its replicas did not answer; calling nodes retry on them (on
// another node) and strip them.
const (
	// UnreachedHeader: no replica was reached (connection refused or
	// failed, none healthy, all busy); retrying is safe for every method.
	UnreachedHeader = "x-servemesh-unreached"
	// ResetHeader: the replica's connection was reset after the request was
	// sent; retrying is safe for idempotent methods only.
	ResetHeader = "x-servemesh-reset"
)

// ShadowHeader marks a mirrored request: its value is the endpoint whose
// shadow it is. A node adds it to the copies it mirrors and strips it from
// the requests it takes from clients, so a replica (and the access log of
// the node that receives the copy) can tell a shadow from a request someone
// waits for.
const ShadowHeader = "x-servemesh-shadow"

// InboundClusterName is the cluster through which a node's inbound
// listener reaches its own replicas of backend over loopback. The leading
// '_' keeps its stats apart from the backend's cluster (ParseStat skips it).
func InboundClusterName(backend string) string { return "_inbound_" + backend }

// InboundAssignmentName names the assignment (EDS) of node's own replicas of
// backend, which only node's inbound cluster asks for: a replica's health
// change updates it, never the cluster.
func InboundAssignmentName(backend, node string) string {
	return InboundClusterName(backend) + "@" + node
}

// NodeViewAssignmentName names the assignment of backend as node sees it
// when it runs replicas of backend: the other nodes by their inbound
// listeners, and its own replicas directly on loopback, without TLS.
func NodeViewAssignmentName(backend, node string) string { return ClusterName(backend) + "@" + node }

// BackendSNI is the TLS server name a node asks for when it calls another
// node's replicas of backend; the inbound listener picks the backend's
// certificate and route by it, as Consul service mesh does.
func BackendSNI(backend string) string { return backend + ".backend.servemesh" }

// ControllerService is the Consul service of the controllers: their
// Connect identity, and the instances whose checks their leader-election
// sessions are bound to.
const ControllerService = "servemesh-controller"

// NodeServicePrefix prefixes the Consul service name of a node's identity
// ("servemesh-node-<node id>"): its Connect leaf names it in a SPIFFE id,
// and the node's agent registers the node under it (AgentTag). Only the
// node's own Consul token may write it.
const NodeServicePrefix = "servemesh-node-"

// NodeService is the Consul service of node id: its identity and its
// agent's registration.
func NodeService(id string) string { return NodeServicePrefix + id }

// sidecarSuffix ends the second name Consul grants with every service
// identity: a token for servemesh-node-a may also be
// servemesh-node-a-sidecar-proxy. No node id ends with it, so that second
// name is never a second node.
const sidecarSuffix = "-sidecar-proxy"

// CheckNodeID says why id cannot be a node's id, or returns nil.
func CheckNodeID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("the node id is empty")
	case strings.ContainsAny(id, "/?#"):
		return fmt.Errorf("node id %q has a /, ? or #; use letters, digits, '-' and '.'", id)
	case strings.HasSuffix(id, sidecarSuffix):
		return fmt.Errorf("node id %q ends in %s, the second name of every Consul service identity; choose another id", id, sidecarSuffix)
	}
	return nil
}

// BackendServicePrefix prefixes the Consul service of a backend servemesh
// runs: its replicas register as its instances, and its Connect leaf is
// the identity its nodes' inbound listeners present. Node tokens may write
// these names and no other service but their own node's, so no node takes
// another's identity, the controller's, or an external service's name.
const BackendServicePrefix = "servemesh-backend-"

// BackendService is the Consul service of backend's replicas.
func BackendService(backend string) string { return BackendServicePrefix + backend }

// Secret names of a node's file-based SDS configs (mesh mTLS): the node's
// own identity, the CA roots, and the identity of each backend it serves.
const (
	NodeSecret  = "node"
	RootsSecret = "roots"
)

// BackendSecret is the secret of backend's identity on the nodes that run
// its replicas.
func BackendSecret(backend string) string { return "backend_" + backend }

// SecretsDir is the folder of a node's file-based SDS configs (mesh mTLS),
// relative to its Envoy's working directory: servemesh runs each node's
// Envoy in its work folder and the agent keeps the folder there, so every
// node's resources name the same paths and nodes share their clusters.
const SecretsDir = "secrets"

// AccessLogFile is a node's Envoy access log, a JSON line per request,
// relative to the folder the node's Envoy runs in.
const AccessLogFile = "access.log"

// SecretFile is where, in a node's secrets folder, the file-based SDS
// config of secret name is.
func SecretFile(dir, name string) string { return dir + "/" + name + ".yaml" }

// RouteStatPrefix is the stat prefix of every route that forwards an
// endpoint's requests, so Envoy counts them as
// vhost.<vhost>.route.<endpoint>.upstream_rq_*.
func RouteStatPrefix(endpoint string) string { return endpoint }

// RateLimitStatPrefix is the stat prefix of an endpoint's local rate
// limit, so Envoy counts the requests it refused, on every listener of the
// node, as servemesh_rate_limit.<endpoint>.http_local_rate_limit.rate_limited
// (StatRateLimited).
func RateLimitStatPrefix(endpoint string) string { return rateLimitStatPrefix + endpoint }

const rateLimitStatPrefix = "servemesh_rate_limit."

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
	// StatGRPCFailures counts a backend's gRPC calls that ended with a
	// status other than OK (Envoy's grpc_stats filter; their HTTP status
	// is 200).
	StatGRPCFailures = "grpc.failure"
	// StatLatency is the histogram of a request's time to its replica's
	// whole answer, in milliseconds (buckets LatencyBoundsMs).
	StatLatency = "upstream_rq_time"
	// StatRateLimited counts an endpoint's requests its local rate limit
	// refused (RateLimitStatPrefix).
	StatRateLimited = "http_local_rate_limit.rate_limited"
)

// StatsFilter selects, in Envoy's /stats?filter=, every stat ParseStat reads.
const StatsFilter = `^(cluster\.[^_].*\.(upstream_rq_(total|5xx|active|pending_active|time)|grpc\.failure)|vhost\..*\.route\..*\.upstream_rq_(total|5xx)|servemesh_rate_limit\..*\.http_local_rate_limit\.rate_limited)$`

// LatencyBoundsMs are the upper bounds, in milliseconds, of the buckets of
// every Envoy's StatLatency histograms (the bootstrap sets them): finer
// than Envoy's defaults below a second, where model servers' answers and
// the latency checks of a rollout fall.
var LatencyBoundsMs = []float64{1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750,
	1000, 1500, 2000, 3000, 5000, 7500, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

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
		for _, name := range []string{StatRequests, StatErrors, StatActive, StatPending, StatLatency, StatGRPCFailures} {
			if backend, found := strings.CutSuffix(rest, "."+name); found && backend != "" && !strings.HasPrefix(backend, "_") {
				return Stat{Backend: backend, Name: name}, true
			}
		}
		return Stat{}, false
	}
	if rest, found := strings.CutPrefix(stat, rateLimitStatPrefix); found {
		if endpoint, found := strings.CutSuffix(rest, "."+StatRateLimited); found && endpoint != "" {
			return Stat{Endpoint: endpoint, Name: StatRateLimited}, true
		}
		return Stat{}, false
	}
	rest, found := strings.CutPrefix(stat, "vhost.")
	if !found {
		return Stat{}, false
	}
	for _, name := range []string{StatRequests, StatErrors} {
		if hosted, found := strings.CutSuffix(rest, "."+name); found {
			if endpoint, listener, ok := routeOf(hosted); ok {
				return Stat{Endpoint: endpoint, Listener: listener, Name: name}, true
			}
		}
	}
	return Stat{}, false
}

// routeOf splits "<virtual host>.route.<endpoint>". Names may hold dots
// (and ".route."), so the split is not the first ".route.": the public
// virtual host is PublicVirtualHost, and on the mesh listener an endpoint's
// virtual host is named after the endpoint, so both halves are the same.
func routeOf(hosted string) (endpoint, listener string, ok bool) {
	const sep = ".route."
	if e, found := strings.CutPrefix(hosted, PublicVirtualHost+sep); found && e != "" {
		return e, PublicListener, true
	}
	n := len(hosted) - len(sep)
	if n <= 0 || n%2 != 0 {
		return "", "", false
	}
	host, mid, e := hosted[:n/2], hosted[n/2:n/2+len(sep)], hosted[n/2+len(sep):]
	if mid != sep || host != e {
		return "", "", false
	}
	return e, MeshListener, true
}

// FileSecret refers an Envoy TLS context to secret name in its file-based
// SDS config in dir (SecretFile), which Envoy watches: replacing the file
// rotates the secret without a restart.
func FileSecret(dir, name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_PathConfigSource{PathConfigSource: &core.PathConfigSource{Path: SecretFile(dir, name)}},
	}}
}

// A node's activator (agent/activator) holds the requests its Envoy has for
// a backend with no ready replica. Every backend's cluster lists it after
// the replicas (at a lower priority), so Envoy calls it only while none of
// them can take a request. It listens on two unix sockets in the folder
// the node's Envoy runs in (the same relative path on every node; neither
// replicas nor other nodes reach them): ActivatorSocket for the backends'
// clusters, where it holds a request until one of the backend's replicas
// anywhere is ready, and ActivatorInboundSocket for the inbound clusters,
// where it holds a request only while a replica of the backend is placed
// on its own node.
const (
	ActivatorSocket        = "activator.sock"
	ActivatorInboundSocket = "activator-inbound.sock"
)

// BackendHeader names, on every request a node forwards, the backend its
// split chose (set by the node, whatever the client sent): how the
// activator knows what a request waits for.
const BackendHeader = "x-servemesh-backend"

// ExitedNote begins the check output an agent gives a replica whose
// process exited, followed by how many times: "the replica's process
// exited 3 times; ...".
const ExitedNote = "the replica's process exited"

// LogTailNote begins, in a replica's check output, the last lines of its
// log: what it printed may hold its secrets, so callers that may not read
// the backend's environment get the output cut here.
const LogTailNote = "; its log ends: "

// ConfigVersionHeader carries, on the POST that gives a replica its
// backend's user_config, the config's version.
const ConfigVersionHeader = "x-servemesh-config-version"

// ReconfigureTokenEnv holds, in a replica's environment, the secret its
// agent sends in ReconfigureTokenHeader with each user_config: a replica
// takes a config only with it, so nobody else who reaches the replica (a
// client of a route of "/", another backend's replica) can reconfigure it.
// Only the replica's own user (its backend's) can read its environment.
const ReconfigureTokenEnv = "SERVEMESH_RECONFIGURE_TOKEN"

// MeshListenerEnv names, in a replica's environment, its node's mesh
// listener (host:port), where it calls the mesh's endpoints: the Python
// runtime's handles (servemesh.get_handle) do. Unset when the node has
// none.
const MeshListenerEnv = "SERVEMESH_MESH_LISTENER"

// ReconfigureTokenHeader carries ReconfigureTokenEnv's value on the POST
// that gives a replica its user_config.
const ReconfigureTokenHeader = "x-servemesh-reconfigure-token"

// Global rate limits (xds/translate's ratelimit.go, agent/ratelimit): a
// node's outbound listeners ask the node's rate limit service, Envoy's
// envoyproxy/ratelimit, which its agent runs on RateLimitSocket in the
// Envoy's folder (cluster RateLimitCluster), about descriptors of
// RateLimitDomain: the endpoint (RateLimitEndpointKey: its name), then,
// for a limit counted by a header or the client's address, its value
// (RateLimitHeaderKey, RateLimitAddressKey, Envoy's own name for it).
// A token quota's descriptors are RateLimitTokensKey's (its value the
// endpoint), then the header's value: each answer's tokens are read into
// dynamic metadata (UsageMetadata, UsageTokensKey) and charged when it
// ends.
const (
	RateLimitTokensKey   = "servemesh_tokens"
	UsageMetadata        = "servemesh.usage"
	UsageTokensKey       = "total_tokens"
	RateLimitSocket      = "ratelimit.sock"
	RateLimitCluster     = "_servemesh_rate_limit"
	RateLimitDomain      = "servemesh"
	RateLimitEndpointKey = "servemesh_endpoint"
	RateLimitHeaderKey   = "servemesh_key"
	// RateLimitModelKey is a token quota's descriptor entry of the
	// request's model, when it counts each model apart.
	RateLimitModelKey   = "servemesh_model"
	RateLimitAddressKey = "remote_address"
)

// Load-aware picking (xds/translate's inference.go): a node's inbound
// listener asks its agent's picker, a gRPC ext_proc server on PickerSocket
// in the Envoy's folder (cluster PickerCluster), which replica takes each
// request of a load-aware backend; the picker names it as the Gateway API
// Inference Extension's Endpoint Picker Protocol (v1.0.0 of the protocol)
// has an endpoint picker do: in dynamic metadata (PickerNamespace,
// DestinationEndpointKey: "IP:port") and in the request header of that
// name. The inbound cluster follows the metadata (override_host) and
// reports the replica that served the request back in metadata
// (PickerNamespace, DestinationEndpointServedKey), which Envoy sends the
// picker with the answer's headers. The picker adds the node's ORCA load
// report to the answer (LoadReportHeader), which the calling node weighs
// nodes by and removes.
const (
	PickerSocket    = "picker.sock"
	PickerCluster   = "servemesh_picker"
	PickerNamespace = "envoy.lb"
	// DestinationEndpointKey and DestinationEndpointServedKey are the
	// protocol's names of the endpoint picked and the one that served.
	DestinationEndpointKey       = "x-gateway-destination-endpoint"
	DestinationEndpointServedKey = "x-gateway-destination-endpoint-served"
	// SubsetHintNamespace and SubsetHintKey are where a proxy may list
	// the endpoints ("IP:port", a list or one comma-separated string) a
	// picker must choose from: the picker answers 503 when none of them
	// is ready.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	SubsetHintKey       = "x-gateway-destination-endpoint-subset"
	// PickedReplicaKey is where a picker of servemesh 0.x before the
	// protocol named the replica: its agents still answer so while an
	// upgrade is rolled out, and the inbound cluster follows it after
	// DestinationEndpointKey (docs/upgrading.md).
	PickedReplicaKey = "x-servemesh-replica"
	LoadReportHeader = "endpoint-load-metrics"
	// LoadReportBinHeader is ORCA's binary form, which Envoy reads first:
	// removed with LoadReportHeader from what replicas send.
	LoadReportBinHeader = "endpoint-load-metrics-bin"
	// PickerBodyHeader, in a picker stream's metadata, says Envoy sends
	// the request's body (as far as it buffers it) after its headers: the
	// picker picks on the body, by the prompt's prefix, unless the
	// request has none.
	PickerBodyHeader = "x-servemesh-picker-body"
	// PickerPromptHeader, in a picker stream's metadata, asks the calling
	// node's picker for the request's prompt affinity instead of a
	// replica: it answers the body by setting PromptAffinityHeader, which
	// the route hashes to pick the node (consistent hashing with bounded
	// loads), so a prompt's prefix reaches the node whose replica holds
	// it.
	PickerPromptHeader = "x-servemesh-picker-prompt"
	// PickerSessionHeader, in a picker stream's metadata, names the
	// request header that names its conversation.
	PickerSessionHeader = "x-servemesh-picker-session"
	// PickerModelHeader, in a picker stream's metadata, names the request
	// header that names its model, for a backend whose replicas load
	// models on demand.
	PickerModelHeader    = "x-servemesh-picker-model"
	PromptAffinityHeader = "x-servemesh-prompt-prefix"
	// PickerTenantHeader, in a picker stream's metadata, names the
	// request header that names its tenant (flow control).
	PickerTenantHeader = "x-servemesh-picker-tenant"
)

// PickerMaxWait is the longest a picker may hold a request's answer
// while the request waits for a replica (the longest queue_timeout_s and
// a second): Envoy lets it extend its answer's time up to that.
const PickerMaxWait = 61 * time.Second

// Model-name routing: the model a request's body names is read into the
// dynamic metadata ModelMetadata, as ModelKey, or ModelMissingKey when the
// body names none.
const (
	ModelMetadata   = "servemesh.model"
	ModelKey        = "model"
	ModelMissingKey = "missing"
)

// Tracing: every node's Envoy sends its spans to the mesh's collector
// through cluster TracingCluster, as service TraceService(node), and tags
// them with these attributes (besides Envoy's own: http.*, upstream_cluster,
// peer.address).
const (
	TracingCluster = "_servemesh_tracing"
	// TagNode is the node whose Envoy made the span.
	TagNode = "servemesh.node"
	// TagEndpoint is the endpoint a caller's request reached, and TagSplit
	// its traffic split as the route had it ("v1=0.9,v2=0.1"; the backend
	// it went to is the upstream span's upstream_cluster).
	TagEndpoint = "servemesh.endpoint"
	TagSplit    = "servemesh.split"
	// TagBackend is the backend an inbound listener served the request
	// for; TagShadowOf, on a shadow copy, the endpoint it mirrors (the
	// ShadowHeader's value).
	TagBackend  = "servemesh.backend"
	TagShadowOf = "servemesh.shadow_of"
	// The agent's spans: the picker's (span "pick <backend>") and the
	// activator's ("hold <backend>"). TagOutcome is what became of the
	// request (the picker's or activator's outcome as counted in their
	// metrics), TagReplica the replica picked (its address), TagWhy why
	// it was picked or shed, TagHeldMS how long the request waited there
	// (for a replica to be ready, or to be free), TagPickPass the
	// request's pass through the picker's pipeline (what each step kept).
	TagOutcome  = "servemesh.outcome"
	TagReplica  = "servemesh.replica"
	TagWhy      = "servemesh.why"
	TagHeldMS   = "servemesh.held_ms"
	TagPickPass = "servemesh.pick.pass"
	// TagOperation is the controller's operation an API call made (span
	// "operation <op>"), TagRevision the stored revision its checkpoint
	// wrote.
	TagOperation = "servemesh.operation"
	TagRevision  = "servemesh.revision"
)

// TraceService is the service name of node's Envoy in its spans;
// AgentTraceService its agent's (the picker's and activator's spans);
// ControllerTraceService the controllers'.
func TraceService(node string) string { return "servemesh-envoy-" + node }

// AgentTraceService is the service name of node's agent in its spans.
func AgentTraceService(node string) string { return "servemesh-agent-" + node }

// ControllerTraceService is the service name of the controllers' spans.
const ControllerTraceService = "servemesh-controller"
