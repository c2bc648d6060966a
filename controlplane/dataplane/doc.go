// Package dataplane owns what the data plane is told: the desired state
// merged with Consul's health view of the replicas, handed to the xDS
// server. In the flow of docs/architecture.md: step 4. It sits between the
// controller, the catalog and the xDS server:
//
//   - The controller adopts a state (a checkpointed change, a watched
//     revision, or recovery) and calls Publisher.Publish with it and what
//     its change touched (meshspec.Touched; the whole state after a load).
//   - Publish validates the state, once (meshspec's Validate, in its
//     role: the stored state; one another writer stored that fails it is
//     refused, and the data plane keeps following the last valid one), and
//     tells the catalog watcher which services to follow (Services:
//     process backends' own, external backends' named ones, and the
//     registrations of the nodes replicas are placed on).
//   - Replicas gives each served backend's replicas from the watcher's
//     instances: plain replicas with their health; instances that cannot
//     be used, or that claim what their node may not, are left out and
//     reported. What changed since the last IR the sink took is one
//     ir.Delta: the touched backends and endpoints, and the backends
//     reading the services the watcher names (TakeChanged). Only those
//     backends' replicas are read, and ir.LowerDelta lowers only those
//     into the next IR (ir.Lower the whole state at a fresh start, or when
//     the change cannot be named), reading the state as it is, and
//     validates what it lowered.
//   - The IR goes to the sink (the xDS server's SetDataPlane), which
//     translates and serves it; a refused IR's delta is kept and merged
//     into the next one's.
//   - When an instance's health changes, the watcher signals Changed and
//     Run merges and hands over again with the last state.
//
// Publish and the refresh in Run hold one lock from the merge to the hand
// over, so a view built from an older state is never handed over after a
// newer one. A view the sink refuses is logged, counted and kept in Err
// until a later view is accepted.
package dataplane
