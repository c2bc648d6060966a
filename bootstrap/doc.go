// Package bootstrap renders what a node's Envoy is started with: its node
// identity, the servemesh metadata that tells the control plane where the
// node's listeners go (wire.ProxyNode.Metadata, read back by the xDS server
// with wire.ProxyNodeFromEnvoy), the admin interface on loopback, and one
// ADS stream (state-of-the-world or delta gRPC) to the control plane for
// everything else. In the flow of docs/architecture.md: step 8.
package bootstrap
