// Package main is the servemesh binary: the controller, the node agent,
// a node's Envoy supervisor, the CLI, the demo and small tools, one
// subcommand each.
package main
