package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// AgentService is the Consul service every agent registers its node under.
const AgentService = "servemesh-agent"

// Meta keys of an agent's registration.
const (
	MetaNodeID     = "node"
	MetaCPUs       = "cpus"
	MetaMemoryMB   = "memory_mb"
	MetaStatusAddr = "status_addr"
)

// Meta keys of a replica's registration, as an instance of its backend's
// Consul service.
const (
	// MetaReplicaTag holds the replica's tag ("<backend>#<6 hex>").
	MetaReplicaTag = "replica_tag"
	// MetaReplicaNode holds the node whose agent runs the replica.
	MetaReplicaNode = "servemesh_node"
)

// ReplicaServiceTag marks the Consul service instances servemesh's agents
// register for replicas.
const ReplicaServiceTag = "servemesh"

// NodeInfo is a node as its agent registers it: where its replicas listen,
// what it offers them, and where the agent reports.
type NodeInfo struct {
	ID string
	// Address is the IP the node's replicas listen on.
	Address  string
	CPUs     float64
	MemoryMB int
	// StatusAddr is where the agent serves /metrics, LoadPath and
	// EnvoyVersionsPath.
	StatusAddr string
}

// AgentServiceID is the Consul service id of node's agent registration.
func AgentServiceID(node string) string { return AgentService + "-" + node }

// ReplicaServiceID is a replica's Consul service id; '#' is not URL-safe.
func ReplicaServiceID(tag string) string { return strings.ReplaceAll(tag, "#", "-") }

// Meta encodes the node for its agent's Consul registration.
func (n NodeInfo) Meta() map[string]string {
	return map[string]string{
		MetaNodeID:     n.ID,
		MetaCPUs:       strconv.FormatFloat(n.CPUs, 'g', -1, 64),
		MetaMemoryMB:   strconv.Itoa(n.MemoryMB),
		MetaStatusAddr: n.StatusAddr,
	}
}

// NodeInfoFromMeta decodes an agent's registration; address is the
// registration's service address.
func NodeInfoFromMeta(address string, meta map[string]string) (NodeInfo, error) {
	n := NodeInfo{ID: meta[MetaNodeID], Address: address, StatusAddr: meta[MetaStatusAddr]}
	if n.ID == "" {
		return NodeInfo{}, fmt.Errorf("agent registration has no %q meta", MetaNodeID)
	}
	var err error
	if n.CPUs, err = strconv.ParseFloat(meta[MetaCPUs], 64); err != nil {
		return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, MetaCPUs, err)
	}
	if n.MemoryMB, err = strconv.Atoi(meta[MetaMemoryMB]); err != nil {
		return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, MetaMemoryMB, err)
	}
	return n, nil
}
