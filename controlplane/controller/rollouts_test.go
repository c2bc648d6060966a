package controller

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func rolloutSetup(t *testing.T) (*Controller, *store.Memory) {
	t.Helper()
	ctx := context.Background()
	st := store.NewMemory()
	c, _ := newLeader(t, st)
	for _, b := range []string{"v1", "v2"} {
		changes(t)(c.CreateBackend(ctx, meshspec.BackendSpecOf(backend(b))))
	}
	changes(t)(c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "gen", Route: "/gen", Traffic: map[string]float64{"v1": 1}}))
	return c, st
}

// changes fails the test unless the call it is given changed the state.
func changes(t *testing.T) func(bool, error) {
	return func(changed bool, err error) {
		t.Helper()
		mustChange(t, changed, err)
	}
}

func twoSteps() meshspec.Rollout {
	return meshspec.Rollout{Candidate: "v2", Shadow: &meshspec.RolloutShadow{Proportion: 1, DurationS: 5},
		Steps: []meshspec.RolloutStep{{Weight: 0.1, DurationS: 5}, {Weight: 1, DurationS: 5}}}
}

func endpointOf(t *testing.T, c *Controller) meshspec.Endpoint {
	t.Helper()
	e, err := c.GetEndpoint("gen")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRolloutMovesOnceAStageAndBackAtAFailure: each verdict moves the
// rollout on in one checkpoint and sets the traffic of the next stage; a
// verdict on a stage already judged changes nothing; a failed one sends
// everything to the primary with the reason.
func TestRolloutMovesOnceAStageAndBackAtAFailure(t *testing.T) {
	ctx := context.Background()
	c, st := rolloutSetup(t)
	changes(t)(c.StartRollout(ctx, "gen", twoSteps()))
	if e := endpointOf(t, c); e.Rollout.Status.Phase != meshspec.RolloutWaiting || !maps.Equal(e.Traffic, map[string]float64{"v1": 1}) || len(e.Shadows) != 0 {
		t.Fatalf("started: %+v", e)
	}
	if changed, err := c.StartRollout(ctx, "gen", twoSteps()); changed || err != nil {
		t.Fatalf("the same start again: changed=%v err=%v", changed, err)
	}
	other := twoSteps()
	other.Steps[0].Weight = 0.2
	_, err := c.StartRollout(ctx, "gen", other)
	mustKind(t, err, Conflict, "rollout of \"v2\" in progress (waiting)")
	_, err = c.SetTraffic(ctx, "gen", map[string]float64{"v2": 1})
	mustKind(t, err, Conflict, "`servemesh rollout promote gen`")

	changes(t)(c.BeginRollout(ctx, "gen"))
	if e := endpointOf(t, c); e.Shadows["v2"] != 1 || !maps.Equal(e.Traffic, map[string]float64{"v1": 1}) {
		t.Fatalf("shadow stage: %+v", e)
	}
	pass := meshspec.RolloutVerdict{Stage: "shadow 100%", Passed: true, Reason: "within the checks"}
	changes(t)(c.JudgeRollout(ctx, "gen", 0, pass))
	if changed, err := c.JudgeRollout(ctx, "gen", 0, pass); changed || err != nil {
		t.Fatalf("judging a stage twice: changed=%v err=%v", changed, err)
	}
	e := endpointOf(t, c)
	if e.Rollout.Status.Stage != 1 || !maps.Equal(e.Traffic, map[string]float64{"v1": 0.9, "v2": 0.1}) || len(e.Shadows) != 0 || len(e.Rollout.Status.Verdicts) != 1 {
		t.Fatalf("first step: %+v %+v", e, e.Rollout.Status)
	}
	fail := meshspec.RolloutVerdict{Stage: "traffic 10%", Reason: "error rate 0.05 above 0.01"}
	changes(t)(c.JudgeRollout(ctx, "gen", 1, fail))
	e = endpointOf(t, c)
	if s := e.Rollout.Status; s.Phase != meshspec.RolloutRolledBack || s.Reason != "traffic 10%: error rate 0.05 above 0.01" || len(s.Verdicts) != 2 ||
		!maps.Equal(e.Traffic, map[string]float64{"v1": 1}) {
		t.Fatalf("rolled back: %+v %+v", e, s)
	}
	// What is stored is what the next leader resumes from.
	m, _, err := st.Load(ctx)
	if err != nil || m.Endpoints[0].Rollout.Status.Phase != meshspec.RolloutRolledBack {
		t.Fatalf("stored: %v %+v", err, m.Endpoints[0].Rollout)
	}
	changes(t)(c.SetTraffic(ctx, "gen", map[string]float64{"v2": 1})) // ended: traffic is the user's again
}

// TestRolloutActions: pause and resume hold and restart a stage; promote
// gives the candidate everything and can scale the primary down.
func TestRolloutActions(t *testing.T) {
	ctx := context.Background()
	c, _ := rolloutSetup(t)
	r := twoSteps()
	r.ScaleDownPrimary = true
	changes(t)(c.StartRollout(ctx, "gen", r))
	changes(t)(c.BeginRollout(ctx, "gen"))
	changes(t)(c.ActOnRollout(ctx, "gen", meshspec.PauseRollout))
	if changed, err := c.JudgeRollout(ctx, "gen", 0, meshspec.RolloutVerdict{Passed: true}); changed || err != nil {
		t.Fatalf("a paused stage was judged: %v %v", changed, err)
	}
	changes(t)(c.ActOnRollout(ctx, "gen", meshspec.ResumeRollout))
	changes(t)(c.ActOnRollout(ctx, "gen", meshspec.PromoteRollout))
	e := endpointOf(t, c)
	if e.Rollout.Status.Phase != meshspec.RolloutPromoted || !maps.Equal(e.Traffic, map[string]float64{"v2": 1}) || len(e.Shadows) != 0 {
		t.Fatalf("promoted: %+v", e)
	}
	_, err := c.ActOnRollout(ctx, "gen", meshspec.AbortRollout)
	mustKind(t, err, Conflict, "has ended (promoted)")
	_, err = c.ActOnRollout(ctx, "gen", "skip")
	mustKind(t, err, Invalid, `"skip" is not an action`)
}

// TestApplyCarriesARolloutOn: a file that declares the running rollout
// keeps its stage and the traffic it sets; one that changes it, or drops
// it, is refused while it runs; a new one starts from the file's traffic.
func TestApplyCarriesARolloutOn(t *testing.T) {
	ctx := context.Background()
	c, _ := rolloutSetup(t)
	r := twoSteps()
	spec := &meshspec.Spec{Backends: []meshspec.BackendSpec{meshspec.BackendSpecOf(backend("v1")), meshspec.BackendSpecOf(backend("v2"))},
		Endpoints: []meshspec.Endpoint{{Name: "gen", Route: "/gen", Traffic: map[string]float64{"v1": 1}, Rollout: &r}}}
	if _, err := c.Apply(ctx, spec, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	changes(t)(c.BeginRollout(ctx, "gen"))
	changes(t)(c.JudgeRollout(ctx, "gen", 0, meshspec.RolloutVerdict{Passed: true}))
	diff, err := c.Apply(ctx, spec, ApplyOptions{})
	if err != nil || len(diff) != 0 {
		t.Fatalf("re-applying the same file: %v %v", diff, err)
	}
	if e := endpointOf(t, c); e.Rollout.Status.Stage != 1 || e.Traffic["v2"] != 0.1 {
		t.Fatalf("after apply: %+v", e)
	}
	changed := twoSteps()
	changed.Steps[0].Weight = 0.2
	spec.Endpoints[0].Rollout = &changed
	_, err = c.Apply(ctx, spec, ApplyOptions{})
	mustKind(t, err, Conflict, "in progress (progressing, stage traffic 10%)")
	spec.Endpoints[0].Rollout = nil
	_, err = c.Apply(ctx, spec, ApplyOptions{})
	mustKind(t, err, Conflict, "in progress")
}

// TestPromotionScalesThePrimaryDownIfAsked: with scale_down_primary, the
// promotion's checkpoint also sets the primary's replicas to 0 and drains
// the running ones.
func TestPromotionScalesThePrimaryDownIfAsked(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 4, MemoryMB: 1000}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	for _, b := range []string{"v1", "v2"} {
		changes(t)(c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend(b, 2, 1))))
	}
	changes(t)(c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "gen", Traffic: map[string]float64{"v1": 1}}))
	r := twoSteps()
	r.ScaleDownPrimary = true
	changes(t)(c.StartRollout(ctx, "gen", r))
	changes(t)(c.BeginRollout(ctx, "gen"))
	changes(t)(c.JudgeRollout(ctx, "gen", 0, meshspec.RolloutVerdict{Passed: true}))
	changes(t)(c.JudgeRollout(ctx, "gen", 1, meshspec.RolloutVerdict{Passed: true}))
	if b, _ := c.GetBackend("v1"); b.Config.NumReplicas != 2 {
		t.Fatalf("v1 scaled before the promotion: %d", b.Config.NumReplicas)
	}
	changes(t)(c.JudgeRollout(ctx, "gen", 2, meshspec.RolloutVerdict{Passed: true}))
	e, _ := c.GetEndpoint("gen")
	b, _ := c.GetBackend("v1")
	if e.Rollout.Status.Phase != meshspec.RolloutPromoted || b.Config.NumReplicas != 0 || perNode(b, meshspec.Running)["n1"] != 0 || perNode(b, meshspec.Draining)["n1"] != 2 {
		t.Fatalf("promoted: %s; v1 wants %d, placements %+v", e.Rollout.Status.Phase, b.Config.NumReplicas, b.Placements)
	}
	if v2, _ := c.GetBackend("v2"); v2.Config.NumReplicas != 2 {
		t.Fatalf("the candidate was scaled: %d", v2.Config.NumReplicas)
	}
}

// TestApplyKeepsAnEndedRolloutsHistory: a file that does not declare an
// ended rollout keeps its record (stages, verdicts), and the file's
// traffic stands; --prune-rollouts removes it, field by field in the diff
// with the verdicts counted, not one long line (issue 40: apply erased
// the history without asking).
func TestApplyKeepsAnEndedRolloutsHistory(t *testing.T) {
	ctx := context.Background()
	c, _ := rolloutSetup(t)
	changes(t)(c.StartRollout(ctx, "gen", twoSteps()))
	changes(t)(c.BeginRollout(ctx, "gen"))
	changes(t)(c.JudgeRollout(ctx, "gen", 0, meshspec.RolloutVerdict{Stage: "shadow 100%", Passed: true}))
	changes(t)(c.ActOnRollout(ctx, "gen", meshspec.PromoteRollout))
	spec := &meshspec.Spec{Backends: []meshspec.BackendSpec{meshspec.BackendSpecOf(backend("v1")), meshspec.BackendSpecOf(backend("v2"))},
		Endpoints: []meshspec.Endpoint{{Name: "gen", Route: "/gen", Traffic: map[string]float64{"v2": 0.5, "v1": 0.5}}}}
	diff, err := c.Apply(ctx, spec, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := endpointOf(t, c)
	if e.Rollout == nil || e.Rollout.Status.Phase != meshspec.RolloutPromoted || len(e.Rollout.Status.Verdicts) != 1 {
		t.Fatalf("the ended rollout's record was not kept: %+v", e.Rollout)
	}
	if !maps.Equal(e.Traffic, map[string]float64{"v1": 0.5, "v2": 0.5}) {
		t.Fatalf("the kept record overrode the file's traffic: %v", e.Traffic)
	}
	if len(diff) != 1 || len(diff[0].Fields) != 2 || diff[0].Fields[0].Field != "traffic.v1" {
		t.Fatalf("the diff of a file keeping the history: %+v", diff)
	}
	diff, err = c.Apply(ctx, spec, ApplyOptions{DryRun: true, PruneRollouts: true})
	if err != nil || len(diff) != 1 {
		t.Fatalf("dry run with prune: %v %v", diff, err)
	}
	lines := map[string]string{}
	for _, f := range diff[0].Fields {
		lines[f.Field] = f.String()
		if len(f.String()) > 200 {
			t.Errorf("a line of the diff is %d characters: %s", len(f.String()), f)
		}
	}
	if lines["rollout.candidate"] != `rollout.candidate: "v2" -> (none)` || lines["rollout.status.verdicts"] != "rollout.status.verdicts: [1 items] -> (none)" ||
		lines["rollout.status.phase"] != `rollout.status.phase: "promoted" -> (none)` {
		t.Errorf("the pruning diff, field by field: %q", lines)
	}
	if _, err := c.Apply(ctx, spec, ApplyOptions{PruneRollouts: true}); err != nil {
		t.Fatal(err)
	}
	if e := endpointOf(t, c); e.Rollout != nil {
		t.Fatalf("prune kept %+v", e.Rollout)
	}
}

// TestApplyListsChangesAsTheyHappen: a dry run listed a backend's
// deletion before that of the endpoint using it (issue 40); changes come
// in the order they take effect.
func TestApplyListsChangesAsTheyHappen(t *testing.T) {
	ctx := context.Background()
	c, _ := rolloutSetup(t)
	spec := &meshspec.Spec{Backends: []meshspec.BackendSpec{meshspec.BackendSpecOf(backend("v1")), meshspec.BackendSpecOf(backend("v3"))},
		Endpoints: []meshspec.Endpoint{{Name: "api", Route: "/api", Traffic: map[string]float64{"v3": 1}}}}
	diff, err := c.Apply(ctx, spec, ApplyOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ch := range diff {
		got = append(got, ch.String())
	}
	want := []string{"create backend v3", "create endpoint api", "delete endpoint gen", "delete backend v2"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
}
