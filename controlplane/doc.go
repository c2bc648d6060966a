// Package controlplane is servemesh's controller side: it owns the desired
// state of the mesh (backends, endpoints, traffic and shadow policies,
// replica placements), validates every change, checkpoints it, and hands
// the accepted state to the xDS server.
//
// Its sub-packages, from the inside out:
//
//   - model: the plain, serialisable desired state and its validation.
//   - store: where the state lives durably (Consul KV), behind a small
//     interface; FORMAT.md documents the stored format.
//   - controller: every operation, under one write lock, checkpointed before
//     it takes effect; replica placement and the reconcile loop.
//   - leader: electing one writer among several controllers.
//   - catalog: replicas from Consul's health view, merged into the data
//     plane's view of the state.
//   - autoscale: load from every node's Envoy, and Ray Serve's policy.
//   - api: the HTTP/JSON API and its Go client.
//   - configfile: the declarative YAML file (`servemesh serve --config`,
//     `servemesh apply -f`).
package controlplane
