// Package server serves translated desired state to Envoy nodes over the
// aggregated xDS API with go-control-plane: per-node snapshots for listeners,
// routes and clusters, a shared per-resource cache for endpoints, coalesced
// rebuilds, ACK tracking per node and NACK detection. See package xds for the
// numbered data flow.
package server
