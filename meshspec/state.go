package meshspec

import "context"

// Revision identifies one committed state of what is stored. It only
// grows; 0 is "never written".
type Revision uint64

// StateReader reads the stored state and never writes it: what the
// agents read the desired state through (the controller's store is one).
type StateReader interface {
	// Load returns the stored model and its revision; an empty model at
	// revision 0 if nothing was ever stored. What it cannot read is left
	// out, never an error.
	Load(ctx context.Context) (*Model, Revision, error)
	// Wait blocks until the stored revision differs from rev, then
	// returns it, without reading the model: a reader that wrote that
	// revision itself need not read it back (Load reads it). It returns
	// ctx's error when ctx ends.
	Wait(ctx context.Context, rev Revision) (Revision, error)
}

// Touched names what a change of the stored state touched: the backends
// (live or retiring) and the endpoints it put or deleted. Whole says it
// cannot name them: a state read whole, or a change of the nodes or the
// mesh's settings, which any backend or endpoint may read. The controller
// hands it with each state it adopts, so that the data plane lowers and
// translates again only what a change touched.
type Touched struct {
	Whole               bool
	Backends, Endpoints []string
}

// WholeState is what a state read whole touched: everything.
var WholeState = Touched{Whole: true}
