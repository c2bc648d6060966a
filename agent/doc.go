// Package agent is servemesh's per-node agent: it runs the replicas the
// controller places on its node, registers them in Consul's catalog with
// health checks, supervises the node's Envoy and reports load.
//
// Today it holds demoreplica, the small HTTP workload the demo and the tests
// run as replicas; the agent's process supervision and Consul registration
// build on it.
package agent
