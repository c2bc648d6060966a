package rollout

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// fakeLoads are the nodes' loads a test sets.
type fakeLoads struct{ loads map[string]wire.Load }

func (f *fakeLoads) latest() map[string]wire.Load { return f.loads }

// set gives node n's Envoy these totals for v1 and v2.
func (f *fakeLoads) set(n string, v1, v2 wire.BackendLoad) {
	f.loads[n] = wire.Load{Node: n, Backends: map[string]wire.BackendLoad{"v1": v1, "v2": v2}}
}

func totals(requests, errors uint64, ms float64) wire.BackendLoad {
	return wire.BackendLoad{Requests: requests, Errors: errors, Latency: histogram(requests, ms)}
}

// TestRunnerBeginsJudgesAndRollsBack drives a runner over a real
// controller: it begins a rollout whose candidate is ready, passes a stage
// whose figures are within the checks once its duration is over, and
// rolls back at the first figures that fail one; each step is what the
// controller stored, and the metrics say so.
func TestRunnerBeginsJudgesAndRollsBack(t *testing.T) {
	ctx := context.Background()
	ctl := controller.New(controller.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: store.NewMemory(),
		Publish: func(*meshspec.Model, meshspec.Revision) error { return nil }})
	if err := ctl.Lead(ctx, "self"); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"v1", "v2"} {
		if _, err := ctl.CreateBackend(ctx, meshspec.BackendSpec{Name: b, Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.1:9000"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ctl.CreateEndpoint(ctx, meshspec.Endpoint{Name: "gen", Traffic: map[string]float64{"v1": 1}}); err != nil {
		t.Fatal(err)
	}
	loads := &fakeLoads{loads: map[string]wire.Load{}}
	reg := prometheus.NewRegistry()
	r := New(ctl, loads.latest, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	now := time.Now()
	r.now = func() time.Time { return now }
	if _, err := ctl.StartRollout(ctx, "gen", meshspec.Rollout{Candidate: "v2",
		Steps: []meshspec.RolloutStep{{Weight: 0.1, DurationS: 10, MinRequests: 50}, {Weight: 1, DurationS: 10}}}); err != nil {
		t.Fatal(err)
	}
	phase := func() *meshspec.RolloutStatus {
		e, _ := ctl.GetEndpoint("gen")
		return e.Rollout.Status
	}
	r.Step(ctx)
	if st := phase(); st.Phase != meshspec.RolloutProgressing || st.Stage != 0 {
		t.Fatalf("after the first step: %+v; want the first stage begun (a listed backend is ready)", st)
	}
	loads.set("n1", totals(1000, 0, 4), totals(0, 0, 4)) // the window starts here
	r.Step(ctx)
	loads.set("n1", totals(1900, 0, 4), totals(100, 0, 4))
	r.Step(ctx)
	if st := phase(); st.Stage != 0 || len(st.Verdicts) != 0 {
		t.Fatalf("judged before the stage's 10 s: %+v", st)
	}
	if live := r.Live()["gen"]; live.Candidate.Requests != 100 || live.Primary.Requests != 900 || live.Stage != "traffic 10%" {
		t.Fatalf("live figures: %+v", live)
	}
	now = now.Add(11 * time.Second)
	r.Step(ctx)
	if st := phase(); st.Stage != 1 || len(st.Verdicts) != 1 || !st.Verdicts[0].Passed {
		t.Fatalf("after the stage's duration: %+v", st)
	}
	r.Step(ctx) // the next stage's window starts from these totals
	loads.set("n1", totals(1900, 0, 4), totals(200, 10, 4))
	r.Step(ctx)
	st := phase()
	if st.Phase != meshspec.RolloutRolledBack || len(st.Verdicts) != 2 || st.Verdicts[1].Passed || st.Verdicts[1].Candidate.Errors != 10 {
		t.Fatalf("after 10%% errors: %+v", st)
	}
	if got := testutil.ToFloat64(r.verdicts.WithLabelValues("gen", "failed")); got != 1 {
		t.Errorf("failed verdicts counted: %v", got)
	}
	if n, err := testutil.GatherAndCount(reg, "servemesh_rollout_phase"); err != nil || n != 1 {
		t.Errorf("servemesh_rollout_phase series: %d, %v", n, err)
	}
}
