// Package picker is the node's endpoint picker for load-aware backends,
// split as the Gateway API Inference Extension's is: the protocol
// (server.go: Envoy's ext_proc, on a unix socket in the node's Envoy's
// folder), the load data (scrape.go: the servers' own gauges, and the
// node's exact count of each replica's requests in flight and its times
// to first byte) and the policy that scores replicas from them
// (the sub-package scoring: pure, table-tested alone, one pass of a
// pipeline of filters, weighted scorers and a picker per request;
// picker.go holds the figures, gathers what each replica is to the
// request, runs the pass and does what the pick implies). In the flow of docs/architecture.md: step 9.
package picker
