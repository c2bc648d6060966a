// Package controller is servemesh's brain: it owns every change to the
// desired state. Each operation (create, update and delete backends and
// endpoints, set traffic and shadows, apply a whole file) runs under one
// write lock as:
//
//  1. copy the current state and apply the operation to the copy;
//  2. if nothing changed, return: repeating a call changes nothing;
//  3. validate the whole new state; bad input changes nothing;
//  4. checkpoint it to the store with check-and-set on the revision read;
//  5. (fault injection: optionally exit here, as a crash would);
//  6. adopt it and publish it to the data plane.
//
// A crash after step 4 loses nothing: the next leader loads the checkpoint
// and publishes it before it serves writes. Only the leader writes; every
// controller watches the store and publishes what it holds, so followers
// serve reads and xDS too.
package controller
