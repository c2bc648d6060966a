// Package main is the apiload benchmark. It measures the controller's API under load, against a real
// Consul dev agent and the servemesh binary, on loopback, bounded in count
// and time:
//
//   - applies of 1,000, 10,000 and 25,000 endpoints (time grows linearly);
//   - read latency of 8 clients while a 25,000-endpoint apply runs, beside
//     the same reads with no apply (the baseline, same run);
//   - mixed reads and writes from 16 clients for a few seconds;
//   - the controller's memory before, with and after 3,000 xDS node ids that
//     each connect once.
//
// Run it with `go run ./bench/apiload`; results go in BENCHMARKS.md.
package main
