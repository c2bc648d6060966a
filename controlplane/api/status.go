package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/controlplane/autoscale"
	"github.com/servemesh/servemesh/controlplane/rollout"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	xdsserver "github.com/servemesh/servemesh/xds/server"
)

// StatusReport is the answer to GET /v1/status: what is configured next to
// what is happening.
type StatusReport struct {
	// RateWindowS is what every rate is averaged over, in seconds.
	RateWindowS float64          `json:"rate_window_s"`
	Endpoints   []EndpointStatus `json:"endpoints"`
	Backends    []BackendStatus  `json:"backends"`
	Nodes       []NodeStatus     `json:"nodes"`
	// Version and Protocol are the servemesh release and protocol of the
	// controller that answers.
	Version  string `json:"version"`
	Protocol int    `json:"protocol"`
	// Problems are what keeps the mesh from following the desired state
	// exactly: stored keys that cannot be read, a view the data plane
	// refused. Empty when all is well.
	Problems []string `json:"problems"`
}

// EndpointStatus is one endpoint's policy and its backends' live rates.
type EndpointStatus struct {
	Name  string `json:"name"`
	Route string `json:"route,omitempty"`
	// RequestRate and ErrorRate are the endpoint's own, over every node.
	RequestRate float64                 `json:"request_rate"`
	ErrorRate   float64                 `json:"error_rate"`
	Backends    []EndpointBackendStatus `json:"backends"`
	// Rollout is the endpoint's rollout, if one was started.
	Rollout *RolloutReport `json:"rollout,omitempty"`
	// RateLimit is the endpoint's rate limit, if it has one.
	RateLimit *meshspec.RateLimit `json:"rate_limit,omitempty"`
	// TokenQuotaShadowed, for a token quota in shadow mode, is how many
	// requests it would have refused, summed over the nodes' reports
	// (each since its agent started).
	TokenQuotaShadowed uint64 `json:"token_quota_shadowed,omitempty"`
}

// EndpointBackendStatus is one backend of an endpoint: configured weight or
// shadow proportion next to its live request and error rates.
type EndpointBackendStatus struct {
	Backend string `json:"backend"`
	// Model, for an endpoint routed by model, is the model whose split
	// and shadows the row is of (a backend may serve several).
	Model       string  `json:"model,omitempty"`
	Weight      float64 `json:"weight"`
	Shadow      float64 `json:"shadow,omitempty"`
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
	// ShadowShare is the observed share of the endpoint's requests the
	// shadow backend gets, when it can be told: the backend serves no other
	// traffic (no endpoint routes to it, none other mirrors to it).
	ShadowShare *float64 `json:"shadow_share,omitempty"`
}

// BackendStatus is one backend's replicas and load.
type BackendStatus struct {
	Name    string `json:"name"`
	Desired int    `json:"desired"`
	// Running are the placed replicas (for a backend of listed replicas,
	// the listed ones); Ready those of them Consul says pass their health
	// check, Unheard those whose check expired: their agent or node
	// stopped answering.
	Running  int `json:"running"`
	Ready    int `json:"ready"`
	Unheard  int `json:"unheard,omitempty"`
	Draining int `json:"draining"`
	// Retiring: the backend was deleted; its draining replicas finish the
	// requests they have in flight, then it is gone.
	Retiring   bool    `json:"retiring,omitempty"`
	Autoscaled bool    `json:"autoscaled"`
	InFlight   float64 `json:"in_flight"`
	// Held are the requests the nodes hold for want of a ready replica
	// (counted in InFlight too).
	Held        float64 `json:"held"`
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
	// Replicas are a process backend's placed replicas, one by one.
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	// ConfigVersion is the version of its user_config (none: "").
	ConfigVersion string `json:"config_version,omitempty"`
}

// NodeStatus says whether a node's Envoy runs the latest config.
type NodeStatus struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"`
	InSync    bool   `json:"in_sync"`
	NACKs     int    `json:"nacks"`
	LastNACK  string `json:"last_nack,omitempty"`
	// Refused says why the node gets no configuration, if it does not.
	Refused string `json:"refused,omitempty"`
	// Version and Protocol are the servemesh release and protocol the
	// node's agent announced (protocol 1: a release that announced none).
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol"`
	// Skew, if set, says why the controller refuses the node: its
	// protocol is outside the skew policy.
	Skew string `json:"skew,omitempty"`
	// Cordoned and Drained are its maintenance (servemesh node).
	Cordoned bool `json:"cordoned,omitempty"`
	Drained  bool `json:"drained,omitempty"`
	// FiguresUnread says why the controller could not read the node's
	// figures (load, request and error rates) when it last tried: the
	// report's rates leave the node out. Empty when they were read.
	FiguresUnread string `json:"figures_unread,omitempty"`
	// RateLimitService, if set, says why the node's rate limit service
	// cannot be reached: the global rate limits and token quotas it
	// counts fail open or closed there. Absent from a previous release's
	// controllers.
	RateLimitService string `json:"rate_limit_service,omitempty"`
	// Tracing, if set, says why the node's spans cannot be sent to the
	// mesh's collector. Absent from a previous release's controllers.
	Tracing string `json:"tracing,omitempty"`
	// Controller, set by the client that merged it in (MergeNodes), is
	// the controller the node's Envoy is connected to, when that is not
	// the one whose report this is.
	Controller string `json:"controller,omitempty"`
}

// XDSNodesPath lists the nodes connected to one controller, as its xDS
// server sees them.
const XDSNodesPath = "/v1/xds/nodes"

// ControllerNodes are the nodes connected to one controller (Err: why they
// could not be read).
type ControllerNodes struct {
	Controller string
	Nodes      []xdsserver.NodeStatus
	Err        error
}

// MergeNodes completes r, one controller's report, with the nodes the
// others serve: each node's Envoy holds a stream to one controller, which
// alone knows whether it is connected and in sync, so in HA one report
// lists only some nodes as connected. A node connected elsewhere replaces
// its entry (its maintenance and figures kept) or is added, marked with
// its controller; a node connected to none stays as r has it.
func MergeNodes(r *StatusReport, others []ControllerNodes) {
	at := map[string]int{}
	for i, n := range r.Nodes {
		at[n.ID] = i
	}
	for _, o := range others {
		for _, n := range o.Nodes {
			i, known := at[n.ID]
			if known && (r.Nodes[i].Connected || !n.Connected) {
				continue
			}
			merged := NodeStatus{ID: n.ID, Connected: n.Connected, InSync: n.InSync, NACKs: n.NACKs, LastNACK: n.LastNACK, Refused: n.Refused,
				Version: n.Version, Protocol: n.Protocol, Skew: n.Skew, Controller: o.Controller}
			if !known {
				at[n.ID] = len(r.Nodes)
				r.Nodes = append(r.Nodes, merged)
				continue
			}
			old := r.Nodes[i]
			merged.Cordoned, merged.Drained, merged.FiguresUnread, merged.RateLimitService, merged.Tracing = old.Cordoned, old.Drained, old.FiguresUnread, old.RateLimitService, old.Tracing
			r.Nodes[i] = merged
		}
	}
	slices.SortFunc(r.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.ID, b.ID) })
}

// NodesOfEach reads the nodes connected to each of the client's
// controllers, one answer each (GET /v1/xds/nodes), in the order given.
func (c *Client) NodesOfEach(ctx context.Context) []ControllerNodes {
	out := make([]ControllerNodes, len(c.bases))
	for i, base := range c.bases {
		out[i].Controller = strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
		out[i].Err = c.doAt(ctx, base, http.MethodGet, XDSNodesPath, nil, &out[i].Nodes)
	}
	return out
}

// Status reads the controller's status report.
func (c *Client) Status(ctx context.Context) (StatusReport, error) {
	var out StatusReport
	return out, c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
}

// ReplicaHealth counts a process backend's running placements by what
// Consul's catalog says of their replicas.
type ReplicaHealth struct {
	Ready, Unheard int
	Replicas       []ReplicaStatus
}

// ReplicaStatus is one placed replica of a process backend as its node
// and Consul see it.
type ReplicaStatus struct {
	Tag   string                  `json:"tag"`
	Node  string                  `json:"node"`
	State meshspec.PlacementState `json:"state"`
	Ready bool                    `json:"ready"`
	// Address is where its agent registered it (host:port; "" until it
	// did, or from a controller older than this field).
	Address string `json:"address,omitempty"`
	// Since is when it entered its state (Unix seconds; 0 unknown).
	Since int64 `json:"since,omitempty"`
	// Unheard: its check expired after it was ready (its agent or node
	// stopped answering).
	Unheard bool `json:"unheard,omitempty"`
	// Note says why it is not ready, as its agent saw it: a failing probe,
	// or that its process exited, how often, and the end of its log.
	Note string `json:"note,omitempty"`
	// ConfigVersion is the version of the backend's user_config it runs,
	// as its agent last said ("" none yet).
	ConfigVersion string `json:"config_version,omitempty"`
	// Restarts are how many times its agent restarted its process after
	// it exited.
	Restarts int `json:"restarts,omitempty"`
	// InFlight, for a draining replica, are the requests it is finishing
	// before it stops, as its agent last counted them.
	InFlight *int `json:"in_flight,omitempty"`
}

// fill adds what agents report of each replica: its user_config version
// and, draining, its requests in flight.
func (in StatusInputs) fill(replicas []ReplicaStatus) {
	for i := range replicas {
		r := &replicas[i]
		r.ConfigVersion = in.Configs[r.Tag]
		if n, ok := in.Draining[r.Tag]; ok && r.State == meshspec.Draining {
			r.InFlight = &n
		}
	}
}

// StatusInputs are what a status report joins: the desired state, the
// live rates (over autoscale.RateWindow) per backend and per endpoint, the
// health of each process backend's replicas, the xDS server's view of the
// nodes, and the problems known elsewhere.
type StatusInputs struct {
	State               *meshspec.Model
	Backends, Endpoints map[string]autoscale.BackendLoad
	Health              func(meshspec.Backend) ReplicaHealth
	Nodes               []xdsserver.NodeStatus
	Problems            []string
	// Configs are the user_config versions replicas run, by tag.
	Configs map[string]string
	// Draining are the requests in flight to each draining replica, by tag.
	Draining map[string]int
	// Rollouts are the live figures of the rollouts' stages, by endpoint.
	Rollouts map[string]rollout.Live
	// Unread are the nodes whose figures (load, rates) could not be read,
	// with why: the rates leave them out.
	Unread map[string]string
	// Loads are the agents' last load reports, by node: what they say of
	// the node's own components (its rate limit service).
	Loads map[string]wire.Load
}

// NewStatusReport joins in into the status report.
func NewStatusReport(in StatusInputs) StatusReport {
	m := in.State
	r := StatusReport{RateWindowS: autoscale.RateWindow.Seconds(), Endpoints: []EndpointStatus{}, Backends: []BackendStatus{},
		Nodes: []NodeStatus{}, Problems: append([]string{}, in.Problems...), Version: wire.Version, Protocol: wire.Protocol}
	uses := map[string]int{} // backend: how many routes and mirrors send to it
	for _, e := range m.Endpoints {
		for b := range e.Traffic {
			uses[b]++
		}
		for b := range e.Shadows {
			uses[b]++
		}
		if e.ModelRouting != nil {
			for b := range e.UsedBackends() {
				uses[b] += 2 // a share of the endpoint's requests per model: no shadow share
			}
		}
	}
	for _, e := range m.Endpoints {
		es := endpointStatus(e, in.Backends, in.Endpoints[e.Name], uses)
		es.Rollout = rolloutReport(e, in.Rollouts)
		for _, l := range in.Loads {
			es.TokenQuotaShadowed += l.TokenQuotaShadowed[e.Name]
		}
		r.Endpoints = append(r.Endpoints, es)
	}
	for _, b := range m.Backends {
		bs := backendStatus(b, in.Backends[b.Name])
		if b.Process != nil {
			h := in.Health(b)
			bs.Ready, bs.Unheard, bs.Replicas = h.Ready, h.Unheard, h.Replicas
			bs.ConfigVersion = b.Config.UserConfig.Version()
			in.fill(bs.Replicas)
			if bs.Ready < bs.Running {
				r.Problems = append(r.Problems, notReady(bs))
			}
		}
		r.Backends = append(r.Backends, bs)
	}
	for _, b := range m.Retiring {
		bs := backendStatus(b, in.Backends[b.Name])
		bs.Retiring = true
		if in.Health != nil {
			bs.Replicas = in.Health(b).Replicas
			in.fill(bs.Replicas)
		}
		r.Backends = append(r.Backends, bs)
	}
	for _, n := range in.Nodes {
		spec, _ := m.NodeSpecOf(n.ID)
		r.Nodes = append(r.Nodes, NodeStatus{ID: n.ID, Connected: n.Connected, InSync: n.InSync, NACKs: n.NACKs, LastNACK: n.LastNACK, Refused: n.Refused,
			Version: n.Version, Protocol: n.Protocol, Skew: n.Skew, Cordoned: spec.Cordoned, Drained: spec.Drained, FiguresUnread: in.Unread[n.ID]})
		if n.Refused != "" && n.Connected {
			r.Problems = append(r.Problems, fmt.Sprintf("node %s gets no configuration: %s", n.ID, n.Refused))
		}
		if n.Skew != "" {
			r.Problems = append(r.Problems, "refused: "+n.Skew)
		}
	}
	r.Problems = append(r.Problems, failedComponents(m, in.Loads, r.Nodes)...)
	return r
}

// failedComponents are the problems the agents report of their nodes'
// own components, each also marked on its node in nodes: a rate limit
// service that cannot be reached while an endpoint has a global rate
// limit or a token quota (it once exited at every start, and every
// request passed fail-open with nothing said), and spans that cannot be
// sent to the mesh's collector while the mesh traces.
func failedComponents(m *meshspec.Model, loads map[string]wire.Load, nodes []NodeStatus) []string {
	var counted []string
	for _, e := range m.Endpoints {
		if e.CountedLimits() != "" {
			counted = append(counted, e.Name)
		}
	}
	tracing := m.Mesh != nil && m.Mesh.Tracing != nil
	var out []string
	for _, node := range meshspec.SortedKeys(loads) {
		l := loads[node]
		if why := l.RateLimitService; why != "" && len(counted) > 0 {
			out = append(out, fmt.Sprintf("node %s: its rate limit service cannot be reached (%s): the global rate limits and token quotas of %s are not counted there, and its requests pass or are refused by each limit's failure mode",
				node, why, strings.Join(counted, ", ")))
			markNode(nodes, node, func(n *NodeStatus) { n.RateLimitService = why })
		}
		if why := l.Tracing; why != "" && tracing {
			out = append(out, fmt.Sprintf("node %s: %s; its agent's spans are dropped (its Envoy's likely too: it sends to the same collector)", node, why))
			markNode(nodes, node, func(n *NodeStatus) { n.Tracing = why })
		}
	}
	return out
}

// markNode sets what mark sets on node's status in nodes.
func markNode(nodes []NodeStatus, node string, mark func(*NodeStatus)) {
	for i := range nodes {
		if nodes[i].ID == node {
			mark(&nodes[i])
		}
	}
}

// endpointStatus lists an endpoint's traffic and shadow backends, sorted by
// name, with their live rates.
func endpointStatus(e meshspec.Endpoint, load map[string]autoscale.BackendLoad, own autoscale.BackendLoad, uses map[string]int) EndpointStatus {
	es := EndpointStatus{Name: e.Name, Route: e.Route, RequestRate: own.RequestRate, ErrorRate: own.ErrorRate, RateLimit: e.RateLimit}
	if r := e.ModelRouting; r != nil {
		for _, m := range meshspec.SortedKeys(r.Models) {
			t := r.Models[m]
			names := map[string]bool{}
			for b := range t.Traffic {
				names[b] = true
			}
			for b := range t.Shadows {
				names[b] = true
			}
			for _, b := range meshspec.SortedKeys(names) {
				es.Backends = append(es.Backends, EndpointBackendStatus{Backend: b, Model: m, Weight: t.Traffic[b], Shadow: t.Shadows[b],
					RequestRate: load[b].RequestRate, ErrorRate: load[b].ErrorRate})
			}
		}
		return es
	}
	names := e.UsedBackends()
	for b := range e.Shadows {
		names[b] = true
	}
	for _, b := range meshspec.SortedKeys(names) {
		bs := EndpointBackendStatus{Backend: b, Weight: e.Traffic[b], Shadow: e.Shadows[b],
			RequestRate: load[b].RequestRate, ErrorRate: load[b].ErrorRate}
		if bs.Shadow > 0 && uses[b] == 1 && own.RequestRate > 0 {
			share := bs.RequestRate / own.RequestRate
			bs.ShadowShare = &share
		}
		es.Backends = append(es.Backends, bs)
	}
	return es
}

// backendStatus counts a backend's replicas: placements for a process
// backend, its listed replicas for a static one.
func backendStatus(b meshspec.Backend, load autoscale.BackendLoad) BackendStatus {
	bs := BackendStatus{Name: b.Name, Desired: b.Config.NumReplicas, Autoscaled: b.Config.Autoscaling != nil,
		InFlight: load.InFlight, Held: load.Held, RequestRate: load.RequestRate, ErrorRate: load.ErrorRate}
	for _, p := range b.Placements {
		if p.State == meshspec.Running {
			bs.Running++
		} else {
			bs.Draining++
		}
	}
	if b.Process == nil {
		bs.Desired, bs.Running, bs.Ready = len(b.Replicas), len(b.Replicas), len(b.Replicas)
	}
	return bs
}

// notReady says why a backend's placed replicas are not all ready.
func notReady(bs BackendStatus) string {
	msg := fmt.Sprintf("backend %q: %d of %d placed replicas are not ready", bs.Name, bs.Running-bs.Ready, bs.Running)
	if bs.Unheard > 0 {
		msg += fmt.Sprintf("; %d not heard from (their agent or node stopped answering: they take requests only while no replica is ready, and are placed elsewhere after --replace-after)", bs.Unheard)
	}
	if rest := bs.Running - bs.Ready - bs.Unheard; rest > 0 {
		msg += fmt.Sprintf("; %d starting, failing their health check, or not registered by their agent", rest)
	}
	return msg
}
