// Package nodeview is one revision of the desired state as a node's parts
// read it: its backends by name, and which of them have a replica placed
// on the node. The agent makes one per desired state it reads, once; the
// activator and the picker each read the latest, so none of them indexes
// or scans the state per request. In the flow of docs/architecture.md:
// step 9.
package nodeview
