package ir

import (
	"maps"
	"slices"
	"strings"
)

// DataPlane is the IR of one view of the mesh: its backends and its
// endpoints, each sorted by name.
type DataPlane struct {
	// Revision is the stored state's revision the data plane was made of
	// (0: none, as a config file's): a node that serves this data plane
	// serves every change committed at or before it.
	Revision  uint64     `json:"revision,omitempty"`
	Backends  []Backend  `json:"backends,omitempty"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Tracing, if set, is where every node's Envoy sends its spans.
	Tracing *Tracing `json:"tracing,omitempty"`
	// Seq numbers the data planes one publisher makes (0: none, as a
	// config file's or a test's), and Changes names what changed since
	// the one it follows (see Delta); neither is part of what is served.
	Seq     uint64 `json:"-"`
	Changes *Delta `json:"-"`
}

// Tracing is the mesh's OTLP/gRPC collector, Host:Port, and the share of
// requests traced (percent) where no endpoint says otherwise: requests
// that reach no endpoint, and those that reach a node's inbound listener
// with no trace decision.
type Tracing struct {
	Host            string  `json:"host"`
	Port            uint32  `json:"port"`
	SamplingPercent float64 `json:"sampling_percent"`
}

// Reach is how every node reaches a backend's replicas.
type Reach string

const (
	// ReachAddress reaches each replica at its own IP and port (a
	// plaintext mesh, or instances outside the mesh).
	ReachAddress Reach = "address"
	// ReachDNS has Envoy resolve the replicas' DNS names itself and serve
	// the healthy ones; the activator does not front such a backend.
	ReachDNS Reach = "dns"
	// ReachInbound reaches each replica through the inbound listener of
	// the node it runs on, over mTLS; a node calls its own replicas on
	// loopback unless a feature needs its inbound listener (Picked).
	ReachInbound Reach = "inbound"
)

// Health is how the data plane treats a replica: Healthy ones are
// called; Unknown ones (their checks only expired: their agent or Consul
// stalled) while none is healthy; Draining and Unhealthy ones never.
type Health string

// The healths of a replica.
const (
	Healthy   Health = "healthy"
	Unknown   Health = "unknown"
	Draining  Health = "draining"
	Unhealthy Health = "unhealthy"
)

// Backend is one backend as the data plane serves it.
type Backend struct {
	Name  string `json:"name"`
	Reach Reach  `json:"reach"`
	// HTTP2: the replicas speak HTTP/2 (gRPC, or h2c).
	HTTP2    bool      `json:"http2,omitempty"`
	Replicas []Replica `json:"replicas,omitempty"`
	// MaxConcurrent is how many requests one replica serves at once
	// (max_concurrent_queries, its default applied); the rest queue.
	MaxConcurrent int `json:"max_concurrent"`
	// Outlier ejects replicas that keep failing; nil: none.
	Outlier *Outlier `json:"outlier,omitempty"`
	// Picked: the picker of the node running the replicas picks each
	// request's replica, and calling nodes weigh nodes by their load
	// reports (load_aware). Only with ReachInbound.
	Picked bool `json:"picked,omitempty"`
	// PromptAware: the picker also reads each request's body (what the
	// inbound listener buffers of it) for its prompt, and prefers the
	// replica that holds its prefix in cache. Picked backends but gRPC
	// ones, whose request streams need not end before their answers
	// start.
	PromptAware bool `json:"prompt_aware,omitempty"`
	// PromptAffinity: calling nodes choose the node by the prompt's prefix
	// (load_aware.prompt_affinity), loads bounded. Only PromptAware ones.
	PromptAffinity bool `json:"prompt_affinity,omitempty"`
	// SessionHeader names the header that names a conversation, which
	// each node's picker keeps on one replica (and, with PromptAffinity,
	// calling nodes hash first); "": none. Only Picked ones.
	SessionHeader string `json:"session_header,omitempty"`
	// MaxModels, if positive, is how many models each replica loads on
	// demand; ModelHeader names a request's model (else its body's
	// "model"), which each node's picker sends to a replica that has it
	// loaded, then to one with room. Only Picked ones.
	MaxModels   int    `json:"max_models,omitempty"`
	ModelHeader string `json:"model_header,omitempty"`
	// TenantHeader names the header that names a request's tenant: while
	// a node's replicas are saturated, requests of one priority waiting
	// there take turns by it. "": one tenant. Only Picked ones.
	TenantHeader string `json:"tenant_header,omitempty"`
	// FirstByteTimeoutS bounds how long one try waits for its answer to
	// start before the request is tried on another replica (0: none);
	// the endpoints that send only to such backends take it
	// (Endpoint.FirstByteTimeoutS).
	FirstByteTimeoutS float64 `json:"first_byte_timeout_s,omitempty"`
	// Picker, if set, is the external endpoint picker every calling node
	// asks which replica takes a request. Only with ReachInbound.
	Picker *EndpointPicker `json:"endpoint_picker,omitempty"`
}

// EndpointPicker is an external picker of a backend's replicas (the
// Endpoint Picker Protocol's): where it listens, IP and port, over TLS or
// not, and whether requests go on unpicked while it does not answer.
type EndpointPicker struct {
	Host     string `json:"host"`
	Port     uint32 `json:"port"`
	TLS      bool   `json:"tls,omitempty"`
	FailOpen bool   `json:"fail_open,omitempty"`
}

// PickedBackend is a backend an endpoint sends to whose replicas an
// external picker picks: the backend, whether its requests go on
// unpicked while the picker does not answer, and its healthy replicas
// as the picker knows them.
type PickedBackend struct {
	Name      string           `json:"name"`
	FailOpen  bool             `json:"fail_open,omitempty"`
	Endpoints []PickerEndpoint `json:"endpoints,omitempty"`
}

// PickerEndpoint is one replica as an external picker names it: its
// node's address and its own port (Endpoint, "IP:port"), the node's
// inbound listener that reaches it (Inbound) and where it listens on
// that node (Local).
type PickerEndpoint struct {
	Endpoint string `json:"endpoint"`
	Inbound  string `json:"inbound"`
	Local    string `json:"local"`
}

// readByEndpoints reports whether the IR of the endpoints that send to b
// reads b: its prompt affinity's nodes and headers, its first-byte
// timeout, whether it is load-aware (Endpoint.ReadsAnswers).
func (b Backend) readByEndpoints() bool {
	return b.PromptAffinity || b.FirstByteTimeoutS > 0 || b.Picked || b.Picker != nil
}

// Activated reports whether the activator fronts b: it holds b's requests
// while b has no ready replica (every backend Envoy does not resolve by
// DNS).
func (b Backend) Activated() bool { return b.Reach != ReachDNS }

// ViaInbound reports whether b's replicas are listed by their nodes'
// inbound listeners (an mTLS backend with replicas).
func (b Backend) ViaInbound() bool { return b.Reach == ReachInbound && len(b.Replicas) > 0 }

// Replica is one replica of a backend.
type Replica struct {
	// Address is IP:port, or host:port with ReachDNS; with ReachInbound,
	// where the replica listens on its node's loopback.
	Address string `json:"address"`
	Health  Health `json:"health"`
	// Node and Inbound, with ReachInbound: the node it runs on and that
	// node's inbound listener (IP:port).
	Node    string `json:"node,omitempty"`
	Inbound string `json:"inbound,omitempty"`
}

// Outlier says when a replica that keeps failing is ejected; a zero field
// keeps Envoy's default.
type Outlier struct {
	Consecutive5xx     int     `json:"consecutive_5xx,omitempty"`
	IntervalS          float64 `json:"interval_s,omitempty"`
	BaseEjectionS      float64 `json:"base_ejection_s,omitempty"`
	MaxEjectionPercent int     `json:"max_ejection_percent,omitempty"`
}

// Endpoint is one endpoint as the data plane routes it.
type Endpoint struct {
	Name string `json:"name"`
	// Route is its public path prefix; "" for a headless endpoint, reached
	// only through the mesh listener.
	Route string `json:"route,omitempty"`
	// Methods are the methods it forwards, upper-case and sorted; others
	// are answered 405.
	Methods []string `json:"methods"`
	// Traffic splits requests across backends by weight (they sum to 1);
	// Shadows mirror a proportion of them to other backends.
	Traffic map[string]float64 `json:"traffic,omitempty"`
	Shadows map[string]float64 `json:"shadows,omitempty"`
	// Timeouts, in seconds; 0: none.
	TimeoutS       float64 `json:"timeout_s,omitempty"`
	IdleTimeoutS   float64 `json:"idle_timeout_s,omitempty"`
	PerTryTimeoutS float64 `json:"per_try_timeout_s,omitempty"`
	// FirstByteTimeoutS, when every backend the endpoint sends to (its
	// split, its match rules, its models') bounds a try's wait for its
	// answer to start, is the largest of theirs: its routes try a request
	// that waits longer again on another replica, whatever its method,
	// never once the answer has started. 0: none.
	FirstByteTimeoutS float64 `json:"first_byte_timeout_s,omitempty"`
	// Match rules send matching requests to one backend, in order, before
	// the split.
	Match []Match `json:"match,omitempty"`
	// Retry widens the mesh's retries; nil keeps them.
	Retry *Retry `json:"retry,omitempty"`
	// Sticky keeps a client on one backend of the split; nil: none.
	Sticky *Sticky `json:"sticky,omitempty"`
	// Models routes by the model a request's JSON body names, instead of
	// Traffic; nil: by Traffic.
	Models *Models `json:"models,omitempty"`
	// Criticality is what the endpoint's requests are marked when they
	// do not say (criticality header).
	Criticality string `json:"criticality"`
	// Priority is the priority of its requests from the public listener
	// (they may ask for less, never more); MeshPriority the most those of
	// the mesh's own callers may ask for (its own priority, or 0 when it
	// sets none: a replica may mark a request critical).
	Priority     int `json:"priority,omitempty"`
	MeshPriority int `json:"mesh_priority,omitempty"`
	// PromptAffinity: it sends to a backend with PromptAffinity, so the
	// calling node reads each request's prompt and picks the node by its
	// prefix (consistent hashing with bounded loads), where that node's
	// picker picks the replica holding it.
	PromptAffinity bool `json:"prompt_affinity,omitempty"`
	// ReadsAnswers: the endpoint serves model traffic (it routes by model,
	// has a token quota, or sends to a load-aware backend), so the calling
	// node reads each answer's tokens and timing (wire/genai.go).
	ReadsAnswers bool `json:"reads_answers,omitempty"`
	// AffinityHeaders are those backends' session and model headers,
	// sorted: the route hashes them, in order, before the prompt.
	AffinityHeaders []string `json:"affinity_headers,omitempty"`
	// AffinityNodes are those backends' nodes, by name: where the calling
	// node's picker places each prefix (bounded loads over the nodes'
	// replicas, agent/picker/placement), so the nodes' caches hold what
	// they can. Sorted by backend.
	AffinityNodes []AffinityBackend `json:"affinity_nodes,omitempty"`
	// Picked are the backends it sends to (or mirrors to) whose replicas
	// an external picker picks, sorted by name.
	Picked []PickedBackend `json:"picked,omitempty"`
	// RateLimit, if set, is the token bucket each node's Envoy keeps for
	// the endpoint's requests (per value of its Header, if any).
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// GlobalRateLimit, if set, is the count every node's Envoy asks its
	// node's rate limit service about (wire.RateLimitDomain).
	GlobalRateLimit *GlobalRateLimit `json:"global_rate_limit,omitempty"`
	// TokenQuota, if set, is the model tokens every node's Envoy charges
	// answers against with the node's rate limit service, and checks
	// before each request.
	TokenQuota *TokenQuota `json:"token_quota,omitempty"`
	// TraceSampling, if set, is the share of the endpoint's requests
	// traced (percent) that come with no trace decision; set on every
	// endpoint when the mesh traces, and only then.
	TraceSampling *float64 `json:"trace_sampling,omitempty"`
}

// TokenQuota is an endpoint's quota of model tokens shared by every node:
// Tokens a Unit, per value of Header if set.
type TokenQuota struct {
	Tokens     int    `json:"tokens"`
	Unit       string `json:"unit"`
	Header     string `json:"header,omitempty"`
	FailClosed bool   `json:"fail_closed,omitempty"`
	// PerModel: each model its own quota (the request's model, which
	// model routing read from its body).
	PerModel bool `json:"per_model,omitempty"`
	// Input, Output and Cached weigh an answer's tokens
	// (meshspec.TokenWeights); all 0: it costs its total (Weighted).
	Input  float64 `json:"input_weight,omitempty"`
	Output float64 `json:"output_weight,omitempty"`
	Cached float64 `json:"cached_weight,omitempty"`
}

// Weighted reports whether an answer costs its tokens weighed by Input,
// Output and Cached, not its total.
func (q TokenQuota) Weighted() bool { return q.Input != 0 || q.Output != 0 || q.Cached != 0 }

// GlobalRateLimit is an endpoint's limit shared by every node: Requests
// a Unit (second, minute, hour, day), per value of Header or per client
// address if either is set; FailClosed refuses requests while the node's
// rate limit service cannot answer.
type GlobalRateLimit struct {
	Requests      int    `json:"requests"`
	Unit          string `json:"unit"`
	Header        string `json:"header,omitempty"`
	ClientAddress bool   `json:"client_address,omitempty"`
	FailClosed    bool   `json:"fail_closed,omitempty"`
}

// RateLimit is an endpoint's local rate limit: RequestsPerSecond tokens a
// second, up to Burst, per value of Header ("": one bucket).
type RateLimit struct {
	RequestsPerSecond int    `json:"requests_per_second"`
	Burst             int    `json:"burst"`
	Header            string `json:"header,omitempty"`
}

// AffinityBackend is a prompt-affinity backend's nodes, each by its
// inbound listener, sorted.
type AffinityBackend struct {
	Name  string      `json:"name"`
	Nodes []NodeShare `json:"nodes"`
}

// NodeShare is a node's share of a backend: its inbound listener
// (IP:port) and how many of the backend's replicas it runs, whatever
// their health (Envoy skips a node that has no healthy one).
type NodeShare struct {
	Inbound  string `json:"inbound"`
	Replicas int    `json:"replicas"`
}

// Headless reports whether e has no public route.
func (e Endpoint) Headless() bool { return e.Route == "" }

// Match sends requests whose header or cookie matches to Backend.
type Match struct {
	Header string `json:"header,omitempty"`
	Cookie string `json:"cookie,omitempty"`
	// One of Exact, Prefix and Regex (RE2) is set.
	Exact   string `json:"exact,omitempty"`
	Prefix  string `json:"prefix,omitempty"`
	Regex   string `json:"regex,omitempty"`
	Backend string `json:"backend"`
	// MeshOnly: only requests through the mesh listener match.
	MeshOnly bool `json:"mesh_only,omitempty"`
}

// Retry is what an endpoint adds to the mesh's retries.
type Retry struct {
	On            []string `json:"retry_on,omitempty"`
	Attempts      int      `json:"attempts,omitempty"`
	NonIdempotent bool     `json:"non_idempotent,omitempty"`
}

// Sticky names the header or the cookie whose hash picks the backend.
type Sticky struct {
	Header string `json:"header,omitempty"`
	Cookie string `json:"cookie,omitempty"`
}

// Models routes by model name: Field is the body's field that names it,
// and each model has its own split.
type Models struct {
	Field  string           `json:"field"`
	Models map[string]Split `json:"models"`
}

// Split is one model's traffic and shadows, and the model names its
// requests are rewritten to, by weight (the calling node's picker
// rewrites the body; only with mTLS, where the picker runs).
type Split struct {
	Traffic map[string]float64 `json:"traffic"`
	Shadows map[string]float64 `json:"shadows,omitempty"`
	Rewrite map[string]float64 `json:"rewrite,omitempty"`
}

// Backend returns dp's backend named name.
func (dp *DataPlane) Backend(name string) (Backend, bool) {
	return byName(dp.Backends, name, func(b Backend) string { return b.Name })
}

// Endpoint returns dp's endpoint named name.
func (dp *DataPlane) Endpoint(name string) (Endpoint, bool) {
	return byName(dp.Endpoints, name, func(e Endpoint) string { return e.Name })
}

// byName finds the item named name in list, sorted by name.
func byName[T any](list []T, name string, nameOf func(T) string) (T, bool) {
	i, ok := slices.BinarySearchFunc(list, name, func(x T, n string) int { return strings.Compare(nameOf(x), n) })
	if !ok {
		var zero T
		return zero, false
	}
	return list[i], true
}

// Equal reports whether a and b are the same backend, as translation
// reads it.
func (b Backend) Equal(o Backend) bool {
	return b.Name == o.Name && b.Reach == o.Reach && b.HTTP2 == o.HTTP2 && b.MaxConcurrent == o.MaxConcurrent &&
		b.Picked == o.Picked && b.PromptAware == o.PromptAware && b.PromptAffinity == o.PromptAffinity && b.SessionHeader == o.SessionHeader &&
		b.MaxModels == o.MaxModels && b.ModelHeader == o.ModelHeader && b.TenantHeader == o.TenantHeader && b.FirstByteTimeoutS == o.FirstByteTimeoutS &&
		equalPtr(b.Outlier, o.Outlier) && equalPtr(b.Picker, o.Picker) && slices.Equal(b.Replicas, o.Replicas)
}

// Equal reports whether e and o are the same endpoint, as translation
// reads it.
func (e Endpoint) Equal(o Endpoint) bool {
	return e.Name == o.Name && e.Route == o.Route && slices.Equal(e.Methods, o.Methods) &&
		maps.Equal(e.Traffic, o.Traffic) && maps.Equal(e.Shadows, o.Shadows) &&
		e.TimeoutS == o.TimeoutS && e.IdleTimeoutS == o.IdleTimeoutS && e.PerTryTimeoutS == o.PerTryTimeoutS && e.FirstByteTimeoutS == o.FirstByteTimeoutS &&
		slices.Equal(e.Match, o.Match) && e.Criticality == o.Criticality && e.Priority == o.Priority && e.MeshPriority == o.MeshPriority && e.PromptAffinity == o.PromptAffinity && e.ReadsAnswers == o.ReadsAnswers && slices.Equal(e.AffinityHeaders, o.AffinityHeaders) &&
		slices.EqualFunc(e.AffinityNodes, o.AffinityNodes, func(a, b AffinityBackend) bool { return a.Name == b.Name && slices.Equal(a.Nodes, b.Nodes) }) &&
		slices.EqualFunc(e.Picked, o.Picked, func(a, b PickedBackend) bool {
			return a.Name == b.Name && a.FailOpen == b.FailOpen && slices.Equal(a.Endpoints, b.Endpoints)
		}) &&
		equalPtr(e.RateLimit, o.RateLimit) && equalPtr(e.GlobalRateLimit, o.GlobalRateLimit) && equalPtr(e.TokenQuota, o.TokenQuota) && equalPtr(e.TraceSampling, o.TraceSampling) &&
		equalRetry(e.Retry, o.Retry) && equalPtr(e.Sticky, o.Sticky) && equalModels(e.Models, o.Models)
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func equalRetry(a, b *Retry) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.On, b.On) && a.Attempts == b.Attempts && a.NonIdempotent == b.NonIdempotent
}

func equalModels(a, b *Models) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Field == b.Field && maps.EqualFunc(a.Models, b.Models, func(x, y Split) bool {
		return maps.Equal(x.Traffic, y.Traffic) && maps.Equal(x.Shadows, y.Shadows) && maps.Equal(x.Rewrite, y.Rewrite)
	})
}
