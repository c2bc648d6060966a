// Package e2e holds servemesh's end-to-end tests. They run the real Envoy
// (from `make tools`) and the real servemesh binary, built once per run, and
// send real HTTP traffic on loopback. A missing Envoy fails the run; nothing
// here is skipped.
package e2e
