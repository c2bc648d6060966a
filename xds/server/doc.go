// Package server serves translated desired state to Envoy nodes over the
// aggregated xDS API (delta or state of the world) with go-control-plane:
// per-node snapshots for listeners, routes, scoped routes and clusters, a
// cache per type set only with the types a change touched (for delta
// streams, deltacache.go: each stream answered from what changed since
// the resources it last got), whose
// resources carry the versions the incremental translation made and are
// encoded once however many streams they are sent on (snapshot.go; nodes
// share them) and kept in one cache by type, name and version
// (encodings.go), cut to what a node reaches (reach.go) or, for a node
// whose clusters come on demand, to those its Envoy asked for (demand.go),
// a shared
// per-resource cache for endpoints, coalesced
// rebuilds, ACK tracking per node and NACK detection, and, with mTLS, each
// stream's node known by its certificate. In the flow of
// docs/architecture.md: step 5 (it also runs step 7's caches and server).
package server
