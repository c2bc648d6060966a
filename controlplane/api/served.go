package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/autoscale"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	xdsserver "github.com/servemesh/servemesh/xds/server"
)

// ServedPath answers whether a change is served: GET
// /v1/served?revision=R[&backend=B...][&endpoint=E...].
const ServedPath = "/v1/served"

// ServedReport says whether every connected node serves the stored state
// of a revision and the named backends' replicas, all ready: what Ray
// Serve's calls wait for before they return, and the CLI's --wait.
type ServedReport struct {
	// Served: every connected node serves the revision asked about (or a
	// later one) and the backends' desired replicas, all ready.
	Served bool `json:"served"`
	// Revision is the revision the data plane serves.
	Revision uint64 `json:"revision"`
	// Nodes are the connected nodes counted.
	Nodes int `json:"nodes"`
	// Waiting says, a line each, what is not served yet.
	Waiting []string `json:"waiting"`
	// Failed, if set, says why it will not be served without another
	// change (a replica crash-looping, replicas that cannot be placed, a
	// view the data plane refused): waiting longer will not help.
	Failed string `json:"failed,omitempty"`
}

// ServedInputs are what a served report joins.
type ServedInputs struct {
	// Revision is the change's: the revision a write answered.
	Revision uint64
	// Backends are the backends asked about, as stored.
	Backends []meshspec.Backend
	// Serving is the xDS server's view of the nodes and of these backends.
	Serving xdsserver.Serving
	// Health counts a process backend's replicas by what Consul says.
	Health func(meshspec.Backend) ReplicaHealth
	// Problems are the status report's (placement problems among them).
	Problems []string
	// Refused, if set, is why the data plane refused the last view.
	Refused error
	// Configs are the user_config versions replicas run, by tag, as their
	// agents last said.
	Configs map[string]string
	// Endpoints are the stored endpoints; Loads each node's load, as its
	// agent last reported it (what its rate limit service has loaded
	// among it).
	Endpoints []meshspec.Endpoint
	Loads     map[string]wire.Load
}

// NewServedReport joins in into a served report.
func NewServedReport(in ServedInputs) ServedReport {
	out := ServedReport{Revision: in.Serving.Revision, Nodes: in.Serving.Nodes, Waiting: []string{}}
	if in.Refused != nil {
		out.Failed = in.Refused.Error()
		return out
	}
	if in.Serving.Revision < in.Revision {
		out.Waiting = append(out.Waiting, fmt.Sprintf("the data plane serves revision %d; the change is revision %d", in.Serving.Revision, in.Revision))
	}
	for _, b := range in.Backends {
		if b.Process == nil {
			continue // listed replicas: servemesh does not run them
		}
		why, err := backendServed(b, in)
		if err != nil {
			out.Failed = err.Error()
			return out
		}
		if why != "" {
			out.Waiting = append(out.Waiting, why)
		}
	}
	out.Waiting = append(out.Waiting, limitsServed(in)...)
	if in.Serving.Nodes == 0 {
		out.Waiting = append(out.Waiting, "no node is connected to the controller, so none serves the mesh: start an agent (servemesh node)")
	}
	out.Waiting = append(out.Waiting, in.Serving.Waiting...)
	out.Served = len(out.Waiting) == 0
	return out
}

// backendServed says what is not ready of process backend b (or ""), or
// why it will not be.
func backendServed(b meshspec.Backend, in ServedInputs) (string, error) {
	for _, problem := range in.Problems {
		if strings.HasPrefix(problem, PlacementProblemPrefix(b.Name)) {
			return "", fmt.Errorf("backend %q cannot be ready: %s", b.Name, problem)
		}
	}
	bs := backendStatus(b, autoscale.BackendLoad{})
	h := in.Health(b)
	if err := crashLoop(b.Name, h.Replicas); err != nil {
		return "", err
	}
	if h.Ready < bs.Desired || bs.Running != bs.Desired {
		return fmt.Sprintf("backend %s: %d of %d replicas ready (%d placed)", b.Name, h.Ready, bs.Desired, bs.Running), nil
	}
	if called := in.Serving.Healthy[b.Name]; called < bs.Desired {
		return fmt.Sprintf("backend %s: the data plane calls %d of its %d ready replicas so far", b.Name, called, bs.Desired), nil
	}
	if want := b.Config.UserConfig.Version(); want != "" {
		behind := 0
		for _, r := range h.Replicas {
			if r.State == meshspec.Running && in.Configs[r.Tag] != want {
				behind++
			}
		}
		if behind > 0 {
			return fmt.Sprintf("backend %s: %d of its replicas have not taken its user_config %s yet", b.Name, behind, want), nil
		}
	}
	return "", nil
}

// limitsServed says, a line each, which nodes' rate limit services do not
// count an endpoint's global rate limit or token quota as stored yet: a
// node's Envoy serves the change when it has it, its rate limit service
// (which counts for it) once it has loaded it. Nodes that run no service,
// and a previous release's agents, say nothing of it.
func limitsServed(in ServedInputs) []string {
	var out []string
	for _, e := range in.Endpoints {
		want := e.CountedLimits()
		if want == "" {
			continue
		}
		for _, node := range meshspec.SortedKeys(in.Loads) {
			loaded := in.Loads[node].RateLimitsLoaded
			if loaded == nil || loaded[e.Name] == want {
				continue
			}
			line := fmt.Sprintf("node %s: its rate limit service does not count endpoint %s's limits yet", node, e.Name)
			if why := in.Loads[node].RateLimitService; why != "" {
				line += " (" + why + ")"
			}
			out = append(out, line)
		}
	}
	return out
}

// ServedQuery is what GET /v1/served asks about.
type ServedQuery struct {
	Revision  uint64
	Backends  []string
	Endpoints []string
}

func (q ServedQuery) values() url.Values {
	v := url.Values{"revision": {strconv.FormatUint(q.Revision, 10)}}
	for _, b := range q.Backends {
		v.Add("backend", b)
	}
	for _, e := range q.Endpoints {
		v.Add("endpoint", e)
	}
	return v
}

// served answers GET /v1/served: the backends named, and those the named
// endpoints send to or mirror to, are asked about, at the revision named
// (none: the current one).
func (s *server) served(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var rev uint64
	if v := q.Get("revision"); v != "" {
		var err error
		if rev, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("revision %q: not a revision (a write's answer gives it)", v), "")
			return
		}
	}
	if rev == 0 { // none named: the state as it is now
		rev = uint64(s.c.Revision())
	}
	var backends []meshspec.Backend
	var missing string
	s.c.Peek(func(m *meshspec.Model, _ meshspec.Revision) {
		names := slices.Clone(q["backend"])
		for _, e := range q["endpoint"] {
			i := slices.IndexFunc(m.Endpoints, func(ep meshspec.Endpoint) bool { return ep.Name == e })
			if i < 0 {
				missing = fmt.Sprintf("no endpoint %q", e)
				return
			}
			for b := range m.Endpoints[i].UsedBackends() {
				names = append(names, b)
			}
		}
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			b, ok := m.Backend(name)
			if !ok {
				missing = fmt.Sprintf("no backend %q", name)
				return
			}
			backends = append(backends, b)
		}
	})
	if missing != "" {
		writeError(w, http.StatusNotFound, "not_found", missing+": was it deleted?", "")
		return
	}
	writeJSON(w, http.StatusOK, s.src.Served(rev, backends))
}

// ServedPoll is how often WaitServed asks, at most: it asks after 10 ms
// first (a node ACKs a change in milliseconds), then twice as long each
// time up to ServedPoll.
const ServedPoll = 200 * time.Millisecond

// ErrServedUnknown says the controller cannot tell whether a change is
// served: it predates GET /v1/served.
var ErrServedUnknown = errors.New("the controller cannot tell when a change is served (it predates " + ServedPath + "; upgrade it)")

// Served asks whether q is served.
func (c *Client) Served(ctx context.Context, q ServedQuery) (ServedReport, error) {
	var out ServedReport
	err := c.do(ctx, http.MethodGet, ServedPath+"?"+q.values().Encode(), nil, &out)
	var ae *Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Body.Kind == "" {
		return out, ErrServedUnknown
	}
	return out, err
}

// WaitServed waits until q is served, telling progress (if not nil) each
// report. It fails when the change will not be served (the report's
// Failed), or when ctx ends first, saying what is still waited for.
func (c *Client) WaitServed(ctx context.Context, q ServedQuery, progress func(ServedReport)) error {
	pause := 10 * time.Millisecond
	for {
		report, err := c.Served(ctx, q)
		if err != nil {
			return fmt.Errorf("waiting for the change to be served: %w", err)
		}
		if progress != nil {
			progress(report)
		}
		switch {
		case report.Failed != "":
			return errors.New("the change will not be served: " + report.Failed)
		case report.Served:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not served in time (%w):\n  %s", ctx.Err(), strings.Join(report.Waiting, "\n  "))
		case <-time.After(pause):
		}
		pause = min(2*pause, ServedPoll)
	}
}
