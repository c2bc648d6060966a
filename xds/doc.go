// Package xds is servemesh's data-plane side of the control plane: it turns
// the accepted desired state into Envoy configuration and serves it.
//
// What steps 5 to 7 of the flow in docs/architecture.md do, in detail:
//
//   - A model (controlplane/model) is accepted: it passed Validate().
//   - server.SetModel stores it as the last good model and wakes the
//     publisher; a model that fails validation is refused there and the last
//     good one stays.
//   - The publisher coalesces bursts of changes (a short hold-off, capped),
//     then calls translate.Shared once for routes, clusters and
//     assignments (each backend's replicas, Envoy's endpoints), and translate.ForNode once per connected node
//     (its listeners and, with mesh mTLS, its inbound listener and clusters).
//   - Assignments go to a LinearCache, updating only the assignments whose
//     content changed, so replica churn wakes only the streams that asked for
//     those clusters.
//   - Listeners, routes and clusters go into one full snapshot per node with a
//     content hash per resource type as its version, checked with
//     Consistent() (together with the assignments) before it is set.
//   - go-control-plane's ADS server (state-of-the-world and delta) answers
//     each node's streams from the two caches; callbacks learn each node's
//     listener settings from its bootstrap metadata, record ACKs and detect
//     NACKs, which are logged, counted and not re-sent.
//
// Sub-packages: translate (the pure functions) and server (the rest).
package xds
