package wire

import "time"

// Paths an agent serves on its status listener (NodeInfo.StatusAddr),
// besides /metrics.
const (
	// LoadPath answers the node's Load as JSON; the controller reads it.
	LoadPath = "/v1/load"
	// EnvoyVersionsPath answers the xDS versions the node's Envoy last
	// accepted, to compare with the controller's /v1/xds/nodes.
	EnvoyVersionsPath = "/v1/envoy"
	// LogsPath answers, as text, a replica's log (?replica=TAG) or the
	// node's Envoy's (?envoy=true): its last ?tail= lines, or what follows
	// byte ?offset=, at most MaxLogBytes; LogOffsetHeader says where the
	// next read starts.
	LogsPath = "/v1/logs"
	// LogOffsetHeader is the offset, in LogsPath's answers, to read on from.
	LogOffsetHeader = "X-Servemesh-Log-Offset"
)

// MaxLogBytes bounds one answer of LogsPath, and MaxLogTail the lines it
// ends with.
const (
	MaxLogBytes = 1 << 20
	MaxLogTail  = 10000
)

// MaxLoadBytes bounds the size of a Load answer a reader accepts.
const MaxLoadBytes = 4 << 20

// BackendLoad is one backend's request figures as one node's Envoy counts
// them.
type BackendLoad struct {
	// Active is the number of requests in flight to the backend now, and
	// Pending those queued in Envoy waiting for a replica to have room
	// (max_concurrent_queries). Both count as load: Ray Serve's signal is
	// its router's queue.
	Active  uint64 `json:"active"`
	Pending uint64 `json:"pending"`
	// Requests and Errors are totals since Envoy started; Errors are the
	// answers with a 5xx status and the gRPC calls that failed (any status
	// but OK), which Envoy counts apart.
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
	// Latency counts, since Envoy started, the answers that took at most
	// each of LatencyBoundsMs (cumulative, one count a bound); empty
	// before Envoy has flushed its first histogram.
	Latency []uint64 `json:"latency,omitempty"`
}

// Load is what an agent reports: its node's Envoy's figures per backend
// (cluster) and per endpoint (route).
type Load struct {
	Node     string                 `json:"node"`
	At       time.Time              `json:"at"`
	Backends map[string]BackendLoad `json:"backends"`
	// Routes are HTTP requests per endpoint and listener, keyed
	// "<endpoint>/<listener>" (RouteKey), with their 5xx answers.
	Routes map[string]BackendLoad `json:"routes"`
	// Held are the requests the node's activator holds now, by backend,
	// for want of a ready replica (also in Backends' Active).
	Held map[string]int `json:"held,omitempty"`
	// Waiting are the requests of load-aware backends waiting for a
	// replica on the node, by backend: in its picker's queue and, as
	// their servers last reported, in the replicas' own (also in
	// Backends' Active). Absent from a previous release's agents.
	Waiting map[string]float64 `json:"waiting,omitempty"`
	// Configs are the user_config versions the node's replicas run, by
	// replica tag (meshspec.UserConfig.Version).
	Configs map[string]string `json:"configs,omitempty"`
	// Draining are the requests the node's Envoy has in flight to each of
	// its draining replicas, by replica tag, as the agent last counted
	// them while it waits for them to end. Absent from a previous
	// release's agents.
	Draining map[string]int `json:"draining,omitempty"`
	// RateLimited are the requests each endpoint's local rate limit
	// refused on the node, since its Envoy started. Absent from a previous
	// release's agents.
	RateLimited map[string]uint64 `json:"rate_limited,omitempty"`
	// GlobalRateLimited are the requests the node's rate limit service
	// refused, by endpoint (its global limit), since the service started;
	// RateLimitService, if set, is why they could not be read (the node
	// runs no service, or it is down). Absent from a previous release's
	// agents.
	GlobalRateLimited map[string]uint64 `json:"global_rate_limited,omitempty"`
	RateLimitService  string            `json:"rate_limit_service,omitempty"`
	// Tracing, if set, is why the agent's spans could not be sent to the
	// mesh's collector when it last sent some. Absent from a previous
	// release's agents.
	Tracing string `json:"tracing,omitempty"`
	// RateLimitsLoaded are the limits the node's rate limit service
	// counts, by endpoint (meshspec.Endpoint.CountedLimits), those of the
	// configuration it has loaded: a change to an endpoint's global limit
	// or token quota is served on the node once they match. Empty (not
	// absent) when its service runs none or is down; absent when the
	// node runs no service, and from a previous release's agents.
	RateLimitsLoaded map[string]string `json:"rate_limits_loaded"`
	// GenAI are the GenAI histograms of the answers the node's agent
	// read (wire/genai.go), by backend. Absent from a previous release's
	// agents.
	GenAI map[string]GenAILoad `json:"genai,omitempty"`
	// TokenQuotaShadowed are the requests each endpoint's token quota in
	// shadow mode would have refused on the node, since its agent
	// started. Absent from a previous release's agents.
	TokenQuotaShadowed map[string]uint64 `json:"token_quota_shadowed,omitempty"`
}

// RouteKey is the key of an endpoint's figures on one listener in
// Load.Routes.
func RouteKey(endpoint, listener string) string { return endpoint + "/" + listener }

// NewLoad reads Envoy's stats (name to value, as /stats answers them) and
// histograms (name to cumulative counts at LatencyBoundsMs) into a Load;
// stats ParseStat does not know are ignored.
func NewLoad(node string, at time.Time, stats map[string]uint64, histograms map[string][]uint64) Load {
	l := Load{Node: node, At: at, Backends: map[string]BackendLoad{}, Routes: map[string]BackendLoad{}}
	for name, v := range stats {
		s, ok := ParseStat(name)
		if !ok {
			continue
		}
		if s.Name == StatRateLimited {
			if l.RateLimited == nil {
				l.RateLimited = map[string]uint64{}
			}
			l.RateLimited[s.Endpoint] += v
			continue
		}
		if s.Backend != "" {
			b := l.Backends[s.Backend]
			setFigure(&b, s.Name, v)
			l.Backends[s.Backend] = b
			continue
		}
		key := RouteKey(s.Endpoint, s.Listener)
		r := l.Routes[key]
		setFigure(&r, s.Name, v)
		l.Routes[key] = r
	}
	for name, counts := range histograms {
		if s, ok := ParseStat(name); ok && s.Backend != "" && s.Name == StatLatency && len(counts) == len(LatencyBoundsMs) {
			b := l.Backends[s.Backend]
			b.Latency = counts
			l.Backends[s.Backend] = b
		}
	}
	return l
}

func setFigure(b *BackendLoad, stat string, v uint64) {
	switch stat {
	case StatRequests:
		b.Requests = v
	case StatErrors, StatGRPCFailures:
		b.Errors += v
	case StatActive:
		b.Active = v
	case StatPending:
		b.Pending = v
	}
}
