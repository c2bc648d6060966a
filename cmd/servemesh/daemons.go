package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/agent"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/daemon"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// faultEnv names the environment variable that sets the probability of
// exiting right after a checkpoint (fault injection for tests).
const faultEnv = "SERVEMESH_FAULT_CRASH_AFTER_CHECKPOINT"

func newControllerCommand(log *slog.Logger) *cobra.Command {
	var o daemon.ControllerOptions
	var tokenFile, writeTokenFile, readTokenFile, agentTokenFile string
	var allowCIDRs, allowNames []string
	c := &cobra.Command{
		Use:   "controller",
		Short: "run the controller: state in Consul, the /v1/ API, xDS; several elect a leader",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := controllerDefaults(&o, cmd.Flags().Changed("fault-crash-after-checkpoint")); err != nil {
				return err
			}
			cidrs, err := meshspec.ParseCIDRs(allowCIDRs)
			if err != nil {
				return err
			}
			o.Addresses.Allow = cidrs
			if o.Addresses.Names, err = meshspec.ParseNames(allowNames); err != nil {
				return err
			}
			o.Tokens = api.Tokens{}
			for _, f := range []struct {
				path  string
				scope api.Scope
			}{{tokenFile, api.ScopeExec}, {writeTokenFile, api.ScopeWrite}, {readTokenFile, api.ScopeRead}} {
				if err := o.Tokens.Add(f.path, f.scope); err != nil {
					return err
				}
			}
			token, err := api.ReadTokenFile(agentTokenFile)
			if err != nil {
				return err
			}
			o.AgentToken = token
			return daemon.RunController(cmd.Context(), log.With("cmd", "controller"), o)
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.APIListen, "api-listen", "127.0.0.1:18001", "address of the HTTP API (/v1/), /metrics and /healthz; beyond loopback it needs a token (--token-file)")
	fs.StringVar(&o.XDSListen, "xds-listen", "127.0.0.1:18000", "address of the xDS gRPC server Envoy nodes connect to")
	fs.StringVar(&o.Advertise, "advertise", "", "API address other controllers hand to clients when this one leads (default: --api-listen)")
	fs.StringVar(&o.ConsulPrefix, "consul-prefix", "servemesh", "Consul KV prefix of the stored state; Consul is reached through CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN")
	fs.StringVar(&o.ID, "id", "", "this controller's id among controllers (default: host name and API port)")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the bearer token with every scope (read, write, and exec: changes that run commands on nodes)")
	fs.StringVar(&writeTokenFile, "write-token-file", "", "file holding a bearer token for reads and changes that run no command")
	fs.StringVar(&readTokenFile, "read-token-file", "", "file holding a bearer token for reads only (state, status, /metrics, /v1/xds/nodes)")
	fs.BoolVar(&o.Insecure, "insecure", false, "allow an API beyond loopback without a token (anyone who reaches it can run commands on every node)")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "run the mesh without mTLS, on a single trusted host only (default: xDS over TLS and calls between nodes over mTLS, with identities from Consul's service-mesh CA)")
	fs.BoolVar(&o.InsecureConsul, "insecure-consul", false, "with mTLS, start even if Consul accepts writes without a token (ACLs off or default allow): then any process that reaches Consul can mint identities; for a single trusted host")
	fs.StringVar(&o.APITLSCert, "api-tls-cert", "", "PEM certificate chain the API serves HTTPS with (with --api-tls-key; replace the files by rename and it is reloaded)")
	fs.StringVar(&o.APITLSKey, "api-tls-key", "", "PEM private key of --api-tls-cert")
	fs.BoolVar(&o.DebugProfiles, "debug-profiles", false, "serve Go's runtime profiles at /debug/pprof/ on the API listener, to tokens with the exec scope (go tool pprof http://<api>/debug/pprof/heap)")
	fs.StringVar(&agentTokenFile, "agent-token-file", "", "file holding the token of agents' status listeners (their --status-token-file), sent only to an agent that does not take TLS (a previous release's, or one in plaintext): the others are called over mTLS")
	fs.Float64Var(&o.CrashAfterCheckpoint, "fault-crash-after-checkpoint", 0, "fault injection: probability of exiting right after a checkpoint (also $"+faultEnv+")")
	fs.DurationVar(&o.DrainGrace, "drain-grace", 5*time.Second, "how long a draining replica serves at least, while the nodes stop sending it requests; its agent then stops it once its requests in flight have ended, or at its backend's graceful_shutdown_timeout_s")
	fs.DurationVar(&o.ReplaceAfter, "replace-after", 30*time.Second, "how long a node may be gone before its replicas are placed elsewhere")
	fs.StringSliceVar(&allowCIDRs, "allow-replica-cidr", nil, "a range (CIDR, repeatable) that static replicas and external instances may name although it is on the node: loopback, link-local, cloud metadata, unspecified and multicast addresses are refused otherwise (Envoy's admin, Consul and the metadata service listen there)")
	fs.StringSliceVar(&allowNames, "allow-replica-name", nil, "a DNS name, or a suffix starting with a dot (repeatable), that static replicas and external instances may use instead of an IP address; the controller resolves it and checks each address as if given directly (names are refused otherwise)")
	return c
}

// xdsCacheEnv names the environment variable that turns translation's
// reuse off: on (the default) or off.
const xdsCacheEnv = "SERVEMESH_XDS_CACHE"

// xdsCacheOff reads $SERVEMESH_XDS_CACHE.
func xdsCacheOff() (bool, error) {
	switch v := os.Getenv(xdsCacheEnv); v {
	case "", "on":
		return false, nil
	case "off":
		return true, nil
	default:
		return false, fmt.Errorf("$%s=%q: set on (the default) or off (each change is translated whole, reusing nothing; for a suspected cache fault)", xdsCacheEnv, v)
	}
}

// controllerDefaults fills what defaults to other flags or the environment.
func controllerDefaults(o *daemon.ControllerOptions, crashFlagSet bool) error {
	off, err := xdsCacheOff()
	if err != nil {
		return err
	}
	o.XDSCacheOff = off
	if v := os.Getenv(faultEnv); v != "" && !crashFlagSet {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("$%s=%q: want a probability between 0 and 1", faultEnv, v)
		}
		o.CrashAfterCheckpoint = p
	}
	if o.CrashAfterCheckpoint < 0 || o.CrashAfterCheckpoint > 1 {
		return fmt.Errorf("--fault-crash-after-checkpoint %v: want a probability between 0 and 1", o.CrashAfterCheckpoint)
	}
	if o.Advertise == "" {
		o.Advertise = o.APIListen
	}
	if o.APITLSCert != "" && !strings.Contains(o.Advertise, "://") {
		o.Advertise = "https://" + o.Advertise // clients given https:// addresses know it
	}
	if o.ID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(o.APIListen)
		o.ID = host + "-" + port
	}
	return nil
}

func newAgentCommand(log *slog.Logger) *cobra.Command {
	var o daemon.AgentOptions
	var ef envoyFlags
	var statusTokenFile, replicaUIDs, redisPasswordFile string
	var resources []string
	var stopAll bool
	var stopGrace time.Duration
	c := &cobra.Command{
		Use:   "agent",
		Short: "run a node's agent: the replicas placed on it, their Consul registration, its Envoy",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("work-dir") {
				ef.workDir = ".run/agent-" + ef.node.id
			}
			if !cmd.Flags().Changed("cpus") {
				o.Node.CPUs = float64(runtime.NumCPU())
			}
			if !cmd.Flags().Changed("memory-mb") {
				o.Node.MemoryMB = agent.MemoryMB()
			}
			n, err := ef.envoyNode(log)
			if err != nil {
				return err
			}
			token, err := api.ReadTokenFile(statusTokenFile)
			if err != nil {
				return err
			}
			o.StatusToken = token
			if o.RateLimit.Password, err = api.ReadTokenFile(redisPasswordFile); err != nil {
				return fmt.Errorf("--rate-limit-redis-password-file: %w", err)
			}
			if replicaUIDs != "" {
				if o.ReplicaUIDs, err = agent.ParseUIDRange(replicaUIDs); err != nil {
					return err
				}
			}
			if err := wire.CheckAllowedCommands(o.Node.AllowedCommands); err != nil {
				return fmt.Errorf("--allow-command: %w", err)
			}
			if o.Node.Resources, err = parseResources(resources); err != nil {
				return err
			}
			o.Envoy, o.Node.ID = n, ef.node.id
			if stopAll {
				return daemon.StopNode(cmd.Context(), log.With("cmd", "agent"), o, stopGrace)
			}
			if o.Inbound == "" {
				o.Inbound = net.JoinHostPort(o.Node.Address, "21000")
			}
			return daemon.RunAgent(cmd.Context(), log.With("cmd", "agent"), o)
		},
	}
	fs := c.Flags()
	ef.register(fs, defaultNode(), ".run/envoy")
	fs.StringVar(&o.Node.Address, "address", "127.0.0.1", "the IP address this node's replicas listen on")
	fs.Float64Var(&o.Node.CPUs, "cpus", 0, "CPUs this node offers to replicas (default: this machine's)")
	fs.IntVar(&o.Node.MemoryMB, "memory-mb", 0, "MiB of memory this node offers to replicas (default: this machine's)")
	fs.StringArrayVar(&resources, "resource", nil, "a named resource this node offers, as NAME=COUNT (gpu=2: devices 0 and 1, one replica each, in CUDA_VISIBLE_DEVICES); repeat for each")
	fs.StringVar(&o.ConsulPrefix, "consul-prefix", "servemesh", "Consul KV prefix of the controller's state; Consul is reached through CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN")
	fs.DurationVar(&o.DrainGrace, "drain-grace", 5*time.Second, "how long a draining replica serves at least, while the nodes stop sending it requests (keep it equal to the controller's); then it is stopped once its requests in flight have ended, or at its backend's graceful_shutdown_timeout_s")
	fs.BoolVar(&o.NoEnvoy, "no-envoy", false, "do not run this node's Envoy")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "run the node without mTLS, on a single trusted host only, as the controller (default: its identity from Consul's service-mesh CA for xDS and calls between nodes; replicas on loopback)")
	fs.StringVar(&o.Inbound, "inbound", "", "address of the node's inbound listener, where other nodes call its replicas over mTLS (default: --address, port 21000)")
	fs.StringVar(&statusTokenFile, "status-token-file", "", "file holding the bearer token the status listener asks of all but the controller: with mTLS it reads the metrics and the load, never a log (the controller is known by its certificate); in plaintext everything; needed beyond loopback")
	fs.BoolVar(&o.Insecure, "insecure", false, "allow the status listener beyond loopback without a token")
	fs.BoolVar(&o.InsecureConsul, "insecure-consul", false, "with mTLS, start even if Consul accepts writes without a token (ACLs off or default allow): then any process that reaches Consul can mint identities; for a single trusted host")
	fs.StringVar(&o.RunAs, "run-as", "", "one user every replica runs as (default: this user; as root, a user per backend from --replica-uids)")
	fs.StringVar(&replicaUIDs, "replica-uids", "", "a range of user ids, FIRST-LAST, each backend's replicas run as one of (and its group), so backends cannot read each other's processes or files; needs root (default as root: "+agent.DefaultUIDs.String()+")")
	fs.StringArrayVar(&o.Node.AllowedCommands, "allow-command", nil, "a command this node runs as replicas: an absolute path or a pattern such as /opt/models/*/serve (repeat; none: it runs no command)")
	fs.BoolVar(&stopAll, "stop-all", false, "stop what this node's agent left running (its Envoy, drained, and its replicas), deregister them and exit: for a node that is being removed; the agent must be stopped first")
	fs.DurationVar(&stopGrace, "stop-grace", 5*time.Second, "with --stop-all, how long the Envoy drains and the replicas have after SIGTERM; 0 kills them at once")
	fs.StringVar(&o.RateLimit.Redis, "rate-limit-redis", "", "host:port of the Redis every node's rate limit service shares: the node then runs one (envoyproxy/ratelimit) for the endpoints' global limits (default: none, and a global limit's failure mode holds on this node)")
	fs.StringVar(&redisPasswordFile, "rate-limit-redis-password-file", "", "file holding that Redis's AUTH password (given to the rate limit service alone)")
	fs.StringVar(&o.RateLimit.Binary, "rate-limit-service", "", "the rate limit service's binary (default: $SERVEMESH_RATELIMIT, else ratelimit in .tools/bin or on $PATH)")
	fs.StringVar(&o.StatusListen, "metrics-listen", "127.0.0.1:0", "address of the agent's /metrics, "+wire.LoadPath+" (read by the controller) and "+wire.EnvoyVersionsPath+"; port 0 picks one")
	return c
}

func newServeCommand(log *slog.Logger) *cobra.Command {
	var o daemon.FilePlaneOptions
	c := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "run a control plane that serves a config file to Envoy nodes (no Consul needed)",
		Args:  names(0, "no arguments besides --config FILE"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.XDSCacheOff, err = xdsCacheOff(); err != nil {
				return err
			}
			return daemon.ServeFile(cmd.Context(), log.With("cmd", "serve"), o)
		},
	}
	registerFilePlane(c, &o, "")
	return c
}

func registerFilePlane(c *cobra.Command, o *daemon.FilePlaneOptions, config string) {
	fs := c.Flags()
	fs.StringVar(&o.ConfigPath, "config", config, "the mesh config file (YAML); changes are applied when it is saved")
	fs.StringVar(&o.XDSListen, "xds-listen", "127.0.0.1:18000", "address of the xDS gRPC server Envoy nodes connect to")
	fs.StringVar(&o.HTTPListen, "http-listen", "127.0.0.1:18001", "address of the HTTP server for /metrics, /healthz and /v1/xds/nodes")
	_ = c.MarkFlagFilename("config", "yaml", "yml", "json")
}

func newEnvoyCommand(log *slog.Logger) *cobra.Command {
	var ef envoyFlags
	c := &cobra.Command{
		Use:   "envoy",
		Short: "run and supervise this node's Envoy, bootstrapped to the control plane",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := ef.envoyNode(log)
			if err != nil {
				return err
			}
			return daemon.RunEnvoy(cmd.Context(), log.With("cmd", "envoy"), n)
		},
	}
	ef.register(c.Flags(), defaultNode(), ".run/envoy")
	return c
}

// newEnvoyParentCommand is the node's Envoy's parent (envoy.RunParent),
// which the agent starts; hidden: nobody types it.
func newEnvoyParentCommand() *cobra.Command {
	return &cobra.Command{
		Use: envoy.ParentCommand + " -- ENVOY [ARGS...]", Hidden: true, Args: cobra.MinimumNArgs(1), DisableFlagParsing: true,
		Short: "parent the node's Envoy, so that it outlives its agent",
		Run: func(cmd *cobra.Command, args []string) {
			if args[0] == "-h" || args[0] == "--help" {
				_ = cmd.Help()
				return
			}
			if args[0] == "--" {
				args = args[1:]
			}
			if len(args) == 0 {
				os.Exit(2)
			}
			os.Exit(envoy.RunParent(args[0], args[1:]))
		},
	}
}

func newBootstrapCommand() *cobra.Command {
	var nf nodeFlags
	c := &cobra.Command{
		Use:   "bootstrap",
		Short: "print a node's Envoy bootstrap",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := nf.bootstrap()
			if err != nil {
				return err
			}
			if opts.AdminSocket == "" { // relative to Envoy's working folder
				opts.AdminSocket = filepath.Join(envoy.AdminSocketFolder, "envoy.sock")
			}
			out, err := bootstrap.YAML(opts)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	nf.register(c.Flags(), defaultNode())
	return c
}

// parseResources reads --resource NAME=COUNT flags.
func parseResources(flags []string) (map[string]int, error) {
	if len(flags) > wire.MaxResources {
		return nil, fmt.Errorf("--resource: %d given; at most %d kinds", len(flags), wire.MaxResources)
	}
	out := map[string]int{}
	for _, f := range flags {
		name, countText, ok := strings.Cut(f, "=")
		count, err := strconv.Atoi(countText)
		if !ok || err != nil {
			return nil, fmt.Errorf("--resource %q: want NAME=COUNT, such as gpu=2", f)
		}
		if err := wire.CheckResource(name, count); err != nil {
			return nil, fmt.Errorf("--resource: %w", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--resource %s is given twice; give each resource once", name)
		}
		out[name] = count
	}
	return out, nil
}
