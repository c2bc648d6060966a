package meshspec

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// AddressPolicy says which addresses users may give replicas, static ones
// and the instances of an external service. By default an address on the
// node itself or its link is refused: loopback (where Envoy's admin,
// Consul's HTTP API, the agent and other replicas listen), link-local and
// the cloud metadata services (169.254.169.254, fd00:ec2::254,
// 100.100.100.200, 168.63.129.16), unspecified and multicast. The operator
// allows such ranges with the controller's --allow-replica-cidr.
//
// A DNS name is refused unless the operator allows it (--allow-replica-name,
// an exact name or a suffix such as .svc.internal): what a name resolves to
// is whoever runs its DNS's to say, and a name such as localhost4, a
// hosts-file entry or *.nip.io points anywhere. An allowed name is resolved
// by the controller (see the dataplane package's Resolver), never by Envoy,
// and each address it resolves to is checked like an IP literal each time,
// so a name that is later pointed at loopback gets no traffic.
//
// Replicas servemesh's agents run are not users' addresses and are not
// checked.
type AddressPolicy struct {
	// Allow lists ranges allowed even though they are refused by default.
	Allow []netip.Prefix
	// Names lists the DNS names allowed: a name, or a suffix starting with
	// a dot (".svc.internal" allows "a.svc.internal", not "svc.internal").
	Names []string
}

// AllowFlag is the controller setting that fills AddressPolicy.Allow.
const AllowFlag = "--allow-replica-cidr"

// NameFlag is the controller setting that fills AddressPolicy.Names.
const NameFlag = "--allow-replica-name"

// metadataServices are cloud metadata and host services outside the
// link-local range.
var metadataServices = []netip.Prefix{
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS, over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure's host (wireserver)
}

// embedding prefixes carry an IPv4 address in their last 32 bits, which is
// checked as well: NAT64's well-known prefix and IPv4-compatible addresses.
var embedding = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("::/96"),
}

// Check says why a replica address (host:port) is refused, or returns nil.
func (p AddressPolicy) Check(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return CheckReplicaAddress(addr)
	}
	ip, err := netip.ParseAddr(host)
	switch {
	case err == nil:
		return p.check(addr, ip)
	case !validHostName(strings.ToLower(strings.TrimSuffix(host, "."))):
		if err := CheckReplicaAddress(addr); err != nil {
			return err
		}
	}
	return p.checkName(addr, host)
}

// CheckIP says why a replica may not be at ip, or returns nil: the check of
// an address an allowed name resolved to.
func (p AddressPolicy) CheckIP(ip netip.Addr) error {
	return p.check(ip.String(), ip)
}

// NameAllowed reports whether the operator allows the DNS name host.
func (p AddressPolicy) NameAllowed(host string) bool {
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	for _, allowed := range p.Names {
		allowed = strings.ToLower(allowed)
		if name == allowed || (strings.HasPrefix(allowed, ".") && strings.HasSuffix(name, allowed)) {
			return true
		}
	}
	return false
}

func (p AddressPolicy) checkName(addr, host string) error {
	if p.NameAllowed(host) {
		return nil
	}
	return fmt.Errorf("address %q names a host by DNS, which replicas may not do unless the operator allows the name: what it resolves to (loopback, the metadata service) is its DNS's to say; give an IP address, or run the controller with %s %s",
		addr, NameFlag, strings.ToLower(strings.TrimSuffix(host, ".")))
}

func (p AddressPolicy) check(addr string, ip netip.Addr) error {
	ip = ip.Unmap()
	kind := refusedKind(ip)
	if kind == "" {
		for _, e := range embedding {
			if e.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback() {
				b := ip.As16()
				if k := refusedKind(netip.AddrFrom4([4]byte(b[12:]))); k != "" {
					kind = k + " (embedded in an IPv6 address)"
				}
			}
		}
	}
	if kind == "" {
		return nil
	}
	for _, allowed := range p.Allow {
		if allowed.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("address %q is %s, which replicas may not name unless the operator allows it: Envoy's admin, Consul, the metadata service and other replicas listen there; run the controller with %s %s to allow it",
		addr, kind, AllowFlag, netip.PrefixFrom(ip, ip.BitLen()).Masked())
}

// refusedKind says which refused range ip is in, or "".
func refusedKind(ip netip.Addr) string {
	switch {
	case ip.IsLoopback():
		return "on loopback"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "link-local"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	}
	for _, m := range metadataServices {
		if m.Contains(ip) {
			return "a cloud metadata service"
		}
	}
	return ""
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

// ParseNames checks a list of DNS names or suffixes, such as NameFlag's
// values.
func ParseNames(values []string) ([]string, error) {
	out := make([]string, 0, len(values))
	for _, v := range values {
		v = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(v), "."))
		if _, err := netip.ParseAddr(v); err == nil || !validHostName(strings.TrimPrefix(v, ".")) {
			return nil, fmt.Errorf("%s %q: not a DNS name; write a name (legacy.internal) or a suffix (.svc.internal); allow addresses with %s", NameFlag, v, AllowFlag)
		}
		out = append(out, v)
	}
	return out, nil
}

func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, r := range label {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				return false
			}
		}
	}
	return true
}

// hostName is a DNS name: dot-separated labels of letters, digits and '-'.
var hostName = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

// CheckReplicaAddress says why addr cannot be a replica's address, or
// returns nil: it must be IP:port or host:port.
func CheckReplicaAddress(addr string) error {
	if _, reason := replicaAddress(addr); reason != "" {
		return fmt.Errorf("%.80q %s", addr, reason)
	}
	return nil
}

// CheckReplicaInbound says why r's inbound listener (if any) cannot be used:
// it must be IP:port, and r must name its node.
func CheckReplicaInbound(r Replica) error {
	if r.Inbound == "" {
		return nil
	}
	if ap, err := netip.ParseAddrPort(r.Inbound); err != nil || ap.Port() == 0 {
		return fmt.Errorf(`inbound %.80q is not IP:port with a port from 1 to 65535; write it like "10.0.0.7:21000"`, r.Inbound)
	}
	if r.Node == "" {
		return fmt.Errorf("inbound %q needs the replica's node", r.Inbound)
	}
	return nil
}

// replicaAddress checks a replica's address, IP:port or host:port, and
// returns its canonical form, or why it is not an address.
func replicaAddress(addr string) (string, string) {
	const fix = `is not an IP:port or host:port address; write it like "127.0.0.1:9001", "[::1]:9001" or "legacy.internal:9001"`
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		if ap.Port() == 0 {
			return "", "has port 0; give the port the replica listens on"
		}
		return ap.String(), ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || len(host) > 253 || !hostName.MatchString(host) {
		return "", fix
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "needs a port from 1 to 65535"
	}
	return strings.ToLower(strings.TrimSuffix(host, ".")) + ":" + port, ""
}
