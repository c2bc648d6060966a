// Package main is the agents benchmark. It measures servemesh's replica
// management on a real Consul, real agents and a real Envoy: the time from a scale-up call to every new
// replica serving, the time from a replica hanging to Envoy no longer
// routing to it, and the controller's CPU and memory with 1,000 replicas
// registered in Consul (as instances of external backends, whose health
// keeps changing).
//
//	go run ./bench/agents
package main
