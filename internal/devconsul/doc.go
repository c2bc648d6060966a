// Package devconsul runs a real `consul agent -dev` on loopback ports: the
// Consul of the tests, the benchmarks and the demo. Its data lives in memory
// and goes with the process.
package devconsul
