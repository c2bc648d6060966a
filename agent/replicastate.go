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
func (s *ReplicaState) ConfigVersions() map[string]string {
	out := map[string]string{}
	s.configs.Range(func(tag, version any) bool {
		out[tag.(string)] = version.(string)
		return true
	})
	return out
}

// DrainingInFlight is the requests in flight to each draining replica, by
// tag, as last counted.
func (s *ReplicaState) DrainingInFlight() map[string]int {
	out := map[string]int{}
	s.draining.Range(func(tag, n any) bool {
		out[tag.(string)] = n.(int)
		return true
	})
	return out
}
