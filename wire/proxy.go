package wire

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// ProxyNode is one Envoy node as the xDS server sees it: its node id and
// where its two listeners go. The bootstrap announces it in the node's
// metadata; the translator builds the node's listeners from it.
type ProxyNode struct {
	// ID is the Envoy node id.
	ID string `json:"id"`
	// PublicAddress and PublicPort are where routed endpoints are served;
	// both empty for a node that serves none (a mesh-only node, Ray Serve's
	// proxy location NoServer), which then gets no public route table.
	PublicAddress string `json:"public_address,omitempty"`
	PublicPort    uint32 `json:"public_port,omitempty"`
	// MeshAddress and MeshPort are the loopback listener where local replicas
	// reach any endpoint by `Host: <endpoint name>`.
	MeshAddress string `json:"mesh_address"`
	MeshPort    uint32 `json:"mesh_port"`
	// PublicTLS, if set, is the absolute path of a file-based SDS config
	// on the node holding the public listener's certificate (secret
	// PublicTLSSecret): the public listener then serves HTTPS, HTTP/2 and
	// HTTP/1.1 by ALPN, and Envoy reloads the certificate when it changes.
	PublicTLS string `json:"public_tls,omitempty"`
	// InboundAddress and InboundPort, with mesh mTLS, are where the node's
	// Envoy receives other nodes' requests for its replicas (InboundListener).
	// Its identities are then in SecretsDir.
	InboundAddress string `json:"inbound_address,omitempty"`
	InboundPort    uint32 `json:"inbound_port,omitempty"`
	// NoAccessLog turns the node's access log (AccessLogFile) off.
	NoAccessLog bool `json:"no_access_log,omitempty"`
	// Reachable, if not nil, are the only endpoints the node's mesh
	// listener serves (empty: none), as Kuma's reachable services and
	// Istio's Sidecar egress hosts: its Envoy then holds the mesh routes of
	// those endpoints alone and, unless it has a public listener, the
	// clusters of their backends alone. nil: every endpoint.
	Reachable []string `json:"reachable_endpoints,omitempty"`
	// ClustersOnDemand: the node's Envoy starts with the clusters of the
	// backends it runs alone and asks for the others by name (Envoy's
	// on-demand cluster discovery) on the first request a route sends to
	// one; it is then sent the clusters of every endpoint whose routes
	// name that one. Its xDS must be delta.
	ClustersOnDemand bool `json:"clusters_on_demand,omitempty"`
	// Version and Protocol are the servemesh release and Protocol of the
	// agent that started the node's Envoy; Protocol 0 when it announced
	// none (an older release: UnannouncedProtocol).
	Version  string `json:"servemesh_version,omitempty"`
	Protocol int    `json:"servemesh_protocol,omitempty"`
}

// Equal reports whether n and o are the same settings (reaching no
// endpoint is not reaching every one).
func (n ProxyNode) Equal(o ProxyNode) bool { return reflect.DeepEqual(n, o) }

// AnnouncedProtocol is the node's Protocol, UnannouncedProtocol if it
// announced none.
func (n ProxyNode) AnnouncedProtocol() int {
	if n.Protocol == 0 {
		return UnannouncedProtocol
	}
	return n.Protocol
}

// MaxReachable bounds how many endpoints a node may name as reachable.
const MaxReachable = 10_000

// MTLS reports whether the node takes part in mesh mTLS: it has an inbound
// listener, and its identities in SecretsDir.
func (n ProxyNode) MTLS() bool { return n.InboundPort != 0 }

// Public reports whether the node serves routed endpoints on a public
// listener.
func (n ProxyNode) Public() bool { return n.PublicPort != 0 || n.PublicAddress != "" }

// PublicTLSSecret names the public listener's certificate in its SDS file.
const PublicTLSSecret = "public_tls"

// Node metadata keys: the bootstrap writes them, the xDS server reads them
// back from the node's first request.
const (
	MetaPublicAddress = "servemesh.public_address"
	MetaPublicPort    = "servemesh.public_port"
	MetaMeshAddress   = "servemesh.mesh_address"
	MetaMeshPort      = "servemesh.mesh_port"
	MetaPublicTLS     = "servemesh.public_tls_sds"
	MetaInboundAddr   = "servemesh.inbound_address"
	MetaInboundPort   = "servemesh.inbound_port"
	MetaNoAccessLog   = "servemesh.no_access_log"
	MetaReachable     = "servemesh.reachable_endpoints"
	MetaOnDemand      = "servemesh.clusters_on_demand"
)

// Validate checks the node's settings.
func (n ProxyNode) Validate() error {
	if n.ID == "" {
		return errors.New("node id is empty: set the Envoy node id")
	}
	if err := CheckNodeID(n.ID); err != nil {
		return fmt.Errorf("--node-id: %w", err)
	}
	type listenerAddr struct {
		field, addr string
		port        uint32
	}
	addrs := []listenerAddr{{"mesh", n.MeshAddress, n.MeshPort}}
	if n.Public() {
		addrs = append(addrs, listenerAddr{"public", n.PublicAddress, n.PublicPort})
	} else if n.PublicTLS != "" {
		return fmt.Errorf("node %q: public_tls is set but the node has no public listener; set public_address and public_port, or drop public_tls", n.ID)
	}
	for _, a := range addrs {
		if _, err := netip.ParseAddr(a.addr); err != nil {
			return fmt.Errorf("node %q: %s_address %q is not an IP address", n.ID, a.field, a.addr)
		}
		if a.port == 0 || a.port > 65535 {
			return fmt.Errorf("node %q: %s_port %d is not a port between 1 and 65535", n.ID, a.field, a.port)
		}
	}
	if n.PublicTLS != "" && !strings.HasPrefix(n.PublicTLS, "/") {
		return fmt.Errorf("node %q: public_tls %q is not an absolute path", n.ID, n.PublicTLS)
	}
	if err := n.validateMTLS(); err != nil {
		return err
	}
	if err := n.validateReachable(); err != nil {
		return err
	}
	if n.PublicPort == n.MeshPort && n.PublicAddress == n.MeshAddress {
		return fmt.Errorf("node %q: public and mesh listeners both use %s:%d; give them different ports", n.ID, n.MeshAddress, n.MeshPort)
	}
	return nil
}

// validateReachable checks the reachable endpoints' names: sorted,
// each once, none empty or holding a comma or a space.
func (n ProxyNode) validateReachable() error {
	if len(n.Reachable) > MaxReachable {
		return fmt.Errorf("node %q: %d reachable endpoints, at most %d; leave them unset to reach every endpoint", n.ID, len(n.Reachable), MaxReachable)
	}
	for i, e := range n.Reachable {
		if e == "" || strings.ContainsAny(e, ", \t\n") {
			return fmt.Errorf("node %q: reachable endpoint %q is not an endpoint name", n.ID, e)
		}
		if i > 0 && n.Reachable[i-1] >= e {
			return fmt.Errorf("node %q: reachable endpoints must be sorted, each once (%q before %q)", n.ID, n.Reachable[i-1], e)
		}
	}
	return nil
}

// validateMTLS checks the inbound listener's address and port: both or
// neither.
func (n ProxyNode) validateMTLS() error {
	if n.InboundAddress == "" && n.InboundPort == 0 {
		return nil
	}
	if _, err := netip.ParseAddr(n.InboundAddress); err != nil {
		return fmt.Errorf("node %q: inbound_address %q is not an IP address; mesh mTLS needs the node's inbound listener", n.ID, n.InboundAddress)
	}
	if n.InboundPort == 0 || n.InboundPort > 65535 {
		return fmt.Errorf("node %q: inbound_port %d is not a port between 1 and 65535", n.ID, n.InboundPort)
	}
	return nil
}

// Metadata returns the node's listener settings as Envoy node metadata.
func (n ProxyNode) Metadata() (*structpb.Struct, error) {
	fields := map[string]any{
		MetaMeshAddress: n.MeshAddress,
		MetaMeshPort:    float64(n.MeshPort),
	}
	if n.Public() {
		fields[MetaPublicAddress], fields[MetaPublicPort] = n.PublicAddress, float64(n.PublicPort)
	}
	if n.PublicTLS != "" {
		fields[MetaPublicTLS] = n.PublicTLS
	}
	if n.MTLS() {
		fields[MetaInboundAddr], fields[MetaInboundPort] = n.InboundAddress, float64(n.InboundPort)
	}
	if n.NoAccessLog {
		fields[MetaNoAccessLog] = true
	}
	if n.Protocol != 0 {
		fields[MetaVersion], fields[MetaProtocol] = n.Version, strconv.Itoa(n.Protocol)
	}
	if n.ClustersOnDemand {
		fields[MetaOnDemand] = true
	}
	if n.Reachable != nil {
		names := make([]any, len(n.Reachable))
		for i, e := range n.Reachable {
			names[i] = e
		}
		fields[MetaReachable] = names
	}
	s, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	return s, nil
}

// ProxyNodeFromEnvoy recovers a node's settings from the node it announced
// on its xDS stream. A node not started from a servemesh bootstrap gets an
// error saying so.
func ProxyNodeFromEnvoy(n *core.Node) (ProxyNode, error) {
	if n == nil || n.GetId() == "" {
		return ProxyNode{}, errors.New("xds request carries no node id")
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
	node := ProxyNode{
		ID:            n.GetId(),
		PublicAddress: str(MetaPublicAddress),
		PublicPort:    port(MetaPublicPort),
		MeshAddress:   str(MetaMeshAddress),
		MeshPort:      port(MetaMeshPort),
		PublicTLS:     str(MetaPublicTLS),

		InboundAddress: str(MetaInboundAddr),
		InboundPort:    port(MetaInboundPort),
		NoAccessLog:    fields[MetaNoAccessLog].GetBoolValue(),
		Version:        str(MetaVersion),

		ClustersOnDemand: fields[MetaOnDemand].GetBoolValue(),
	}
	if p := str(MetaProtocol); p != "" {
		protocol, err := ParseProtocol(p)
		if err != nil {
			return ProxyNode{}, fmt.Errorf("node %s: %w", n.GetId(), err)
		}
		node.Protocol = protocol
	}
	if list := fields[MetaReachable].GetListValue(); list != nil {
		node.Reachable = make([]string, 0, len(list.GetValues()))
		for _, v := range list.GetValues() {
			node.Reachable = append(node.Reachable, v.GetStringValue())
		}
	}
	if err := node.Validate(); err != nil {
		return ProxyNode{}, fmt.Errorf("node %q has no valid servemesh metadata (start it with a bootstrap from `servemesh bootstrap`): %w", n.GetId(), err)
	}
	return node, nil
}
