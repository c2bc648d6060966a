// Package daemon assembles servemesh's long-running processes from their
// packages: what `servemesh controller`, `agent`, `serve`, `envoy` and the
// demos run. cmd/servemesh fills each one's Options from flags and calls
// it; everything that connects packages to each other is here, where it is
// tested.
//
// The controller (RunController) wires steps 1 to 7 and 10 to 11 of the flow
// in docs/architecture.md: the API and the controller, the store and leader
// election, the data-plane publisher and the catalog watcher, the xDS
// server, and the autoscaler.
//
// An agent (RunAgent) wires steps 8 and 9: it runs the replicas placed on
// its node (package agent), supervises the node's Envoy (package envoy) and serves its status
// listener (agent.StatusHandler).
package daemon
