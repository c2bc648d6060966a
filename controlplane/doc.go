// Package controlplane is servemesh's controller side: it owns the desired
// state of the mesh (backends, endpoints, traffic and shadow policies,
// replica placements; their vocabulary, meshspec, sits below it, shared
// with the node side and translation), validates every change, checkpoints it, merges it
// with the replicas' health and hands it to the xDS server. In the flow of
// docs/architecture.md: steps 1 to 4 and 10 to 12. Its sub-packages, with
// their steps:
//
//   - api (1): the HTTP/JSON API and its Go client; configfile (1): the
//     declarative YAML file (`servemesh serve`, `servemesh apply -f`);
//     gatewayapi (1): Gateway API HTTPRoutes read as endpoints.
//   - controller (2): every operation, under one write lock, checkpointed
//     before it takes effect; replica placement and the reconcile loop.
//   - leader (2): electing the one writer among several controllers.
//   - store (3): where the state lives durably (Consul KV), behind a small
//     interface; FORMAT.md documents the stored format.
//   - dataplane (4): the adopted state merged with the replicas' health,
//     the view the xDS server translates.
//   - catalog (10): the live nodes and the replicas' health from Consul's
//     catalog, which dataplane merges.
//   - autoscale (11): load from every node's Envoy, and Ray Serve's policy.
//   - rollout (12): judging each endpoint's rollout stage from that load.
//   - console (off the flow): the web console, a client of the API.
package controlplane
