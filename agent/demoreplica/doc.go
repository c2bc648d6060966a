// Package demoreplica is a tiny HTTP server that stands in for a model server
// or API replica in demos and tests. Every response says which backend and
// replica answered, so a client can see how traffic was split; it counts the
// requests it served so tests can see where mirrored traffic went.
package demoreplica
