// Package server serves translated desired state to Envoy nodes over the
// aggregated xDS API (delta or state of the world) with go-control-plane:
// per-node snapshots for listeners, routes, scoped routes and clusters, a
// cache per type set only with the types a change touched, a shared
// per-resource cache for endpoints, coalesced rebuilds, ACK tracking per
// node and NACK detection, and, with mTLS, each stream's node known by its
// certificate. In the flow of docs/architecture.md: step 5 (it also runs
// step 7's caches and server).
//
// A data plane's path through the files:
//
//  1. server.go: Server takes each accepted data plane (SetDataPlane),
//     keeps the last good one, and registers the ADS services.
//  2. publish.go: one publish at a time, coalesced: the builder
//     (xds/translate) rebuilds what changed; the shared resources and each
//     node's own become per-node snapshots (snapshot.go: a kind is one
//     type's resources, versioned by the translation, encoded once and
//     shared by the nodes that have the same), cut to what a node reaches
//     (reach.go) or, for a node whose clusters come on demand, to those its
//     Envoy asked for (demand.go); each cache is set only with the types
//     the change touched. Every resource comes encoded from the builder;
//     the kinds made of them are entries of the one cache (xds/cache,
//     KindSnapshotKinds), keyed by what each is made from and its version.
//  3. deltacache.go answers delta streams from what changed since the
//     resources each last got; go-control-plane's snapshot caches answer
//     state-of-the-world streams, its linear cache the assignments.
//     retire.go removes an assignment only once no node's clusters name it
//     (make before break). codec.go is the gRPC codec, pooling answers'
//     encodings within a budget for large ones.
//  4. callbacks.go: go-control-plane's callbacks see streams open and
//     close, requests (ACKs and NACKs) and responses, and each stream's node
//     by its certificate; status.go keeps what each node ACKed (Status: in
//     sync or not), and forgets nodes long gone; serving.go says which
//     nodes serve a backend's latest replicas (their assignments ACKed),
//     what `--wait` waits for.
//  5. metrics.go: the server's metrics (pushes, NACKs, convergence time,
//     nodes connected and out of sync).
//
// Options.CacheOff ($SERVEMESH_XDS_CACHE=off) turns the one cache off:
// the builder's parts and step 2's kinds are made anew at each change,
// each change translated, encoded and cut whole, and compared with what
// was sent (TestCacheOffPublishesTheSame holds the two ways to the same
// snapshots). Server.CacheKeys is the cache's debug view.
package server
