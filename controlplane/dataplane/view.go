package dataplane

import (
	"fmt"

	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/controlplane/model"
)

// Services returns the Consul services a state's backends read replicas from.
func Services(m *model.Model) []string {
	var out []string
	for _, b := range m.Backends {
		switch {
		case b.Process != nil:
			out = append(out, b.Name)
		case b.External != nil:
			out = append(out, b.External.Service)
		}
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
	Addresses model.AddressPolicy
}

// View returns m with every backend's replicas listed plainly, as the
// translator reads them: a process backend gets its placed replicas that
// Consul knows (draining when their placement drains), an external backend
// its service's instances, by IP or by DNS name. What only the controller
// and agents use (process specs, placements, autoscaling) is left out. An
// instance whose address the data plane cannot use, or that the address
// policy refuses, is dropped alone and listed in the second result; m is
// not modified.
//
// With mTLS, a replica servemesh runs keeps its node and its node's inbound
// listener, through which every node reaches it; one whose agent announces
// no inbound listener (it runs without mesh mTLS) is dropped.
func View(m *model.Model, instances map[string][]catalog.Instance, rules Rules) (*model.Model, []Dropped) {
	out := model.Clone(m)
	var dropped []Dropped
	for i := range out.Backends {
		b := &out.Backends[i]
		switch {
		case b.Process != nil:
			placed := map[string]model.PlacementState{}
			for _, p := range b.Placements {
				placed[p.Tag] = p.State
			}
			for _, in := range instances[b.Name] {
				state, ok := placed[in.Tag]
				if !ok {
					continue // not (or no longer) placed: not ours to serve
				}
				if rules.MTLS && in.Inbound == "" {
					dropped = append(dropped, Dropped{Backend: b.Name, Instance: in.ID,
						Reason: fmt.Sprintf("node %q announces no inbound listener: run its agent with mesh mTLS, as the controller", in.Node)})
					continue
				}
				b.Replicas, dropped = addReplica(b, in, state, dropped)
			}
		case b.External != nil:
			for _, in := range instances[b.External.Service] {
				in.Node, in.Inbound = "", "" // outside the mesh: reached directly
				if err := rules.Addresses.Check(in.Address); err != nil {
					dropped = append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: err.Error()})
					continue
				}
				b.Replicas, dropped = addReplica(b, in, model.Running, dropped)
			}
		}
		b.Process, b.External, b.Placements, b.Config.Autoscaling = nil, nil, nil, nil
	}
	return out, dropped
}

// addReplica appends instance in to b's replicas unless its address is not
// IP:port or host:port (a DNS name Envoy resolves), or another instance
// already has it.
func addReplica(b *model.Backend, in catalog.Instance, state model.PlacementState, dropped []Dropped) ([]model.Replica, []Dropped) {
	if err := model.CheckReplicaAddress(in.Address); err != nil {
		return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: "address " + err.Error()})
	}
	for _, r := range b.Replicas {
		if r.Address == in.Address && r.Inbound == in.Inbound {
			return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID,
				Reason: fmt.Sprintf("address %s is registered twice", in.Address)})
		}
	}
	r := model.Replica{Address: in.Address, Health: health(in.Passing, state), Node: in.Node, Inbound: in.Inbound}
	if err := model.CheckReplicaInbound(r); err != nil {
		return b.Replicas, append(dropped, Dropped{Backend: b.Name, Instance: in.ID, Reason: err.Error()})
	}
	return append(b.Replicas, r), dropped
}

func health(passing bool, state model.PlacementState) model.Health {
	switch {
	case state == model.Draining:
		return model.HealthDraining
	case passing:
		return model.HealthHealthy
	default:
		return model.HealthUnhealthy
	}
}
