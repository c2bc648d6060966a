// Package daemon assembles servemesh's long-running processes from their
// packages: what `servemesh controller`, `agent`, `serve`, `envoy` and the
// demos run. cmd/servemesh fills each one's Options from flags and calls
// it; everything that connects packages to each other is here, where it is
// tested.
//
// The controller (RunController), numbered as in docs/architecture.md:
//
//  1. the HTTP API (controlplane/api) takes an operation;
//  2. the controller (controlplane/controller) validates and checkpoints it
//     to Consul KV (controlplane/store), with leader election
//     (controlplane/leader) choosing the one writer;
//  3. the adopted state goes to the data-plane publisher
//     (controlplane/dataplane), which merges it with the replicas' health
//     from Consul's catalog (controlplane/catalog);
//  4. the xDS server (xds/server) translates the view (xds/translate) and
//     serves it to every node's Envoy;
//  5. the autoscaler (controlplane/autoscale) reads each agent's load and
//     scales through step 2.
//
// An agent (RunAgent) runs the replicas placed on its node (package agent),
// supervises the node's Envoy (package envoy) and serves its status
// listener (agent.StatusHandler).
package daemon
