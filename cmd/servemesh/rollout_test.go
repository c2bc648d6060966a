package main

import (
	"strings"
	"testing"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/rollout"
	"github.com/servemesh/servemesh/meshspec"
)

// TestRolloutFlagsAndStatus: the flags make the rollout they say, bad
// ones name the flag, and `rollout status` shows the stage, the live
// figures next to the thresholds, and the verdicts.
func TestRolloutFlagsAndStatus(t *testing.T) {
	f := rolloutFlags{candidate: "v2", steps: "0.1, 1", shadow: 0.5, header: "x-canary=1", duration: 30e9, minRequests: 10}
	r, err := f.rollout()
	if err != nil || len(r.Stages()) != 4 || r.Header.Value != "1" || r.Steps[0].DurationS != 30 || r.Shadow.MinRequests != 10 {
		t.Fatalf("rollout %+v, %v", r, err)
	}
	for _, bad := range []rolloutFlags{{steps: "1"}, {candidate: "v2", steps: "x"}, {candidate: "v2", steps: "1", header: "x-canary"}} {
		if _, err := bad.rollout(); err == nil || !strings.HasPrefix(err.Error(), "--") {
			t.Errorf("%+v: %v; want an error naming the flag", bad, err)
		}
	}
	var out strings.Builder
	rep := api.RolloutReport{Endpoint: "gen", Candidate: "v2", Primary: "v1", Phase: meshspec.RolloutProgressing, StageIndex: 1,
		Stages: []string{"shadow 50%", "traffic 10%", "traffic 100%"}, Checks: meshspec.RolloutChecks{}.Effective(),
		Live: &rollout.Live{Stage: "traffic 10%", WindowS: 12, Candidate: rollout.Sample{RolloutFigures: meshspec.RolloutFigures{Requests: 40, Errors: 1, ErrorRate: 0.025, LatencyMs: 9.5}},
			Primary: rollout.Sample{RolloutFigures: meshspec.RolloutFigures{Requests: 360, LatencyMs: 8}}},
		Verdicts: []meshspec.RolloutVerdict{{Stage: "shadow 50%", Passed: true, Reason: "within the checks"}}}
	if err := printRollout(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rolling out v2 over v1", "✓ shadow 50%", "▶ traffic 10%", "  traffic 100%", "2.50%", "≤ 1.00%", "9.5 ms", "≤ 2 × primary", "passed   shadow 50%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rollout status lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRolloutStatusSaysHowItEnded: an aborted or failed rollout's status
// said "rolling out" still, and "phase waiting" went unexplained (issue
// 40): each phase now says what it means for the requests.
func TestRolloutStatusSaysHowItEnded(t *testing.T) {
	for _, c := range []struct {
		phase meshspec.RolloutPhase
		want  []string
		not   string
	}{
		{meshspec.RolloutRolledBack, []string{"endpoint gen: rollout of v2 ended; every request is back on v1", "phase rolled_back", "aborted by the operator",
			"(rolled back: a check failed, or the rollout was aborted; servemesh rollout start begins another)"}, "rolling out"},
		{meshspec.RolloutPromoted, []string{"endpoint gen: rolled v2 out: it has every request; v1 has none"}, "rolling out"},
		{meshspec.RolloutWaiting, []string{"rolling out v2 over v1", "(waiting: the candidate has no ready replica yet, so every request stays on the primary"}, "▶"},
	} {
		var out strings.Builder
		rep := api.RolloutReport{Endpoint: "gen", Candidate: "v2", Primary: "v1", Phase: c.phase, Reason: "aborted by the operator",
			Stages: []string{"traffic 10%", "traffic 100%"}, Checks: meshspec.RolloutChecks{}.Effective()}
		if err := printRollout(&out, rep); err != nil {
			t.Fatal(err)
		}
		for _, want := range c.want {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: rollout status lacks %q:\n%s", c.phase, want, out.String())
			}
		}
		if strings.Contains(out.String(), c.not) {
			t.Errorf("%s: rollout status says %q:\n%s", c.phase, c.not, out.String())
		}
	}
}
