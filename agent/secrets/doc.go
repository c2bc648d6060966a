// Package secrets keeps a node's identities for its Envoy: the node's
// leaf, the CA roots and the leaf of each backend the node runs, from
// Consul's service-mesh CA (internal/connect), as file-based SDS configs
// in the agent's own secrets folder. In the flow of docs/architecture.md:
// step 9.
package secrets
