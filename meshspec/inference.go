package meshspec

import (
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/wire"
)

// Serving model traffic: what the Gateway API Inference Extension adds to a
// gateway, as settings of servemesh's backends and endpoints.
//
//   - A backend's LoadAware setting has the node in front of each replica
//     pick the replica by its load (and report the node's load to the
//     callers, which weigh nodes by it), and shed sheddable requests when
//     every replica there is saturated.
//   - An endpoint's ModelRouting chooses the split, and the shadows, by the
//     model a request's JSON body names.
//   - An endpoint's Criticality is what its requests are when they say
//     nothing (CriticalityHeader).

// LoadAware picks a backend's replicas by their load: the requests each has
// in flight (counted by its node, which every request to it crosses), how
// long it takes to answer, and, when MetricsPath is set, the queue and
// KV-cache use the server itself reports. Its replicas must be run by
// servemesh's agents (a process backend) in the mesh's default mTLS mode.
type LoadAware struct {
	// MetricsPath is where the replica serves Prometheus metrics (vLLM:
	// /metrics); empty reads none.
	MetricsPath string `json:"metrics_path,omitempty"`
	// QueueMetric is the gauge of requests waiting in the server
	// (vLLM: vllm:num_requests_waiting); RunningMetric of those it is
	// running (vllm:num_requests_running); KVCacheMetric of the share of
	// its KV cache in use, from 0 to 1 (vllm:kv_cache_usage_perc; a
	// server that exports only vLLM's deprecated name for it,
	// vllm:gpu_cache_usage_perc, is read by that one, and the other way
	// round: KVCacheMetricFallback). Empty names are not read.
	QueueMetric   string `json:"queue_metric,omitempty"`
	RunningMetric string `json:"running_metric,omitempty"`
	KVCacheMetric string `json:"kv_cache_metric,omitempty"`
	// QueueLimit is how many waiting requests (QueueMetric) saturate a
	// replica; 0: only max_concurrent_queries in flight does.
	QueueLimit int `json:"queue_limit,omitempty"`
	// KVCacheLimit is the KV-cache use that saturates a replica (0.95 by
	// default when KVCacheMetric is set).
	KVCacheLimit float64 `json:"kv_cache_limit,omitempty"`
	// PromptAffinity has calling nodes choose the node by the prefix of
	// each request's prompt (consistent hashing, each node's load bounded
	// at 1.5 times the average) rather than by the nodes' load reports, so
	// that a prefix reaches the node whose replica holds it in cache. On
	// every node the picker prefers such a replica anyway; this carries
	// it across nodes, for workloads of long shared prompts. Not for gRPC.
	PromptAffinity bool `json:"prompt_affinity,omitempty"`
	// PrefixCacheTokens is how many tokens each replica's prefix (KV)
	// cache holds: each node's picker expects a replica to hold only the
	// prompts it sent it lately that fit there (the Inference Extension's
	// lruCapacityPerServer, in tokens), so a prompt its home has evicted
	// goes where it is still held. 0: what the server's metrics say
	// (vLLM's vllm:cache_config_info, SGLang's
	// sglang:max_total_num_tokens; with MetricsPath), else 262,144
	// (agent/picker/prefix.DefaultIndexBlocks).
	PrefixCacheTokens int `json:"prefix_cache_tokens,omitempty"`
	// SessionHeader names the request header that names a conversation
	// (say x-session-id): each node's picker keeps a conversation on the
	// replica that served it while that one is ready and not saturated,
	// and with PromptAffinity calling nodes hash it, before the prompt, to
	// pick the node.
	SessionHeader string `json:"session_header,omitempty"`
	// MaxModelsPerReplica, if positive, has each replica serve up to that
	// many models it loads on demand (Ray Serve's
	// max_num_models_per_replica): each node's picker prefers a replica
	// with the request's model loaded, then one with room for it. The
	// model is the request's ModelHeader (Ray Serve's
	// serve_multiplexed_model_id by default), else its body's "model";
	// with PromptAffinity calling nodes hash it first to pick the node.
	MaxModelsPerReplica int    `json:"max_models_per_replica,omitempty"`
	ModelHeader         string `json:"model_header,omitempty"`
	// Flow control (flow.go): while the replicas on a node are saturated,
	// requests wait there by priority, tenants taking turns.
	// TenantHeader names the request header that names its tenant (say
	// x-tenant-id); empty: one tenant, first come first served. MaxQueued
	// is how many may wait on one node (default DefaultMaxQueued);
	// QueueTimeoutS how long one may wait (default DefaultQueueTimeoutS),
	// then it is answered 429.
	TenantHeader  string  `json:"tenant_header,omitempty"`
	MaxQueued     int     `json:"max_queued,omitempty"`
	QueueTimeoutS float64 `json:"queue_timeout_s,omitempty"`
	// RefuseLate has each node's picker answer 429 at once a request that
	// states a time to first token (TTFTObjectiveHeader, from inside the
	// mesh) it cannot meet: its replicas' typical time to first byte is
	// longer, or it waited past it. Without it such a request is served
	// late. Waiting requests of one priority are served earliest deadline
	// first either way.
	RefuseLate bool `json:"refuse_late,omitempty"`
	// TTFTBudgetMs turns on token load, llm-d's "sticky until
	// saturated": each node's picker counts each replica's queued
	// prefill (the uncached prompt tokens, by its own prefix index, of
	// the requests it sent there that have had no first byte), measures
	// the replica's prefill rate from its own cold prefills (again when
	// the backend's process or user_config changes), and a prompt's
	// home, its conversation's or its model's replica keeps a request
	// only while that queue and the request's own tokens would be
	// prefilled within this many milliseconds, or no other replica with
	// no prefill queued would prefill it sooner; past it the affinity is
	// released to the one of those that would prefill it soonest (the
	// token_load scorer counts the same wait in every replica's cost).
	// 0: off. From 1 to MaxTTFTBudgetMs.
	TTFTBudgetMs int `json:"ttft_budget_ms,omitempty"`
	// Weights weigh the picker's scorers (agent/picker/scoring's
	// pipeline), by name: queue (requests pending), ttfb (time to first
	// byte), kv_cache, prefix (the prompt held in cache), model (the
	// request's model to load) and token_load (queued prefill, with
	// TTFTBudgetMs). Each is a factor of a replica's cost,
	// raised to its weight: 1, the default, is as is; 0 leaves it out; 2
	// counts it twice. From 0 to MaxScorerWeight.
	Weights map[string]float64 `json:"weights,omitempty"`
}

// ScorerNames are the picker's scorers that LoadAware.Weights may weigh
// (agent/picker/scoring.Scorers, whose test holds the two lists alike).
var ScorerNames = []string{"queue", "ttfb", "kv_cache", "prefix", "model", "token_load"}

// MaxTTFTBudgetMs bounds LoadAware.TTFTBudgetMs: ten minutes.
const MaxTTFTBudgetMs = 600000

// MaxScorerWeight bounds a scorer's weight.
const MaxScorerWeight = 10

// TTFTObjectiveHeader carries the time to first token a request aims for,
// in milliseconds (LoadAware.RefuseLate).
const TTFTObjectiveHeader = wire.TTFTObjectiveHeader

// DefaultModelHeader is LoadAware.ModelHeader's default, Ray Serve's.
const DefaultModelHeader = "serve_multiplexed_model_id"

// PrefixCacheTokensLimit bounds LoadAware.PrefixCacheTokens (and what the
// picker takes from a server's report).
const PrefixCacheTokensLimit = 4194304

// MaxModelsPerReplicaLimit bounds LoadAware.MaxModelsPerReplica.
const MaxModelsPerReplicaLimit = 1000

// EffectiveModelHeader is the header that names a request's model, or ""
// when the backend's replicas do not multiplex models.
func (l LoadAware) EffectiveModelHeader() string {
	switch {
	case l.MaxModelsPerReplica <= 0:
		return ""
	case l.ModelHeader == "":
		return DefaultModelHeader
	}
	return l.ModelHeader
}

// vLLM's gauge of KV-cache use, by its current name and by the one it
// deprecated (and no longer exports by default).
const (
	VLLMKVCacheMetric           = "vllm:kv_cache_usage_perc"
	VLLMKVCacheMetricDeprecated = "vllm:gpu_cache_usage_perc"
)

// VLLMLoRAMetric is vLLM's gauge of the adapters its requests use: a
// series per reading, valued by when, labelled running_lora_adapters and
// waiting_lora_adapters (comma-separated names). The picker reads it, for
// a backend whose replicas load models on demand, where a server exports
// it.
const VLLMLoRAMetric = "vllm:lora_requests_info"

// KVCacheMetricFallback is the name read when a server exports no gauge
// named name: vLLM's other name for it, or "" for any other name.
func KVCacheMetricFallback(name string) string {
	switch name {
	case VLLMKVCacheMetric:
		return VLLMKVCacheMetricDeprecated
	case VLLMKVCacheMetricDeprecated:
		return VLLMKVCacheMetric
	}
	return ""
}

// LoadAwarePatch sets a backend's load-aware setting, or with Off, removes
// it (an empty LoadAware is a setting: picked by load, no metrics read).
type LoadAwarePatch struct {
	Off bool `json:"off,omitempty"`
	LoadAware
}

// DefaultKVCacheLimit is LoadAware.KVCacheLimit's default.
const DefaultKVCacheLimit = 0.95

// EffectiveKVCacheLimit is the KV-cache use that saturates a replica.
func (l LoadAware) EffectiveKVCacheLimit() float64 {
	if l.KVCacheLimit == 0 {
		return DefaultKVCacheLimit
	}
	return l.KVCacheLimit
}

// ByModel routes an endpoint's requests by the model their JSON body
// names (the OpenAI API's "model"): each model has its own split and
// shadows. A request whose body names no model is answered 400, one naming
// a model not listed 404. Bodies are buffered to be read, up to
// MaxModelBodyBytes (413 beyond).
type ByModel struct {
	// Field is the body's top-level field that names the model; "model"
	// by default.
	Field string `json:"field,omitempty"`
	// Models are the split and shadows of each model name.
	Models map[string]TrafficPolicy `json:"models"`
}

// TrafficPolicy is one model's traffic and shadow policies, as an
// endpoint's own, and the model names its requests are rewritten to.
type TrafficPolicy struct {
	// Traffic splits the model's requests over backends by weight
	// (summing to 1); Shadows mirrors a proportion of them to others.
	Traffic map[string]float64 `json:"traffic"`
	Shadows map[string]float64 `json:"shadows,omitempty"`
	// Rewrite, if set, splits the model's requests over the model names
	// it lists, by weight (summing to 1), as Traffic splits them over
	// backends: the
	// calling node rewrites the body's model field to the name drawn
	// (the Gateway API Inference Extension's InferenceModelRewrite), so
	// two adapters of one pool, say, are tried side by side under one
	// public name. A name may be the model's own. Served where the mesh
	// runs mTLS (the calling node's picker rewrites it).
	Rewrite map[string]float64 `json:"rewrite,omitempty"`
}

// MaxRewriteTargets bounds the names a model's requests are rewritten to.
const MaxRewriteTargets = 16

// DefaultModelField is ByModel.Field's default.
const DefaultModelField = wire.DefaultModelField

// MaxModelBodyBytes is the largest body of a model-routed request: each
// node's Envoy buffers it whole to read the model (its per-connection
// buffer limit, 1 MiB).
const MaxModelBodyBytes = 1 << 20

// EffectiveField is the body field that names the model.
func (r ByModel) EffectiveField() string {
	if r.Field == "" {
		return DefaultModelField
	}
	return r.Field
}

// Criticality is how a request fares when its backend is saturated.
type Criticality string

// The criticalities of a request.
const (
	// Critical requests wait for a replica when all are saturated.
	Critical Criticality = wire.Critical
	// Sheddable requests are answered 429 with Retry-After when every
	// replica of a load-aware backend on the node they reach is saturated.
	Sheddable Criticality = wire.Sheddable
)

// CriticalityHeader carries a request's criticality; without it, the
// request is its endpoint's Criticality.
const CriticalityHeader = wire.CriticalityHeader

// Limits of an endpoint's model routing.
const (
	MaxModels       = 256
	MaxModelNameLen = 256
)

// modelField is what a model field may be called: a JSON key without
// spaces or quotes.
var modelField = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// metricName is a Prometheus metric name (vLLM's have colons).
var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$`)

// UsedBackends are the backends an endpoint sends to: in its traffic, its
// shadows, its match rules and its models' traffic and shadows.
func (e Endpoint) UsedBackends() map[string]bool {
	out := map[string]bool{}
	for b := range e.Traffic {
		out[b] = true
	}
	for b, p := range e.Shadows {
		if p > 0 {
			out[b] = true
		}
	}
	for _, m := range e.Match {
		out[m.Backend] = true
	}
	if e.ModelRouting != nil {
		for _, t := range e.ModelRouting.Models {
			for b := range t.Traffic {
				out[b] = true
			}
			for b, p := range t.Shadows {
				if p > 0 {
					out[b] = true
				}
			}
		}
	}
	return out
}

// RoutesTo reports whether the endpoint sends requests to backend other
// than as one of its own shadows: by its traffic, a match rule, or a
// model's traffic or shadows.
func (e Endpoint) RoutesTo(backend string) bool {
	if _, ok := e.Traffic[backend]; ok {
		return true
	}
	for _, m := range e.Match {
		if m.Backend == backend {
			return true
		}
	}
	if e.ModelRouting != nil {
		for _, t := range e.ModelRouting.Models {
			if _, ok := t.Traffic[backend]; ok {
				return true
			}
			if p := t.Shadows[backend]; p > 0 {
				return true
			}
		}
	}
	return false
}

// validateLoadAware checks a backend's load_aware setting.
func validateLoadAware(p *problems, field string, b Backend) {
	l := b.Config.LoadAware
	if l == nil {
		return
	}
	// Replicas of another source: an external service, or listed ones.
	if b.Process == nil && (b.External != nil || len(b.Replicas) > 0) {
		p.add(field, "needs replicas servemesh's agents run (a process backend): the node in front of each replica picks it; remove load_aware or give the backend a process")
	}
	if l.MetricsPath != "" && (!strings.HasPrefix(l.MetricsPath, "/") || len(l.MetricsPath) > MaxRouteBytes || strings.ContainsAny(l.MetricsPath, " ?#")) {
		p.add(field+".metrics_path", "%.80q is not a path; write one such as /metrics", l.MetricsPath)
	}
	for name, v := range map[string]string{"queue_metric": l.QueueMetric, "running_metric": l.RunningMetric, "kv_cache_metric": l.KVCacheMetric} {
		if v == "" {
			continue
		}
		if !metricName.MatchString(v) {
			p.add(field+"."+name, "%.80q is not a Prometheus metric name; write one such as vllm:num_requests_waiting", v)
		}
		if l.MetricsPath == "" {
			p.add(field+"."+name, "is read from the replicas' metrics: set metrics_path too (vLLM: /metrics)")
		}
	}
	if h := l.SessionHeader; h != "" && (!headerName.MatchString(h) || strings.HasPrefix(h, "x-servemesh-") || strings.HasPrefix(h, ":")) {
		p.add(field+".session_header", "%.80q is not a header of the clients' own; name a lower-case header such as x-session-id", h)
	}
	if l.MaxModelsPerReplica < 0 || l.MaxModelsPerReplica > MaxModelsPerReplicaLimit {
		p.add(field+".max_models_per_replica", "is %d; set the models one replica holds at once, from 1 to %d, or 0 for one model", l.MaxModelsPerReplica, MaxModelsPerReplicaLimit)
	}
	if l.PrefixCacheTokens < 0 || l.PrefixCacheTokens > PrefixCacheTokensLimit {
		p.add(field+".prefix_cache_tokens", "is %d; set the tokens one replica's prefix (KV) cache holds, from 1 to %d (vLLM logs it at start as its KV cache size), or 0 to read it from the server's metrics", l.PrefixCacheTokens, PrefixCacheTokensLimit)
	}
	if h := l.ModelHeader; h != "" && (l.MaxModelsPerReplica == 0 || !headerName.MatchString(h) || strings.HasPrefix(h, "x-servemesh-")) {
		p.add(field+".model_header", "%.80q: name a lower-case header of the clients' own (default %s), with max_models_per_replica set", h, DefaultModelHeader)
	}
	if l.PromptAffinity && b.HTTP2() {
		p.add(field+".prompt_affinity", "is for HTTP/1 model servers: a %s stream's prompt is not read before it starts; remove prompt_affinity", b.Protocol)
	}
	if l.QueueLimit < 0 || l.QueueLimit > MaxConcurrentQueriesLimit {
		p.add(field+".queue_limit", "is %d; set the waiting requests that saturate a replica, from 1 to %d, or 0 to go by max_concurrent_queries alone", l.QueueLimit, MaxConcurrentQueriesLimit)
	}
	if l.QueueLimit > 0 && l.QueueMetric == "" {
		p.add(field+".queue_limit", "needs queue_metric: the limit applies to the queue the server reports")
	}
	if k := l.KVCacheLimit; math.IsNaN(k) || k < 0 || k > 1 {
		p.add(field+".kv_cache_limit", "is %v; set a share of the KV cache from 0 to 1 (0.9 is 90%%), or leave it out for %v", k, DefaultKVCacheLimit)
	}
	if l.TTFTBudgetMs < 0 || l.TTFTBudgetMs > MaxTTFTBudgetMs {
		p.add(field+".ttft_budget_ms", "is %d; set the prefill a replica may have queued and keep a prompt's affinity, in milliseconds from 1 to %d (llm-d's sticky until saturated; say 500), or 0 for none", l.TTFTBudgetMs, MaxTTFTBudgetMs)
	}
	validateFlowControl(p, field, *l)
	validateWeights(p, field+".weights", l.Weights)
}

// validateWeights checks the picker's scorers' weights.
func validateWeights(p *problems, field string, w map[string]float64) {
	if len(w) > len(ScorerNames) {
		p.add(field, "names %d scorers; the picker has %d: %s", len(w), len(ScorerNames), strings.Join(ScorerNames, ", "))
		return
	}
	for _, name := range SortedKeys(w) {
		v := w[name]
		switch {
		case !slices.Contains(ScorerNames, name):
			p.add(field, "%.80q is not a scorer of the picker; weigh %s", name, strings.Join(ScorerNames, ", "))
		case math.IsNaN(v) || v < 0 || v > MaxScorerWeight:
			p.add(field+"."+name, "is %v; set a weight from 0 (left out) to %d, or leave it out for 1", v, MaxScorerWeight)
		}
	}
}

// validateInference checks an endpoint's model routing and criticality.
func validateInference(p *problems, field string, e Endpoint, backends map[string]bool) {
	switch e.Criticality {
	case "", Critical, Sheddable:
	default:
		p.add(field+".criticality", "%q is not a criticality; use %q (the default) or %q", e.Criticality, Critical, Sheddable)
	}
	validatePriority(p, field, e)
	r := e.ModelRouting
	if r == nil {
		validateTraffic(p, field+".traffic", e.Traffic, backends)
		validateShadows(p, field+".shadows", e.Shadows, backends)
		return
	}
	field += ".model_routing"
	if len(e.Traffic) > 0 || len(nonZero(e.Shadows)) > 0 || len(e.Match) > 0 || e.Sticky != nil || e.Rollout != nil {
		p.add(field, "splits by model: give each model its traffic and shadows under model_routing.models, and leave the endpoint's own traffic, shadows, match, sticky and rollout out")
	}
	if r.Field != "" && !modelField.MatchString(r.Field) {
		p.add(field+".field", "%.80q is not a JSON field name of letters, digits, '_', '.' or '-' (at most 64); the default is %q", r.Field, DefaultModelField)
	}
	if len(r.Models) == 0 {
		p.add(field+".models", "is empty; give at least one model its traffic, for example {llama-3-8b: {traffic: {llama-a: 1}}}")
	}
	if len(r.Models) > MaxModels {
		p.add(field+".models", "lists %d models; at most %d", len(r.Models), MaxModels)
		return
	}
	for _, name := range SortedKeys(r.Models) {
		mf := field + ".models." + name
		if name == "" || len(name) > MaxModelNameLen || strings.ContainsFunc(name, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			p.add(mf, "%.80q is not a model name: 1 to %d printable characters", name, MaxModelNameLen)
		}
		validateTraffic(p, mf+".traffic", r.Models[name].Traffic, backends)
		validateShadows(p, mf+".shadows", r.Models[name].Shadows, backends)
		validateRewrite(p, mf+".rewrite", r.Models[name].Rewrite)
	}
}

// validateRewrite checks a model's rewrite: up to MaxRewriteTargets model
// names, weighed as traffic is (from 0 to 1, summing to 1).
func validateRewrite(p *problems, field string, rewrite map[string]float64) {
	if len(rewrite) > MaxRewriteTargets {
		p.add(field, "lists %d model names; at most %d", len(rewrite), MaxRewriteTargets)
		return
	}
	sum, finite := 0.0, true
	for _, name := range SortedKeys(rewrite) {
		if name == "" || len(name) > MaxModelNameLen || strings.ContainsFunc(name, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			p.add(field, "%.80q is not a model name: 1 to %d printable characters", name, MaxModelNameLen)
		}
		switch w := rewrite[name]; {
		case math.IsNaN(w) || math.IsInf(w, 0):
			p.add(field+"."+name, "weight %v is not a number; weights are between 0 and 1", w)
			finite = false
		case w < 0:
			p.add(field+"."+name, "weight %v is negative; weights cannot be negative", w)
		default:
			sum += w
		}
	}
	if len(rewrite) > 0 && finite {
		checkWeightsSum(p, field, rewrite, sum)
	}
}

// EffectiveCriticality is what the endpoint's requests are when they say
// nothing.
func (e Endpoint) EffectiveCriticality() Criticality {
	if e.Criticality == "" {
		if e.Priority < 0 {
			return Sheddable
		}
		return Critical
	}
	return e.Criticality
}

// cloneModelRouting returns a deep copy of r.
func cloneModelRouting(r *ByModel) *ByModel {
	if r == nil {
		return nil
	}
	out := &ByModel{Field: r.Field, Models: make(map[string]TrafficPolicy, len(r.Models))}
	for name, t := range r.Models {
		out.Models[name] = TrafficPolicy{Traffic: maps.Clone(t.Traffic), Shadows: maps.Clone(t.Shadows), Rewrite: maps.Clone(t.Rewrite)}
	}
	return out
}

// modelRoutingsEqual reports whether two model routings are the same,
// treating a shadow of 0 as none.
func modelRoutingsEqual(a, b *ByModel) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.EffectiveField() != b.EffectiveField() || len(a.Models) != len(b.Models) {
		return false
	}
	for name, ta := range a.Models {
		tb, ok := b.Models[name]
		if !ok || !maps.Equal(ta.Traffic, tb.Traffic) || !maps.Equal(nonZero(ta.Shadows), nonZero(tb.Shadows)) || !maps.Equal(ta.Rewrite, tb.Rewrite) {
			return false
		}
	}
	return true
}
