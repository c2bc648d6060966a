// Package xds is servemesh's data-plane side of the control plane: it turns
// the data plane's IR (package ir) into Envoy resources and serves
// them. In the flow of docs/architecture.md: steps 5 and 6 (server also
// runs step 7's caches and gRPC service).
//
// What happens to one change, as the code does it:
//
//  1. server.SetDataPlane takes the IR that ir.Lower made (and validated)
//     from the view; it checks the IR's invariants once more (an IR made
//     otherwise is refused, counted, and the last good one keeps
//     serving). An accepted one is the new generation and wakes the
//     publisher.
//  2. server.Run coalesces a burst of changes (a short hold-off, capped),
//     then publish runs once.
//  3. translate.Builder.Build rebuilds only the backends and endpoints that
//     changed since the last build (clusters, assignments, routes and
//     scopes, each versioned when it is built) and says which backends it
//     rebuilt.
//  4. server's sharedResources encode what was rebuilt once, and each
//     node's snapshot (its own listeners, inbound listener and local
//     clusters from translate's node builder, cut to what the node reaches:
//     reach.go) is made only for nodes whose inputs changed.
//  5. Assignments that changed go to go-control-plane's LinearCache first
//     (so new clusters warm), then each node's snapshot of listeners,
//     routes, scoped routes and clusters is set, per type, in a
//     SnapshotCache of that type only when that type's version changed for
//     the node; an assignment no longer built is removed only once every
//     connected node has ACKed clusters that no longer ask for it
//     (retire.go: make before break).
//  6. go-control-plane's ADS server (delta and state of the world) answers
//     each stream from those caches; server's callbacks learn each node's
//     listener settings from its bootstrap metadata (with mTLS, its id
//     from its certificate), record ACKs and count NACKs.
//
// translate.Translate, Shared and ForNode are the reference translation
// (all at once, no memory of the last build) that the incremental one is
// tested against.
package xds
