// Package server serves translated desired state to Envoy nodes over the
// aggregated xDS API with go-control-plane: per-node snapshots for listeners,
// routes and clusters, a shared per-resource cache for endpoints, coalesced
// rebuilds, ACK tracking per node and NACK detection, and, with mTLS, each
// stream's node known by its certificate. In the flow of
// docs/architecture.md: step 5 (it also runs step 7's caches and server).
package server
