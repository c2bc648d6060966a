// Package testutil holds helpers for servemesh's tests: golden-file
// comparison with -update rewriting, a goroutine-safe buffer for logs, a
// Consul dev agent, and process helpers (free addresses, CPU time, pids).
package testutil
