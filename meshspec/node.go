package meshspec

import (
	"fmt"
	"math"
	"regexp"
	"slices"

	"github.com/servemesh/servemesh/wire"
)

// NodeSpec is what the desired state says of a node: its maintenance and
// its policy, the operator's to set (servemesh node
// cordon|uncordon|drain|policy). What a node offers is its agent's to say
// (wire.NodeInfo), bounded by its policy. A node the state names no
// NodeSpec for is schedulable on its agent's word.
type NodeSpec struct {
	Name string `json:"name"`
	// Cordoned nodes get no new replicas; those they run stay.
	Cordoned bool `json:"cordoned,omitempty"`
	// Drained nodes are cordoned, and each of their replicas is replaced
	// on another node, drained once its backend has its replicas ready
	// elsewhere.
	Drained bool `json:"drained,omitempty"`
	// Since is when it was cordoned or drained (Unix seconds).
	Since int64 `json:"since,omitempty"`
	// Policy, if set, is what the operator grants the node: the scheduler
	// takes the smaller of it and what the node's agent claims, and runs a
	// command there only if both allow it. A compromised node could claim
	// any capacity and every command to attract every backend's replicas.
	Policy *NodePolicy `json:"policy,omitempty"`
}

// NodePolicy is what the operator grants a node. Each figure is an upper
// bound (0: none); a command runs only if one of AllowedCommands matches
// it (none: no command).
type NodePolicy struct {
	CPUs            float64        `json:"cpus,omitempty"`
	MemoryMB        int            `json:"memory_mb,omitempty"`
	Resources       map[string]int `json:"resources,omitempty"`
	AllowedCommands []string       `json:"allowed_commands,omitempty"`
}

// Bound is what n offers under the policy: the smaller of each figure.
// Which commands it may run is Allows's to say, with n's own.
func (p NodePolicy) Bound(n wire.NodeInfo) wire.NodeInfo {
	n.CPUs = min(n.CPUs, p.CPUs)
	n.MemoryMB = min(n.MemoryMB, p.MemoryMB)
	resources := map[string]int{}
	for name, count := range n.Resources {
		if granted := min(count, p.Resources[name]); granted > 0 {
			resources[name] = granted
		}
	}
	n.Resources = resources
	return n
}

// Allows reports whether the policy lets its node run command.
func (p NodePolicy) Allows(command string) bool {
	return wire.NodeInfo{AllowedCommands: p.AllowedCommands}.Allows(command)
}

// checkPolicy says what is wrong with a node's policy.
func checkPolicy(node string, p NodePolicy) error {
	switch {
	case math.IsNaN(p.CPUs) || p.CPUs < 0 || p.CPUs > MaxCPUs:
		return fmt.Errorf("node %q: policy.cpus %v: want 0 to %v", node, p.CPUs, MaxCPUs)
	case p.MemoryMB < 0 || p.MemoryMB > MaxMemoryMB:
		return fmt.Errorf("node %q: policy.memory_mb %d: want 0 to %d", node, p.MemoryMB, MaxMemoryMB)
	}
	for name, count := range p.Resources {
		if err := wire.CheckResource(name, count); err != nil {
			return fmt.Errorf("node %q: policy.resources: %w", node, err)
		}
	}
	if err := wire.CheckAllowedCommands(p.AllowedCommands); err != nil {
		return fmt.Errorf("node %q: policy.allowed_commands: %w", node, err)
	}
	return nil
}

// nodeNamePattern is what a node id may be: a host name's characters.
var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// ValidateNode says what is wrong with n, naming the field and the fix.
func ValidateNode(n NodeSpec) error {
	if !nodeNamePattern.MatchString(n.Name) {
		return fmt.Errorf("node name %q: want 1 to 253 letters, digits, '.', '_' or '-', starting with a letter or digit (a node's --node-id)", n.Name)
	}
	if n.Drained && !n.Cordoned {
		return fmt.Errorf("node %q: drained but not cordoned; a drained node is cordoned too", n.Name)
	}
	if n.Policy != nil {
		return checkPolicy(n.Name, *n.Policy)
	}
	return nil
}

// NodeSpecOf is the NodeSpec the state names for node, and whether it
// names one.
func (m *Model) NodeSpecOf(node string) (NodeSpec, bool) {
	i := slices.IndexFunc(m.Nodes, func(n NodeSpec) bool { return n.Name == node })
	if i < 0 {
		return NodeSpec{Name: node}, false
	}
	return m.Nodes[i], true
}

// Schedulable reports whether node may get new replicas.
func (m *Model) Schedulable(node string) bool {
	n, _ := m.NodeSpecOf(node)
	return !n.Cordoned && !n.Drained
}

// Drained reports whether node's replicas are being moved elsewhere.
func (m *Model) Drained(node string) bool {
	n, _ := m.NodeSpecOf(node)
	return n.Drained
}

// SetNodeSpec sets node's NodeSpec in m, sorted by name; one that is
// neither cordoned nor drained and has no policy is removed (the default).
func (m *Model) SetNodeSpec(n NodeSpec) {
	m.Nodes = slices.DeleteFunc(m.Nodes, func(o NodeSpec) bool { return o.Name == n.Name })
	if n.Cordoned || n.Drained || n.Policy != nil {
		m.Nodes = append(m.Nodes, n)
		slices.SortFunc(m.Nodes, func(a, b NodeSpec) int {
			switch {
			case a.Name < b.Name:
				return -1
			case a.Name > b.Name:
				return 1
			}
			return 0
		})
	}
}
