// Package daemon assembles servemesh's long-running processes from their
// packages: what `servemesh controller`, `agent`, `serve`, `envoy` and the
// demos run. cmd/servemesh fills each one's Options from flags and calls
// it; everything that connects packages to each other is here, where it is
// tested.
//
// The controller (RunController) wires steps 1 to 7 and 10 to 12 of the
// flow in docs/architecture.md: the API and the controller, the store and
// leader election, the data-plane publisher and the catalog watcher, the
// xDS server, the autoscaler and the rollout runner.
//
// An agent (RunAgent) wires steps 8 and 9: it runs the replicas placed on
// its node (package agent), supervises the node's Envoy (package envoy),
// serves its status listener (agent.StatusHandler), its activator and its
// picker.
//
// Each daemon runs its components in one run group (internal/rungroup):
// the first to fail or stop stops the others, and the daemon returns when
// every one of them has, naming the one that stopped it. Nothing it starts
// outlives it (TestDaemonsLeaveNoGoroutine).
package daemon
