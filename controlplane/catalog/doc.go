// Package catalog reads servemesh's view of Consul's catalog: the live
// nodes (Nodes: agents whose heartbeat passes, with their capacity) and the
// instances of the services backends read replicas from (Watcher).
//
// Watcher keeps one blocking query per watched service (a process backend's
// name, or an external backend's service), so a replica's health change is
// seen in one round trip; Changed tells the data plane (package dataplane)
// to rebuild its view.
package catalog
