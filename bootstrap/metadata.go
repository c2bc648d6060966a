package bootstrap

import (
	"fmt"
	"net"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/servemesh/servemesh/xds/translate"
)

// Node metadata keys: the bootstrap writes them, the control plane reads them
// back from the node's first xDS request to build the node's listeners.
const (
	MetaPublicAddress = "servemesh.public_address"
	MetaPublicPort    = "servemesh.public_port"
	MetaMeshAddress   = "servemesh.mesh_address"
	MetaMeshPort      = "servemesh.mesh_port"
)

func nodeMetadata(n translate.Node) map[string]any {
	return map[string]any{
		MetaPublicAddress: n.PublicAddress,
		MetaPublicPort:    float64(n.PublicPort),
		MetaMeshAddress:   n.MeshAddress,
		MetaMeshPort:      float64(n.MeshPort),
	}
}

// NodeFromMetadata recovers a node's listener settings from the node it
// announced on its xDS stream. A node not started from a servemesh bootstrap
// gets an error saying so.
func NodeFromMetadata(n *core.Node) (translate.Node, error) {
	if n == nil || n.GetId() == "" {
		return translate.Node{}, fmt.Errorf("xds request carries no node id")
	}
	fields := n.GetMetadata().GetFields()
	str := func(key string) string { return fields[key].GetStringValue() }
	port := func(key string) uint32 {
		v := fields[key].GetNumberValue()
		if v < 1 || v > 65535 || v != float64(uint32(v)) {
			return 0
		}
		return uint32(v)
	}
	node := translate.Node{
		ID:            n.GetId(),
		PublicAddress: str(MetaPublicAddress),
		PublicPort:    port(MetaPublicPort),
		MeshAddress:   str(MetaMeshAddress),
		MeshPort:      port(MetaMeshPort),
	}
	if err := node.Validate(); err != nil {
		return translate.Node{}, fmt.Errorf("node %q has no valid servemesh metadata (start it with a bootstrap from `servemesh bootstrap`): %w", n.GetId(), err)
	}
	return node, nil
}

func splitHostPort(field, hostport string) (string, uint32, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("bootstrap: %s %q is not host:port: %w", field, hostport, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 || host == "" {
		return "", 0, fmt.Errorf("bootstrap: %s %q needs a host and a port between 1 and 65535", field, hostport)
	}
	return host, uint32(port), nil
}
