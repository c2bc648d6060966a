// Package wire is the vocabulary servemesh's processes share: what crosses
// a process boundary, so both sides import it instead of each other.
//
//   - proxy.go: ProxyNode, an Envoy node's identity and listener addresses,
//     and the bootstrap metadata that carries them to the xDS server.
//   - node.go: NodeInfo, a node as its agent registers it in Consul's
//     catalog (capacity, status address), and the Consul names and meta
//     keys of agents and replicas.
//   - names.go: the names the translator gives Envoy resources, and
//     ParseStat, which reads back the stats Envoy counts under them.
//   - load.go: Load, the figures an agent reports on its status listener.
//
// It imports nothing of servemesh's, so every other package may import it.
package wire
