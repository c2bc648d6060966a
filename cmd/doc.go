// Package cmd holds servemesh's binaries; cmd/servemesh is the one binary,
// with a subcommand per role (control plane, node Envoy, demo, tools).
package cmd
