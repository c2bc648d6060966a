// Package meshspec owns servemesh's desired state: the plain, serialisable
// structs that describe backends (groups of replicas running one version of a
// service), endpoints (a route, or none for headless endpoints, with the HTTP
// methods it accepts), each endpoint's traffic policy (weights over backends
// that sum to 1) and its shadow policy (proportions of requests mirrored to
// other backends).
//
// The types carry YAML and JSON tags and no protobuf. What users write (the
// API, apply, config files, the CLI) is a Spec (BackendSpec, ReplicaSpec):
// no placements, no derived health. What the controller stores, and what the
// xDS translator reads once the data plane filled in each backend's
// replicas, is a Model. Validate checks every rule Ray Serve's controller
// enforces and names the offending field in its error, so bad input is
// refused before it reaches Envoy. In the flow of docs/architecture.md:
// step 2.
//
// It is the bottom of the house: every other package may import it, and it
// imports nothing of servemesh's but wire, so the controller side, the
// node side and translation share one vocabulary without importing each
// other (it was controlplane/model, under the controller's tree).
package meshspec
