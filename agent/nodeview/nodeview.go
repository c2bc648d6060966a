package nodeview

import "github.com/servemesh/servemesh/meshspec"

// View is one revision of the desired state, seen from one node. Read
// only once made; nil reads as no desired state yet.
type View struct {
	node     string
	backends map[string]meshspec.Backend
	here     map[string]bool // backends with a running placement on node
}

// New makes node's view of m; nil for a nil m.
func New(m *meshspec.Model, node string) *View {
	if m == nil {
		return nil
	}
	served := m.Served() // retiring backends too: their replicas drain here
	v := &View{node: node, backends: make(map[string]meshspec.Backend, len(served)), here: map[string]bool{}}
	for _, b := range served {
		v.backends[b.Name] = b
		for _, p := range b.Placements {
			if p.Node == node && p.State == meshspec.Running {
				v.here[b.Name] = true
				break
			}
		}
	}
	return v
}

// Backend is the backend named name.
func (v *View) Backend(name string) (meshspec.Backend, bool) {
	if v == nil {
		return meshspec.Backend{}, false
	}
	b, ok := v.backends[name]
	return b, ok
}

// PlacedHere reports whether a replica of the backend named name is to
// run on the view's node.
func (v *View) PlacedHere(name string) bool { return v != nil && v.here[name] }
