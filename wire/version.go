package wire

import (
	"fmt"
	"strconv"
)

// Version is this build's release, set when it is linked (make build and
// make release: -X github.com/servemesh/servemesh/wire.Version=...); "dev"
// for a plain go build.
var Version = "dev"

// Protocol is the version of what servemesh's processes share: the
// stored state (controlplane/store/FORMAT.md), the Consul registrations,
// the xDS node metadata, the agents' records in their work folders and
// status listeners. A release that changes any of these in a way the
// previous release would misread bumps it. Releases before versions were
// announced speak protocol 1 (UnannouncedProtocol).
//
// The skew policy (docs/upgrading.md): a controller serves nodes of its
// own protocol and of the one before (MinNodeProtocol); a node is never
// newer than the leading controller. So upgrades go controllers first,
// then agents, one release at a time; downgrades go agents first.
const Protocol = 2

// MinNodeProtocol is the oldest protocol a controller of Protocol serves.
const MinNodeProtocol = Protocol - 1

// UnannouncedProtocol is the protocol of a process that announces none:
// one of a release before versions were announced.
const UnannouncedProtocol = 1

// Meta keys that announce a process's release and protocol, in an agent's
// Consul registration and its Envoy's node metadata.
const (
	MetaVersion  = "servemesh_version"
	MetaProtocol = "servemesh_protocol"
)

// ParseProtocol reads an announced protocol; "" is UnannouncedProtocol.
func ParseProtocol(s string) (int, error) {
	if s == "" {
		return UnannouncedProtocol, nil
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 {
		return 0, fmt.Errorf("servemesh protocol %q: want a positive integer", s)
	}
	return p, nil
}

// NodeSkew says why a node announcing protocol (and release version) may
// not run against a controller of this build, or returns "".
func NodeSkew(node string, protocol int, version string) string {
	switch {
	case protocol > Protocol:
		return fmt.Sprintf("node %s runs servemesh %s (protocol %d), newer than this controller's %s (protocol %d): a node may not be newer than its controller; upgrade the controllers first, or run the node's previous release",
			node, version, protocol, Version, Protocol)
	case protocol < MinNodeProtocol:
		return fmt.Sprintf("node %s runs servemesh %s (protocol %d), older than this controller's %s (protocol %d) serves (protocols %d to %d); upgrade the node's agent, one release at a time",
			node, version, protocol, Version, Protocol, MinNodeProtocol, Protocol)
	}
	return ""
}
