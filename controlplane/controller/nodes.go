package controller

import (
	"context"
	"fmt"
	"slices"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Node maintenance, as kubectl's cordon and drain: a cordoned node gets no
// new replicas; a drained one is cordoned and its replicas move elsewhere,
// each replica of a backend drained once the backend has its replicas
// ready on other nodes (Reconcile's rollOut), so a drain fails no request
// where the other nodes have room. Uncordon ends both; replicas that moved
// stay where they went.

// NodeReport is one node as servemesh node list shows it: what its agent
// registered, the state's maintenance of it, and its replicas.
type NodeReport struct {
	Name string `json:"name"`
	// Registered: its agent's registration passes in Consul.
	Registered bool `json:"registered"`
	Cordoned   bool `json:"cordoned"`
	Drained    bool `json:"drained"`
	// Replicas are those placed on it running, Draining those being
	// stopped.
	Replicas int `json:"replicas"`
	Draining int `json:"draining"`
	// DrainingRequests are the requests in flight to its draining
	// replicas, which they finish before they stop, as its agent last
	// counted them.
	DrainingRequests int     `json:"draining_requests,omitempty"`
	CPUs             float64 `json:"cpus,omitempty"`
	MemoryMB         int     `json:"memory_mb,omitempty"`
	Version          string  `json:"version,omitempty"`
	Protocol         int     `json:"protocol,omitempty"`
	// Policy is what the operator grants the node, if anything; CPUs and
	// MemoryMB above are its agent's claim.
	Policy *meshspec.NodePolicy `json:"policy,omitempty"`
}

// Nodes lists the registered nodes and those the state names, by name.
func (c *Controller) Nodes(ctx context.Context) ([]NodeReport, error) {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return nil, err
	}
	m, _ := c.State()
	byName := map[string]*NodeReport{}
	report := func(name string) *NodeReport {
		if byName[name] == nil {
			spec, _ := m.NodeSpecOf(name)
			byName[name] = &NodeReport{Name: name, Cordoned: spec.Cordoned, Drained: spec.Drained, Policy: spec.Policy}
		}
		return byName[name]
	}
	for _, n := range nodes {
		r := report(n.ID)
		r.Registered, r.CPUs, r.MemoryMB, r.Version, r.Protocol = true, n.CPUs, n.MemoryMB, n.Version, n.Protocol
	}
	for _, n := range m.Nodes {
		report(n.Name)
	}
	for _, b := range m.Served() {
		for _, p := range b.Placements {
			if p.State == meshspec.Running {
				report(p.Node).Replicas++
			} else {
				report(p.Node).Draining++
			}
		}
	}
	out := make([]NodeReport, 0, len(byName))
	for _, name := range meshspec.SortedKeys(byName) {
		out = append(out, *byName[name])
	}
	return out, nil
}

// NodeAction is what SetNodeMaintenance does to a node.
type NodeAction string

// The node actions.
const (
	Cordon   NodeAction = "cordon"
	Uncordon NodeAction = "uncordon"
	Drain    NodeAction = "drain"
)

// SetNodeMaintenance cordons, uncordons or drains node. A node must be
// registered (or, to uncordon, named by the state) to be acted on.
func (c *Controller) SetNodeMaintenance(ctx context.Context, node string, action NodeAction) (bool, error) {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	registered := slices.ContainsFunc(nodes, func(n wire.NodeInfo) bool { return n.ID == node })
	return c.mutate(ctx, "node_"+string(action), func(m *meshspec.Model) error {
		spec, named := m.NodeSpecOf(node)
		if !registered && (!named || action != Uncordon) {
			return errorf(NotFound, "no node %q is registered (its agent's registration does not pass in Consul); servemesh node list shows the nodes", node)
		}
		was := spec
		switch action {
		case Cordon:
			spec.Cordoned = true
		case Drain:
			spec.Cordoned, spec.Drained = true, true
		case Uncordon:
			spec.Cordoned, spec.Drained = false, false
		default:
			return errorf(Invalid, "node action %q: want cordon, uncordon or drain", action)
		}
		if spec.Cordoned != was.Cordoned || spec.Drained != was.Drained {
			spec.Since = c.now().Unix()
		}
		m.SetNodeSpec(spec)
		if action == Drain {
			// Place the replacements now; Reconcile drains the node's
			// replicas once they are ready.
			for i := range m.Backends {
				if err := schedule(m, i, nodes, c.now(), c.readyTags(m.Backends[i].Name)); err != nil {
					return &Error{Kind: Conflict, Msg: fmt.Sprintf("cannot drain node %q: the other nodes have no room for its replicas of backend %q; add a node, or scale the backend down, then drain again (nothing changed)", node, m.Backends[i].Name), Err: err}
				}
			}
		}
		return nil
	})
}

// SetNodePolicy sets what the operator grants node (nil: clears it, so the
// node is taken at its agent's word). A policy decides which commands run
// where, so it needs the exec scope. Replicas already placed stay; drain the
// node to move those its new policy does not allow.
func (c *Controller) SetNodePolicy(ctx context.Context, node string, policy *meshspec.NodePolicy) (bool, error) {
	if !mayRunCommands(ctx) {
		return false, errorf(Forbidden, "node %q: a node policy decides which commands run where, which needs a token with the exec scope (--token-file)", node)
	}
	return c.mutate(ctx, "node_policy", func(m *meshspec.Model) error {
		spec, _ := m.NodeSpecOf(node)
		spec.Policy = policy
		if err := meshspec.ValidateNode(spec); err != nil {
			return &Error{Kind: Invalid, Msg: "refused", Err: err}
		}
		m.SetNodeSpec(spec)
		return nil
	})
}
