// Package main is the controlplane benchmark. It measures the controller
// on a real Consul and a real Envoy: how long a set-traffic call takes to be served by Envoy, how long a
// checkpoint write takes, and how long a controller takes to recover 1,000
// backends and 1,000 endpoints from Consul.
//
//	go run ./bench/controlplane [-flips 100] [-commits 200]
package main
