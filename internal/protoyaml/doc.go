// Package protoyaml renders protobuf messages (Envoy resources, bootstraps) as
// stable, human-readable YAML for golden files, CLI output and Envoy's own
// YAML config loading.
package protoyaml
