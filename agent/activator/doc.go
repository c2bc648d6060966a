// Package activator is each node's activator: Knative's, inside the
// node's agent. It holds the requests the node's Envoy has for a process
// backend while none of its replicas can take them (just created,
// restarting, scaled to zero), within the backend's hold_timeout_s and
// max_held, then tells Envoy to retry them on the replica that became
// ready. It reads the node's view of the desired state (agent/nodeview).
// In the flow of docs/architecture.md: step 9.
package activator
