package model

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// AddressPolicy says which addresses users may give replicas, static ones
// and the instances of an external service. By default an address on the
// node itself or its link is refused: loopback (where Envoy's admin,
// Consul's HTTP API, the agent and other replicas listen), link-local (the
// cloud metadata service at 169.254.169.254), unspecified, and the name
// localhost. Otherwise whoever may write a backend could point a public
// route at them. The operator allows such ranges with the controller's
// --allow-replica-cidr. Replicas servemesh's agents run are not users'
// addresses and are not checked.
type AddressPolicy struct {
	// Allow lists ranges allowed even though they are refused by default.
	Allow []netip.Prefix
}

// AllowFlag is the controller setting that fills AddressPolicy.Allow.
const AllowFlag = "--allow-replica-cidr"

// Check says why a replica address (host:port) is refused, or returns nil.
// A DNS name is checked only for being localhost: what else it resolves to
// is the DNS operator's to say.
func (p AddressPolicy) Check(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return CheckReplicaAddress(addr)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil { // a DNS name
		name := strings.ToLower(strings.TrimSuffix(host, "."))
		if name != "localhost" && !strings.HasSuffix(name, ".localhost") {
			return nil
		}
		ip = netip.MustParseAddr("127.0.0.1")
	}
	ip = ip.Unmap()
	var kind string
	switch {
	case ip.IsLoopback():
		kind = "on loopback"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		kind = "link-local"
	case ip.IsUnspecified():
		kind = "unspecified"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		kind = "multicast"
	default:
		return nil
	}
	for _, allowed := range p.Allow {
		if allowed.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("address %q is %s, which replicas may not name unless the operator allows it: Envoy's admin, Consul and other replicas listen there; run the controller with %s %s to allow it",
		addr, kind, AllowFlag, netip.PrefixFrom(ip, ip.BitLen()).Masked())
}

// ParseCIDRs parses a list of CIDR ranges, such as AllowFlag's values.
func ParseCIDRs(values []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(values))
	for _, v := range values {
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%s %q: not a CIDR range; write it like 127.0.0.0/8 or ::1/128", AllowFlag, v)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
