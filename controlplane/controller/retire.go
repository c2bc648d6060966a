package controller

import (
	"slices"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// A deleted backend's replicas finish the requests they have in flight
// (issue 59): whatever deletes a backend (`backend delete`, an apply
// that leaves it out), change moves it to the state's retiring backends
// (meshspec.Model.Retiring) with every placement draining, and the
// reconcile loop drops each placement once drained (see drained) and the
// backend with its last. Until then it holds its name: a backend created
// again under it would run as the same user on its nodes (agents give each
// backend name one), which a deleted backend's successor must not.

// retireDeleted makes retiring, in next, each backend of before that
// next deletes and that still has placements, its placements draining
// from now; its replica count and autoscaling are cleared, so a previous
// release, which reads it as a backend, places nothing more of it.
func retireDeleted(before, next *meshspec.Model, now time.Time) {
	for _, b := range before.Backends {
		if !b.Managed() || len(b.Placements) == 0 {
			continue
		}
		if _, kept := next.Backend(b.Name); kept {
			continue
		}
		b.Placements = slices.Clone(b.Placements)
		for i, p := range b.Placements {
			if p.State != meshspec.Draining {
				b.Placements[i].State, b.Placements[i].Since = meshspec.Draining, now.Unix()
			}
		}
		b.Config.NumReplicas, b.Config.Autoscaling = 0, nil
		next.Retiring = append(next.Retiring, b)
	}
}

// retiringNameTaken refuses a state that creates a backend under the name
// of one still retiring.
func retiringNameTaken(m *meshspec.Model) error {
	for _, r := range m.Retiring {
		if _, taken := m.Backend(r.Name); taken {
			return nameRetiring(r)
		}
	}
	return nil
}

// retiringNamed refuses name if a backend of m retires under it.
func retiringNamed(m *meshspec.Model, name string) error {
	for _, r := range m.Retiring {
		if r.Name == name {
			return nameRetiring(r)
		}
	}
	return nil
}

func nameRetiring(r meshspec.Backend) error {
	return errorf(Conflict, "backend %q was deleted and its replicas are still finishing the requests they had in flight "+
		"(for at most its graceful_shutdown_timeout_s, %s); create it again once they have (`servemesh status` lists it as retiring until then), or give it another name",
		r.Name, r.Config.EffectiveGracefulShutdown())
}

// pruneRetiring drops the drained placements of m's retiring backends, and
// each backend with its last.
func (c *Controller) pruneRetiring(m *meshspec.Model, now time.Time) {
	var kept []meshspec.Backend
	for _, b := range m.Retiring {
		b.Placements = slices.DeleteFunc(b.Placements, func(p meshspec.Placement) bool { return c.drained(&b, p, now) })
		if len(b.Placements) > 0 {
			kept = append(kept, b)
		}
	}
	m.Retiring = kept
}
