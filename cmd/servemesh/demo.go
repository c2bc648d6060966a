package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/daemon"
)

func newDemoStackCommand(log *slog.Logger) *cobra.Command {
	var o daemon.StackOptions
	c := &cobra.Command{
		Use:   "demo-stack",
		Short: "run all of servemesh on this machine with a demo: Consul, controller, agent, Envoy (what `make run` does)",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Self = self
			return daemon.RunStack(cmd.Context(), log.With("cmd", "demo-stack"), o, cmd.OutOrStdout())
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.WorkDir, "work-dir", ".run/demo-stack", "folder for logs, replica output and the applied mesh.yaml")
	fs.IntVar(&o.ConsulHTTPPort, "consul-http-port", 18500, "port of the Consul dev agent's HTTP API and UI")
	fs.StringVar(&o.API, "api", "127.0.0.1:18001", "the controller's API address")
	fs.StringVar(&o.XDS, "xds", "127.0.0.1:18000", "the controller's xDS address")
	fs.StringVar(&o.Public, "public", "127.0.0.1:8080", "the node's public listener")
	fs.StringVar(&o.Mesh, "mesh", "127.0.0.1:15001", "the node's mesh listener")
	fs.StringVar(&o.Inbound, "inbound", "127.0.0.1:21000", "the node's inbound listener, where other nodes call its replicas over mTLS")
	fs.StringVar(&o.ModelServer, "model-server", daemon.StandIn, "what serves the demo's llama model: "+daemon.StandIn+" (servemesh's own stand-in) or "+daemon.Llama+" (llama.cpp's OpenAI-compatible server, a real engine, which make tools builds)")
	fs.StringSliceVar(&o.AllowCommands, "allow-command", nil, "another command the demo's agent may run as replicas (repeatable; a clean absolute path, or a folder's /*), such as the Python your model runs with; servemesh itself is always allowed")
	_ = c.RegisterFlagCompletionFunc("model-server", cobra.FixedCompletions([]string{daemon.StandIn, daemon.Llama}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newDemoCommand(log *slog.Logger) *cobra.Command {
	var o daemon.DemoOptions
	var ef envoyFlags
	c := &cobra.Command{
		Use:   "demo",
		Short: "run a file-mode demo: control plane, Envoy and demo replicas, no Consul",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := ef.envoyNode(log)
			if err != nil {
				return err
			}
			if !n.Bootstrap.Node.Public() {
				return fmt.Errorf("--public %s: the demo serves its endpoints on the public listener; give it an address such as 127.0.0.1:8080", noPublic)
			}
			o.Envoy = n
			if o.Plane.XDSCacheOff, err = xdsCacheOff(); err != nil {
				return err
			}
			return daemon.RunDemo(cmd.Context(), log.With("cmd", "demo"), o, cmd.OutOrStdout())
		},
	}
	registerFilePlane(c, &o.Plane, "examples/demo.yaml")
	def := defaultNode()
	def.id, def.public = "demo-node", "127.0.0.1:8080"
	ef.register(c.Flags(), def, ".run/demo")
	_ = c.Flags().MarkHidden("xds") // the demo's own control plane
	return c
}

func newDemoReplicaCommand(log *slog.Logger) *cobra.Command {
	var backend, listen string
	var grpc bool
	var startDelay time.Duration
	c := &cobra.Command{
		Use:   "demo-replica --backend NAME --listen ADDR",
		Short: "run one demo replica: an HTTP (or gRPC) server that says which backend it is",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return daemon.RunDemoReplica(cmd.Context(), log.With("cmd", "demo-replica"), backend, os.Getenv("SERVEMESH_REPLICA_TAG"), listen, grpc, startDelay)
		},
	}
	c.Flags().BoolVar(&grpc, "grpc", false, "serve gRPC (the standard health service, unary and streaming) instead of HTTP")
	c.Flags().StringVar(&backend, "backend", "", "the backend this replica belongs to")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:9001", "address to listen on")
	c.Flags().DurationVar(&startDelay, "start-delay", 0, "wait this long before listening, as a model server loading its weights does")
	return c
}

func newModelServerCommand(log *slog.Logger) *cobra.Command {
	var o daemon.ModelServerOptions
	c := &cobra.Command{
		Use:   "demo-model-server --backend NAME --listen ADDR",
		Short: "run a stand-in model server: OpenAI-style answers that slow as its batch grows, and vLLM's load gauges at /metrics",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Tag = os.Getenv("SERVEMESH_REPLICA_TAG")
			return daemon.RunModelServer(cmd.Context(), log.With("cmd", "demo-model-server"), o)
		},
	}
	c.Flags().StringVar(&o.Backend, "backend", "", "the backend this replica belongs to")
	c.Flags().StringVar(&o.Listen, "listen", "127.0.0.1:9001", "address to listen on")
	c.Flags().IntVar(&o.Slots, "slots", 4, "requests it runs at once; the rest wait (vllm:num_requests_waiting)")
	c.Flags().DurationVar(&o.Service, "service", 20*time.Millisecond, "one request's time alone; a full batch doubles it")
	c.Flags().StringVar(&o.SlowLock, "slow-lock", "", "a file the first replica to create it takes: that replica is --slow-factor times slower")
	c.Flags().Float64Var(&o.SlowFactor, "slow-factor", 3, "how much slower the replica that takes --slow-lock is")
	c.Flags().IntVar(&o.FakeWaiting, "fake-waiting", 0, "requests the replica that takes --slow-lock adds to the queue its metrics report")
	c.Flags().DurationVar(&o.PrefillPerBlock, "prefill-per-block", 0, "with --cache-blocks, what each block of a prompt not in its prefix cache adds to the answer's time (a cached one, a twentieth)")
	c.Flags().IntVar(&o.CacheBlocks, "cache-blocks", 0, "blocks of prompts its prefix cache holds, least recently used dropped first (0: no prefix cache)")
	c.Flags().IntVar(&o.ModelsPerReplica, "models-per-replica", 0, "models it holds at once, loading them on demand (Ray Serve's multiplexing; 0: one), named in vllm:lora_requests_info")
	c.Flags().DurationVar(&o.ModelLoad, "model-load", 0, "with --models-per-replica, what loading a model adds to a request's time")
	c.Flags().BoolVar(&o.ForgeReport, "forge-load-report", false, "the replica that takes --slow-lock sends ORCA load reports of its own claiming a huge capacity (a compromised replica, for tests)")
	c.Flags().BoolVar(&o.Hang, "hang", false, "the replica that takes --slow-lock accepts every POST and never answers it (a stalled engine, for tests); it still answers GET")
	c.Flags().DurationVar(&o.TokenInterval, "token-interval", 0, "in a streamed answer, the time between two tokens (a model's inter-token latency)")
	return c
}
