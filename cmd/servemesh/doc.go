// Command servemesh is the servemesh binary: the control plane, a node's
// Envoy supervisor, the demo and small tools, one subcommand each.
package main
