// Package bench holds servemesh's benchmark programs; their results, with the
// commands that reproduce them, are in BENCHMARKS.md.
package bench
