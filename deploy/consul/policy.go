// Package consul holds servemesh's Consul ACL policies, the files
// deployers read (node-policy.hcl, controller-policy.hcl, README.md), for
// the programs that install them: the demo stack and the tests mint their
// daemons' tokens from these same files.
package consul

import (
	_ "embed" // the policy files
	"strings"
)

//go:embed node-policy.hcl
var nodePolicy string

//go:embed controller-policy.hcl
var controllerPolicy string

// NodePolicy is the policy every node's token shares (node-policy.hcl).
func NodePolicy() string { return nodePolicy }

// ControllerPolicy is the controller's policy (controller-policy.hcl) for
// a controller whose Consul agent is the Consul node consulNode.
func ControllerPolicy(consulNode string) string {
	return strings.ReplaceAll(controllerPolicy, "NODE", consulNode)
}
