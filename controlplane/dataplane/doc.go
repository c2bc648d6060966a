// Package dataplane owns what the data plane is told: the desired state
// merged with Consul's health view of the replicas, handed to the xDS
// server. In the flow of docs/architecture.md: step 4. It sits between the
// controller, the catalog and the xDS server:
//
//   - The controller adopts a state (a checkpointed change, a watched
//     revision, or recovery) and calls Publisher.Publish with it.
//   - Publish tells the catalog watcher which services to follow
//     (Services: process backends' own, external backends' named ones, and
//     the registrations of the nodes replicas are placed on).
//   - View merges the state with the watcher's instances (Replicas): every
//     backend ends up listing plain replicas with their health, as a
//     config file would; instances that cannot be used, or that claim what
//     their node may not, are left out and reported. It then lowers that
//     view to the data plane's IR (ir.Lower), validated once, there.
//   - The IR goes to the sink (the xDS server's SetDataPlane), which
//     translates and serves it.
//   - When an instance's health changes, the watcher signals Changed and
//     Run merges and hands over again with the last state.
//
// Publish and the refresh in Run hold one lock from the merge to the hand
// over, so a view built from an older state is never handed over after a
// newer one. A view the sink refuses is logged, counted and kept in Err
// until a later view is accepted.
package dataplane
