// Package main is the statsoverhead benchmark. It measures what servemesh's
// stats collection costs:
// Envoy serves 1,000 requests a second while an agent's /v1/load (which
// reads Envoy's /stats) is polled not at all, once a second (the
// controller's default) and ten times a second; it reports the CPU the
// Envoy and the agent processes use in each phase.
//
//	go run ./bench/statsoverhead [-rate 1000] [-phase 10s]
package main
