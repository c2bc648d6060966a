package rollout

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Interval is how often the runner looks at every rollout: about as often
// as the agents' loads are read (controlplane/autoscale).
const Interval = time.Second

// Live is what a rollout's current stage has seen so far.
type Live struct {
	Stage string `json:"stage"`
	// WindowS is how long the figures were gathered: since the stage
	// began, or since this controller began watching it (a takeover).
	WindowS   float64 `json:"window_s"`
	Candidate Sample  `json:"candidate"`
	Primary   Sample  `json:"primary"`
}

// Runner judges every progressing rollout from the agents' loads and moves
// it on through the controller. Every controller runs one, so status shows
// the live figures on followers too; only the leader's moves are taken.
type Runner struct {
	ctl   *controller.Controller
	loads func() map[string]wire.Load
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	windows map[string]*window // by endpoint
	live    map[string]Live    // by endpoint

	verdicts *prometheus.CounterVec
}

// New returns a runner reading the nodes' latest loads (by node) from
// loads; reg receives its metrics (nil skips them).
func New(ctl *controller.Controller, loads func() map[string]wire.Load, log *slog.Logger, reg prometheus.Registerer) *Runner {
	r := &Runner{ctl: ctl, loads: loads, log: log, now: time.Now, windows: map[string]*window{}, live: map[string]Live{},
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "servemesh_rollout_verdicts_total",
			Help: "Stages of rollouts judged by this controller, by endpoint and result (passed, failed)."}, []string{"endpoint", "result"}),
	}
	if reg != nil {
		reg.MustRegister(r.verdicts, newCollector(r))
	}
	return r
}

// Run looks at every rollout each Interval until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.Step(ctx)
		}
	}
}

// Step looks at every rollout once: begins those whose candidate is
// ready, updates the live figures of those in a stage, and has the
// controller record each verdict reached.
func (r *Runner) Step(ctx context.Context) {
	leading, _ := r.ctl.Leader()
	loads := r.loads()
	active := map[string]bool{}
	for _, e := range r.ctl.RolloutEndpoints() {
		if !e.Rollout.Active() {
			continue
		}
		active[e.Name] = true
		switch e.Rollout.Status.Phase {
		case meshspec.RolloutWaiting:
			if leading && r.ctl.BackendReady(e.Rollout.Candidate) {
				r.began(r.ctl.BeginRollout(ctx, e.Name))
			}
		case meshspec.RolloutProgressing:
			v, decided := r.observe(e, loads)
			if decided && leading {
				r.judge(ctx, e, v)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.windows {
		if !active[name] {
			delete(r.windows, name)
			delete(r.live, name)
		}
	}
}

// observe adds the latest loads to e's window and judges its stage.
func (r *Runner) observe(e meshspec.Endpoint, loads map[string]wire.Load) (meshspec.RolloutVerdict, bool) {
	ro := e.Rollout
	st := ro.Status
	stage, ok := currentStage(*ro)
	if !ok {
		return meshspec.RolloutVerdict{}, false // a stored state no validation passed: nothing to judge
	}
	checks := ro.Checks.Effective()
	r.mu.Lock()
	defer r.mu.Unlock()
	key := windowKey{stage: st.Stage, sinceMs: st.SinceMs}
	w := r.windows[e.Name]
	if w == nil || w.key != key {
		w = newWindow(key)
		w.started = r.now()
		r.windows[e.Name] = w
	}
	c := w.observe(loads, ro.Candidate, st.Primary)
	cand := sampleOf(c[0], judgedPercentile(checks.LatencyPercentile, c[0].timed()))
	prim := sampleOf(c[1], cand.Percentile) // compared at the candidate's percentile
	now := r.now()
	r.live[e.Name] = Live{Stage: stage.Name(), WindowS: now.Sub(w.started).Seconds(), Candidate: cand, Primary: prim}
	return Judge(stage, ro.Checks, now.Sub(time.UnixMilli(st.SinceMs)), cand, baseline(prim, st.Verdicts, checks.MinSample))
}

// judge has the controller record v on e's current stage.
func (r *Runner) judge(ctx context.Context, e meshspec.Endpoint, v meshspec.RolloutVerdict) {
	changed, err := r.ctl.JudgeRollout(ctx, e.Name, e.Rollout.Status.Stage, v)
	if err != nil {
		r.log.Warn("rollout: recording a verdict failed; judging again", "endpoint", e.Name, "stage", v.Stage, "err", err)
		return
	}
	if !changed {
		return
	}
	result := "passed"
	if !v.Passed {
		result = "failed"
		r.log.Warn("rollout: a check failed; all traffic is back on the primary", "endpoint", e.Name, "candidate", e.Rollout.Candidate,
			"stage", v.Stage, "reason", v.Reason)
	} else {
		r.log.Info("rollout: stage passed", "endpoint", e.Name, "candidate", e.Rollout.Candidate, "stage", v.Stage, "reason", v.Reason)
	}
	r.verdicts.WithLabelValues(e.Name, result).Inc()
}

func (r *Runner) began(_ bool, err error) {
	if err != nil {
		r.log.Warn("rollout: beginning a rollout failed; trying again", "err", err)
	}
}

// currentStage is the stage a started rollout is at, if it has it.
func currentStage(r meshspec.Rollout) (meshspec.RolloutStage, bool) {
	stages := r.Stages()
	if r.Status == nil || r.Status.Stage < 0 || r.Status.Stage >= len(stages) {
		return meshspec.RolloutStage{}, false
	}
	return stages[r.Status.Stage], true
}

// Live returns, by endpoint, the figures of each rollout's current stage.
func (r *Runner) Live() map[string]Live {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.live)
}
