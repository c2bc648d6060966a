// Package main is the dataplane benchmark. It measures what Envoy adds to
// a request: it runs a demo replica as its own process, the servemesh control plane and a real Envoy,
// then drives the same load generator at the replica directly and through
// Envoy, at a fixed rate (open loop: latency counts from each request's
// scheduled time, so a stall is not hidden) and at saturation (closed loop).
//
//	go run ./bench/dataplane [-rate 1000] [-duration 10s] [-concurrency 32]
package main
