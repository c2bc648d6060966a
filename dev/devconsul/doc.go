// Package devconsul runs a real Consul on loopback: a `consul agent -dev`
// on free ports (Agent: the Consul of most tests, the benchmarks and the
// demo; its data lives in memory and goes with the process), or a cluster
// as production runs it (Cluster: servers with Raft and the Connect CA,
// data on disk, and a client agent for each address that runs servemesh
// daemons, each agent on its own loopback address with Consul's default
// ports).
package devconsul
