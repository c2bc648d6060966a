package meshspec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// DefaultMaxConcurrentQueries is the per-replica concurrency limit used when a
// backend's config does not set one (Ray Serve's historical default).
const DefaultMaxConcurrentQueries = 100

// DefaultMethods are the HTTP methods an endpoint accepts when it names none.
var DefaultMethods = []string{"GET"}

// Model is the whole desired state of a mesh.
type Model struct {
	Backends  []Backend  `json:"backends,omitempty"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Retiring are the backends deleted while their replicas finish the
	// requests they have in flight (long answer streams): every placement
	// draining, each dropped once drained, the backend with its last.
	// Users neither see nor name them; the data plane and the agents serve
	// them as they do the others (Served). A backend created again under a
	// retiring one's name takes its draining placements over.
	Retiring []Backend `json:"retiring,omitempty"`
	// Nodes are the nodes under maintenance (cordoned or drained).
	Nodes []NodeSpec `json:"nodes,omitempty"`
	// Mesh holds the settings of the whole mesh (tracing.go).
	Mesh *Mesh `json:"mesh,omitempty"`
}

// Backend is a named group of replicas that run one version of a service.
type Backend struct {
	// Name identifies the backend; traffic and shadow policies refer to it.
	Name string `json:"name"`
	// Replicas are the addresses that serve this backend: static ones a user
	// lists. For process and external backends they stay empty in the stored
	// state; the data plane takes theirs from Consul's catalog
	// (controlplane/dataplane's Replicas), beside the state.
	Replicas []Replica `json:"replicas,omitempty"`
	// Config tunes how the backend is served.
	Config BackendConfig `json:"config,omitempty"`
	// Protocol is how Envoy talks to the replicas: http1 (the default),
	// http2 (cleartext, h2c), or grpc (HTTP/2, and a replica's health is
	// the standard gRPC health service unless it has a health path).
	Protocol Protocol `json:"protocol,omitempty"`
	// Process, if set, is the command servemesh's agents run as this
	// backend's replicas: Config.NumReplicas of them, placed on nodes by the
	// controller. Such a backend lists no static Replicas.
	Process *ProcessSpec `json:"process,omitempty"`
	// External, if set, routes to a Consul service that something else
	// registers and runs; servemesh manages none of its processes.
	External *ExternalSpec `json:"external,omitempty"`
	// Placements are where the controller placed this backend's replicas.
	// The controller manages them; users do not set them.
	Placements []Placement `json:"placements,omitempty"`
}

// ProcessSpec is how to run one replica. In Args and Env values, ${PORT}
// and ${HOST} expand to the address the replica must listen on.
type ProcessSpec struct {
	// Command is the program, which the node's agent must allow
	// (--allow-command).
	Command string `json:"command"`
	// Args are its arguments, in order.
	Args []string `json:"args,omitempty"`
	// Env are environment variables it gets besides servemesh's own.
	Env map[string]string `json:"env,omitempty"`
	// HealthPath is probed over HTTP (2xx is healthy); empty probes TCP.
	HealthPath string `json:"health_path,omitempty"`
	// ReconfigurePath is where a replica takes its backend's user_config:
	// its agent POSTs the JSON there before the replica is first routed
	// to, and again whenever user_config changes, without a restart (Ray
	// Serve's reconfigure). A replica that does not answer 2xx is taken
	// out of rotation until it does.
	ReconfigurePath string `json:"reconfigure_path,omitempty"`
}

// UserConfig is a backend's user_config: any JSON value, kept in a
// canonical form (compact, objects' keys sorted, numbers as written) so
// that the same value written differently is the same config.
type UserConfig json.RawMessage

// UnmarshalJSON keeps b in canonical form; null is no config.
func (u *UserConfig) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		*u = nil
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return err
	}
	canon, err := json.Marshal(v) // maps marshal in key order
	if err != nil {
		return err
	}
	*u = canon
	return nil
}

// MarshalJSON writes the value (null when unset).
func (u UserConfig) MarshalJSON() ([]byte, error) {
	if len(u) == 0 {
		return []byte("null"), nil
	}
	return u, nil
}

// Version names the value: the first 12 hex digits of its SHA-256, ""
// when unset.
func (u UserConfig) Version() string {
	if len(u) == 0 {
		return ""
	}
	sum := sha256.Sum256(u)
	return hex.EncodeToString(sum[:6])
}

// ExternalSpec names a Consul service to route to.
type ExternalSpec struct {
	// Service is the Consul service's name.
	Service string `json:"service"`
}

// PlacementState says whether a placed replica should serve or drain.
type PlacementState string

// The states of a placement.
const (
	// Running replicas are started and kept running by their node's agent.
	Running PlacementState = "running"
	// Draining replicas get no new requests; their agent stops them after
	// the drain period, and the controller then removes the placement.
	Draining PlacementState = "draining"
)

// Placement is one replica's intent: which node runs it, and whether it
// serves or drains. Being part of the checkpointed state, a crash between
// deciding and doing loses nothing: recovery finishes the work.
type Placement struct {
	// Tag names the replica: "<backend>#<6 hex digits>", as in Ray Serve.
	Tag   string         `json:"tag"`
	Node  string         `json:"node"`
	State PlacementState `json:"state"`
	// Since is when the placement entered its state (Unix seconds).
	Since int64 `json:"since"`
	// Spec identifies the process spec the replica runs (SpecHash), so a
	// changed spec can be rolled out replica by replica.
	Spec string `json:"spec,omitempty"`
}

// SpecHash is a stable identifier of a process spec: 128 bits of its
// SHA-256, so no two specs share one in practice. It only tells replicas of
// an older spec from the current one; whether a change may run a new
// command is decided by comparing whole specs (see the controller).
func SpecHash(p *ProcessSpec) string {
	if p == nil {
		return ""
	}
	b, _ := json.Marshal(p) // maps marshal in key order: stable
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// legacySpecHashLen is the length of the 32-bit hashes placements stored
// before SpecHash grew to 128 bits.
const legacySpecHashLen = 8

// Runs reports whether the placed replica runs the spec whose SpecHash is
// hash. A placement stored before specs were recorded runs the current one,
// and one stored with a 32-bit hash runs it if that is hash's prefix, so an
// upgrade restarts no replica.
func (p Placement) Runs(hash string) bool {
	switch len(p.Spec) {
	case 0:
		return true
	case legacySpecHashLen:
		return strings.HasPrefix(hash, p.Spec)
	}
	return p.Spec == hash
}

// Managed reports whether servemesh's agents run the backend's replicas.
func (b Backend) Managed() bool { return b.Process != nil }

// Spec returns the backend without its controller-managed placements: what a
// user declares.
func (b Backend) Spec() Backend {
	b.Placements = nil
	return b
}

// BackendConfig holds the tunables of a backend.
type BackendConfig struct {
	// MaxConcurrentQueries is how many requests one replica serves at once.
	// Envoy's circuit breaker for the backend allows this many per replica.
	// Zero means DefaultMaxConcurrentQueries.
	MaxConcurrentQueries int `json:"max_concurrent_queries,omitempty"`
	// NumReplicas is how many replicas the scheduler should run for the
	// backend on servemesh's nodes. Static replicas (Backend.Replicas) are
	// served as listed whatever this says.
	NumReplicas int `json:"num_replicas,omitempty"`
	// CPUs and MemoryMB are what one replica needs of a node.
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	// Resources are the named devices one replica needs of a node besides
	// CPUs and memory ({gpu: 1}), as nodes offer them (agent --resource);
	// the replica gets the indexes of its own (wire.ResourceEnv).
	Resources map[string]int `json:"resources,omitempty"`
	// Outlier, if set, ejects replicas that keep failing.
	Outlier *OutlierDetection `json:"outlier,omitempty"`
	// UserConfig reaches every running replica without a restart, at its
	// process's ReconfigurePath (Ray Serve's user_config).
	UserConfig UserConfig `json:"user_config,omitempty"`
	// HoldTimeoutS is how long a node holds a request for the backend
	// while none of its replicas is ready (starting, restarting, scaled to
	// zero) before answering 503; zero means DefaultHoldTimeoutS.
	HoldTimeoutS float64 `json:"hold_timeout_s,omitempty"`
	// GracefulShutdownTimeoutS bounds how long a replica being removed
	// (scaled down, replaced, its node drained) keeps serving the requests
	// it has in flight, a model's long answer streams above all, after it
	// stops receiving new ones; it stops once they have ended. Zero means
	// DefaultGracefulShutdownTimeoutS (Ray Serve's graceful_shutdown_timeout_s).
	GracefulShutdownTimeoutS float64 `json:"graceful_shutdown_timeout_s,omitempty"`
	// MaxHeld bounds the requests a node holds for the backend at once;
	// beyond it, requests are answered 503 at once. Zero means
	// DefaultMaxHeld.
	MaxHeld int `json:"max_held,omitempty"`
	// FirstByteTimeoutS bounds, in seconds, how long one try of a request
	// waits for its answer to start: past it, the try is given up and the
	// request tried again on another replica (another node's first),
	// whatever its method, as a model server that accepts a request and
	// stalls would hold it until the endpoint's timeout (Envoy AI
	// Gateway's per-try idle time before the first token). Never once the
	// answer has started: a long token stream is not cut by it. A POST
	// tried again may have reached the stalled replica: set it where that
	// is safe, as a model's completion is. An endpoint's routes take it
	// when every backend they send to sets it (the largest of theirs). 0,
	// the default: no bound.
	FirstByteTimeoutS float64 `json:"first_byte_timeout_s,omitempty"`
	// Autoscaling, if set, lets the controller choose NumReplicas from the
	// backend's load (process backends only).
	Autoscaling *AutoscalingConfig `json:"autoscaling,omitempty"`
	// LoadAware, if set, picks the replicas by their load rather than by
	// least requests (model servers; see inference.go).
	LoadAware *LoadAware `json:"load_aware,omitempty"`
	// EndpointPicker, if set, has an external picker (the Endpoint Picker
	// Protocol's) choose each request's replica; not with LoadAware.
	EndpointPicker *EndpointPicker `json:"endpoint_picker,omitempty"`
}

// AutoscalingConfig is Ray Serve's autoscaling policy: keep about
// TargetInFlight requests in flight per replica, averaged over the look-back
// period, between MinReplicas and MaxReplicas, scaling up only after the
// need has lasted UpscaleDelayS and down only after DownscaleDelayS. Zero
// durations take the defaults (Ray Serve's).
type AutoscalingConfig struct {
	// MinReplicas is the fewest replicas (0 or more; 0 lets an idle
	// backend sleep, its next request held while one starts).
	MinReplicas int `json:"min_replicas"`
	// MaxReplicas is the most replicas, from 1 to 1,000.
	MaxReplicas int `json:"max_replicas"`
	// TargetInFlight is the requests in flight one replica should carry.
	TargetInFlight float64 `json:"target_in_flight_requests"`
	// MetricsIntervalS is how often the load is read, in seconds (default
	// 10).
	MetricsIntervalS float64 `json:"metrics_interval_s,omitempty"`
	// LookBackPeriodS is the window the load is averaged over, in seconds
	// (default 30).
	LookBackPeriodS float64 `json:"look_back_period_s,omitempty"`
	// UpscaleDelayS is how long a need for more replicas must last before
	// they are added, in seconds (default 30).
	UpscaleDelayS float64 `json:"upscale_delay_s,omitempty"`
	// DownscaleDelayS is how long a need for fewer must last before
	// replicas are removed, in seconds (default 600).
	DownscaleDelayS float64 `json:"downscale_delay_s,omitempty"`
	// TargetQueued, if positive, also scales a load-aware backend on its
	// queue depth: enough replicas that at most this many requests wait
	// per replica on average (in the nodes' pickers and the servers' own
	// queues, QueueMetric), whichever of the two targets needs more.
	TargetQueued float64 `json:"target_queued_requests,omitempty"`
	// InitialReplicas is how many replicas a new autoscaled backend starts
	// with (Ray Serve's initial_replicas); 0: MinReplicas.
	InitialReplicas int `json:"initial_replicas,omitempty"`
	// DownscaleToZeroDelayS is how long a need for no replica must last
	// before the last one goes (Ray Serve's downscale_to_zero_delay_s);
	// 0: DownscaleDelayS.
	DownscaleToZeroDelayS float64 `json:"downscale_to_zero_delay_s,omitempty"`
}

// StartReplicas is how many replicas a new autoscaled backend starts with.
func (a AutoscalingConfig) StartReplicas() int {
	if a.InitialReplicas == 0 {
		return a.MinReplicas
	}
	return a.InitialReplicas
}

// Autoscaling defaults, as in Ray Serve: scale down much slower than up.
const (
	DefaultMetricsIntervalS = 10
	DefaultLookBackPeriodS  = 30
	DefaultUpscaleDelayS    = 30
	DefaultDownscaleDelayS  = 600
)

// Effective returns the config with defaults filled in.
func (a AutoscalingConfig) Effective() AutoscalingConfig {
	orDefault(&a.MetricsIntervalS, DefaultMetricsIntervalS)
	orDefault(&a.LookBackPeriodS, DefaultLookBackPeriodS)
	orDefault(&a.UpscaleDelayS, DefaultUpscaleDelayS)
	orDefault(&a.DownscaleDelayS, DefaultDownscaleDelayS)
	orDefault(&a.DownscaleToZeroDelayS, a.DownscaleDelayS)
	return a
}

// orDefault sets *v to d if it is zero: unset.
func orDefault[T int | float64](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// WithoutProcessOnlyFields returns b without the fields that size the
// replicas servemesh runs if b has none to run: values older versions
// accepted there and which never had an effect.
func (b Backend) WithoutProcessOnlyFields() Backend {
	if b.Process == nil {
		b.Config.NumReplicas, b.Config.CPUs, b.Config.MemoryMB, b.Config.Resources, b.Config.UserConfig = 0, 0, 0, nil, nil
	}
	return b
}

// Protocol is how Envoy talks to a backend's replicas.
type Protocol string

// The protocols of a backend.
const (
	ProtocolHTTP1 Protocol = "http1"
	ProtocolHTTP2 Protocol = "http2"
	ProtocolGRPC  Protocol = "grpc"
)

// HTTP2 reports whether Envoy talks HTTP/2 to the backend's replicas.
func (b Backend) HTTP2() bool { return b.Protocol == ProtocolHTTP2 || b.Protocol == ProtocolGRPC }

// Health is a replica's health as the data plane should treat it.
type Health string

// The health states of a replica.
const (
	// HealthHealthy replicas receive traffic. It is the default.
	HealthHealthy Health = "healthy"
	// HealthUnhealthy replicas receive no traffic.
	HealthUnhealthy Health = "unhealthy"
	// HealthDraining replicas receive no new requests; in-flight ones finish.
	HealthDraining Health = "draining"
	// HealthUnknown replicas answered when last heard of, and have not been
	// heard of since (their agent, their node or Consul stalled): they
	// receive requests only while no replica of their backend is healthy,
	// and a request that does not reach one is retried on another.
	HealthUnknown Health = "unknown"
)

// RedactedEnv stands for an environment value to callers that may not
// read it (without the exec scope); written back, it keeps the stored
// value.
const RedactedEnv = "<redacted: reading it needs the exec scope>"

// Replica is one serving instance of a backend.
type Replica struct {
	// Address is the replica's IP and port, such as "127.0.0.1:9001", or a
	// DNS name and port, such as "legacy.internal:8080", which Envoy
	// resolves.
	Address string `json:"address"`
	// Health defaults to healthy.
	Health Health `json:"health,omitempty"`
	// Node is the node whose agent runs the replica, for replicas servemesh
	// runs.
	Node string `json:"node,omitempty"`
	// Inbound, with mesh mTLS, is the IP:port of the inbound listener of the
	// replica's node: every node's Envoy reaches the replica through it, and
	// Address is then on that node's loopback, reachable only there.
	Inbound string `json:"inbound,omitempty"`
}

// Endpoint exposes a service to clients and splits its requests over backends.
type Endpoint struct {
	// Name identifies the endpoint. Inside the mesh it is also the host name
	// under which the endpoint is reached (`Host: <name>`).
	Name string `json:"name"`
	// Route is the HTTP path prefix served on the public listener; it matches
	// the path itself and its sub-paths ("/api" matches "/api" and "/api/x",
	// not "/apix"). Empty means headless: reachable only inside the mesh.
	Route string `json:"route,omitempty"`
	// Methods are the HTTP methods allowed; others get 405. Empty means GET.
	Methods []string `json:"methods,omitempty"`
	// Traffic maps backend names to weights; weights are >= 0 and sum to 1.
	Traffic map[string]float64 `json:"traffic"`
	// Shadows maps backend names to the proportion, in [0, 1], of this
	// endpoint's requests mirrored to them. Responses of mirrored requests are
	// discarded. A proportion of 0 is the same as no shadow.
	Shadows map[string]float64 `json:"shadows,omitempty"`
	// TimeoutS bounds a request, in seconds, from its start to the end of
	// its answer, retries included; 0, the default, sets no bound (as Ray
	// Serve: a generation may take minutes).
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// IdleTimeoutS ends a request, in seconds, when nothing has moved in
	// either direction for that long (a stream that stalls); 0 keeps
	// Envoy's default of 5 minutes.
	IdleTimeoutS float64 `json:"idle_timeout_s,omitempty"`
	// PerTryTimeoutS bounds each try of a request, in seconds; 0 sets no
	// bound. A try of an idempotent method (GET, HEAD, OPTIONS) that runs
	// out is retried on another replica; of another method, answered 504
	// (the request reached the replica). It must not exceed TimeoutS when
	// both are set.
	PerTryTimeoutS float64 `json:"per_try_timeout_s,omitempty"`
	// Match sends the requests that match a rule to the rule's backend,
	// before the weighted split; the first rule that matches wins.
	Match []RequestMatch `json:"match,omitempty"`
	// Retry widens what the endpoint retries beyond the requests that
	// reached no replica, which are always retried.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Sticky, if set, makes the split keep each client on one backend: the
	// requests that carry the same value of this header or cookie go to
	// the same backend, on every node, while many values still split by
	// the weights. Requests without it are split at random.
	Sticky *StickyKey `json:"sticky,omitempty"`
	// Rollout, if set, moves the endpoint from its primary backend to a
	// candidate in stages judged by live figures; while it is active it
	// sets the candidate's traffic, shadow and match rule (ApplyRollout).
	Rollout *Rollout `json:"rollout,omitempty"`
	// ModelRouting, if set, splits and mirrors requests by the model their
	// JSON body names, in place of Traffic and Shadows (inference.go).
	ModelRouting *ByModel `json:"model_routing,omitempty"`
	// Criticality is what the endpoint's requests are when they carry no
	// CriticalityHeader: critical (the default) or sheddable.
	Criticality Criticality `json:"criticality,omitempty"`
	// Priority is its requests' priority when they ask for none, and the
	// most they may ask for (flow.go): from -1000 to 1000, below 0
	// sheddable; 0 (unset) is by criticality, critical 0 and sheddable -1.
	Priority int `json:"priority,omitempty"`
	// RateLimit, if set, bounds the endpoint's requests (ratelimit.go).
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// Tracing, if set, overrides the mesh's sampling for the endpoint's
	// requests (tracing.go).
	Tracing *EndpointTracing `json:"tracing,omitempty"`
}

// RequestMatch is a rule of an endpoint: requests whose header (or
// cookie) matches go to Backend. Give one of Header and Cookie, and one of
// Exact, Prefix and Regex (RE2, matching the whole value).
type RequestMatch struct {
	// Header or Cookie names what the rule reads.
	Header string `json:"header,omitempty"`
	Cookie string `json:"cookie,omitempty"`
	// Exact, Prefix or Regex is how its value must read.
	Exact  string `json:"exact,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	Regex  string `json:"regex,omitempty"`
	// Backend takes the requests that match.
	Backend string `json:"backend"`
	// MeshOnly applies the rule only to requests from inside the mesh
	// (replicas, through their node's mesh listener); a public client's
	// request goes by the split whatever it carries. A rollout's header
	// stage is mesh-only, so no public client decides its verdict.
	MeshOnly bool `json:"mesh_only,omitempty"`
}

// RetryPolicy is what an endpoint retries on another replica, besides the
// requests that reached none (always retried).
type RetryPolicy struct {
	// On (retry_on) are the conditions: 5xx, gateway-error (502, 503, 504), 503,
	// reset (the connection broke after the request was sent), and the gRPC
	// statuses unavailable, cancelled, deadline-exceeded,
	// resource-exhausted, internal.
	On []string `json:"retry_on,omitempty"`
	// Attempts are the retries after the first try: 3 by default, at
	// most MaxRetryAttempts.
	Attempts int `json:"attempts,omitempty"`
	// NonIdempotent retries requests of every method on these conditions;
	// by default only GET, HEAD and OPTIONS are (a POST that reached a
	// replica may have had an effect).
	NonIdempotent bool `json:"non_idempotent,omitempty"`
}

// RetryConditions are the conditions a RetryPolicy may name.
var RetryConditions = []string{"5xx", "gateway-error", "503", "reset", "unavailable", "cancelled", "deadline-exceeded", "resource-exhausted", "internal"}

// MaxRetryAttempts bounds RetryPolicy.Attempts.
const MaxRetryAttempts = 10

// OutlierDetection ejects a replica that keeps failing for a while, as
// Envoy's outlier detection does.
type OutlierDetection struct {
	// Consecutive5xx ejects a replica after this many 5xx answers in a row
	// (5 by default).
	Consecutive5xx int `json:"consecutive_5xx,omitempty"`
	// IntervalS is how often ejections are decided (10 s by default);
	// BaseEjectionS how long a first ejection lasts (30 s by default; each
	// later one lasts longer).
	IntervalS     float64 `json:"interval_s,omitempty"`
	BaseEjectionS float64 `json:"base_ejection_s,omitempty"`
	// MaxEjectionPercent bounds the share of a backend's replicas ejected
	// at once (10 by default; at least one replica may always be ejected).
	MaxEjectionPercent int `json:"max_ejection_percent,omitempty"`
}

// StickyKey names what keeps a client on one backend: a header or a
// cookie (one of the two).
type StickyKey struct {
	// Header, or Cookie, is what a client's requests carry the same value
	// of.
	Header string `json:"header,omitempty"`
	Cookie string `json:"cookie,omitempty"`
}

// Headless reports whether the endpoint has no public route.
func (e Endpoint) Headless() bool { return e.Route == "" }

// AllowedMethods returns the endpoint's methods, upper-cased, de-duplicated
// and sorted, or DefaultMethods when it names none.
func (e Endpoint) AllowedMethods() []string {
	if len(e.Methods) == 0 {
		return slices.Clone(DefaultMethods)
	}
	out := make([]string, 0, len(e.Methods))
	for _, m := range e.Methods {
		out = append(out, strings.ToUpper(strings.TrimSpace(m)))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// Bounds of holding requests for a backend with no ready replica.
const (
	DefaultHoldTimeoutS = 30
	MaxHoldTimeoutS     = 3600
	DefaultMaxHeld      = 1000
	// MaxFirstByteTimeoutS bounds BackendConfig.FirstByteTimeoutS.
	MaxFirstByteTimeoutS = 3600
	MaxMaxHeld           = 100_000
)

// EffectiveHoldTimeout is how long a node holds a request for the backend.
func (c BackendConfig) EffectiveHoldTimeout() time.Duration {
	return secondsOr(c.HoldTimeoutS, DefaultHoldTimeoutS)
}

// secondsOr is s seconds, or def when s is zero (unset).
func secondsOr(s, def float64) time.Duration {
	if s == 0 {
		s = def
	}
	return time.Duration(s * float64(time.Second))
}

// Bounds of a removed replica's wait for its requests in flight.
const (
	DefaultGracefulShutdownTimeoutS = 600
	MaxGracefulShutdownTimeoutS     = 86_400
)

// EffectiveGracefulShutdown is how long a removed replica of the backend
// may serve its requests in flight.
func (c BackendConfig) EffectiveGracefulShutdown() time.Duration {
	return secondsOr(c.GracefulShutdownTimeoutS, DefaultGracefulShutdownTimeoutS)
}

// EffectiveMaxHeld is how many requests a node holds for the backend at once.
func (c BackendConfig) EffectiveMaxHeld() int {
	if c.MaxHeld == 0 {
		return DefaultMaxHeld
	}
	return c.MaxHeld
}

// EffectiveMaxConcurrentQueries returns the configured limit or the default.
func (c BackendConfig) EffectiveMaxConcurrentQueries() int {
	if c.MaxConcurrentQueries == 0 {
		return DefaultMaxConcurrentQueries
	}
	return c.MaxConcurrentQueries
}

// ByName reports whether the replica's address is a DNS name, not an IP.
func (r Replica) ByName() bool {
	host, _, err := net.SplitHostPort(r.Address)
	if err != nil {
		return false
	}
	_, err = netip.ParseAddr(host)
	return err != nil
}

// ResolvedByDNS reports whether any of the backend's replicas is named by
// DNS, so Envoy must resolve them.
func (b Backend) ResolvedByDNS() bool {
	return slices.ContainsFunc(b.Replicas, Replica.ByName)
}

// EffectiveHealth returns the replica's health, healthy when unset.
func (r Replica) EffectiveHealth() Health {
	if r.Health == "" {
		return HealthHealthy
	}
	return r.Health
}

// Backend returns the backend with the given name.
func (m *Model) Backend(name string) (Backend, bool) {
	for _, b := range m.Backends {
		if b.Name == name {
			return b, true
		}
	}
	return Backend{}, false
}

// SortedKeys returns a map's keys in order, for deterministic iteration.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Served are the backends whose replicas the data plane serves and the
// agents run: the backends, then the retiring ones.
func (m *Model) Served() []Backend {
	if len(m.Retiring) == 0 {
		return m.Backends
	}
	return append(slices.Clip(m.Backends), m.Retiring...)
}

// Clone returns a deep copy of m.
func Clone(m *Model) *Model {
	out := &Model{}
	for _, b := range m.Backends {
		out.Backends = append(out.Backends, cloneBackend(b))
	}
	for _, b := range m.Retiring {
		out.Retiring = append(out.Retiring, cloneBackend(b))
	}
	for _, e := range m.Endpoints {
		out.Endpoints = append(out.Endpoints, CloneEndpoint(e))
	}
	out.Nodes = slices.Clone(m.Nodes)
	for i, n := range out.Nodes {
		if n.Policy != nil {
			p := *n.Policy
			p.Resources, p.AllowedCommands = maps.Clone(p.Resources), slices.Clone(p.AllowedCommands)
			out.Nodes[i].Policy = &p
		}
	}
	out.Mesh = cloneMesh(m.Mesh)
	return out
}

// cloneBackend is a deep copy of b.
func cloneBackend(b Backend) Backend {
	b.Replicas = slices.Clone(b.Replicas)
	b.Placements = slices.Clone(b.Placements)
	if b.Process != nil {
		p := *b.Process
		p.Args = slices.Clone(p.Args)
		p.Env = maps.Clone(p.Env)
		b.Process = &p
	}
	if b.External != nil {
		x := *b.External
		b.External = &x
	}
	b.Config = cloneConfig(b.Config)
	return b
}

// cloneConfig is a deep copy of c.
func cloneConfig(c BackendConfig) BackendConfig {
	c.Resources = maps.Clone(c.Resources)
	if c.UserConfig != nil {
		c.UserConfig = slices.Clone(c.UserConfig)
	}
	if c.Autoscaling != nil {
		as := *c.Autoscaling
		c.Autoscaling = &as
	}
	if c.Outlier != nil {
		o := *c.Outlier
		c.Outlier = &o
	}
	if c.LoadAware != nil {
		l := *c.LoadAware
		l.Weights = maps.Clone(l.Weights)
		c.LoadAware = &l
	}
	if c.EndpointPicker != nil {
		e := *c.EndpointPicker
		c.EndpointPicker = &e
	}
	return c
}

// CloneEndpoint returns a deep copy of e.
func CloneEndpoint(e Endpoint) Endpoint {
	e.Methods = slices.Clone(e.Methods)
	e.Traffic = maps.Clone(e.Traffic)
	e.Shadows = maps.Clone(e.Shadows)
	e.Match = slices.Clone(e.Match)
	if e.Sticky != nil {
		k := *e.Sticky
		e.Sticky = &k
	}
	if e.Retry != nil {
		r := *e.Retry
		r.On = slices.Clone(r.On)
		e.Retry = &r
	}
	cloneEndpointRollout(&e)
	e.ModelRouting = cloneModelRouting(e.ModelRouting)
	e.RateLimit = cloneRateLimit(e.RateLimit)
	if e.Tracing != nil {
		t := *e.Tracing
		e.Tracing = &t
	}
	return e
}

// BackendsEqual reports whether two backends are the same, placements included.
func BackendsEqual(a, b Backend) bool {
	return a.Name == b.Name && a.Protocol == b.Protocol && slices.Equal(a.Replicas, b.Replicas) && configsEqual(a.Config, b.Config) &&
		ptrsEqual(a.Process, b.Process) && ptrsEqual(a.External, b.External) &&
		slices.Equal(a.Placements, b.Placements)
}

// configsEqual is reflect.DeepEqual of two configs, without reflection
// for what is set in most (translation compares every backend at every
// change).
func configsEqual(a, b BackendConfig) bool {
	return a.MaxConcurrentQueries == b.MaxConcurrentQueries && a.NumReplicas == b.NumReplicas && a.CPUs == b.CPUs &&
		a.MemoryMB == b.MemoryMB && a.HoldTimeoutS == b.HoldTimeoutS && a.MaxHeld == b.MaxHeld &&
		a.GracefulShutdownTimeoutS == b.GracefulShutdownTimeoutS && a.FirstByteTimeoutS == b.FirstByteTimeoutS &&
		bytes.Equal(a.UserConfig, b.UserConfig) && (a.UserConfig == nil) == (b.UserConfig == nil) &&
		maps.Equal(a.Resources, b.Resources) && (a.Resources == nil) == (b.Resources == nil) &&
		ptrsEqual(a.Outlier, b.Outlier) && ptrsEqual(a.Autoscaling, b.Autoscaling) && ptrsEqual(a.LoadAware, b.LoadAware) && ptrsEqual(a.EndpointPicker, b.EndpointPicker)
}

// ptrsEqual is reflect.DeepEqual of two pointers, without reflection when
// either is nil (as most are).
func ptrsEqual[T any](a, b *T) bool {
	return a == b || (a != nil && b != nil && reflect.DeepEqual(*a, *b))
}

// EndpointsEqual reports whether two endpoints are the same, treating unset
// methods as GET and a shadow of 0 as no shadow.
func EndpointsEqual(a, b Endpoint) bool {
	return a.Name == b.Name && a.Route == b.Route &&
		(slices.Equal(a.Methods, b.Methods) || slices.Equal(a.AllowedMethods(), b.AllowedMethods())) &&
		maps.Equal(a.Traffic, b.Traffic) &&
		(maps.Equal(a.Shadows, b.Shadows) || maps.Equal(nonZero(a.Shadows), nonZero(b.Shadows))) &&
		a.TimeoutS == b.TimeoutS && a.IdleTimeoutS == b.IdleTimeoutS && a.PerTryTimeoutS == b.PerTryTimeoutS &&
		slices.Equal(a.Match, b.Match) && ptrsEqual(a.Sticky, b.Sticky) && ptrsEqual(a.Retry, b.Retry) &&
		rolloutsEqual(a.Rollout, b.Rollout) && modelRoutingsEqual(a.ModelRouting, b.ModelRouting) &&
		a.EffectiveCriticality() == b.EffectiveCriticality() && a.Priority == b.Priority && rateLimitsEqual(a.RateLimit, b.RateLimit) &&
		ptrsEqual(a.Tracing, b.Tracing)
}

func nonZero(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
