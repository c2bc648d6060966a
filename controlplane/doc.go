// Package controlplane is servemesh's controller: it owns the desired state
// of the mesh (backends, endpoints, traffic and shadow policies), validates
// every change against it and hands the accepted state to the xDS server.
//
// Its sub-packages:
//
//   - model: the plain, serialisable desired state and its validation.
//   - configfile: reads the declarative YAML file and watches it for changes.
//
// The durable, Consul-backed controller with its operation API arrives on top
// of these; until then `servemesh serve --config FILE` drives the data plane
// from a file.
package controlplane
