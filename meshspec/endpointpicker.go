package meshspec

import (
	"net"
	"net/netip"
	"strconv"
)

// EndpointPicker names an external picker of a backend's replicas: a
// server of the Gateway API Inference Extension's Endpoint Picker
// Protocol (an EPP: the extension's reference picker, llm-d's router),
// which every calling node's Envoy asks, for each request to the backend,
// which replica takes it. servemesh tells it the backend's healthy
// replicas (the protocol's subset hint), sends the request to the one it
// names (or the next of its list on that node), never outside the
// backend's replicas, and tells it which replica served the request.
//
// A replica is named to the picker as its node's address and the
// replica's port ("10.0.0.7:8001"): the replicas of one node are the
// ranks of one address (the protocol's data-parallel endpoints).
type EndpointPicker struct {
	// Address is IP:port of the picker's gRPC (ext_proc) server, checked
	// like any address a backend names: loopback, link-local and metadata
	// services only where the operator allows them (--allow-replica-cidr).
	Address string `json:"address"`
	// TLS reaches the picker over TLS, its certificate verified against
	// the node's system trust store for the address's IP; else plaintext
	// (a picker on the node, or on a trusted network).
	TLS bool `json:"tls,omitempty"`
	// FailOpen: while the picker does not answer, requests go on to a
	// replica the node chooses (least requests); else they fail with a 503.
	FailOpen bool `json:"fail_open,omitempty"`
}

// validateEndpointPicker checks a backend's endpoint_picker setting; the
// controller checks its address against the operator's address policy.
func validateEndpointPicker(p *problems, field string, b Backend) {
	e := b.Config.EndpointPicker
	if e == nil {
		return
	}
	if b.Process == nil && (b.External != nil || len(b.Replicas) > 0) {
		p.add(field, "needs replicas servemesh's agents run (a process backend): the picker names replicas the nodes' inbound listeners reach; remove endpoint_picker or give the backend a process")
	}
	if b.Config.LoadAware != nil {
		p.add(field, "and load_aware both pick the backend's replicas; keep one: load_aware for the picker on each node, endpoint_picker for an external one")
	}
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil {
		p.add(field+".address", "%.80q is not IP:port (%v); write it as 10.0.0.5:9002", e.Address, err)
		return
	}
	if _, err := netip.ParseAddr(host); err != nil {
		p.add(field+".address", "host %.80q of %.80q is not an IP address: a picker is named by IP (a DNS name would let its DNS point the mesh anywhere); write it as 10.0.0.5:9002", host, e.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		p.add(field+".address", "port %.20q of %.80q: want a number from 1 to 65535", port, e.Address)
	}
}
