// Package controller is servemesh's brain: it owns every change to the
// desired state. Each operation (create, update and delete backends and
// endpoints, set traffic and shadows, apply a whole file) runs under one
// write lock as:
//
//   - copy the current state and apply the operation to the copy;
//   - if nothing changed, return: repeating a call changes nothing;
//   - validate the whole new state; bad input changes nothing;
//   - checkpoint it to the store with check-and-set on the revision read;
//   - (fault injection: optionally exit here, as a crash would);
//   - adopt it and publish it to the data plane.
//
// In the flow of docs/architecture.md: step 2.
//
// A crash after the checkpoint loses nothing: the next leader loads the checkpoint
// and publishes it before it serves writes. Only the leader writes; every
// controller watches the store's revision, loads what another controller
// wrote (not its own commits, adopted as it made them, but for one that
// stores a backend a left-out endpoint names) and publishes
// what it holds, so followers serve reads and xDS too.
package controller
