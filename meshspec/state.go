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
