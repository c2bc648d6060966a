package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func findBackend(m *meshspec.Model, name string) int {
	return slices.IndexFunc(m.Backends, func(b meshspec.Backend) bool { return b.Name == name })
}

func findEndpoint(m *meshspec.Model, name string) int {
	return slices.IndexFunc(m.Endpoints, func(e meshspec.Endpoint) bool { return e.Name == name })
}

// registered refuses traffic to the first of backends m does not have,
// saying what to write instead.
func registered(m *meshspec.Model, backends []string) error {
	for _, b := range backends {
		if findBackend(m, b) < 0 {
			return errorf(Invalid, "attempted to assign traffic to a backend %q that is not registered (create it first); %s", b, backendHint(m, b))
		}
	}
	return nil
}

// backendHint and endpointHint say what to write instead of a name m does
// not have: the nearest one, and the names there are (meshspec.Suggest).
func backendHint(m *meshspec.Model, name string) string {
	return hint("backend", name, m.Backends, func(b meshspec.Backend) string { return b.Name })
}

func endpointHint(m *meshspec.Model, name string) string {
	return hint("endpoint", name, m.Endpoints, func(e meshspec.Endpoint) string { return e.Name })
}

func hint[T any](kind, name string, items []T, nameOf func(T) string) string {
	names := make([]string, len(items))
	for i, x := range items {
		names[i] = nameOf(x)
	}
	return meshspec.Suggest(kind, name, names)
}

// CreateBackend adds a backend. Creating it again with the same spec changes
// nothing; with a different spec it is a conflict.
//
// A backend with a process gets Config.NumReplicas replicas placed on nodes;
// if they do not all fit, nothing is created.
func (c *Controller) CreateBackend(ctx context.Context, spec meshspec.BackendSpec) (bool, error) {
	ctx = specsWritten(ctx)
	b := spec.Backend() // an autoscaled one starting at its initial_replicas
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	return c.mutate(ctx, "create_backend", func(m *meshspec.Model) error {
		if err := meshspec.ValidateBackend(b); err != nil {
			return &Error{Kind: Invalid, Msg: "refused", Err: err} // before any work its numbers size
		}
		if err := c.guard(ctx, m, &meshspec.Model{Backends: []meshspec.Backend{b}}); err != nil {
			return err // before placement says whether it would fit
		}
		if err := retiringNamed(m, b.Name); err != nil {
			return err
		}
		if i := findBackend(m, b.Name); i >= 0 {
			if meshspec.BackendsEqual(m.Backends[i].Spec(), b) {
				return nil
			}
			return errorf(Conflict, "backend %q already exists with a different spec; use `backend update` to change its config, or delete it first", b.Name)
		}
		m.Backends = append(m.Backends, b)
		return schedule(m, len(m.Backends)-1, nodes, c.now(), nil)
	})
}

// UpdateBackendConfig changes the set fields of a backend's config (Ray
// Serve's update_backend_config), as PatchBackendConfig does with the
// patch's merge patch.
func (c *Controller) UpdateBackendConfig(ctx context.Context, name string, patch meshspec.BackendConfigPatch) (bool, error) {
	p, err := patch.MergePatch()
	if err != nil {
		return false, &Error{Kind: Invalid, Msg: "refused", Err: err}
	}
	return c.PatchBackendConfig(ctx, name, p)
}

// PatchBackendConfig merges patch into a backend's config, and replaces
// its listed replicas if the patch lists them; the result is validated
// before any work its numbers size, and placed.
func (c *Controller) PatchBackendConfig(ctx context.Context, name string, patch meshspec.ConfigPatch) (bool, error) {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	return c.mutate(ctx, "update_backend", func(m *meshspec.Model) error {
		i := findBackend(m, name)
		if i < 0 {
			return errorf(NotFound, "backend %q is not registered; %s", name, backendHint(m, name))
		}
		if patch.Empty() {
			return errorf(Invalid, "the update sets no field; set at least one of max_concurrent_queries, num_replicas, cpus, memory_mb, autoscaling, replicas")
		}
		if replicas := patch.Replicas(); replicas != nil {
			if b := m.Backends[i]; b.Process != nil || b.External != nil {
				return errorf(Invalid, "backend %q %s: replicas are set only on a backend of listed replicas", name, source(b))
			}
			m.Backends[i].Replicas = meshspec.BackendSpec{Replicas: replicas}.Backend().Replicas
		}
		next, err := patch.Apply(m.Backends[i].Config)
		if err != nil {
			return &Error{Kind: Invalid, Msg: "refused", Err: err}
		}
		if as := next.Autoscaling; as != nil {
			if patch.Sets("num_replicas") {
				return errorf(Conflict, "backend %q is autoscaled between %d and %d replicas: the autoscaler sets num_replicas; change autoscaling.min_replicas and max_replicas instead, or turn autoscaling off", name, as.MinReplicas, as.MaxReplicas)
			}
			next.NumReplicas = min(max(next.NumReplicas, as.MinReplicas), as.MaxReplicas)
		}
		m.Backends[i].Config = next
		if err := meshspec.ValidateBackend(m.Backends[i]); err != nil {
			return &Error{Kind: Invalid, Msg: "refused", Err: err} // before any work its numbers size
		}
		return schedule(m, i, nodes, c.now(), c.readyTags(name))
	})
}

// plural is noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}

// source says where a process or external backend's replicas come from.
func source(b meshspec.Backend) string {
	if b.Process != nil {
		return "runs a process, whose replicas servemesh places (scale it with num_replicas)"
	}
	return fmt.Sprintf("routes to Consul service %q's instances", b.External.Service)
}

// DeleteBackend removes a backend no endpoint uses. Deleting a backend that
// does not exist changes nothing.
func (c *Controller) DeleteBackend(ctx context.Context, name string) (bool, error) {
	return c.mutate(ctx, "delete_backend", func(m *meshspec.Model) error {
		i := findBackend(m, name)
		if i < 0 {
			return nil
		}
		var routes, shadows []string
		for _, e := range m.Endpoints {
			if e.RoutesTo(name) {
				routes = append(routes, fmt.Sprintf("%q", e.Name))
			}
			if p, ok := e.Shadows[name]; ok && p > 0 {
				shadows = append(shadows, fmt.Sprintf("%q", e.Name))
			}
		}
		var uses, fixes []string
		if len(routes) > 0 {
			uses = append(uses, fmt.Sprintf("it is in the traffic of %s %s", plural(len(routes), "endpoint"), strings.Join(routes, ", ")))
			fixes = append(fixes, "take it out of that traffic")
		}
		if len(shadows) > 0 {
			uses = append(uses, fmt.Sprintf("%s %s %s requests to it", plural(len(shadows), "endpoint"), strings.Join(shadows, ", "), verb(len(shadows), "mirrors", "mirror")))
			fixes = append(fixes, "set those shadows to 0")
		}
		if len(uses) > 0 {
			return errorf(Conflict, "backend %q cannot be deleted: %s; %s first", name, strings.Join(uses, ", and "), strings.Join(fixes, " and "))
		}
		m.Backends = slices.Delete(m.Backends, i, i+1)
		return nil
	})
}

// CreateEndpoint adds an endpoint with its route (or none: headless), methods
// and initial traffic. Creating it again with the same spec changes nothing.
func (c *Controller) CreateEndpoint(ctx context.Context, e meshspec.Endpoint) (bool, error) {
	if e.Rollout != nil {
		return false, errorf(Invalid, "endpoint.rollout: create the endpoint, then start its rollout with `servemesh rollout start` (POST /v1/endpoints/%s/rollout), or declare both in a file for `servemesh apply`", e.Name)
	}
	return c.mutate(ctx, "create_endpoint", func(m *meshspec.Model) error {
		if i := findEndpoint(m, e.Name); i >= 0 {
			existing := m.Endpoints[i]
			want := e
			want.Shadows = existing.Shadows // shadows are set separately
			if meshspec.EndpointsEqual(existing, want) {
				return nil
			}
			return errorf(Conflict, "cannot create endpoint: endpoint %q is already registered with a different route, methods or traffic; change it with servemesh endpoint update (or traffic set), or delete it first", e.Name)
		}
		if e.Route != "" {
			for _, other := range m.Endpoints {
				if other.Route == e.Route {
					return errorf(Conflict, "cannot create endpoint: route %q is already registered to endpoint %q", e.Route, other.Name)
				}
			}
		}
		if err := registered(m, meshspec.SortedKeys(e.UsedBackends())); err != nil {
			return err
		}
		m.Endpoints = append(m.Endpoints, meshspec.CloneEndpoint(e))
		return nil
	})
}

// PatchEndpoint merges a JSON merge patch into an endpoint
// (meshspec.PatchEndpoint): its route, methods, timeouts, limits, traffic
// or any other field but its name and rollout, in one checkpointed
// change, the whole state validated.
func (c *Controller) PatchEndpoint(ctx context.Context, name string, patch []byte) (bool, error) {
	return c.mutate(ctx, "update_endpoint", func(m *meshspec.Model) error {
		i := findEndpoint(m, name)
		if i < 0 {
			return errorf(NotFound, "endpoint %q is not registered; create it with servemesh endpoint create", name)
		}
		next, err := meshspec.PatchEndpoint(m.Endpoints[i], patch)
		if err != nil {
			return &Error{Kind: Invalid, Msg: "refused", Err: err}
		}
		for j, other := range m.Endpoints {
			if j != i && next.Route != "" && other.Route == next.Route {
				return errorf(Conflict, "cannot update endpoint %q: route %q is already registered to endpoint %q", name, next.Route, other.Name)
			}
		}
		if err := registered(m, meshspec.SortedKeys(next.UsedBackends())); err != nil {
			return err
		}
		m.Endpoints[i] = next
		return nil
	})
}

// DeleteEndpoint removes an endpoint; its backends stay. Deleting an
// endpoint that does not exist changes nothing.
func (c *Controller) DeleteEndpoint(ctx context.Context, name string) (bool, error) {
	return c.mutate(ctx, "delete_endpoint", func(m *meshspec.Model) error {
		if i := findEndpoint(m, name); i >= 0 {
			m.Endpoints = slices.Delete(m.Endpoints, i, i+1)
		}
		return nil
	})
}

// SetTraffic replaces an endpoint's traffic policy.
func (c *Controller) SetTraffic(ctx context.Context, endpoint string, traffic map[string]float64) (bool, error) {
	return c.mutate(ctx, "set_traffic", func(m *meshspec.Model) error {
		i := findEndpoint(m, endpoint)
		if i < 0 {
			return errorf(NotFound, "attempted to assign traffic for an endpoint %q that is not registered; %s", endpoint, endpointHint(m, endpoint))
		}
		if err := registered(m, meshspec.SortedKeys(traffic)); err != nil {
			return err
		}
		if m.Endpoints[i].Rollout.Active() {
			return busyRollout(m.Endpoints[i])
		}
		m.Endpoints[i].Traffic = traffic
		return nil
	})
}

// SetModelTraffic replaces the split of one model of an endpoint routed
// by model, keeping its shadows and rewrite.
func (c *Controller) SetModelTraffic(ctx context.Context, endpoint, model string, traffic map[string]float64) (bool, error) {
	return c.mutate(ctx, "set_traffic", func(m *meshspec.Model) error {
		i := findEndpoint(m, endpoint)
		if i < 0 {
			return errorf(NotFound, "attempted to assign traffic for an endpoint %q that is not registered; %s", endpoint, endpointHint(m, endpoint))
		}
		r := m.Endpoints[i].ModelRouting
		if r == nil {
			return errorf(Invalid, "endpoint %q is not routed by model; set its split without a model", endpoint)
		}
		policy, ok := r.Models[model]
		if !ok {
			return errorf(Invalid, "endpoint %q routes no model %q; %s", endpoint, model, meshspec.Suggest("model", model, meshspec.SortedKeys(r.Models)))
		}
		if err := registered(m, meshspec.SortedKeys(traffic)); err != nil {
			return err
		}
		policy.Traffic = traffic
		r.Models[model] = policy
		return nil
	})
}

// SetShadow mirrors proportion of an endpoint's requests to backend; 0
// removes the shadow.
func (c *Controller) SetShadow(ctx context.Context, endpoint, backend string, proportion float64) (bool, error) {
	return c.mutate(ctx, "set_shadow", func(m *meshspec.Model) error {
		i := findEndpoint(m, endpoint)
		if i < 0 {
			return errorf(NotFound, "attempted to shadow traffic from an endpoint %q that is not registered; %s", endpoint, endpointHint(m, endpoint))
		}
		if findBackend(m, backend) < 0 {
			return errorf(Invalid, "attempted to shadow traffic to a backend %q that is not registered (create it first); %s", backend, backendHint(m, backend))
		}
		e := &m.Endpoints[i]
		if e.Rollout.Active() && e.Rollout.Candidate == backend {
			return busyRollout(*e)
		}
		if proportion == 0 {
			delete(e.Shadows, backend)
			return nil
		}
		if e.Shadows == nil {
			e.Shadows = map[string]float64{}
		}
		e.Shadows[backend] = proportion
		return nil
	})
}

// GetBackend returns one backend.
func (c *Controller) GetBackend(name string) (meshspec.Backend, error) {
	m, _ := c.State()
	if i := findBackend(m, name); i >= 0 {
		return m.Backends[i], nil
	}
	return meshspec.Backend{}, errorf(NotFound, "backend %q is not registered; %s", name, backendHint(m, name))
}

// GetEndpoint returns one endpoint.
func (c *Controller) GetEndpoint(name string) (meshspec.Endpoint, error) {
	m, _ := c.State()
	if i := findEndpoint(m, name); i >= 0 {
		return m.Endpoints[i], nil
	}
	return meshspec.Endpoint{}, errorf(NotFound, "endpoint %q is not registered; %s", name, endpointHint(m, name))
}

// ApplyOptions are how an apply goes.
type ApplyOptions struct {
	// DryRun only reports the differences.
	DryRun bool
	// PruneRollouts removes the records of ended rollouts the file does
	// not declare; without it they are kept, history and all.
	PruneRollouts bool
	// Merge keeps what the file does not name: the backends and endpoints
	// of other names and, if it has none, the mesh's settings. A Ray
	// Serve config is applied so: its applications, not the whole mesh.
	Merge bool
}

// Apply makes the desired state equal to desired, as `kubectl apply` does
// for a whole file: it is idempotent, and with dryRun it only reports the
// differences. It returns one line per difference.
//
// A file says what users declare, never placements: applying it keeps the
// replicas the controller placed, scales process backends to the file's
// num_replicas (draining any surplus), leaves an autoscaled backend's
// replica count to the autoscaler, and rolls out a changed process spec
// (the old replicas drain while new ones are placed).
func (c *Controller) Apply(ctx context.Context, spec *meshspec.Spec, opts ApplyOptions) ([]Change, error) {
	ctx = specsWritten(ctx)
	for i, e := range spec.Endpoints {
		if err := meshspec.CheckDeclared(meshspec.ItemField("endpoints", i, e.Name, false), e); err != nil {
			return nil, &Error{Kind: Invalid, Msg: "refused", Err: err}
		}
	}
	declared := spec.Model()
	desiredOf := func(current *meshspec.Model) *meshspec.Model {
		if opts.Merge {
			return mergeDeclared(current, declared)
		}
		return declared
	}
	nodes, err := c.nodes(ctx)
	if err != nil {
		return nil, err
	}
	if opts.DryRun {
		current, _ := c.State()
		desired := desiredOf(current)
		if err := c.guard(ctx, current, desired); err != nil {
			return nil, err
		}
		next, err := prepareApply(current, desired, nodes, c.now(), c.readyTags, opts.PruneRollouts)
		if err != nil {
			return nil, err
		}
		return describe(current, store.Diff(current, next)), nil
	}
	var diff []Change
	_, err = c.change(ctx, "apply", func(m *meshspec.Model) error {
		desired := desiredOf(m)
		if err := c.guard(ctx, m, desired); err != nil {
			return err // before placement says whether it would fit
		}
		next, err := prepareApply(m, desired, nodes, c.now(), c.readyTags, opts.PruneRollouts)
		if err != nil {
			return err
		}
		diff = describe(m, store.Diff(m, next))
		*m = *next
		return nil
	}, false) // prepareApply validated it
	return diff, err
}

// mergeDeclared is what current declares with file's backends and
// endpoints in place of those of the same names, and file's mesh settings
// if it has any: a merge under the write lock, so nothing written
// meanwhile is lost.
func mergeDeclared(current, file *meshspec.Model) *meshspec.Model {
	out := meshspec.SpecOf(current).Model()
	out.Backends = replaceByName(out.Backends, file.Backends, func(b meshspec.Backend) string { return b.Name })
	out.Endpoints = replaceByName(out.Endpoints, file.Endpoints, func(e meshspec.Endpoint) string { return e.Name })
	if file.Mesh != nil {
		out.Mesh = file.Mesh
	}
	return meshspec.Clone(out)
}

// replaceByName is items with each of with in place of the item of its
// name, or after them if none has it.
func replaceByName[T any](items, with []T, name func(T) string) []T {
	at := indexByName(items, name)
	for _, x := range with {
		if i, ok := at[name(x)]; ok {
			items[i] = x
		} else {
			items = append(items, x)
		}
	}
	return items
}

// prepareApply turns a file's model into the state to store: it carries
// over what the controller manages from current (ended rollouts' records
// too, unless prune) and places replicas.
func prepareApply(current, desired *meshspec.Model, nodes []wire.NodeInfo, now time.Time, ready func(backend string) map[string]bool, prune bool) (*meshspec.Model, error) {
	next := meshspec.Clone(desired)
	next.Nodes = slices.Clone(current.Nodes) // maintenance is the operator's, not a file's
	next.Retiring = meshspec.Clone(current).Retiring
	currentBackends := indexByName(current.Backends, func(b meshspec.Backend) string { return b.Name })
	for i := range next.Backends {
		d := &next.Backends[i] // an autoscaled one left without num_replicas starts at its initial_replicas (BackendSpec.Backend)
		if j, ok := currentBackends[d.Name]; ok && d.Managed() && current.Backends[j].Managed() {
			cur := current.Backends[j]
			d.Placements = slices.Clone(cur.Placements)
			for k := range d.Placements {
				if d.Placements[k].Spec == "" { // placed before specs were recorded
					d.Placements[k].Spec = meshspec.SpecHash(cur.Process)
				}
			}
			// A changed spec needs nothing more here: schedule (below) counts
			// only replicas of the current spec, so it places a full set of
			// new ones, and the reconcile loop drains the old ones once the
			// new ones are healthy.
			if as := d.Config.Autoscaling; as != nil && cur.Config.Autoscaling != nil {
				d.Config.NumReplicas = min(max(cur.Config.NumReplicas, as.MinReplicas), as.MaxReplicas)
			}
		}
	}
	if err := carryRollouts(current, next, now, prune); err != nil {
		return nil, err
	}
	retireDeleted(current, next, now) // before placing: their replicas hold their nodes' resources
	if err := retiringNameTaken(next); err != nil {
		return nil, err
	}
	if err := next.Validate(); err != nil {
		return nil, &Error{Kind: Invalid, Msg: "refused", Err: err}
	}
	for i := range next.Backends {
		if err := schedule(next, i, nodes, now, ready(next.Backends[i].Name)); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// indexByName maps each item's name to its index.
func indexByName[T any](items []T, name func(T) string) map[string]int {
	out := make(map[string]int, len(items))
	for i, x := range items {
		out[name(x)] = i
	}
	return out
}

// Autoscale sets an autoscaled backend's replica count, through the same
// checkpointed path as a user's call; the count is kept within the
// backend's bounds. When the nodes have room for only some of the new
// replicas, those are placed, the count is kept (the reconcile places the
// rest when room comes) and the error, an *Error with a Shortfall, says
// why: the change is made all the same.
func (c *Controller) Autoscale(ctx context.Context, name string, replicas int) (bool, error) {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return false, err
	}
	var short *Error
	changed, err := c.mutate(ctx, "autoscale", func(m *meshspec.Model) error {
		i := findBackend(m, name)
		if i < 0 || m.Backends[i].Config.Autoscaling == nil {
			return errorf(NotFound, "backend %q is not registered or not autoscaled", name)
		}
		as := m.Backends[i].Config.Autoscaling
		m.Backends[i].Config.NumReplicas = min(max(replicas, as.MinReplicas), as.MaxReplicas)
		err := schedule(m, i, nodes, c.now(), c.readyTags(name))
		if e := (*Error)(nil); errors.As(err, &e) && e.Shortfall > 0 {
			short = e // what fits is placed; the reconcile keeps trying for the rest
			return nil
		}
		return err
	})
	if err == nil && short != nil {
		return changed, short
	}
	return changed, err
}

// verb is one of a verb's forms, by count: singular for 1.
func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
