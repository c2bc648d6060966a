// Package cache is the xDS wing's one cache (Istio's XdsCache, in
// servemesh's shape): what translation (xds/translate) and the xDS server
// (xds/server) keep from one change to the next, so that a change costs
// what it touched. Every memo of the wing is an entry here, named by a
// Key: its kind (a backend's parts, an endpoint's, a route table, a
// node's parts, an encoding, a cut of a kind), its name, and the version
// of the inputs it was made from. docs/architecture.md's table of caches
// lists the kinds, what each holds, what clears it and what it saves.
//
// A Cache is on or off (New(Off)): off, Get never hits, so every change
// is translated, encoded and cut whole, while Last still gives what was
// built before, by which a change is declared (the whole-state compare,
// the test oracle). Keys lists every entry: the debug view
// (`GET /debug/xds/cache` on the controller's API).
//
// A Cache is safe for concurrent use: the builder reads it from the
// goroutines that build backends and nodes in parallel, and the debug
// view from the API's. In the flow of docs/architecture.md: step 6.
package cache
