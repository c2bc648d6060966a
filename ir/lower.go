package ir

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/servemesh/servemesh/meshspec"
)

// Options are what Lower needs besides the state and the replicas.
type Options struct {
	// MTLS: the mesh runs mTLS between nodes, so a backend that has no
	// replica yet is reached through inbound listeners once it has some.
	MTLS bool
}

// Lower returns the IR of state, a stored state that passed
// meshspec.Validate (it reads no field it has not checked), whose served
// backends have the replicas in replicas, by backend name (the catalog's
// and DNS's, as controlplane/dataplane's Replicas gives them); a backend
// replicas does not name keeps the ones it lists (static replicas, a
// config file's). Nothing of state is cleared or changed: what the
// controller alone reads (processes, placements, autoscaling) is simply
// not read. The IR is validated (DataPlane.Validate): one translation
// cannot serve is refused with the error.
func Lower(state *meshspec.Model, replicas map[string][]meshspec.Replica, o Options) (*DataPlane, error) {
	served := state.Served()
	dp := &DataPlane{
		Backends:  make([]Backend, 0, len(served)),
		Endpoints: make([]Endpoint, 0, len(state.Endpoints)),
	}
	for _, b := range served {
		if rs, ok := replicas[b.Name]; ok {
			b.Replicas = rs // b is a copy: state keeps its own
		}
		dp.Backends = append(dp.Backends, lowerBackend(b, o))
	}
	slices.SortFunc(dp.Backends, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
	if state.Mesh != nil && state.Mesh.Tracing != nil {
		t := state.Mesh.Tracing
		host, port, _ := net.SplitHostPort(t.Collector) // valid: state.Validate checked it
		n, _ := strconv.ParseUint(port, 10, 16)
		dp.Tracing = &Tracing{Host: host, Port: uint32(n), SamplingPercent: t.Sampling()}
	}
	for _, e := range state.Endpoints {
		dp.Endpoints = append(dp.Endpoints, dp.lowerEndpoint(state.Mesh, e, o))
	}
	slices.SortFunc(dp.Endpoints, func(a, b Endpoint) int { return strings.Compare(a.Name, b.Name) })
	if err := dp.Validate(); err != nil {
		return nil, fmt.Errorf("the view cannot be served: %w", err)
	}
	return dp, nil
}

// reach decides how nodes reach b's replicas: by DNS if any is named by
// DNS, through inbound listeners if they have them (or, with mTLS, while
// there are none yet), else each at its address.
func reach(b meshspec.Backend, o Options) Reach {
	switch {
	case b.ResolvedByDNS():
		return ReachDNS
	case len(b.Replicas) == 0 && o.MTLS, len(b.Replicas) > 0 && b.Replicas[0].Inbound != "":
		return ReachInbound
	default:
		return ReachAddress
	}
}

// nodeShares are b's nodes, each by its inbound listener with its
// replicas, sorted.
func (b Backend) nodeShares() []NodeShare {
	count := map[string]int{}
	for _, r := range b.Replicas {
		if r.Inbound != "" {
			count[r.Inbound]++
		}
	}
	out := make([]NodeShare, 0, len(count))
	for _, in := range slices.Sorted(maps.Keys(count)) {
		out = append(out, NodeShare{Inbound: in, Replicas: count[in]})
	}
	return out
}

func lowerBackend(b meshspec.Backend, o Options) Backend {
	out := Backend{
		Name:          b.Name,
		Reach:         reach(b, o),
		HTTP2:         b.HTTP2(),
		MaxConcurrent: b.Config.EffectiveMaxConcurrentQueries(),

		FirstByteTimeoutS: b.Config.FirstByteTimeoutS,
	}
	// The picker runs on the inbound listener: without one (a plaintext
	// mesh), load_aware is not served, and the controller says so in its
	// status (UnservedSettings) rather than the whole view being refused.
	out.Picked = b.Config.LoadAware != nil && out.Reach == ReachInbound
	out.PromptAware = out.Picked && !out.HTTP2
	out.PromptAffinity = out.PromptAware && b.Config.LoadAware.PromptAffinity
	if out.Picked {
		la := b.Config.LoadAware
		out.SessionHeader = la.SessionHeader
		out.MaxModels, out.ModelHeader = la.MaxModelsPerReplica, la.EffectiveModelHeader()
		out.TenantHeader = la.TenantHeader
	}
	if e := b.Config.EndpointPicker; e != nil && out.Reach == ReachInbound {
		out.Picker = lowerPicker(*e)
	}
	if od := b.Config.Outlier; od != nil {
		out.Outlier = &Outlier{Consecutive5xx: od.Consecutive5xx, IntervalS: od.IntervalS, BaseEjectionS: od.BaseEjectionS, MaxEjectionPercent: od.MaxEjectionPercent}
	}
	if len(b.Replicas) > 0 {
		out.Replicas = make([]Replica, 0, len(b.Replicas))
	}
	for _, r := range b.Replicas {
		out.Replicas = append(out.Replicas, Replica{Address: r.Address, Health: Health(r.EffectiveHealth()), Node: r.Node, Inbound: r.Inbound})
	}
	return out
}

// lowerEndpoint is e's IR in dp, whose backends are lowered: an endpoint
// reads the nodes and headers of the prompt-affine backends it sends to.
func (dp *DataPlane) lowerEndpoint(mesh *meshspec.Mesh, e meshspec.Endpoint, o Options) Endpoint {
	out := lowerEndpointAlone(e, o)
	if sampling, traced := meshspec.TraceSampling(mesh, e); traced {
		out.TraceSampling = &sampling
	}
	out.ReadsAnswers = out.Models != nil || out.TokenQuota != nil
	for _, name := range out.backends() {
		b, ok := dp.Backend(name)
		out.ReadsAnswers = out.ReadsAnswers || (ok && b.Picked)
		if ok && b.PromptAffinity {
			out.PromptAffinity = true
			if !slices.ContainsFunc(out.AffinityNodes, func(a AffinityBackend) bool { return a.Name == name }) {
				out.AffinityNodes = append(out.AffinityNodes, AffinityBackend{Name: name, Nodes: b.nodeShares()})
			}
			for _, h := range []string{b.SessionHeader, b.ModelHeader} {
				if h != "" && !slices.Contains(out.AffinityHeaders, h) {
					out.AffinityHeaders = append(out.AffinityHeaders, h)
				}
			}
		}
	}
	out.Picked = dp.pickedBackends(out)
	slices.Sort(out.AffinityHeaders)
	slices.SortFunc(out.AffinityNodes, func(a, b AffinityBackend) int { return strings.Compare(a.Name, b.Name) })
	out.FirstByteTimeoutS = dp.firstByteTimeout(out)
	return out
}

// firstByteTimeout is e's: the largest of its serving backends' (those
// it sends requests to, not mirrors) if every one sets one, else 0.
func (dp *DataPlane) firstByteTimeout(e Endpoint) float64 {
	most := 0.0
	for _, name := range e.servingBackends() {
		b, ok := dp.Backend(name)
		if !ok || b.FirstByteTimeoutS <= 0 {
			return 0
		}
		most = max(most, b.FirstByteTimeoutS)
	}
	return most
}

// lowerEndpointAlone is what e's IR reads of e alone.
func lowerEndpointAlone(e meshspec.Endpoint, o Options) Endpoint {
	out := Endpoint{
		Name:           e.Name,
		Route:          e.Route,
		Methods:        e.AllowedMethods(),
		Traffic:        maps.Clone(e.Traffic),
		Shadows:        maps.Clone(e.Shadows),
		TimeoutS:       e.TimeoutS,
		IdleTimeoutS:   e.IdleTimeoutS,
		PerTryTimeoutS: e.PerTryTimeoutS,
		Criticality:    string(e.EffectiveCriticality()),
		Priority:       e.EffectivePriority(),
		MeshPriority:   e.Priority,
	}
	for _, m := range e.Match {
		out.Match = append(out.Match, Match{Header: m.Header, Cookie: m.Cookie, Exact: m.Exact, Prefix: m.Prefix, Regex: m.Regex, Backend: m.Backend, MeshOnly: m.MeshOnly})
	}
	if r := e.Retry; r != nil {
		out.Retry = &Retry{On: slices.Clone(r.On), Attempts: r.Attempts, NonIdempotent: r.NonIdempotent}
	}
	if k := e.Sticky; k != nil {
		out.Sticky = &Sticky{Header: k.Header, Cookie: k.Cookie}
	}
	if r := e.RateLimit; r != nil && r.Local != nil {
		out.RateLimit = &RateLimit{RequestsPerSecond: r.Local.RequestsPerSecond, Burst: r.Local.EffectiveBurst(), Header: r.Local.Header}
	}
	if r := e.RateLimit; r != nil && r.Global != nil {
		g := r.Global
		out.GlobalRateLimit = &GlobalRateLimit{Requests: g.Requests, Unit: g.EffectiveUnit(), Header: g.Header, ClientAddress: g.ClientAddress, FailClosed: g.Closed()}
	}
	if r := e.RateLimit; r != nil && r.Tokens != nil {
		q := r.Tokens
		out.TokenQuota = &TokenQuota{Tokens: q.Tokens, Unit: q.EffectiveUnit(), Header: q.Header, FailClosed: q.Closed(),
			PerModel: q.PerModel, Input: q.Weights.Input, Output: q.Weights.Output, Cached: q.Weights.Cached}
	}
	if r := e.ModelRouting; r != nil {
		out.Models = &Models{Field: r.EffectiveField(), Models: make(map[string]Split, len(r.Models))}
		for name, t := range r.Models {
			split := Split{Traffic: maps.Clone(t.Traffic), Shadows: maps.Clone(t.Shadows)}
			if o.MTLS { // else not served: the controller's status says so
				split.Rewrite = maps.Clone(t.Rewrite)
			}
			out.Models.Models[name] = split
		}
	}
	return out
}
