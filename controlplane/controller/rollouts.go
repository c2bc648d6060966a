package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// A rollout's every move is one checkpointed change of its endpoint: the
// stage, the verdict that ended the last one and the traffic the new one
// sets are written together, and each move names the phase and stage it
// moves from, so a move made twice (a controller that crashed after its
// checkpoint, then the one that took over) changes nothing the second time.

// StartRollout starts rolling out r.Candidate on an endpoint whose traffic
// all goes to one backend, the primary. Starting the same rollout again
// while it runs changes nothing; a different one is refused until the
// running one is promoted or aborted.
func (c *Controller) StartRollout(ctx context.Context, endpoint string, r meshspec.Rollout) (bool, error) {
	if err := meshspec.CheckDeclared("rollout", meshspec.Endpoint{Rollout: &r}); err != nil {
		return false, &Error{Kind: Invalid, Msg: "refused", Err: err}
	}
	return c.mutate(ctx, "start_rollout", func(m *meshspec.Model) error {
		e, err := rolloutEndpoint(m, endpoint)
		if err != nil {
			return err
		}
		if e.Rollout.Active() {
			if e.Rollout.SameSpec(r) {
				return nil
			}
			return busyRollout(*e)
		}
		return startRollout(e, r, c.now())
	})
}

// startRollout sets e's rollout to r, started now, and the traffic of its
// first phase.
func startRollout(e *meshspec.Endpoint, r meshspec.Rollout, now time.Time) error {
	primary, ok := soleBackend(e.Traffic)
	if !ok {
		return errorf(Invalid, "endpoint %q splits its traffic over %v; a rollout starts from one backend with all of it: `servemesh traffic set %s <backend>=1` first", e.Name, meshspec.SortedKeys(e.Traffic), e.Name)
	}
	if primary == r.Candidate {
		return errorf(Invalid, "rollout.candidate: %q has all of endpoint %q's traffic already; roll out another backend", r.Candidate, e.Name)
	}
	r = r.Spec()
	r.Status = &meshspec.RolloutStatus{Primary: primary, Phase: meshspec.RolloutWaiting, SinceMs: now.UnixMilli()}
	e.Rollout = &r
	meshspec.ApplyRollout(e)
	return nil
}

// soleBackend returns the backend that has all of a traffic policy.
func soleBackend(traffic map[string]float64) (string, bool) {
	for b, w := range traffic {
		if w == 1 && len(traffic) == 1 {
			return b, true
		}
	}
	return "", false
}

// ActOnRollout pauses, resumes, promotes or aborts an endpoint's active
// rollout. Asking for the state it is in changes nothing.
func (c *Controller) ActOnRollout(ctx context.Context, endpoint string, action meshspec.RolloutAction) (bool, error) {
	if !slices.Contains(meshspec.RolloutActions, action) {
		return false, errorf(Invalid, "%q is not an action on a rollout; use one of %v", action, meshspec.RolloutActions)
	}
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	return c.mutate(ctx, string(action)+"_rollout", func(m *meshspec.Model) error {
		e, err := rolloutEndpoint(m, endpoint)
		if err != nil {
			return err
		}
		r := e.Rollout
		if r == nil {
			return errorf(NotFound, "endpoint %q has no rollout; start one with `servemesh rollout start %s --candidate <backend>`", endpoint, endpoint)
		}
		st := r.Status
		if !st.Phase.Active() {
			return errorf(Conflict, "the rollout of endpoint %q has ended (%s); start a new one", endpoint, st.Phase)
		}
		now := c.now()
		switch action {
		case meshspec.PauseRollout:
			if st.Phase == meshspec.RolloutProgressing {
				st.Phase, st.SinceMs = meshspec.RolloutPaused, now.UnixMilli()
			}
		case meshspec.ResumeRollout:
			if st.Phase == meshspec.RolloutPaused {
				st.Phase, st.SinceMs = meshspec.RolloutProgressing, now.UnixMilli()
			}
		case meshspec.PromoteRollout:
			return c.endRollout(m, e, meshspec.RolloutPromoted, "promoted by a user", nodes, now)
		case meshspec.AbortRollout:
			return c.endRollout(m, e, meshspec.RolloutRolledBack, "aborted by a user", nodes, now)
		}
		return nil
	})
}

// BeginRollout moves a waiting rollout to its first stage: the caller saw
// its candidate ready. Anything else changes nothing.
func (c *Controller) BeginRollout(ctx context.Context, endpoint string) (bool, error) {
	return c.mutate(ctx, "begin_rollout", func(m *meshspec.Model) error {
		e, err := rolloutEndpoint(m, endpoint)
		if err != nil || e.Rollout == nil || e.Rollout.Status.Phase != meshspec.RolloutWaiting {
			return err
		}
		st := e.Rollout.Status
		st.Phase, st.Stage, st.SinceMs = meshspec.RolloutProgressing, 0, c.now().UnixMilli()
		meshspec.ApplyRollout(e)
		return nil
	})
}

// JudgeRollout records the verdict on stage of an endpoint's rollout and
// moves it on in the same checkpoint: to the next stage, to promotion after
// the last, or, if the verdict failed, back to the primary. It changes
// nothing unless the rollout is still progressing at that stage, so a
// stage is judged once whoever judges it.
func (c *Controller) JudgeRollout(ctx context.Context, endpoint string, stage int, v meshspec.RolloutVerdict) (bool, error) {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	return c.mutate(ctx, "judge_rollout", func(m *meshspec.Model) error {
		e, err := rolloutEndpoint(m, endpoint)
		if err != nil || e.Rollout == nil {
			return err
		}
		st := e.Rollout.Status
		if st.Phase != meshspec.RolloutProgressing || st.Stage != stage {
			return nil // judged already
		}
		now := c.now()
		v.AtMs = now.UnixMilli()
		st.Verdicts = append(st.Verdicts, v)
		switch {
		case !v.Passed:
			return c.endRollout(m, e, meshspec.RolloutRolledBack, v.Stage+": "+v.Reason, nodes, now)
		case stage+1 >= len(e.Rollout.Stages()):
			return c.endRollout(m, e, meshspec.RolloutPromoted, "every stage passed", nodes, now)
		}
		st.Stage, st.SinceMs = stage+1, now.UnixMilli()
		meshspec.ApplyRollout(e)
		return nil
	})
}

// endRollout ends e's rollout in phase, sets the traffic it leaves, and at
// a promotion scales the primary down if the rollout says so.
func (c *Controller) endRollout(m *meshspec.Model, e *meshspec.Endpoint, phase meshspec.RolloutPhase, reason string, nodes []wire.NodeInfo, now time.Time) error {
	st := e.Rollout.Status
	st.Phase, st.Reason, st.SinceMs = phase, reason, now.UnixMilli()
	meshspec.ApplyRollout(e)
	if phase != meshspec.RolloutPromoted || !e.Rollout.ScaleDownPrimary {
		return nil
	}
	i := findBackend(m, st.Primary)
	if i < 0 || !m.Backends[i].Managed() || m.Backends[i].Config.Autoscaling != nil {
		return nil
	}
	m.Backends[i].Config.NumReplicas = 0
	return schedule(m, i, nodes, now, c.readyTags(st.Primary))
}

// rolloutEndpoint finds the endpoint a rollout call names.
func rolloutEndpoint(m *meshspec.Model, name string) (*meshspec.Endpoint, error) {
	i := findEndpoint(m, name)
	if i < 0 {
		return nil, errorf(NotFound, "endpoint %q is not registered; %s", name, endpointHint(m, name))
	}
	return &m.Endpoints[i], nil
}

// busyRollout is the error for a change an active rollout of e forbids.
func busyRollout(e meshspec.Endpoint) error {
	st := e.Rollout.Status
	where := string(st.Phase)
	if stages := e.Rollout.Stages(); st.Phase != meshspec.RolloutWaiting && st.Stage < len(stages) {
		where = fmt.Sprintf("%s, stage %s", st.Phase, stages[st.Stage].Name())
	}
	return errorf(Conflict, "endpoint %q has a rollout of %q in progress (%s), which sets its traffic; `servemesh rollout promote %s` or `servemesh rollout abort %s` first",
		e.Name, e.Rollout.Candidate, where, e.Name, e.Name)
}

// BackendReady reports whether a backend of the last adopted state can
// answer: a process backend needs a running replica that passes its
// checks; others are ready.
func (c *Controller) BackendReady(name string) bool {
	m := c.adopted.Load().model // adopted states are never modified
	i := findBackend(m, name)
	if i < 0 {
		return false
	}
	b := m.Backends[i]
	if !b.Managed() {
		return true
	}
	ready := c.readyTags(name)
	for _, p := range b.Placements {
		if p.State == meshspec.Running && (c.healthy == nil || ready[p.Tag]) { // no health view: every placed replica counts
			return true
		}
	}
	return false
}

// RolloutEndpoints returns copies of the endpoints of the last adopted
// state that have a rollout, without copying the rest of the state (the
// rollout runner reads them every second).
func (c *Controller) RolloutEndpoints() []meshspec.Endpoint {
	var out []meshspec.Endpoint
	for _, e := range c.adopted.Load().model.Endpoints {
		if e.Rollout != nil {
			out = append(out, meshspec.CloneEndpoint(e))
		}
	}
	return out
}

// carryRollouts keeps, for each endpoint of desired whose file declares
// the rollout current has, the rollout's status and the traffic it sets;
// a new rollout in the file starts now; an ended one the file does not
// declare is kept (its history) unless prune. A file may not replace a
// rollout in progress.
func carryRollouts(current, desired *meshspec.Model, now time.Time, prune bool) error {
	cur := indexByName(current.Endpoints, func(e meshspec.Endpoint) string { return e.Name })
	for i := range desired.Endpoints {
		d := &desired.Endpoints[i]
		var was *meshspec.Rollout
		if j, ok := cur[d.Name]; ok {
			was = current.Endpoints[j].Rollout
		}
		switch {
		case d.Rollout == nil && was.Active():
			return busyRollout(current.Endpoints[cur[d.Name]])
		case d.Rollout == nil && was != nil && !prune:
			// An ended rollout's record is its history (stages, verdicts):
			// a file that does not declare it keeps it, inert (the file's
			// traffic stands), unless told to prune it.
			d.Rollout = meshspec.CloneEndpoint(current.Endpoints[cur[d.Name]]).Rollout
		case d.Rollout == nil:
		case was != nil && was.SameSpec(*d.Rollout):
			r := *d.Rollout
			r.Status = was.Status
			d.Rollout = &r
			meshspec.ApplyRollout(d)
		case was.Active():
			return busyRollout(current.Endpoints[cur[d.Name]])
		default:
			if err := startRollout(d, *d.Rollout, now); err != nil {
				return err
			}
		}
	}
	return nil
}
