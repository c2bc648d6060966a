package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/agent"
	"github.com/servemesh/servemesh/agent/activator"
	"github.com/servemesh/servemesh/agent/genai"
	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker"
	"github.com/servemesh/servemesh/agent/ratelimit"
	"github.com/servemesh/servemesh/agent/secrets"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/leader"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/internal/tracing"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// AgentOptions configure `servemesh agent`. Consul is reached through
// CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN.
type AgentOptions struct {
	// Node is the node's address and capacity; its ID names the node, and
	// its status address is filled in from StatusListen.
	Node wire.NodeInfo
	// Envoy is how to run the node's Envoy; NoEnvoy runs none.
	Envoy        envoy.Launcher
	NoEnvoy      bool
	ConsulPrefix string
	DrainGrace   time.Duration
	// StatusListen is the agent's status listener (port 0 picks one).
	StatusListen string
	// RunAs is the user replicas run as; see agent.Options.
	RunAs string
	// ReplicaUIDs is the range each backend's replicas get a user from;
	// see agent.Options.
	ReplicaUIDs agent.UIDRange
	// StatusToken, if set, is the bearer token the status listener asks
	// for; beyond loopback it must be set unless Insecure.
	StatusToken string
	Insecure    bool
	// Plaintext runs the node without mTLS, for a single trusted host:
	// xDS in plaintext, replicas listening on the node's address and called
	// directly. Otherwise the node's Envoy reaches the controller and other
	// nodes with the node's Consul Connect identity (service
	// servemesh-node-<id>), receives other nodes' calls on Inbound, and
	// replicas listen on loopback.
	Plaintext bool
	// InsecureConsul skips, with mTLS, the check that Consul enforces ACLs.
	InsecureConsul bool
	// Inbound is the IP:port of the node's inbound listener (mTLS).
	Inbound string
	// RateLimit, if its Redis is set, runs the node's rate limit service
	// for the endpoints' global limits.
	RateLimit RateLimitOptions
}

// RateLimitOptions configure a node's rate limit service
// (agent/ratelimit).
type RateLimitOptions struct {
	// Redis is the store every node's service shares (host:port); none:
	// the node runs no service, and its global limits' failure modes hold.
	Redis string
	// Password is Redis's AUTH password, if any.
	Password string
	// Binary is the service's binary (default: ratelimit.Find's).
	Binary string
}

// RunAgent runs a node's agent and, unless NoEnvoy, its Envoy, until ctx
// ends or either fails.
func RunAgent(ctx context.Context, log *slog.Logger, o AgentOptions) error {
	if err := proc.CheckDistinct(agentListeners(o)); err != nil {
		return err
	}
	client, closeConsul, err := consulClient()
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	defer closeConsul()
	o.Node.Version, o.Node.Protocol = wire.Version, wire.Protocol
	if err := checkControllerSkew(ctx, log, client, o.ConsulPrefix); err != nil {
		return err
	}
	reg := httpserver.NewRegistry()
	admin := envoy.Admin{Socket: o.Envoy.AdminSocket()}
	// The node's parts built before the agent read the desired state it
	// reads through views, and the status listener what it keeps of its
	// replicas through replicas.
	views, replicas := &nodeview.Latest{}, &agent.ReplicaState{}
	limits, err := rateLimitService(log, o, views.Model)
	if err != nil {
		return err
	}
	if !o.NoEnvoy {
		agent.RegisterLoadMetrics(reg, admin, o.Node.ID, rateLimitsOf(limits))
	}
	if o.StatusToken == "" && !httpserver.IsLoopback(o.StatusListen) {
		if !o.Insecure {
			return fmt.Errorf("refusing to serve the agent's status listener on %s without a token: give --status-token-file (and the controller --agent-token-file), or --insecure", o.StatusListen)
		}
		log.Warn("INSECURE: the agent's status listener is beyond loopback without a token", "listen", o.StatusListen)
	}
	// The picker's and activator's spans go to the mesh's collector.
	tracer := tracing.New(wire.AgentTraceService(o.Node.ID), func() *meshspec.Tracing { return meshTracing(views.Model()) },
		log.With("component", "tracing"))
	defer shutdownTracer(tracer, log)
	// The activator holds requests for backends with no ready replica.
	hold := activator.New(activator.Options{Admin: admin, Node: o.Node.ID, Logger: log.With("component", "activator"), Registerer: reg,
		Desired: views.View, Tracer: tracer})
	// The picker picks the node's replicas of load-aware backends.
	pick := picker.New(views.View)
	checkpoint := filepath.Join(o.Envoy.WorkDir, picker.CheckpointFile)
	if err := pick.Restore(checkpoint); err != nil {
		log.Warn("the picker starts without what it learned before the agent restarted", "err", err)
	}
	// The node's GenAI signals: what its Envoy read of model answers.
	signals := genai.New(log.With("component", "genai"), reg)
	identity := &nodeIdentity{}
	status, err := listenStatus(ctx, o, identity, agent.StatusHandler(reg, admin, o.Node.ID, agent.LoadExtras{
		Held:       hold.Held,
		Waiting:    pick.Waiting,
		RateLimits: rateLimitsOf(limits),
		Replicas:   replicas,
		Tracing:    tracer.Problem,
		GenAI:      signals.Loads,
		Shadowed:   signals.Shadowed,
	}, statusLogs(o)))
	if err != nil {
		return fmt.Errorf("agent status listener: %w", err)
	}
	o.Node.StatusAddr, o.Node.StatusTLS = status.Addr(), !o.Plaintext
	// Every component runs in one group: the first to stop stops the
	// others, and RunAgent returns when all have. The agent and the Envoy's
	// supervisor each leave their part of the data plane serving (or, with
	// --stop-on-exit, stop it) before they return.
	g, gctx := rungroup.New(ctx)
	g.Go("status listener", status.Serve)
	log.Info("agent status listener serving", "status", status.Addr(), "paths", "/metrics "+wire.LoadPath+" "+wire.EnvoyVersionsPath+" "+wire.LogsPath)
	identities, err := nodeMTLS(gctx, log, client, &o)
	if err == nil && identities != nil {
		err = identity.follow(gctx, g, log, client, o.Node.ID)
	}
	if err != nil {
		return stopWith(g, err)
	}
	ao := agent.Options{
		Node: o.Node, Consul: client, Store: store.NewConsul(client, o.ConsulPrefix, log.With("component", "store")), Logger: log.With("component", "agent"),
		WorkDir: replicasDir(o.Envoy), Registerer: reg, DrainGrace: o.DrainGrace, RunAs: o.RunAs, ReplicaUIDs: o.ReplicaUIDs, Secrets: identities,
		StopOnExit: o.Envoy.StopOnExit,
	}
	if identities != nil {
		ao.Inbound = o.Inbound
		g.Go("secrets", func(ctx context.Context) error { <-ctx.Done(); identities.Wait(); return nil })
	}
	ao.Picker, ao.Views, ao.State = pick, views, replicas
	if !o.NoEnvoy {
		ao.MeshListener = meshListener(o.Envoy.Bootstrap.Node)
		ao.InFlight = agent.EnvoyRequestsInFlight(admin)
	}
	a, err := agent.New(ao)
	if err != nil {
		return stopWith(g, err)
	}
	g.Go("agent", a.Run)
	if !o.NoEnvoy {
		sup, err := o.Envoy.Supervise(gctx)
		if err != nil {
			return stopWith(g, err)
		}
		g.Go("envoy", sup.Run)
		g.Go("activator", func(ctx context.Context) error { return hold.Serve(ctx, o.Envoy.WorkDir) })
		pickerServer := picker.NewServer(pick, log.With("component", "picker"), reg, tracer)
		g.Go("picker", func(ctx context.Context) error { return pickerServer.Serve(ctx, o.Envoy.WorkDir) })
		g.Go("genai", func(ctx context.Context) error { return signals.Serve(ctx, o.Envoy.WorkDir) })
		g.Go("picker scrape", func(ctx context.Context) error { pick.Scrape(ctx); return nil })
		g.Go("picker checkpoint", func(ctx context.Context) error {
			pick.KeepCheckpoint(ctx, checkpoint, log.With("component", "picker"))
			return nil
		})
		if limits != nil {
			g.Go("rate limit service", limits.Run)
		}
		if !o.Envoy.Bootstrap.Node.NoAccessLog {
			accessLog := filepath.Join(o.Envoy.WorkDir, wire.AccessLogFile)
			log.Info("the node's access log: a JSON line per request", "path", accessLog)
			g.Go("access log rotation", func(ctx context.Context) error {
				envoy.RotateAccessLog(ctx, log, accessLog, admin, envoy.AccessLogMaxBytes, 10*time.Second)
				return nil
			})
		}
	}
	err = g.Wait()
	logStopped(log, "agent", err)
	return err
}

// meshTracing is the mesh's tracing in m (nil: none).
func meshTracing(m *meshspec.Model) *meshspec.Tracing {
	if m == nil || m.Mesh == nil {
		return nil
	}
	return m.Mesh.Tracing
}

// shutdownTracer sends the spans a daemon's tracer has not sent yet,
// within a few seconds.
func shutdownTracer(t *tracing.Tracer, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans not sent at exit", "err", err)
	}
}

// rateLimitService is the node's rate limit service, nil if it runs none
// (no Redis, or no Envoy to ask it).
func rateLimitService(log *slog.Logger, o AgentOptions, desired func() *meshspec.Model) (*ratelimit.Service, error) {
	if o.RateLimit.Redis == "" || o.NoEnvoy {
		return nil, nil
	}
	bin, err := ratelimit.Find(o.RateLimit.Binary)
	if err != nil {
		return nil, fmt.Errorf("rate limit service (--rate-limit-redis is set): %w", err)
	}
	return ratelimit.New(ratelimit.Options{Binary: bin, Redis: o.RateLimit.Redis, Password: o.RateLimit.Password,
		Dir: o.Envoy.WorkDir, Desired: desired,
		Logger: log.With("component", "ratelimit"), StopOnExit: o.Envoy.StopOnExit})
}

// rateLimitsOf reads what s does; nil if no service runs.
func rateLimitsOf(s *ratelimit.Service) agent.RateLimitReader {
	if s == nil {
		return nil
	}
	return func(ctx context.Context) (map[string]uint64, map[string]string, error) {
		r, err := s.Report(ctx)
		return r.OverLimit, r.Loaded, err
	}
}

// stopWith stops a daemon's group whose start failed with err: what it
// already runs stops and is waited for, and err is returned.
func stopWith(g *rungroup.Group, err error) error {
	g.Go("start", func(context.Context) error { return err })
	_ = g.Wait()
	return err
}

// checkControllerSkew refuses to run this agent against a leading
// controller of an older protocol (the skew policy: an agent is never
// newer than its controller). The node's Envoy and replicas, left by the
// previous agent, serve on meanwhile. With no leader, or Consul not
// answering, it cannot tell, and lets the agent start.
func checkControllerSkew(ctx context.Context, log *slog.Logger, client *consulapi.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	holder, ok, err := leader.Current(ctx, client, strings.Trim(prefix, "/")+"/leader")
	if err != nil || !ok {
		log.Info("no leading controller to check this agent's version against", "version", wire.Version, "protocol", wire.Protocol, "err", err)
		return nil
	}
	protocol := holder.Protocol
	if protocol == 0 {
		protocol = wire.UnannouncedProtocol
	}
	if protocol < wire.Protocol {
		return fmt.Errorf("the leading controller %s runs servemesh %s (protocol %d), older than this agent's %s (protocol %d): an agent may not be newer than its controller; upgrade the controllers first (docs/upgrading.md), or run the previous agent; the node's Envoy and replicas serve on meanwhile",
			holder.ID, orUnknown(holder.Version), protocol, wire.Version, wire.Protocol)
	}
	log.Info("agent version", "version", wire.Version, "protocol", wire.Protocol, "controller", holder.ID, "controller_version", holder.Version, "controller_protocol", protocol)
	return nil
}

func orUnknown(v string) string {
	if v == "" {
		return "of a release that announced none"
	}
	return v
}

// replicasDir is where a node's agent keeps its replicas' folders, logs
// and records: in the node's work folder.
func replicasDir(n envoy.Launcher) string { return filepath.Join(n.WorkDir, "replicas") }

// StopNode stops what a node's agent left running (servemesh agent
// --stop-all): its Envoy, drained for grace, and its replicas, given grace
// after SIGTERM (0: killed at once), and deregisters them and the node
// from the local Consul agent.
func StopNode(ctx context.Context, log *slog.Logger, o AgentOptions, grace time.Duration) error {
	client, closeConsul, err := consulClient()
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	defer closeConsul()
	pid, err := o.Envoy.StopLeft(ctx, grace, log)
	if err != nil {
		return err
	}
	if pid != 0 {
		log.Info("the node's envoy stopped", "pid", pid)
	}
	if pid, err := ratelimit.StopLeft(o.Envoy.WorkDir, grace); err != nil {
		return err
	} else if pid != 0 {
		log.Info("the node's rate limit service stopped", "pid", pid)
	}
	deregister, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stopped, err := agent.StopLeft(deregister, client, o.Node.ID, replicasDir(o.Envoy), grace)
	if err != nil {
		return err
	}
	log.Info("the node's replicas stopped", "pids", stopped)
	return nil
}

// logStopped says that a daemon stopped, and why.
func logStopped(log *slog.Logger, what string, err error) {
	if err != nil {
		log.Error(what+" stopped", "err", err)
		return
	}
	log.Info(what + " stopped")
}

// nodeMTLS, unless the node runs in plaintext, starts keeping the node's
// identities in its secrets folder and points its Envoy at them: xDS over
// TLS, and the inbound listener. It returns the secrets (nil in plaintext).
func nodeMTLS(ctx context.Context, log *slog.Logger, client *consulapi.Client, o *AgentOptions) (*secrets.Files, error) {
	if o.Plaintext {
		log.Warn("PLAINTEXT: xDS and calls between nodes are neither encrypted nor authenticated, and replicas listen on the node's address; "+
			"use this on a single trusted host only", "address", o.Node.Address)
		return nil, nil
	}
	if err := checkConsulACLs(ctx, log, o.InsecureConsul); err != nil {
		return nil, err
	}
	inbound, err := netip.ParseAddrPort(o.Inbound)
	if err != nil || inbound.Port() == 0 {
		return nil, fmt.Errorf("--inbound %q: want the IP:port of the node's inbound listener, like 10.0.0.7:21000", o.Inbound)
	}
	// Envoy runs in its work folder and finds them at wire.SecretsDir.
	dir, err := filepath.Abs(filepath.Join(o.Envoy.WorkDir, wire.SecretsDir))
	if err != nil {
		return nil, fmt.Errorf("secrets folder: %w", err)
	}
	files := secrets.New(dir, client, o.Node.ID, log.With("component", "secrets"))
	if err := files.Start(ctx); err != nil {
		return nil, fmt.Errorf("the node's identity from Consul's service-mesh CA (is Connect on? or run with --plaintext on a single trusted host): %w", err)
	}
	n := &o.Envoy.Bootstrap.Node
	n.InboundAddress, n.InboundPort = inbound.Addr().String(), uint32(inbound.Port())
	o.Envoy.Bootstrap.XDSTLS = &bootstrap.XDSTLS{Secrets: dir, ServerSAN: files.IdentityPrefix() + connect.ControllerService}
	log.Info("mTLS: the node is known by its Consul Connect identity; replicas listen on loopback", "identity", wire.NodeService(o.Node.ID),
		"inbound", o.Inbound, "secrets", dir)
	return files, nil
}

// agentListeners are the addresses the agent and its node's Envoy will
// listen on, each named by its flag.
func agentListeners(o AgentOptions) []proc.Listener {
	ls := []proc.Listener{{What: "--metrics-listen", Addr: o.StatusListen}}
	if o.NoEnvoy {
		return ls
	}
	n := o.Envoy.Bootstrap.Node
	if n.PublicPort != 0 {
		ls = append(ls, proc.Listener{What: "--public", Addr: net.JoinHostPort(n.PublicAddress, strconv.Itoa(int(n.PublicPort)))})
	}
	ls = append(ls, proc.Listener{What: "--mesh", Addr: net.JoinHostPort(n.MeshAddress, strconv.Itoa(int(n.MeshPort)))})
	if !o.Plaintext {
		ls = append(ls, proc.Listener{What: "--inbound", Addr: o.Inbound})
	}
	return ls
}

// RunEnvoy supervises one node's Envoy, and serves its activator, until
// ctx ends or either fails.
func RunEnvoy(ctx context.Context, log *slog.Logger, n envoy.Launcher) error {
	sup, err := n.Supervise(ctx)
	if err != nil {
		return err
	}
	// With no agent, no desired state: the activator holds every backend's
	// requests within the default bounds.
	hold := activator.New(activator.Options{Admin: envoy.Admin{Socket: n.AdminSocket()}, Node: n.Bootstrap.Node.ID,
		Logger: log.With("component", "activator")})
	g, _ := rungroup.New(ctx)
	g.Go("envoy", sup.Run) // the Envoy is left serving, or stopped, before Wait returns
	g.Go("activator", func(ctx context.Context) error { return hold.Serve(ctx, n.WorkDir) })
	return g.Wait()
}

// meshListener is where a node's replicas call its mesh listener: its
// address, or loopback when it listens on every address; "" when the node
// has none.
func meshListener(n wire.ProxyNode) string {
	if n.MeshPort == 0 {
		return ""
	}
	host := n.MeshAddress
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip.Is6() {
			host = "::1"
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(int(n.MeshPort)))
}

// statusLogs serves the node's logs on its status listener: with mTLS,
// to the controller alone (statusAccess); in plaintext, only behind a
// status token, never to whoever reaches a tokenless loopback listener.
func statusLogs(o AgentOptions) http.Handler {
	if o.Plaintext && o.StatusToken == "" {
		return agent.LogsRefused()
	}
	return agent.LogsHandler(replicasDir(o.Envoy), filepath.Join(o.Envoy.WorkDir, envoy.LogFile))
}
