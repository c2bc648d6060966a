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
//     scopes, each versioned when it is built) and declares what it
//     changed, by kind and name (translate.ChangeSet, Istio's
//     ConfigsUpdated shape).
//  4. The server's one cache of encoded resources (encodings.go, by type,
//     name and version) drops what the change set names; the
//     sharedResources encode what was rebuilt once, and each
//     node's snapshot (its own listeners, inbound listener and local
//     clusters from translate's node builder, nodebuilder.go, each part
//     rebuilt only when what it depends on changed, and encoded there,
//     an inbound chain once for the nodes that have it alike; cut to what the node
//     reaches, reach.go, or to the clusters it asked for, demand.go) is
//     made only for nodes whose inputs changed.
//  5. Assignments the change set names go to go-control-plane's LinearCache first
//     (so new clusters warm), then each node's snapshot of listeners,
//     routes, scoped routes and clusters is set, per type, in the caches
//     of that type (server's deltaCache for delta streams, which answers
//     each from the names its last kind and the new one differ in, and a
//     SnapshotCache for state-of-the-world ones) only when that type's
//     version changed for the node; an assignment no longer built is removed only once every
//     connected node has ACKed clusters that no longer ask for it
//     (retire.go: make before break).
//  6. go-control-plane's ADS server (delta and state of the world) answers
//     each stream from those caches; server's callbacks learn each node's
//     listener settings from its bootstrap metadata (with mTLS, its id
//     from its certificate), record ACKs and count NACKs, and the clusters
//     a node with clusters on demand names, which bring it back to step 4.
//
// translate.Translate, Shared and ForNode are the reference translation
// (all at once, no memory of the last build): a test oracle, which the
// incremental one is tested against resource for resource, with its
// declared change set against what changed.
//
// go-control-plane's caches and ADS server do the protocol. Two of its
// pieces are not used, on purpose: its Snapshot hashes every resource of
// a node's snapshot to version it (ConstructVersionMap), which costs what
// sending them all does, so server's snapshot type carries the versions
// the translation made; and its Snapshot.Consistent wants the assignments
// in the same snapshot, while they live in one LinearCache for every node
// (so replica churn wakes only the streams that asked), so the check of
// a node's snapshot (sharedResources.consistent) takes the route names
// its listeners reference from go-control-plane (GetResourceReferences)
// and the assignments its clusters ask for from the translation.
package xds
