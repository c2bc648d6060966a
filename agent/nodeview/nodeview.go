package nodeview

import (
	"sync/atomic"

	"github.com/servemesh/servemesh/meshspec"
)

// View is one revision of the desired state, seen from one node. Read
// only once made; nil reads as no desired state yet.
type View struct {
	node     string
	model    *meshspec.Model
	backends map[string]meshspec.Backend
	here     map[string]bool // backends with a running placement on node
}

// Latest is the node's latest view: the agent sets it as it reads each
// desired state, and the node's other parts (the activator, the picker,
// the rate limit service, the tracer) read it, built with it before the
// agent is. The zero value holds none.
type Latest struct{ v atomic.Pointer[View] }

// Set makes v the latest view.
func (l *Latest) Set(v *View) { l.v.Store(v) }

// View is the latest view; nil before the first.
func (l *Latest) View() *View { return l.v.Load() }

// Model is the latest view's desired state; nil before the first.
func (l *Latest) Model() *meshspec.Model { return l.View().Model() }

// New makes node's view of m; nil for a nil m.
func New(m *meshspec.Model, node string) *View {
	if m == nil {
		return nil
	}
	served := m.Served() // retiring backends too: their replicas drain here
	v := &View{node: node, model: m, backends: make(map[string]meshspec.Backend, len(served)), here: map[string]bool{}}
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

// Model is the desired state the view was made of; nil for a nil view.
func (v *View) Model() *meshspec.Model {
	if v == nil {
		return nil
	}
	return v.model
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
