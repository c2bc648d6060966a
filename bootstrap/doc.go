// Package bootstrap owns what a node's Envoy is started with: its node
// identity, the servemesh metadata that tells the control plane where the
// node's listeners go, the admin interface on loopback, and one ADS stream
// (state-of-the-world or delta gRPC) to the control plane for everything else.
//
// The metadata keys written here are read back by NodeFromMetadata when the
// node connects, so this package is the single owner of that contract.
package bootstrap
