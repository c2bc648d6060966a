package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// nodeFlags describe one node's Envoy: identity, listeners, control plane.
type nodeFlags struct {
	id, public, mesh, adminSocket, xds, protocol string
	reachable, clusters                          string
	noAccessLog                                  bool
}

// defaultNode is what nodeFlags default to.
func defaultNode() nodeFlags {
	host, _ := os.Hostname()
	return nodeFlags{id: host, public: "0.0.0.0:8080", mesh: "127.0.0.1:15001",
		xds: "127.0.0.1:18000", protocol: string(bootstrap.ProtocolDelta), clusters: clustersAll}
}

func (o *nodeFlags) register(fs *pflag.FlagSet, def nodeFlags) {
	fs.StringVar(&o.id, "node-id", def.id, "this node's Envoy node id")
	fs.StringVar(&o.public, "public", def.public, "address of the public listener serving routed endpoints, or \"none\" for a mesh-only node (its replicas still reach every endpoint, and its Envoy gets no public route table)")
	fs.StringVar(&o.mesh, "mesh", def.mesh, "address of the mesh listener where replicas reach any endpoint by Host header")
	fs.StringVar(&o.adminSocket, "admin-socket", def.adminSocket, "Unix socket of Envoy's admin API (default: admin/envoy.sock in --work-dir, a folder only this user may enter)")
	fs.StringVar(&o.xds, "xds", def.xds, "address of the control plane's xDS server, or several comma-separated (HA controllers)")
	fs.StringVar(&o.protocol, "xds-protocol", def.protocol, "xDS variant: delta (a change sends the resources it changed) or sotw (state of the world: every resource of each type a change touched)")
	fs.StringVar(&o.reachable, "reachable-endpoints", "", "the only endpoints this node's replicas call, comma-separated, or \"none\" (default: every endpoint); its Envoy then holds only their routes and, without a public listener, their backends' clusters: for meshes of many nodes and endpoints")
	fs.StringVar(&o.clusters, "clusters", def.clusters, "which backends' clusters this node's Envoy holds: all, or on-demand (those of the backends it runs, and of each endpoint from the first request a route sends to it, fetched over delta xDS while the request waits; with --public none, each endpoint's routes come the same way): for nodes that call few of a large mesh's endpoints without naming them")
	fs.BoolVar(&o.noAccessLog, "no-access-log", false, "do not write Envoy's access log (a JSON line per request, access.log in the work folder)")
}

func (o *nodeFlags) bootstrap() (bootstrap.Options, error) {
	var publicHost string
	var publicPort uint32
	if o.public != noPublic {
		var err error
		if publicHost, publicPort, err = hostPort("--public", o.public); err != nil {
			return bootstrap.Options{}, fmt.Errorf("%w, or %s for a node without a public listener", err, noPublic)
		}
	}
	meshHost, meshPort, err := hostPort("--mesh", o.mesh)
	if err != nil {
		return bootstrap.Options{}, err
	}
	if o.clusters != clustersAll && o.clusters != clustersOnDemand {
		return bootstrap.Options{}, fmt.Errorf("--clusters %q: want %s or %s", o.clusters, clustersAll, clustersOnDemand)
	}
	return bootstrap.Options{
		Node: wire.ProxyNode{ID: o.id, PublicAddress: publicHost, PublicPort: publicPort, MeshAddress: meshHost, MeshPort: meshPort,
			NoAccessLog: o.noAccessLog, Reachable: reachable(o.reachable), Version: wire.Version, Protocol: wire.Protocol,
			ClustersOnDemand: o.clusters == clustersOnDemand},
		XDSAddress: o.xds, AdminSocket: o.adminSocket, Protocol: bootstrap.Protocol(o.protocol),
	}, nil
}

// reachable turns --reachable-endpoints into the node's setting: nil for
// every endpoint, none for "none", else the names sorted, each once.
func reachable(flag string) []string {
	switch flag {
	case "":
		return nil
	case "none":
		return []string{}
	}
	var out []string
	for _, e := range strings.Split(flag, ",") {
		out = append(out, strings.TrimSpace(e))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// --clusters' values.
const (
	clustersAll      = "all"
	clustersOnDemand = "on-demand"
)

// noPublic is --public's value for a node without a public listener.
const noPublic = "none"

func hostPort(flagName, addr string) (string, uint32, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: want IP:port, like 127.0.0.1:8080", flagName, addr)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: port must be a number from 1 to 65535", flagName, addr)
	}
	return host, uint32(port), nil
}

// envoyFlags add how to run Envoy to a node's flags.
type envoyFlags struct {
	node        nodeFlags
	binary      string
	workDir     string
	concurrency int
	drain       time.Duration
	upgrade     time.Duration
	logLevel    string
	tlsCert     string
	tlsKey      string
	stopOnExit  bool
	limits      bootstrap.Limits
}

func (o *envoyFlags) register(fs *pflag.FlagSet, def nodeFlags, workDir string) {
	o.node.register(fs, def)
	fs.StringVar(&o.binary, "envoy", "", "path to the Envoy binary (default: $"+envoy.EnvVar+", .tools/bin/envoy, then $PATH)")
	fs.StringVar(&o.workDir, "work-dir", workDir, "folder for the bootstrap file and Envoy's log")
	fs.IntVar(&o.concurrency, "concurrency", 0, "Envoy worker threads (default: one per core)")
	fs.DurationVar(&o.drain, "drain", 2*time.Second, "how long listeners drain on shutdown")
	fs.DurationVar(&o.upgrade, "envoy-upgrade-grace", meshspec.DefaultGracefulShutdownTimeoutS*time.Second,
		"how long an Envoy replaced by a hot restart (a new Envoy binary, bootstrap or setting) goes on serving the requests it has open, such as long answer streams; "+
			"at least the longest graceful_shutdown_timeout_s of the backends the node serves")
	fs.StringVar(&o.logLevel, "envoy-log-level", "warning", "Envoy's log level")
	fs.StringVar(&o.tlsCert, "public-tls-cert", "", "PEM certificate chain for HTTPS on the public listener (with --public-tls-key; replace the files by rename and Envoy reloads them)")
	fs.StringVar(&o.tlsKey, "public-tls-key", "", "PEM private key for HTTPS on the public listener")
	fs.Uint64Var(&o.limits.MaxConnections, "envoy-max-connections", bootstrap.DefaultMaxConnections, "connections the node's Envoy holds at once over all its listeners; past it a new one is closed at once")
	fs.Uint64Var(&o.limits.MaxHeapMB, "envoy-max-heap-mb", bootstrap.DefaultMaxHeapMB, "MiB of heap the node's Envoy may use: near it, it resets the streams buffering most, stops keep-alive and answers new requests 503")
	fs.BoolVar(&o.stopOnExit, "stop-on-exit", false, "stop the node's Envoy (and an agent's replicas) when this process stops; by default they serve on, and the next start adopts them (or hot restarts Envoy when its binary or bootstrap changed)")
}

// envoyNode returns the node's Envoy as the envoy package runs it.
func (o *envoyFlags) envoyNode(log *slog.Logger) (envoy.Launcher, error) {
	b, err := o.node.bootstrap()
	if err != nil {
		return envoy.Launcher{}, err
	}
	if err := o.limits.Check(); err != nil {
		return envoy.Launcher{}, err
	}
	if limit := meshspec.MaxGracefulShutdownTimeoutS * time.Second; o.upgrade < time.Second || o.upgrade > limit {
		return envoy.Launcher{}, fmt.Errorf("--envoy-upgrade-grace %s: must be from 1s to %s (a backend's graceful_shutdown_timeout_s may be no longer); the default is %ds",
			o.upgrade, limit, meshspec.DefaultGracefulShutdownTimeoutS)
	}
	b.Limits = o.limits
	return envoy.Launcher{Bootstrap: b, Binary: o.binary, WorkDir: o.workDir, LogLevel: o.logLevel,
		Concurrency: o.concurrency, Drain: o.drain, UpgradeGrace: o.upgrade, Logger: log.With("component", "envoy"),
		PublicCert: o.tlsCert, PublicKey: o.tlsKey, StopOnExit: o.stopOnExit, Parent: self()}, nil
}

// self is this servemesh binary, to parent the node's Envoy; empty if it
// cannot be found (the Envoy then dies with its supervisor).
func self() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	return p
}
