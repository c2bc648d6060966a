package wire

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// AgentTag marks an agent's registration of its node, an instance of the
// node's own service (NodeService), which only the node's token may write.
const AgentTag = "servemesh-agent"

// Meta keys of an agent's registration.
const (
	MetaNodeID     = "node"
	MetaCPUs       = "cpus"
	MetaMemoryMB   = "memory_mb"
	MetaStatusAddr = "status_addr"
	// MetaStatusTLS is "true" when the agent's status listener takes TLS
	// and knows the controller by its certificate (NodeInfo.StatusTLS).
	MetaStatusTLS = "status_tls"
	// MetaInbound is, with mesh mTLS, the node's inbound listener (as
	// MetaReplicaInbound is in its replicas' registrations).
	MetaInbound = MetaReplicaInbound
)

// Meta keys of a replica's registration, as an instance of its backend's
// Consul service.
const (
	// MetaReplicaTag holds the replica's tag ("<backend>#<6 hex>").
	MetaReplicaTag = "replica_tag"
	// MetaReplicaNode holds the node whose agent runs the replica.
	MetaReplicaNode = "servemesh_node"
	// MetaReplicaInbound holds, with mesh mTLS, the IP:port of the inbound
	// listener of the replica's node; the replica's own address is then on
	// that node's loopback.
	MetaReplicaInbound = "servemesh_inbound"
	// MetaReplicaRestarts holds how many times the replica's process was
	// restarted after it exited (absent: never).
	MetaReplicaRestarts = "restarts"
)

// MaxExitNote bounds what an agent says of a replica's exit in its check's
// notes: why, how often (after ExitedNote) and the end of its log. Notes,
// not the check's output: Consul agents sync a check's output at once only
// when its status changes, and an exit leaves it critical; a registration
// with new notes is synced, and wakes the controller's watch.
const MaxExitNote = 512

// ReplicaServiceTag marks the Consul service instances servemesh's agents
// register for replicas.
const ReplicaServiceTag = "servemesh"

// ReplicaReadyOutput is the output an agent gives a replica's TTL check
// with each passing beat. When the check's TTL then expires (the agent, its
// node or Consul stalled), Consul keeps it as the check's last output, and
// the controller knows the replica answered when it was last heard of.
const ReplicaReadyOutput = "servemesh: the replica answers its health check"

// NodeInfo is a node as its agent registers it: where its replicas listen,
// what it offers them, and where the agent reports.
type NodeInfo struct {
	ID string
	// Address is the IP the node's replicas listen on.
	Address  string
	CPUs     float64
	MemoryMB int
	// StatusAddr is where the agent serves /metrics, LoadPath,
	// EnvoyVersionsPath and LogsPath.
	StatusAddr string
	// StatusTLS says the status listener takes TLS with the node's
	// identity, and serves the controller (known by its certificate)
	// without a token. An agent of a release before it took the
	// controller's token over plain HTTP.
	StatusTLS bool
	// AllowedCommands are the commands the node's agent runs as replicas:
	// paths or path.Match patterns ("/opt/models/*/serve"). None: it runs
	// no command.
	AllowedCommands []string
	// Inbound is the IP:port of the node's inbound listener, with mesh
	// mTLS; "" without.
	Inbound string
	// Resources are the named devices the node offers besides CPUs and
	// memory ("gpu": 2), each counted in whole devices, indexed from 0.
	Resources map[string]int
	// Version and Protocol are the servemesh release and Protocol of its
	// agent; Protocol is UnannouncedProtocol for an agent that announced
	// none.
	Version  string
	Protocol int
}

// MetaResource prefixes the meta keys of a node's resources, one per
// resource ("resource_gpu": "2").
const MetaResource = "resource_"

// MaxResources bounds the kinds of resources a node offers, and
// MaxResourceCount how many of one.
const (
	MaxResources     = 8
	MaxResourceCount = 1024
)

var resourceName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// CheckResource says what is wrong with a resource's name and count, or
// returns nil.
func CheckResource(name string, count int) error {
	if !resourceName.MatchString(name) {
		return fmt.Errorf("resource %q: name it with 1 to 31 lowercase letters, digits and '_', starting with a letter (such as gpu)", name)
	}
	if count < 0 || count > MaxResourceCount {
		return fmt.Errorf("resource %s: %d; count it in whole devices, from 0 to %d", name, count, MaxResourceCount)
	}
	return nil
}

// ResourceEnv is the environment variable that gives a replica the indexes
// of its devices of resource name ("0,1"): SERVEMESH_<NAME>_DEVICES; a
// replica asking for gpu also gets them in CUDA_VISIBLE_DEVICES.
func ResourceEnv(name string) string { return "SERVEMESH_" + strings.ToUpper(name) + "_DEVICES" }

// MetaAllowCommand prefixes the meta keys of an agent's allowed commands,
// one pattern per key (a meta value holds at most 512 characters).
const MetaAllowCommand = "allow_command_"

// MaxAllowedCommands bounds a node's allowed command patterns (Consul
// allows 64 meta keys).
const MaxAllowedCommands = 48

// Allows reports whether the node's agent may run command: a clean
// absolute path (a '*' would match "..", so "/opt/*/bin/*" would allow
// "/opt/../bin/sh") that an allowed pattern matches. The agent also checks
// where the path's symlinks lead (agent.mayRun).
func (n NodeInfo) Allows(command string) bool {
	if !strings.HasPrefix(command, "/") || path.Clean(command) != command {
		return false
	}
	for _, pattern := range n.AllowedCommands {
		if ok, err := path.Match(pattern, command); err == nil && ok {
			return true
		}
	}
	return false
}

// AgentServiceID is the Consul service id of node's agent registration.
func AgentServiceID(node string) string { return AgentTag + "-" + node }

// ReplicaServiceID is a replica's Consul service id; '#' is not URL-safe.
func ReplicaServiceID(tag string) string { return strings.ReplaceAll(tag, "#", "-") }

// Meta encodes the node for its agent's Consul registration.
func (n NodeInfo) Meta() map[string]string {
	m := map[string]string{
		MetaNodeID:     n.ID,
		MetaCPUs:       strconv.FormatFloat(n.CPUs, 'g', -1, 64),
		MetaMemoryMB:   strconv.Itoa(n.MemoryMB),
		MetaStatusAddr: n.StatusAddr,
	}
	if n.Protocol != 0 {
		m[MetaVersion], m[MetaProtocol] = n.Version, strconv.Itoa(n.Protocol)
	}
	if n.Inbound != "" {
		m[MetaInbound] = n.Inbound
	}
	if n.StatusTLS {
		m[MetaStatusTLS] = "true"
	}
	for i, p := range n.AllowedCommands {
		m[fmt.Sprintf("%s%02d", MetaAllowCommand, i)] = p
	}
	for name, count := range n.Resources {
		m[MetaResource+name] = strconv.Itoa(count)
	}
	return m
}

// CheckAllowedCommands says what is wrong with a list of allowed command
// patterns, or returns nil.
func CheckAllowedCommands(patterns []string) error {
	if len(patterns) > MaxAllowedCommands {
		return fmt.Errorf("%d allowed commands; at most %d: use patterns such as /opt/models/*/serve", len(patterns), MaxAllowedCommands)
	}
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || !strings.HasPrefix(p, "/") || len(p) > 500 {
			return fmt.Errorf("allowed command %.80q: want an absolute path or path.Match pattern of at most 500 characters", p)
		}
	}
	return nil
}

// NodeInfoFromMeta decodes an agent's registration; address is the
// registration's service address.
func NodeInfoFromMeta(address string, meta map[string]string) (NodeInfo, error) {
	n := NodeInfo{ID: meta[MetaNodeID], Address: address, StatusAddr: meta[MetaStatusAddr], StatusTLS: meta[MetaStatusTLS] == "true",
		Inbound: meta[MetaInbound], Version: meta[MetaVersion]}
	if n.ID == "" {
		return NodeInfo{}, fmt.Errorf("agent registration has no %q meta", MetaNodeID)
	}
	if err := CheckNodeID(n.ID); err != nil { // what no agent may register as
		return NodeInfo{}, fmt.Errorf("agent registration: %w", err)
	}
	var err error
	if n.Protocol, err = ParseProtocol(meta[MetaProtocol]); err != nil {
		return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, MetaProtocol, err)
	}
	if n.CPUs, err = strconv.ParseFloat(meta[MetaCPUs], 64); err != nil {
		return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, MetaCPUs, err)
	}
	if n.MemoryMB, err = strconv.Atoi(meta[MetaMemoryMB]); err != nil {
		return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, MetaMemoryMB, err)
	}
	for k, v := range meta {
		if strings.HasPrefix(k, MetaAllowCommand) {
			n.AllowedCommands = append(n.AllowedCommands, v)
		}
		if name, ok := strings.CutPrefix(k, MetaResource); ok {
			count, err := strconv.Atoi(v)
			if err == nil {
				err = CheckResource(name, count)
			}
			if err != nil {
				return NodeInfo{}, fmt.Errorf("node %q: meta %q: %w", n.ID, k, err)
			}
			if n.Resources == nil {
				n.Resources = map[string]int{}
			}
			n.Resources[name] = count
		}
	}
	sort.Strings(n.AllowedCommands)
	return n, nil
}
