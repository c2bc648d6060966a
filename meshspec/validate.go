package meshspec

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/wire"
)

// The ranges of the model's numbers and the lengths of its strings; each is
// checked by Validate, and docs/limits.md lists them all.
const (
	// MaxReplicas bounds a backend's replicas, static or scheduled, so one
	// backend with all its placements always fits one stored value.
	MaxReplicas = 1000
	// MaxConcurrentQueriesLimit bounds max_concurrent_queries; times
	// MaxReplicas it still fits Envoy's 32-bit circuit-breaker limits.
	MaxConcurrentQueriesLimit = 10000
	// MaxCPUs and MaxMemoryMB bound what one replica may ask of a node.
	MaxCPUs     = 1024
	MaxMemoryMB = 4 << 20 // 4 TiB
	// MinTargetInFlight and MaxTargetInFlight bound autoscaling's target.
	MinTargetInFlight = 0.01
	MaxTargetInFlight = 100000
	// MaxAutoscalingSeconds bounds autoscaling's periods and delays;
	// MinMetricsIntervalS is the shortest metrics interval.
	MaxAutoscalingSeconds = 86400
	MinMetricsIntervalS   = 0.1
	// MaxRouteBytes bounds a route; MaxMethods an endpoint's methods.
	MaxRouteBytes = 1024
	MaxMethods    = 16
	// MaxTrafficBackends and MaxShadows bound an endpoint's policies.
	MaxTrafficBackends = 256
	MaxShadows         = 16
	// MaxArgs, MaxEnv and MaxStringBytes bound a process spec.
	MaxArgs        = 256
	MaxEnv         = 256
	MaxStringBytes = 4096
	// MaxProblems is how many problems a ValidationError lists.
	MaxProblems = 50
)

// WeightTolerance is how far the weights of a traffic policy may sum from 1.
// Ray Serve's controller used numpy's isclose with the same absolute tolerance.
const WeightTolerance = 1e-8

// ReservedPrefix starts the names of servemesh's own Consul services and
// identities; no backend may take one (a backend named after a node's
// identity would have nodes fetch that node's key).
const ReservedPrefix = "servemesh-"

// namePattern is what backend and endpoint names may look like. Endpoint names
// double as host names inside the mesh, so they stay DNS-label-like.
var namePattern = regexp.MustCompile(NamePattern)

// NamePattern is namePattern's regular expression, for descriptions of
// the API (its OpenAPI schemas).
const NamePattern = `^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`

// routeSegment is what a route's path segments may contain: RFC 3986 unreserved
// characters and a few sub-delimiters, nothing that needs escaping.
var routeSegment = regexp.MustCompile(`^[A-Za-z0-9._~!$&'()*+,;=:@-]+$`)

var knownMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true,
	"CONNECT": true, "OPTIONS": true, "TRACE": true, "PATCH": true,
}

// ValidationError lists every problem found in a model. Each problem names the
// field it is about and says how to fix it.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems:\n  - %s", len(e.Problems), strings.Join(e.Problems, "\n  - "))
}

// ItemField is how a problem names the i-th item of one of a file's lists
// of named objects (list is "backends" or "endpoints"): by the name the
// user gave it (`endpoint "chat"`), or by its place where it has none or
// repeats an earlier item's (`endpoints[2]`, `endpoints[2] ("chat")`).
// checkShape names the same items the same way, to find where they are
// written.
func ItemField(list string, i int, name string, repeated bool) string {
	switch {
	case name == "":
		return fmt.Sprintf("%s[%d]", list, i)
	case repeated:
		return fmt.Sprintf("%s[%d] (%q)", list, i, name)
	}
	return fmt.Sprintf("%s %q", strings.TrimSuffix(list, "s"), name)
}

// problems collects a ValidationError's problems, keeping the first
// MaxProblems and counting the rest, so no input makes a long answer.
type problems struct {
	list    []string
	dropped int
}

func (p *problems) add(field, format string, args ...any) {
	if len(p.list) >= MaxProblems {
		p.dropped++
		return
	}
	p.list = append(p.list, field+": "+fmt.Sprintf(format, args...))
}

// merge adds the problems of err, a *ValidationError (other errors are
// added as one problem), each once.
func (p *problems) merge(err error) {
	if err == nil {
		return
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		ve = &ValidationError{Problems: []string{err.Error()}}
	}
	for _, problem := range ve.Problems {
		if slices.Contains(p.list, problem) {
			continue
		}
		if len(p.list) >= MaxProblems {
			p.dropped++
			continue
		}
		p.list = append(p.list, problem)
	}
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	list := p.list
	if p.dropped > 0 {
		list = append(list, fmt.Sprintf("... and %d more problems; fix these first", p.dropped))
	}
	return &ValidationError{Problems: list}
}

// IsValidationError reports whether err is (or wraps) a *ValidationError.
func IsValidationError(err error) bool {
	var ve *ValidationError
	return errors.As(err, &ve)
}

// Validate checks the model against every rule of the data plane and returns a
// *ValidationError listing all problems, or nil. It does not modify the model.
func (m *Model) Validate() error {
	var p problems
	backends := map[string]bool{}
	for i, b := range m.Backends {
		field := validateNamed(&p, "backend", i, b.Name, backends)
		validateBackend(&p, field, b)
	}

	endpoints := map[string]bool{}
	routes := map[string]string{}
	users := backendUsers(m)
	var endpointTracing []string
	for i, e := range m.Endpoints {
		field := validateNamed(&p, "endpoint", i, e.Name, endpoints)
		if !e.Headless() {
			if validateRoute(&p, field+".route", e.Route) {
				if owner, taken := routes[e.Route]; taken {
					p.add(field+".route", "route %q is already used by endpoint %q; choose another route or delete that endpoint", e.Route, owner)
				} else {
					routes[e.Route] = e.Name
				}
			}
		}
		validateMethods(&p, field+".methods", e.Methods)
		validateInference(&p, field, e, backends)
		validateRateLimit(&p, field, e.RateLimit, e.ModelRouting != nil)
		if e.Tracing != nil {
			endpointTracing = append(endpointTracing, field+".tracing")
			validatePercent(&p, field+".tracing.sampling_percent", e.Tracing.SamplingPercent)
		}
		validateTimeouts(&p, field, e)
		validateMatches(&p, field+".match", e.Match, backends)
		if e.Sticky != nil {
			validateKey(&p, field+".sticky", e.Sticky.Header, e.Sticky.Cookie)
		}
		if e.Retry != nil {
			validateRetry(&p, field+".retry", *e.Retry)
		}
		if e.Rollout != nil {
			validateRollout(&p, field+".rollout", e, backends, users)
		}
	}
	for i, n := range m.Nodes {
		if err := ValidateNode(n); err != nil {
			p.add(fmt.Sprintf("nodes[%d]", i), "%v", err)
		}
	}
	validateMesh(&p, m.Mesh, endpointTracing)
	return p.err()
}

// Limits of an endpoint's match rules.
const (
	MaxMatches       = 16
	MaxMatchValueLen = 100
)

var (
	headerName = regexp.MustCompile(`^[a-z0-9!#$%&'*+.^_|~-]{1,100}$`)
	cookieName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
)

// validateMatches checks an endpoint's match rules.
func validateMatches(p *problems, field string, rules []RequestMatch, backends map[string]bool) {
	if len(rules) > MaxMatches {
		p.add(field, "has %d rules; at most %d", len(rules), MaxMatches)
		return
	}
	for i, r := range rules {
		rf := fmt.Sprintf("%s[%d]", field, i)
		validateKey(p, rf, r.Header, r.Cookie)
		set := 0
		for _, v := range []string{r.Exact, r.Prefix, r.Regex} {
			if v != "" {
				set++
			}
			if len(v) > MaxMatchValueLen {
				p.add(rf, "matches a value of %d bytes; at most %d", len(v), MaxMatchValueLen)
			}
		}
		if set != 1 {
			p.add(rf, "gives %d of exact, prefix and regex; give one", set)
		}
		if r.Regex != "" {
			if _, err := regexp.Compile(r.Regex); err != nil {
				p.add(rf+".regex", "%q is not a regular expression (RE2): %v", r.Regex, err)
			}
		}
		if !backends[r.Backend] {
			p.add(rf+".backend", "%q is not a backend of the model; name one, or create it first", r.Backend)
		}
	}
}

// validateRetry checks an endpoint's retry policy.
func validateRetry(p *problems, field string, r RetryPolicy) {
	for i, on := range r.On {
		if !slices.Contains(RetryConditions, on) {
			p.add(fmt.Sprintf("%s.retry_on[%d]", field, i), "%q is not a retry condition; use one of %s", on, strings.Join(RetryConditions, ", "))
		}
	}
	if r.Attempts < 0 || r.Attempts > MaxRetryAttempts {
		p.add(field+".attempts", "is %d; set retries from 1 to %d, or leave it out for 3", r.Attempts, MaxRetryAttempts)
	}
}

// validateOutlier checks a backend's outlier detection.
func validateOutlier(p *problems, field string, o OutlierDetection) {
	for _, f := range []struct {
		name     string
		v, limit float64
	}{{"consecutive_5xx", float64(o.Consecutive5xx), 1000}, {"interval_s", o.IntervalS, 3600},
		{"base_ejection_s", o.BaseEjectionS, 86400}, {"max_ejection_percent", float64(o.MaxEjectionPercent), 100}} {
		if !(f.v >= 0 && f.v <= f.limit) {
			p.add(field+"."+f.name, "is %v; set it from 0 (the default) to %v", f.v, f.limit)
		}
	}
}

// validateKey checks a header or cookie name given as one of the two.
func validateKey(p *problems, field, header, cookie string) {
	switch {
	case header == "" && cookie == "":
		p.add(field, "names neither a header nor a cookie; name one")
	case header != "" && cookie != "":
		p.add(field, "names both a header and a cookie; name one")
	case header != "" && !headerName.MatchString(header):
		p.add(field+".header", "%q is not a header name; use lower-case letters, digits and - (such as x-canary)", header)
	case cookie != "" && !cookieName.MatchString(cookie):
		p.add(field+".cookie", "%q is not a cookie name; use letters, digits, - and _", cookie)
	}
}

// MaxTimeoutSeconds bounds an endpoint's timeouts: a day.
const MaxTimeoutSeconds = 86400

// validateTimeouts checks an endpoint's timeouts: each from 0 (none) to a
// day, and a try no longer than the whole request.
func validateTimeouts(p *problems, field string, e Endpoint) {
	for _, t := range []struct {
		name, zero string
		v          float64
	}{{"timeout_s", "none", e.TimeoutS}, {"idle_timeout_s", "Envoy's default of 5 minutes", e.IdleTimeoutS}, {"per_try_timeout_s", "none", e.PerTryTimeoutS}} {
		if !(t.v >= 0 && t.v <= MaxTimeoutSeconds) {
			p.add(field+"."+t.name, "is %v; set seconds from 0 (%s) to %d, such as 30 or 0.5", t.v, t.zero, MaxTimeoutSeconds)
		}
	}
	if e.TimeoutS > 0 && e.PerTryTimeoutS > e.TimeoutS {
		p.add(field+".per_try_timeout_s", "is %v, longer than the request's timeout_s of %v; a try cannot outlast its request: lower it, or raise timeout_s", e.PerTryTimeoutS, e.TimeoutS)
	}
}

// ValidateBackend checks one backend on its own: every rule of Validate
// that does not need the rest of the model. The controller runs it before
// any work the backend's numbers size, such as placing its replicas.
func ValidateBackend(b Backend) error {
	var p problems
	field := "backend"
	if b.Name != "" {
		field = fmt.Sprintf("backend %q", b.Name)
	}
	validateName(&p, field+".name", b.Name)
	validateBackend(&p, field, b)
	return p.err()
}

// validateNamed checks the name of the i-th backend or endpoint (kind) and
// that it is unique among seen, and returns the item's field path.
func validateNamed(p *problems, kind string, i int, name string, seen map[string]bool) string {
	field := ItemField(kind+"s", i, name, seen[name])
	validateName(p, field+".name", name)
	if seen[name] && name != "" {
		p.add(field+".name", "%s %q is defined twice; give each %s a unique name", kind, name, kind)
	}
	seen[name] = true
	return field
}

func validateName(p *problems, field, name string) {
	switch {
	case name == "":
		p.add(field, "is empty; set a name of letters, digits, '.', '_' or '-'")
	case !namePattern.MatchString(name):
		p.add(field, "%q is not a valid name; use 1 to 63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	}
}

func validateBackend(p *problems, field string, b Backend) {
	if strings.HasPrefix(strings.ToLower(b.Name), ReservedPrefix) {
		p.add(field+".name", "%q starts with %q, which is reserved for servemesh's own services and identities (%scontroller, %snode-<id>); choose another name",
			b.Name, ReservedPrefix, ReservedPrefix, ReservedPrefix)
	}
	if mcq := b.Config.MaxConcurrentQueries; mcq < 0 || mcq > MaxConcurrentQueriesLimit {
		p.add(field+".config.max_concurrent_queries", "is %d; set a number from 1 to %d, or leave it out for the default of %d",
			mcq, MaxConcurrentQueriesLimit, DefaultMaxConcurrentQueries)
	}
	validateUserConfig(p, field, b)
	if g := b.Config.GracefulShutdownTimeoutS; g < 0 || g > MaxGracefulShutdownTimeoutS || math.IsNaN(g) {
		p.add(field+".config.graceful_shutdown_timeout_s", "is %g; set the seconds a removed replica may finish its requests in flight, from 0 (the default of %d) to %d",
			g, DefaultGracefulShutdownTimeoutS, MaxGracefulShutdownTimeoutS)
	}
	if h := b.Config.HoldTimeoutS; h < 0 || h > MaxHoldTimeoutS || math.IsNaN(h) {
		p.add(field+".config.hold_timeout_s", "is %g; set the seconds a request may wait for a ready replica, from 0 (the default of %d) to %d",
			h, DefaultHoldTimeoutS, MaxHoldTimeoutS)
	}
	if f := b.Config.FirstByteTimeoutS; f < 0 || f > MaxFirstByteTimeoutS || math.IsNaN(f) {
		p.add(field+".config.first_byte_timeout_s", "is %g; set the seconds one try may wait for its answer to start before it is tried on another replica, up to %d, or 0 for no bound",
			f, MaxFirstByteTimeoutS)
	}
	if m := b.Config.MaxHeld; m < 0 || m > MaxMaxHeld {
		p.add(field+".config.max_held", "is %d; set how many requests a node may hold for the backend, from 1 to %d, or leave it out for the default of %d",
			m, MaxMaxHeld, DefaultMaxHeld)
	}
	if b.Process == nil {
		validateProcessOnly(p, field+".config", b)
	} else {
		validateSizing(p, field+".config", b.Config)
	}
	if len(b.Placements) > 2*MaxReplicas {
		p.add(field+".placements", "are %d; at most %d (running and draining) fit one backend", len(b.Placements), 2*MaxReplicas)
	}
	if len(b.Replicas) > MaxReplicas {
		p.add(field+".replicas", "lists %d replicas; at most %d fit one backend", len(b.Replicas), MaxReplicas)
	}
	validateSource(p, field, b)
	switch b.Protocol {
	case "", ProtocolHTTP1, ProtocolHTTP2, ProtocolGRPC:
	default:
		p.add(field+".protocol", "%q is not a protocol; use %q (the default), %q or %q", b.Protocol, ProtocolHTTP1, ProtocolHTTP2, ProtocolGRPC)
	}
	validateAutoscaling(p, field+".config", b)
	if o := b.Config.Outlier; o != nil {
		validateOutlier(p, field+".config.outlier", *o)
	}
	validateLoadAware(p, field+".config.load_aware", b)
	validateEndpointPicker(p, field+".config.endpoint_picker", b)
	seen := make(map[string]bool, len(b.Replicas))
	for j, r := range b.Replicas {
		// Field names are formatted only for problems: models hold many replicas.
		rf := func(leaf string) string { return fmt.Sprintf("%s.replicas[%d].%s", field, j, leaf) }
		key, reason := replicaAddress(r.Address)
		if r.Inbound != "" {
			key = r.Inbound + " " + key // loopback addresses repeat across nodes
			if err := CheckReplicaInbound(r); err != nil {
				p.add(rf("inbound"), "%s", err.Error())
			}
		}
		switch {
		case reason != "":
			p.add(rf("address"), "%.80q %s", r.Address, reason)
		case seen[key]:
			p.add(rf("address"), "%q is listed twice; list each replica once", r.Address)
		default:
			seen[key] = true
		}
		switch r.Health {
		case "", HealthHealthy, HealthUnhealthy, HealthDraining, HealthUnknown:
		default:
			p.add(rf("health"), "%q is not a health state; use %q, %q, %q or %q", r.Health, HealthHealthy, HealthUnhealthy, HealthDraining, HealthUnknown)
		}
	}
}

// validateRoute reports problems with a non-empty route and whether it is valid.
func validateRoute(p *problems, field, route string) bool {
	fix := "write a path such as \"/api\" or \"/models/v1\", or leave route out for a headless endpoint"
	if !strings.HasPrefix(route, "/") {
		p.add(field, "%q does not start with '/'; %s", route, fix)
		return false
	}
	if len(route) > MaxRouteBytes {
		p.add(field, "is %d bytes long; a route has at most %d", len(route), MaxRouteBytes)
		return false
	}
	if route == "/" {
		return true
	}
	if strings.HasSuffix(route, "/") {
		p.add(field, "%q ends with '/'; remove it (sub-paths are matched anyway)", route)
		return false
	}
	for _, seg := range strings.Split(route[1:], "/") {
		switch {
		case seg == "":
			p.add(field, "%q has an empty segment (\"//\"); %s", route, fix)
			return false
		case seg == "." || seg == "..":
			p.add(field, "%q has a %q segment; %s", route, seg, fix)
			return false
		case !routeSegment.MatchString(seg):
			p.add(field, "%q has characters that are not allowed in a route (spaces, '?', '#', '%%' or non-ASCII); %s", route, fix)
			return false
		}
	}
	return true
}

func validateMethods(p *problems, field string, methods []string) {
	if len(methods) > MaxMethods {
		p.add(field, "lists %d methods; list each of the %d HTTP methods at most once", len(methods), len(knownMethods))
		return
	}
	for i, m := range methods {
		if !knownMethods[strings.ToUpper(strings.TrimSpace(m))] {
			p.add(fmt.Sprintf("%s[%d]", field, i), "%q is not an HTTP method; use GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE or CONNECT", m)
		}
	}
}

func validateTraffic(p *problems, field string, traffic map[string]float64, backends map[string]bool) {
	if len(traffic) == 0 {
		p.add(field, "is empty; give at least one backend a weight, for example {my-backend: 1}")
		return
	}
	if len(traffic) > MaxTrafficBackends {
		p.add(field, "splits traffic over %d backends; at most %d", len(traffic), MaxTrafficBackends)
		return
	}
	sum := 0.0
	finite := true
	for _, name := range SortedKeys(traffic) {
		w := traffic[name]
		if !backends[name] {
			p.add(field+"."+name, "backend %q is not defined; define it under backends or remove it from the traffic policy", name)
		}
		switch {
		case math.IsNaN(w) || math.IsInf(w, 0):
			p.add(field+"."+name, "weight %v is not a number; weights are between 0 and 1", w)
			finite = false
		case w < 0:
			p.add(field+"."+name, "weight %v is negative; weights cannot be negative", w)
		}
		sum += w
	}
	if finite {
		checkWeightsSum(p, field, traffic, sum)
	}
}

// checkWeightsSum adds a problem of field if its weights do not sum to 1;
// weights written as percentages (summing to 100, as Istio's, Gateway
// API's and HTTPRoute's are) are told what to write instead.
func checkWeightsSum(p *problems, field string, weights map[string]float64, sum float64) {
	if math.Abs(sum-1) <= WeightTolerance {
		return
	}
	if math.Abs(sum/100-1) <= WeightTolerance {
		fractions := make([]string, 0, len(weights))
		for _, name := range SortedKeys(weights) {
			fractions = append(fractions, fmt.Sprintf("%s: %.10g", name, weights[name]/100))
		}
		p.add(field, "weights sum to 100, as percentages do; here weights are fractions that sum to 1: write %s", strings.Join(fractions, ", "))
		return
	}
	p.add(field, "weights sum to %.10g; they must sum to 1 (within %g), adjust them", sum, WeightTolerance)
}

func validateShadows(p *problems, field string, shadows map[string]float64, backends map[string]bool) {
	if len(shadows) > MaxShadows {
		p.add(field, "mirrors to %d backends; at most %d (each mirror is a copy of every request)", len(shadows), MaxShadows)
		return
	}
	for _, name := range SortedKeys(shadows) {
		v := shadows[name]
		if !backends[name] {
			p.add(field+"."+name, "backend %q is not defined; define it under backends or remove the shadow", name)
		}
		if math.IsNaN(v) || v < 0 || v > 1 {
			p.add(field+"."+name, "proportion %v is outside [0, 1]; 0.05 mirrors 5%% of requests, 0 removes the shadow", v)
		}
	}
}

// envName is what a process's environment variable may be called.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// serviceName is what an external backend's Consul service may be called.
var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$`)

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+#[0-9a-f]{6}$`)

// IsReplicaTag reports whether tag is a replica tag, <backend>#<6 hex
// digits>: safe to name a file after.
func IsReplicaTag(tag string) bool { return tagPattern.MatchString(tag) }

// validateSource checks where a backend's replicas come from: static
// addresses, a process agents run, or an external Consul service; one only.
// validateSizing checks the fields that size a process backend's replicas.
func validateSizing(p *problems, field string, c BackendConfig) {
	if c.NumReplicas < 0 || c.NumReplicas > MaxReplicas {
		p.add(field+".num_replicas", "is %d; set a number from 0 to %d", c.NumReplicas, MaxReplicas)
	}
	if math.IsNaN(c.CPUs) || c.CPUs < 0 || c.CPUs > MaxCPUs {
		p.add(field+".cpus", "is %v; set the CPUs one replica needs, from 0 to %d (0.5 is half a core)", c.CPUs, MaxCPUs)
	}
	if c.MemoryMB < 0 || c.MemoryMB > MaxMemoryMB {
		p.add(field+".memory_mb", "is %d; set the MiB of memory one replica needs, from 0 to %d", c.MemoryMB, MaxMemoryMB)
	}
	if len(c.Resources) > wire.MaxResources {
		p.add(field+".resources", "names %d resources; at most %d", len(c.Resources), wire.MaxResources)
	}
	for _, name := range SortedKeys(c.Resources) {
		if err := wire.CheckResource(name, c.Resources[name]); err != nil {
			p.add(field+".resources."+name, "%v", err)
		}
	}
}

// MaxUserConfigBytes bounds a backend's user_config.
const MaxUserConfigBytes = 64 << 10

// validateUserConfig checks a backend's user_config: bounded, and with a
// path where its replicas take it.
func validateUserConfig(p *problems, field string, b Backend) {
	u := b.Config.UserConfig
	switch {
	case len(u) == 0:
	case len(u) > MaxUserConfigBytes:
		p.add(field+".config.user_config", "is %d bytes of JSON; at most %d: keep large data in files the replicas read, and their names here", len(u), MaxUserConfigBytes)
	case !json.Valid(u):
		p.add(field+".config.user_config", "is not JSON; give any JSON value")
	case b.Process == nil:
		// validateProcessOnly says it
	case b.Process.ReconfigurePath == "":
		p.add(field+".config.user_config", "is set, but the backend's replicas have no process.reconfigure_path to take it at (the agent POSTs the JSON there); set one, such as \"/reconfigure\"")
	case b.Protocol == ProtocolGRPC:
		p.add(field+".config.user_config", "reaches replicas by an HTTP POST, and a gRPC backend's replicas serve gRPC; give the config in process.env or args instead")
	}
}

// validateProcessOnly refuses, on a backend whose replicas servemesh does
// not run, the fields that size the replicas it runs: they would be stored
// and change nothing.
func validateProcessOnly(p *problems, field string, b Backend) {
	kind, fix := "a backend of listed replicas", "list its replicas' addresses instead (backend update --replica, or replicas: in the file)"
	if b.External != nil {
		kind, fix = fmt.Sprintf("a backend of Consul service %q's instances", b.External.Service), "scale that service where it runs"
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"num_replicas", b.Config.NumReplicas != 0}, {"cpus", b.Config.CPUs != 0}, {"memory_mb", b.Config.MemoryMB != 0}, {"resources", len(b.Config.Resources) > 0}, {"user_config", len(b.Config.UserConfig) > 0}} {
		if f.set {
			p.add(field+"."+f.name, "is set on %s; servemesh does not run its replicas, so %s does not apply: %s, or give the backend a command", kind, f.name, fix)
		}
	}
}

func validateSource(p *problems, field string, b Backend) {
	sources := 0
	if len(b.Replicas) > 0 {
		sources++
	}
	if b.Process != nil {
		sources++
		validateProcess(p, field+".process", *b.Process)
	}
	if b.External != nil {
		sources++
		switch s := b.External.Service; {
		case !serviceName.MatchString(s):
			p.add(field+".external.service", "%q is not a Consul service name; use 1 to 255 letters, digits, '.', '_' or '-', starting with a letter or digit", s)
		case strings.HasPrefix(strings.ToLower(s), ReservedPrefix):
			// servemesh's own services (the controllers, nodes' agents,
			// backends' replicas): a backend of them would send a route's
			// requests to the controllers' API or another backend's
			// replicas, around their routes and limits.
			p.add(field+".external.service", "%q starts with %q, servemesh's own services (%scontroller, %snode-<id>, %sbackend-<name>); name a service of yours, or route to a servemesh backend by its name",
				s, ReservedPrefix, ReservedPrefix, ReservedPrefix, ReservedPrefix)
		}
	}
	if sources > 1 {
		p.add(field, "has more than one of replicas, process and external; a backend's replicas come from one source")
	}
	if b.Process == nil && len(b.Placements) > 0 {
		p.add(field+".placements", "are set on a backend without a process; only the controller places replicas of process backends")
	}
	seen := map[string]bool{}
	for i, pl := range b.Placements {
		pf := fmt.Sprintf("%s.placements[%d]", field, i)
		switch {
		case !tagPattern.MatchString(pl.Tag) || !strings.HasPrefix(pl.Tag, b.Name+"#"):
			p.add(pf+".tag", "%q is not a replica tag of backend %q (<backend>#<6 hex digits>)", pl.Tag, b.Name)
		case seen[pl.Tag]:
			p.add(pf+".tag", "%q is placed twice", pl.Tag)
		}
		seen[pl.Tag] = true
		if pl.Node == "" {
			p.add(pf+".node", "is empty")
		}
		if pl.State != Running && pl.State != Draining {
			p.add(pf+".state", "%q is not %q or %q", pl.State, Running, Draining)
		}
	}
}

func validateAutoscaling(p *problems, field string, b Backend) {
	a := b.Config.Autoscaling
	if a == nil {
		return
	}
	config := field
	field += ".autoscaling"
	if b.Process == nil {
		p.add(field, "is set on a backend without a process; only replicas servemesh runs can be autoscaled")
	}
	switch {
	case a.MinReplicas < 0:
		p.add(field+".min_replicas", "is %d; set 0 or more", a.MinReplicas)
	case a.MaxReplicas < 1 || a.MaxReplicas > MaxReplicas:
		p.add(field+".max_replicas", "is %d; set a number from 1 to %d", a.MaxReplicas, MaxReplicas)
	case a.MinReplicas > a.MaxReplicas:
		p.add(field+".min_replicas", "%d is above max_replicas %d; lower it or raise max_replicas", a.MinReplicas, a.MaxReplicas)
	case a.InitialReplicas != 0 && (a.InitialReplicas < a.MinReplicas || a.InitialReplicas > a.MaxReplicas):
		p.add(field+".initial_replicas", "%d is outside [min_replicas %d, max_replicas %d]; set one within, or leave it out to start at min_replicas", a.InitialReplicas, a.MinReplicas, a.MaxReplicas)
	case b.Config.NumReplicas < a.MinReplicas || b.Config.NumReplicas > a.MaxReplicas:
		p.add(config+".num_replicas", "%d is outside autoscaling's [%d, %d]; leave num_replicas out to start at initial_replicas (default min_replicas)", b.Config.NumReplicas, a.MinReplicas, a.MaxReplicas)
	}
	if t := a.TargetInFlight; !(t >= MinTargetInFlight && t <= MaxTargetInFlight) {
		p.add(field+".target_in_flight_requests", "is %v; set the requests in flight one replica should carry, from %g to %g (such as 2)",
			t, float64(MinTargetInFlight), float64(MaxTargetInFlight))
	}
	if t := a.TargetQueued; t != 0 && !(t >= MinTargetInFlight && t <= MaxTargetInFlight) {
		p.add(field+".target_queued_requests", "is %v; set the requests that may wait per replica, from %g to %g (such as 4), or leave it out to scale on requests in flight alone",
			t, float64(MinTargetInFlight), float64(MaxTargetInFlight))
	}
	if a.TargetQueued != 0 && b.Config.LoadAware == nil {
		p.add(field+".target_queued_requests", "needs load_aware: the nodes' pickers count the requests waiting")
	}
	for _, d := range []struct {
		name string
		v    float64
	}{{"metrics_interval_s", a.MetricsIntervalS}, {"look_back_period_s", a.LookBackPeriodS},
		{"upscale_delay_s", a.UpscaleDelayS}, {"downscale_delay_s", a.DownscaleDelayS}, {"downscale_to_zero_delay_s", a.DownscaleToZeroDelayS}} {
		if !(d.v >= 0 && d.v <= MaxAutoscalingSeconds) {
			p.add(field+"."+d.name, "is %v; set seconds from 0 (the default) to %d", d.v, MaxAutoscalingSeconds)
		}
	}
	if v := a.MetricsIntervalS; v > 0 && v < MinMetricsIntervalS {
		p.add(field+".metrics_interval_s", "is %v; set %g seconds or more, or 0 for the default", v, MinMetricsIntervalS)
	}
}

// validateProcess checks a process spec's strings and their sizes.
func validateProcess(p *problems, field string, spec ProcessSpec) {
	switch {
	case strings.TrimSpace(spec.Command) == "":
		p.add(field+".command", "is empty; name the program that runs one replica")
	case len(spec.Command) > MaxStringBytes:
		p.add(field+".command", "is %d bytes long; at most %d", len(spec.Command), MaxStringBytes)
	case !strings.HasPrefix(spec.Command, "/") || path.Clean(spec.Command) != spec.Command:
		p.add(field+".command", "%.80q is not a clean absolute path; name the program as nodes allow it, like \"/opt/model/serve\" (no '..', '.' or '//')", spec.Command)
	}
	if hp := spec.HealthPath; hp != "" && (!strings.HasPrefix(hp, "/") || len(hp) > MaxRouteBytes || strings.ContainsAny(hp, " ?#\r\n")) {
		p.add(field+".health_path", "%.64q is not a path; write it like \"/healthz\" (at most %d bytes), or leave it out to probe TCP", hp, MaxRouteBytes)
	}
	if rp := spec.ReconfigurePath; rp != "" && (!strings.HasPrefix(rp, "/") || len(rp) > MaxRouteBytes || strings.ContainsAny(rp, " ?#\r\n")) {
		p.add(field+".reconfigure_path", "%.64q is not a path; write it like \"/reconfigure\" (at most %d bytes)", rp, MaxRouteBytes)
	}
	if len(spec.Args) > MaxArgs {
		p.add(field+".args", "lists %d arguments; at most %d", len(spec.Args), MaxArgs)
	}
	for i, a := range spec.Args {
		if len(a) > MaxStringBytes {
			p.add(fmt.Sprintf("%s.args[%d]", field, i), "is %d bytes long; at most %d", len(a), MaxStringBytes)
		}
	}
	if len(spec.Env) > MaxEnv {
		p.add(field+".env", "sets %d variables; at most %d", len(spec.Env), MaxEnv)
	}
	for _, k := range SortedKeys(spec.Env) {
		switch {
		case !envName.MatchString(k):
			p.add(field+".env", "%.64q is not an environment variable name; use letters, digits and '_', not starting with a digit", k)
		case LoaderVariable(k):
			p.add(field+".env."+k, "makes the program load code it does not name (a library, module or startup file), which would run more than the command nodes allow; set it inside the command (a wrapper script the nodes allow) instead")
		case len(spec.Env[k]) > MaxStringBytes:
			p.add(field+".env."+k, "is %d bytes long; at most %d", len(spec.Env[k]), MaxStringBytes)
		}
	}
}

// loaderVariables make a program (its dynamic loader, shell or runtime)
// load and run code the command line does not name.
var loaderVariables = map[string]bool{
	"GCONV_PATH": true, "BASH_ENV": true, "ENV": true, "SHELLOPTS": true, "PS4": true,
	"NODE_OPTIONS": true, "NODE_PATH": true,
	"PYTHONPATH": true, "PYTHONHOME": true, "PYTHONSTARTUP": true, "PYTHONUSERBASE": true, "PYTHONWARNINGS": true, "PYTHONINSPECT": true,
	"PERL5LIB": true, "PERL5OPT": true, "PERLLIB": true, "RUBYOPT": true, "RUBYLIB": true,
	"JAVA_TOOL_OPTIONS": true, "_JAVA_OPTIONS": true, "JDK_JAVA_OPTIONS": true, "CLASSPATH": true,
}

// LoaderVariable reports whether an environment variable makes a program
// load code its command line does not name: LD_* and DYLD_* (the dynamic
// loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT) and the startup hooks of
// shells and language runtimes. A backend may not set one: it would run
// more than the command the nodes' operators allow.
func LoaderVariable(name string) bool {
	return strings.HasPrefix(name, "LD_") || strings.HasPrefix(name, "DYLD_") || loaderVariables[name]
}
