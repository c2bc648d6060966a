package dataplane

import (
	"fmt"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Services returns the Consul services a state's view reads: each
// backend's replicas (wire.BackendService for a process backend, the named
// service for an external one), and the registration of every node a
// replica is placed on (wire.NodeService), which the view checks the
// replicas' claims against.
func Services(m *meshspec.Model) []string {
	var out []string
	nodes := map[string]bool{}
	for _, b := range m.Served() {
		switch {
		case b.Process != nil:
			out = append(out, wire.BackendService(b.Name))
			for _, p := range b.Placements {
				nodes[p.Node] = true
			}
		case b.External != nil:
			out = append(out, b.External.Service)
		}
	}
	for _, n := range meshspec.SortedKeys(nodes) {
		out = append(out, wire.NodeService(n))
	}
	return out
}

// Dropped is an instance left out of the view, and why.
type Dropped struct {
	Backend, Instance, Reason string
}

// Rules are what View checks of the instances it is given.
type Rules struct {
	// MTLS says the mesh runs mesh mTLS: a replica is reached only through
	// its node's inbound listener.
	MTLS bool
	// Addresses are the addresses an external service's instances may
	// have, as for static replicas (their registrations are as much users'
	// input).
	Addresses meshspec.AddressPolicy
	// Names resolves the DNS names of static replicas and external
	// instances, so the data plane gets addresses, each checked by
	// Addresses; nil leaves names for Envoy to resolve.
	Names *Resolver
}

// View returns the data plane's IR of state m, which it validates
// (meshspec.Validate, in its role: the stored state), given the health
// view: ir.Lower of m and Replicas. An instance whose address the data
// plane cannot use, or that the address policy refuses, is dropped alone
// and listed in the second result; a state or an IR the data plane cannot
// serve is refused with the error; m is not modified.
func View(m *meshspec.Model, instances map[string][]catalog.Instance, rules Rules) (*ir.DataPlane, []Dropped, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, err
	}
	return lower(m, instances, rules)
}

// lower is View of a state already validated.
func lower(m *meshspec.Model, instances map[string][]catalog.Instance, rules Rules) (*ir.DataPlane, []Dropped, error) {
	replicas, dropped := Replicas(m, instances, rules)
	dp, err := ir.Lower(m, replicas, ir.Options{MTLS: rules.MTLS})
	return dp, dropped, err
}

// Replicas returns the replicas the data plane serves of each of m's
// served backends, by name: a process backend's placed replicas that
// Consul knows (draining when their placement drains), an external
// backend's service's instances, a backend of listed replicas its own; by
// IP or by DNS name (resolved by rules.Names, each address checked, when
// it is set). An instance whose address the data plane cannot use, or that
// the address policy refuses, is dropped alone and listed in the second
// result; m is not read beyond its backends, nor modified.
//
// With mTLS, a replica servemesh runs keeps its node and its node's inbound
// listener, through which every node reaches it; one whose agent announces
// no inbound listener (it runs without mesh mTLS) is dropped.
func Replicas(m *meshspec.Model, instances map[string][]catalog.Instance, rules Rules) (map[string][]meshspec.Replica, []Dropped) {
	served := m.Served() // a retiring backend's replicas drain like others
	out := make(map[string][]meshspec.Replica, len(served))
	var dropped []Dropped
	for _, stored := range served {
		// b collects the replicas: addReplica and resolveNames read its
		// name and replicas alone.
		b := &meshspec.Backend{Name: stored.Name, Replicas: slices.Clone(stored.Replicas)}
		switch {
		case stored.Process != nil:
			placed := map[string]meshspec.Placement{}
			for _, p := range stored.Placements {
				placed[p.Tag] = p
			}
			served := map[string]bool{}
			for _, in := range instances[wire.BackendService(b.Name)] {
				p, ok := placed[in.Tag]
				if !ok {
					continue // not (or no longer) placed: not ours to serve
				}
				if reason := rules.refuse(in, p, instances[wire.NodeService(p.Node)], served); reason != "" {
					dropped = append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: reason})
					continue
				}
				served[in.Tag] = true
				b.Replicas, dropped = addReplica(b, in, p.State, dropped)
			}
		case stored.External != nil:
			for _, in := range instances[stored.External.Service] {
				in.Node, in.Inbound = "", "" // outside the mesh: reached directly
				if err := rules.Addresses.Check(in.Address); err != nil {
					dropped = append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: err.Error()})
					continue
				}
				b.Replicas, dropped = addReplica(b, in, meshspec.Running, dropped)
			}
		}
		dropped = resolveNames(b, rules.Names, rules.Addresses, dropped)
		out[b.Name] = b.Replicas
	}
	return out, dropped
}

// refuse says why a replica instance of placement p is not served, or
// returns "". Whoever may register a backend's instances in Consul (any
// node's token) could claim any node, so an instance is served only if it
// is the one replica of its placement, claims the placement's node, and
// is registered on the Consul node of that node's agent registration
// (regs, which only that node's token may write), with its inbound
// listener.
func (r Rules) refuse(in catalog.Instance, p meshspec.Placement, regs []catalog.Instance, served map[string]bool) string {
	switch {
	case served[in.Tag]:
		return fmt.Sprintf("replica %s is registered twice; the first registration is served", in.Tag)
	case in.Node != p.Node:
		return fmt.Sprintf("it claims node %q, but replica %s is placed on node %q", in.Node, in.Tag, p.Node)
	case r.MTLS && in.Inbound == "":
		return fmt.Sprintf("node %q announces no inbound listener: run its agent with mesh mTLS, as the controller", in.Node)
	}
	for _, reg := range regs {
		if reg.Node == p.Node && reg.ConsulNode == in.ConsulNode && (!r.MTLS || reg.Inbound == in.Inbound) {
			return ""
		}
	}
	if len(regs) == 0 {
		return fmt.Sprintf("node %q has no agent registration (%s) to check it against", p.Node, wire.NodeService(p.Node))
	}
	return fmt.Sprintf("it is registered on Consul node %q with inbound %q, which node %q's agent registration (Consul node %q, inbound %q) does not match",
		in.ConsulNode, in.Inbound, p.Node, regs[0].ConsulNode, regs[0].Inbound)
}

// addReplica appends instance in to b's replicas unless its address is not
// IP:port or host:port (a DNS name Envoy resolves), or another instance
// already has it.
func addReplica(b *meshspec.Backend, in catalog.Instance, state meshspec.PlacementState, dropped []Dropped) ([]meshspec.Replica, []Dropped) {
	if err := meshspec.CheckReplicaAddress(in.Address); err != nil {
		return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: "address " + err.Error()})
	}
	for _, r := range b.Replicas {
		if r.Address == in.Address && r.Inbound == in.Inbound {
			return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID,
				Reason: fmt.Sprintf("address %s is registered twice", in.Address)})
		}
	}
	r := meshspec.Replica{Address: in.Address, Health: health(in, state), Node: in.Node, Inbound: in.Inbound}
	if err := meshspec.CheckReplicaInbound(r); err != nil {
		return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: err.Error()})
	}
	return append(b.Replicas, r), dropped
}

// health is how the data plane treats instance in of a placement in state:
// a replica whose checks only expired (its agent or Consul stalled, see
// catalog.Instance.Expired) is unknown, not unhealthy, so that a stall of
// Consul, which expires every check at once, leaves the data plane
// something to call.
func health(in catalog.Instance, state meshspec.PlacementState) meshspec.Health {
	switch {
	case state == meshspec.Draining:
		return meshspec.HealthDraining
	case in.Passing:
		return meshspec.HealthHealthy
	case in.Expired:
		return meshspec.HealthUnknown
	default:
		return meshspec.HealthUnhealthy
	}
}

// backendsReading are the backends of m whose replicas Replicas reads from
// services: a process backend's own service and the registrations of the
// nodes it is placed on, an external backend's service.
func backendsReading(m *meshspec.Model, services []string) []string {
	if len(services) == 0 {
		return nil
	}
	own, nodes, other := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, s := range services {
		if b, ok := strings.CutPrefix(s, wire.BackendServicePrefix); ok {
			own[b] = true
		}
		if n, ok := strings.CutPrefix(s, wire.NodeServicePrefix); ok {
			nodes[n] = true
		}
		other[s] = true
	}
	var out []string
	for _, b := range m.Served() {
		switch {
		case b.Process != nil:
			if own[b.Name] || len(nodes) > 0 && slices.ContainsFunc(b.Placements, func(p meshspec.Placement) bool { return nodes[p.Node] }) {
				out = append(out, b.Name)
			}
		case b.External != nil:
			if other[b.External.Service] {
				out = append(out, b.Name)
			}
		}
	}
	return out
}
