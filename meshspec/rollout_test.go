package meshspec

import (
	"maps"
	"strings"
	"testing"
)

func rolloutModel(r Rollout) *Model {
	return &Model{
		Backends: []Backend{{Name: "v1"}, {Name: "v2"}, {Name: "other"}},
		Endpoints: []Endpoint{{Name: "gen", Traffic: map[string]float64{"v1": 1}, Rollout: &r},
			{Name: "side", Traffic: map[string]float64{"other": 1}}},
	}
}

func fullRollout() Rollout {
	return Rollout{Candidate: "v2",
		Shadow: &RolloutShadow{Proportion: 0.5, DurationS: 10, MinRequests: 50},
		Header: &RolloutHeader{Header: "x-canary", Value: "1", DurationS: 10},
		Steps:  []RolloutStep{{Weight: 0.05, DurationS: 10, MinRequests: 50}, {Weight: 0.5, DurationS: 10}, {Weight: 1, DurationS: 10}}}
}

// TestRolloutStagesSetTheTraffic: each stage of a started rollout sets
// the endpoint's traffic, shadow and match rule; the end states send
// everything to one backend, and the user's own rules stay.
func TestRolloutStagesSetTheTraffic(t *testing.T) {
	r := fullRollout()
	names := []string{}
	for _, s := range r.Stages() {
		names = append(names, s.Name())
	}
	if got := strings.Join(names, ", "); got != "shadow 50%, header x-canary=1, traffic 5%, traffic 50%, traffic 100%" {
		t.Fatalf("stages: %s", got)
	}
	own := RequestMatch{Header: "x-user", Exact: "a", Backend: "v1"}
	for _, tc := range []struct {
		phase   RolloutPhase
		stage   int
		traffic map[string]float64
		shadow  float64
		rules   int
	}{
		{RolloutWaiting, 0, map[string]float64{"v1": 1}, 0, 1},
		{RolloutProgressing, 0, map[string]float64{"v1": 1}, 0.5, 1},
		{RolloutProgressing, 1, map[string]float64{"v1": 1}, 0, 2},
		{RolloutPaused, 2, map[string]float64{"v1": 0.95, "v2": 0.05}, 0, 1},
		{RolloutProgressing, 4, map[string]float64{"v2": 1}, 0, 1},
		{RolloutPromoted, 4, map[string]float64{"v2": 1}, 0, 1},
		{RolloutRolledBack, 3, map[string]float64{"v1": 1}, 0, 1},
	} {
		r := fullRollout()
		r.Status = &RolloutStatus{Primary: "v1", Phase: tc.phase, Stage: tc.stage}
		e := Endpoint{Name: "gen", Traffic: map[string]float64{"v1": 0.5, "v2": 0.5}, Shadows: map[string]float64{"v2": 0.1},
			Match: []RequestMatch{own}, Rollout: &r}
		ApplyRollout(&e)
		if !maps.Equal(e.Traffic, tc.traffic) || e.Shadows["v2"] != tc.shadow || len(e.Match) != tc.rules || e.Match[len(e.Match)-1] != own {
			t.Errorf("%s stage %d: traffic %v shadows %v match %v", tc.phase, tc.stage, e.Traffic, e.Shadows, e.Match)
		}
		if tc.rules == 2 && e.Match[0] != (RequestMatch{Header: "x-canary", Exact: "1", Backend: "v2", MeshOnly: true}) { // no public client decides the stage
			t.Errorf("header stage: match %v", e.Match)
		}
		m := rolloutModel(r)
		m.Endpoints[0] = e
		if err := m.Validate(); err != nil {
			t.Errorf("%s stage %d: %v", tc.phase, tc.stage, err)
		}
	}
}

// TestRolloutValidation: every bad field is named with its limit.
func TestRolloutValidation(t *testing.T) {
	for _, tc := range []struct {
		change func(r *Rollout)
		want   string
	}{
		{func(r *Rollout) { r.Candidate = "v9" }, `rollout.candidate: "v9" is not a backend`},
		{func(r *Rollout) { r.Candidate = "other" }, `rollout.candidate: "other" also serves endpoint "side"`},
		{func(r *Rollout) { r.Steps = nil }, "rollout.steps: has 0 steps"},
		{func(r *Rollout) { r.Steps[1].Weight = 0.01 }, "rollout.steps[1].weight: is 0.01; each step's weight is above the one before (0.05)"},
		{func(r *Rollout) { r.Steps[2].Weight = 1.5 }, "rollout.steps[2].weight: is 1.5"},
		{func(r *Rollout) { r.Steps[0].DurationS = -1 }, "rollout.steps[0].duration_s: is -1; set seconds from 0 to 604800"},
		{func(r *Rollout) { r.Shadow.Proportion = 0 }, "rollout.shadow.proportion: is 0"},
		{func(r *Rollout) { r.Header.Header = "X Bad" }, `rollout.header.header: "X Bad" is not a header name`},
		{func(r *Rollout) { r.Header.Value = "" }, "rollout.header.value: is 0 bytes"},
		{func(r *Rollout) { r.Checks.MaxErrorRate = 2 }, "rollout.checks.max_error_rate: is 2; set it from 0 to 1"},
		{func(r *Rollout) { r.Checks.MaxLatencyRatio = 0.5 }, "rollout.checks.max_latency_ratio: is 0.5; a ratio below 1"},
		{func(r *Rollout) { r.Status.Primary = "v2" }, `rollout.candidate: "v2" is the backend that has the endpoint's traffic already`},
		{func(r *Rollout) { r.Status.Stage = 5 }, "rollout.status.stage: is 5; the rollout has 5 stages"},
		{func(r *Rollout) { r.Status.Phase = "done" }, `rollout.status.phase: "done" is not a phase`},
	} {
		r := fullRollout()
		r.Status = &RolloutStatus{Primary: "v1", Phase: RolloutProgressing}
		tc.change(&r)
		m := rolloutModel(r)
		if r.Candidate == "other" {
			m.Endpoints[0].Traffic = map[string]float64{"v1": 1}
		}
		err := m.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	// A finished rollout's candidate may serve other endpoints.
	r := fullRollout()
	r.Candidate = "other"
	r.Status = &RolloutStatus{Primary: "v1", Phase: RolloutPromoted, Stage: 4}
	if err := rolloutModel(r).Validate(); err != nil {
		t.Errorf("finished rollout: %v", err)
	}
	// Its backends may be deleted: it is history.
	m := rolloutModel(r)
	m.Backends = m.Backends[:1]
	m.Endpoints = m.Endpoints[:1]
	if err := m.Validate(); err != nil {
		t.Errorf("finished rollout of a deleted candidate: %v", err)
	}
}

// TestDeclaredRolloutsHaveNoStatus: a file may not set a rollout's status,
// and what users declared of a state leaves it out.
func TestDeclaredRolloutsHaveNoStatus(t *testing.T) {
	_, err := ParseSpec([]byte(`
backends: [{name: v1}, {name: v2}]
endpoints:
- name: gen
  traffic: {v1: 1}
  rollout:
    candidate: v2
    steps: [{weight: 1, duration_s: 10}]
    status: {primary: v1, phase: promoted}
`))
	if err == nil || !strings.Contains(err.Error(), `endpoint "gen".rollout.status`) || !strings.Contains(err.Error(), "servemesh's to set") {
		t.Fatalf("status in a file: %v", err)
	}
	r := fullRollout()
	r.Status = &RolloutStatus{Primary: "v1", Phase: RolloutProgressing}
	s := SpecOf(rolloutModel(r))
	if s.Endpoints[0].Rollout.Status != nil || !s.Endpoints[0].Rollout.SameSpec(r) {
		t.Fatalf("SpecOf kept the status: %+v", s.Endpoints[0].Rollout)
	}
}
