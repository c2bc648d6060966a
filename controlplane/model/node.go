package model

import (
	"fmt"
	"regexp"
	"slices"
)

// NodeSpec is what the desired state says of a node: its maintenance, the
// operator's to set (servemesh node cordon|uncordon|drain). What a node
// offers is its agent's to say (wire.NodeInfo). A node the state names
// no NodeSpec for is schedulable.
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
// neither cordoned nor drained is removed (the default).
func (m *Model) SetNodeSpec(n NodeSpec) {
	m.Nodes = slices.DeleteFunc(m.Nodes, func(o NodeSpec) bool { return o.Name == n.Name })
	if n.Cordoned || n.Drained {
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
