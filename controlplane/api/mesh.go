package api

import (
	"context"
	"net/http"

	"github.com/servemesh/servemesh/meshspec"
)

// SpecPath is where the declared state is read whole, as apply takes it.
const SpecPath = "/v1/spec"

// getSpec answers what users declared of the adopted state: every kind
// of setting, of one revision, so that export is complete by
// construction.
func (s *server) getSpec(w http.ResponseWriter, _ *http.Request) {
	m, _ := s.c.State()
	writeJSON(w, http.StatusOK, meshspec.SpecOf(m))
}

// Spec reads the declared state whole (GET /v1/spec); an *Error of status
// 404 from a controller of a release that does not serve it.
func (c *Client) Spec(ctx context.Context) (*meshspec.Spec, error) {
	var out meshspec.Spec
	return &out, c.do(ctx, http.MethodGet, SpecPath, nil, &out)
}

// TracingPath is where the mesh's tracing is read (GET), set (PUT) or
// removed (DELETE).
const TracingPath = "/v1/mesh/tracing"

func (s *server) getTracing(w http.ResponseWriter, _ *http.Request) {
	t, err := s.c.Tracing()
	s.answer(w, t, err)
}

func (s *server) setTracing(w http.ResponseWriter, r *http.Request) {
	var t meshspec.Tracing
	if !decode(w, r, &t) {
		return
	}
	changed, err := s.c.SetTracing(r.Context(), &t)
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) clearTracing(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.SetTracing(r.Context(), nil)
	s.answerChange(w, changed, err, http.StatusOK)
}

// Tracing reads the mesh's tracing; a *StatusError of 404 when it has none.
func (c *Client) Tracing(ctx context.Context) (*meshspec.Tracing, error) {
	var out meshspec.Tracing
	return &out, c.do(ctx, http.MethodGet, TracingPath, nil, &out)
}

// SetTracing sets the mesh's tracing; nil removes it.
func (c *Client) SetTracing(ctx context.Context, t *meshspec.Tracing) (bool, error) {
	var out Changed
	if t == nil {
		return out.Changed, c.do(ctx, http.MethodDelete, TracingPath, nil, &out)
	}
	return out.Changed, c.do(ctx, http.MethodPut, TracingPath, t, &out)
}
