package api

import (
	"context"
	"net/http"

	"github.com/servemesh/servemesh/controlplane/rollout"
	"github.com/servemesh/servemesh/meshspec"
)

// RolloutReport is an endpoint's rollout as GET /v1/endpoints/{name}/rollout
// and the status report show it: the spec, where it is, the live figures of
// the current stage next to the thresholds, and the verdicts so far.
type RolloutReport struct {
	Endpoint  string                `json:"endpoint"`
	Candidate string                `json:"candidate"`
	Primary   string                `json:"primary"`
	Phase     meshspec.RolloutPhase `json:"phase"`
	// Stage is the current stage's name, StageIndex its place in Stages.
	Stage      string   `json:"stage"`
	StageIndex int      `json:"stage_index"`
	Stages     []string `json:"stages"`
	SinceMs    int64    `json:"since_ms"`
	// Checks are the thresholds, defaults filled in.
	Checks   meshspec.RolloutChecks    `json:"checks"`
	Live     *rollout.Live             `json:"live,omitempty"`
	Reason   string                    `json:"reason,omitempty"`
	Verdicts []meshspec.RolloutVerdict `json:"verdicts"`
	Spec     meshspec.Rollout          `json:"spec"`
}

// RolloutActionPath is where an action on an endpoint's rollout is posted.
func RolloutActionPath(endpoint string, action meshspec.RolloutAction) string {
	return "/v1/endpoints/" + esc(endpoint) + "/rollout/" + esc(string(action))
}

// rolloutReport reports e's rollout; nil if it has none started.
func rolloutReport(e meshspec.Endpoint, live map[string]rollout.Live) *RolloutReport {
	r := e.Rollout
	if r == nil || r.Status == nil {
		return nil
	}
	st := r.Status
	out := &RolloutReport{Endpoint: e.Name, Candidate: r.Candidate, Primary: st.Primary, Phase: st.Phase, StageIndex: st.Stage,
		SinceMs: st.SinceMs, Checks: r.Checks.Effective(), Reason: st.Reason, Verdicts: append([]meshspec.RolloutVerdict{}, st.Verdicts...), Spec: r.Spec()}
	for _, s := range r.Stages() {
		out.Stages = append(out.Stages, s.Name())
	}
	if st.Stage >= 0 && st.Stage < len(out.Stages) {
		out.Stage = out.Stages[st.Stage]
	}
	if l, ok := live[e.Name]; ok && st.Phase == meshspec.RolloutProgressing {
		out.Live = &l
	}
	return out
}

func (s *server) startRollout(w http.ResponseWriter, r *http.Request) {
	var spec meshspec.Rollout
	if !decode(w, r, &spec) {
		return
	}
	changed, err := s.c.StartRollout(r.Context(), r.PathValue("name"), spec)
	s.answerChange(w, changed, err, http.StatusCreated)
}

func (s *server) actOnRollout(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.ActOnRollout(r.Context(), r.PathValue("name"), meshspec.RolloutAction(r.PathValue("action")))
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) getRollout(w http.ResponseWriter, r *http.Request) {
	e, err := s.c.GetEndpoint(r.PathValue("name"))
	if err != nil {
		s.answer(w, nil, err)
		return
	}
	var live map[string]rollout.Live
	if s.src.Live != nil {
		live = s.src.Live()
	}
	rep := rolloutReport(e, live)
	if rep == nil {
		writeError(w, http.StatusNotFound, "not_found", "endpoint "+e.Name+" has no rollout; start one with `servemesh rollout start "+e.Name+" --candidate <backend> --steps 0.05,0.25,1`", "")
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// StartRollout starts a rollout on an endpoint.
func (c *Client) StartRollout(ctx context.Context, endpoint string, r meshspec.Rollout) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, "/v1/endpoints/"+esc(endpoint)+"/rollout", r, &out)
}

// ActOnRollout pauses, resumes, promotes or aborts an endpoint's rollout.
func (c *Client) ActOnRollout(ctx context.Context, endpoint string, action meshspec.RolloutAction) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, RolloutActionPath(endpoint, action), nil, &out)
}

// Rollout reads an endpoint's rollout.
func (c *Client) Rollout(ctx context.Context, endpoint string) (RolloutReport, error) {
	var out RolloutReport
	return out, c.do(ctx, http.MethodGet, "/v1/endpoints/"+esc(endpoint)+"/rollout", nil, &out)
}
