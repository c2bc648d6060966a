package wire

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// What a route tells the calling node's picker (its prompt stream's
// metadata), for prompt affinity and model rewrites.
//
// Prompt affinity across nodes: a route to a backend with prompt_affinity
// has its calling node's picker place each request's affinity key (its
// conversation or model header, else its prompt's prefix) on one of the
// backend's nodes (agent/picker/placement). The route tells the picker
// which, in its prompt stream's metadata (AffinityRouteHeader: an
// AffinityRoute, JSON); the picker names the node it chose, by its
// inbound listener, in dynamic metadata (PickerNamespace,
// PromptNodeKey: "IP:port", one per backend of the route, comma
// separated), which the backend's cluster of nodes follows while that
// node is healthy (override_host), hashing the key (Maglev) otherwise.
const (
	AffinityRouteHeader = "x-servemesh-affinity-route"
	PromptNodeKey       = "x-servemesh-prompt-node"
)

// MaxAffinityRouteBytes bounds an AffinityRoute's encoding, which every
// request's prompt stream carries: some 350 nodes. A route whose backends
// run on more lists none, and Maglev alone picks their nodes.
const MaxAffinityRouteBytes = 16 << 10

// AffinityRoute is what a route with prompt affinity tells the calling
// node's picker: the request headers that name a request's affinity key
// before its prompt, in order, and the nodes of each of its backends with
// prompt affinity.
type AffinityRoute struct {
	Headers  []string          `json:"headers,omitempty"`
	Backends []AffinityBackend `json:"backends"`
}

// AffinityBackend is a backend's nodes.
type AffinityBackend struct {
	Name  string         `json:"name"`
	Nodes []AffinityNode `json:"nodes"`
}

// AffinityNode is a node by its inbound listener (IP:port), with how many
// of the backend's replicas it runs: its share of the keys.
type AffinityNode struct {
	Inbound  string `json:"inbound"`
	Replicas int    `json:"replicas"`
}

// Encode is r's encoding, for AffinityRouteHeader.
func (r AffinityRoute) Encode() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("affinity route: %w", err)
	}
	if len(b) > MaxAffinityRouteBytes {
		return "", fmt.Errorf("affinity route: %d bytes, more than %d: too many nodes", len(b), MaxAffinityRouteBytes)
	}
	return string(b), nil
}

// ParseAffinityRoute decodes an AffinityRouteHeader, checking each node's
// address and share.
func ParseAffinityRoute(s string) (AffinityRoute, error) {
	var r AffinityRoute
	if len(s) > MaxAffinityRouteBytes {
		return r, fmt.Errorf("affinity route: %d bytes, more than %d", len(s), MaxAffinityRouteBytes)
	}
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return AffinityRoute{}, fmt.Errorf("affinity route: %w", err)
	}
	for _, b := range r.Backends {
		for _, n := range b.Nodes {
			if _, err := netip.ParseAddrPort(n.Inbound); err != nil || n.Replicas < 1 {
				return AffinityRoute{}, fmt.Errorf("affinity route: backend %q: node %q with %d replicas: want IP:port and at least 1", b.Name, n.Inbound, n.Replicas)
			}
		}
	}
	return r, nil
}

// ModelRewriteHeader is the prompt stream's metadata that has the calling
// node's picker rewrite the request's model (its JSON body's top-level
// Field) to one of Targets, drawn by weight: a ModelRewrite, JSON. A
// model route sends it for a model with a rewrite.
const ModelRewriteHeader = "x-servemesh-model-rewrite"

// ModelRewrite is a model route's rewrite.
type ModelRewrite struct {
	Field   string          `json:"field"`
	Targets []RewriteTarget `json:"targets"`
}

// RewriteTarget is a model name a request may be rewritten to, and its
// weight.
type RewriteTarget struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
}

// Encode is m's encoding, for ModelRewriteHeader.
func (m ModelRewrite) Encode() (string, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("model rewrite: %w", err)
	}
	return string(b), nil
}

// ParseModelRewrite decodes a ModelRewriteHeader.
func ParseModelRewrite(s string) (ModelRewrite, error) {
	var m ModelRewrite
	if len(s) > MaxAffinityRouteBytes {
		return m, fmt.Errorf("model rewrite: %d bytes, more than %d", len(s), MaxAffinityRouteBytes)
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return ModelRewrite{}, fmt.Errorf("model rewrite: %w", err)
	}
	total := 0.0
	for _, t := range m.Targets {
		if t.Name == "" || !(t.Weight >= 0) {
			return ModelRewrite{}, fmt.Errorf("model rewrite: target %q of weight %v: want a name and a weight of 0 or more", t.Name, t.Weight)
		}
		total += t.Weight
	}
	if m.Field == "" || !(total > 0) {
		return ModelRewrite{}, fmt.Errorf("model rewrite: field %q, weights summing to %v: want a field and weights above 0", m.Field, total)
	}
	return m, nil
}
