package meshspec

// Spec is the desired state as users write it: a config file, `servemesh
// apply`, the API. It holds only what users may set: no placements (the
// controller's), and no replica's node or inbound listener (the catalog's,
// which the data plane reads beside the state). Strict decoding refuses those fields by
// name. Spec.Model is the state the controller stores and the translator
// reads.
type Spec struct {
	// Backends are the services that run replicas, by name.
	Backends []BackendSpec `json:"backends,omitempty"`
	// Endpoints expose routes and split their requests over backends.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Mesh holds the settings of the whole mesh (tracing); absent keeps
	// them as they are.
	Mesh *Mesh `json:"mesh,omitempty"`
}

// BackendSpec is a backend as users declare it.
type BackendSpec struct {
	// Name identifies the backend: lower-case letters, digits and dashes.
	Name string `json:"name"`
	// Replicas are static replicas at addresses something else runs; give
	// these, Process or External.
	Replicas []ReplicaSpec `json:"replicas,omitempty"`
	// Config is how many replicas, how they scale, and how requests reach
	// them.
	Config BackendConfig `json:"config,omitempty"`
	// Protocol is what the replicas speak: http1 (the default), http2 or
	// grpc.
	Protocol Protocol `json:"protocol,omitempty"`
	// Process is a command servemesh's agents run as each replica.
	Process *ProcessSpec `json:"process,omitempty"`
	// External routes to a Consul service run by something else.
	External *ExternalSpec `json:"external,omitempty"`
}

// ReplicaSpec is a static replica as users list it.
type ReplicaSpec struct {
	// Address is IP:port or host:port.
	Address string `json:"address"`
	// Health defaults to healthy.
	Health Health `json:"health,omitempty"`
}

// Model returns the state s declares, sharing nothing with s.
func (s *Spec) Model() *Model {
	m := &Model{Backends: make([]Backend, 0, len(s.Backends))}
	for _, b := range s.Backends {
		m.Backends = append(m.Backends, b.Backend())
	}
	for _, e := range s.Endpoints {
		m.Endpoints = append(m.Endpoints, CloneEndpoint(e))
	}
	m.Mesh = s.Mesh
	return Clone(m)
}

// Backend returns the backend b declares.
func (b BackendSpec) Backend() Backend {
	out := Backend{Name: b.Name, Config: b.Config, Protocol: b.Protocol, Process: b.Process, External: b.External}
	if as := out.Config.Autoscaling; as != nil && out.Config.NumReplicas == 0 && out.Process != nil {
		out.Config.NumReplicas = as.StartReplicas() // left out: initial_replicas, else its minimum
	}
	for _, r := range b.Replicas {
		out.Replicas = append(out.Replicas, Replica{Address: r.Address, Health: r.Health})
	}
	return out
}

// SpecOf returns what users declared of m: m without what the system sets.
func SpecOf(m *Model) *Spec {
	s := &Spec{Mesh: cloneMesh(m.Mesh)}
	for _, b := range Clone(m).Backends {
		s.Backends = append(s.Backends, BackendSpecOf(b))
	}
	for _, e := range m.Endpoints {
		e = CloneEndpoint(e)
		if e.Rollout != nil {
			r := e.Rollout.Spec()
			e.Rollout = &r
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

// CheckDeclared refuses an endpoint as a user declares it (a file, the
// API) that sets what only the controller sets: a rollout's status.
func CheckDeclared(field string, e Endpoint) error {
	if e.Rollout != nil && e.Rollout.Status != nil {
		return &ValidationError{Problems: []string{field + ".rollout.status: is servemesh's to set, not yours: the controller records a rollout's progress; leave it out"}}
	}
	return nil
}

// BackendSpecOf returns what users declared of b.
func BackendSpecOf(b Backend) BackendSpec {
	out := BackendSpec{Name: b.Name, Config: b.Config, Protocol: b.Protocol, Process: b.Process, External: b.External}
	for _, r := range b.Replicas {
		out.Replicas = append(out.Replicas, ReplicaSpec{Address: r.Address, Health: r.Health})
	}
	return out
}
