package agent

import "sync"

// ReplicaState is what the agent keeps of its replicas that the node's
// status listener reports (wire.Load): the user_config version each
// runs, and the requests in flight to each draining one, by tag. The
// status listener starts before the agent (the agent registers its
// address), so RunAgent makes this first and gives it to both
// (Options.State, LoadExtras.Replicas).
type ReplicaState struct {
	configs  sync.Map // replica tag -> the user_config version it runs
	draining sync.Map // draining replica tag -> its requests in flight, last counted
}

// ConfigVersions are, by replica tag, the user_config version each of the
// node's replicas runs.
func (s *ReplicaState) ConfigVersions() map[string]string { return copyOf[string](&s.configs) }

// DrainingInFlight is the requests in flight to each draining replica, by
// tag, as last counted.
func (s *ReplicaState) DrainingInFlight() map[string]int { return copyOf[int](&s.draining) }

// copyOf is m, whose keys are replica tags and values V, as a map.
func copyOf[V any](m *sync.Map) map[string]V {
	out := map[string]V{}
	m.Range(func(tag, v any) bool {
		out[tag.(string)] = v.(V)
		return true
	})
	return out
}
