// Package testutil holds helpers for servemesh's tests: golden-file
// comparison with -update rewriting, and a goroutine-safe buffer for logs.
package testutil
