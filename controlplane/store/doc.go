// Package store keeps the controller's desired state durably: the source of
// truth that is written, with check-and-set, before any effect of a change is
// published. In the flow of docs/architecture.md: step 3.
//
// Store is deliberately small (load, commit a change at a revision, wait for
// the next revision) so that a second implementation, such as an embedded
// single-node store, can sit beside the two here:
//
//   - Consul (consul.go): Consul's KV under a prefix, one key per backend and
//     endpoint plus a meta key whose ModifyIndex is the revision; every commit
//     is one Consul transaction that checks the meta key's index first.
//   - Memory (memory.go): the same semantics in memory, for unit tests.
//
// The stored format is versioned JSON; see FORMAT.md beside this file.
package store
