// Package catalog reads servemesh's view of Consul's catalog: the live
// nodes (Nodes: agents whose heartbeat passes, with their capacity, which
// the controller places replicas on) and the instances of the services the
// backends read replicas from (Watcher). In the flow of
// docs/architecture.md: step 10.
//
// Watcher holds one blocking query on the health state of every check (so
// a replica's health change is seen in one round trip, whatever the number
// of services), then reads again, at most Fetchers at a time, the services
// whose checks changed, and every watched service each Resync. Each
// instance says whether it passes, and whether it fails only because its
// TTL checks expired after a ready beat (Expired). Changed tells the data
// plane (package dataplane) to rebuild its view.
package catalog
