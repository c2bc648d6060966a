package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

func newBackendCommand() *cobra.Command {
	var f clientFlags
	return nounCommand("backend", "create, update, delete, list, get and describe backends", &f,
		newBackendCreateCommand(&f), newBackendUpdateCommand(&f),
		deleteCommand("backend", &f, (*api.Client).DeleteBackend),
		listCommand("backend", &f, (*api.Client).ListBackends, backendColumns),
		getCommand("backend", &f, (*api.Client).GetBackend, backendColumns),
		newBackendDescribeCommand(&f))
}

// backendSource are the flags that say where a new backend's replicas come
// from.
type backendSource struct {
	replicas, args, env []string
	command, health     string
	reconfigure         string
	external, protocol  string
}

func newBackendCreateCommand(f *clientFlags) *cobra.Command {
	var src backendSource
	var cfg configFlags
	var wait waitFlags
	c := &cobra.Command{
		Use:   "create NAME",
		Short: "create a backend: static replicas (--replica), a command servemesh runs (--command) or a Consul service (--external)",
		Args:  names(1, "one backend name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			patch, err := cfg.patch(cmd.Flags())
			if err != nil {
				return err
			}
			config, err := patch.Config()
			if err != nil {
				return err
			}
			b, err := src.backend(args[0], config)
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.CreateBackend(cmd.Context(), b)
			if err := report(cmd, "backend", b.Name, changed, err, "created", "already exists with this spec"); err != nil {
				return err
			}
			return wait.waitServed(cmd, c, processBackends(&meshspec.Spec{Backends: []meshspec.BackendSpec{b}}), api.ServedQuery{Backends: []string{b.Name}})
		},
	}
	fs := c.Flags()
	wait.register(fs)
	fs.StringArrayVar(&src.replicas, "replica", nil, "a static replica's IP:port (repeat the flag for several)")
	fs.StringVar(&src.command, "command", "", "run replicas of this program on servemesh's nodes (with --num-replicas)")
	fs.StringArrayVar(&src.args, "arg", nil, "an argument of --command (repeat in order); ${PORT} and ${HOST} expand per replica, so quote them: '--arg=${HOST}:${PORT}'")
	fs.StringArrayVar(&src.env, "env", nil, "an environment variable of --command, as KEY=VALUE (repeat)")
	fs.StringVar(&src.health, "health-path", "", "HTTP path that answers 2xx when a replica is healthy (default: a TCP probe)")
	fs.StringVar(&src.reconfigure, "reconfigure-path", "", "HTTP path where a replica takes the backend's --user-config (a POST of the JSON)")
	fs.StringVar(&src.external, "external", "", "route to this Consul service, run by something else")
	fs.StringVar(&src.protocol, "protocol", "", "how Envoy talks to the replicas: http1 (the default), http2 (h2c) or grpc (probed with the gRPC health service unless --health-path)")
	_ = c.RegisterFlagCompletionFunc("protocol", cobra.FixedCompletions([]string{"http1", "http2", "grpc"}, cobra.ShellCompDirectiveNoFileComp))
	cfg.register(fs)
	return c
}

// backend builds the backend the flags describe.
func (s backendSource) backend(name string, cfg meshspec.BackendConfig) (meshspec.BackendSpec, error) {
	b := meshspec.BackendSpec{Name: name, Config: cfg, Protocol: meshspec.Protocol(s.protocol)}
	for _, r := range s.replicas {
		b.Replicas = append(b.Replicas, meshspec.ReplicaSpec{Address: r})
	}
	if s.command == "" && (len(s.args) > 0 || len(s.env) > 0 || s.health != "" || s.reconfigure != "") {
		return b, errors.New("--arg, --env, --health-path and --reconfigure-path go with --command")
	}
	if s.command != "" {
		b.Process = &meshspec.ProcessSpec{Command: s.command, Args: s.args, HealthPath: s.health, ReconfigurePath: s.reconfigure}
		for _, kv := range s.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return b, fmt.Errorf("--env %q: want KEY=VALUE", kv)
			}
			if b.Process.Env == nil {
				b.Process.Env = map[string]string{}
			}
			b.Process.Env[k] = v
		}
	}
	if s.external != "" {
		b.External = &meshspec.ExternalSpec{Service: s.external}
	}
	return b, nil
}

func newBackendUpdateCommand(f *clientFlags) *cobra.Command {
	var cfg configFlags
	var wait waitFlags
	var replicas, unset []string
	c := &cobra.Command{
		Use:               "update NAME",
		ValidArgsFunction: completeName(f, backendNames),
		Short:             "change a backend's config, or the addresses of a backend of listed replicas: only the flags given change",
		Args:              names(1, "one backend name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			patch, err := cfg.patch(cmd.Flags())
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("replica") {
				patch.Replicas = make([]meshspec.ReplicaSpec, 0, len(replicas))
				for _, a := range replicas {
					patch.Replicas = append(patch.Replicas, meshspec.ReplicaSpec{Address: a})
				}
			}
			merge, err := mergePatch(patch, unset)
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.PatchBackend(cmd.Context(), args[0], merge)
			if err := report(cmd, "backend", args[0], changed, err, "updated", "already has this config"); err != nil || !wait.wait {
				return err
			}
			b, err := c.GetBackend(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var process []string
			if b.Process != nil {
				process = []string{b.Name}
			}
			return wait.waitServed(cmd, c, process, api.ServedQuery{Backends: []string{b.Name}})
		},
	}
	cfg.register(c.Flags())
	wait.register(c.Flags())
	c.Flags().StringArrayVar(&replicas, "replica", nil, "the address (IP:port or host:port) of a replica of a backend of listed replicas; repeat it for each: the list replaces the backend's")
	c.Flags().StringArrayVar(&unset, "unset", nil, "a config field to remove, back to its default, as backend get -o json names it (hold_timeout_s, outlier, user_config, ...); repeat for each")
	return c
}

// mergePatch is the JSON merge patch the API takes: the flags' patch, with
// each --unset field null.
func mergePatch(p meshspec.BackendConfigPatch, unset []string) (map[string]any, error) {
	mp, err := p.MergePatch()
	if err != nil && len(unset) == 0 {
		return nil, err
	}
	out := map[string]any{}
	if err == nil {
		if out, err = mp.JSON(); err != nil {
			return nil, err
		}
	}
	for _, field := range unset {
		if _, set := out[field]; set {
			return nil, fmt.Errorf("--unset %s: the other flags set it too; give one or the other", field)
		}
		out[field] = nil
	}
	return out, nil
}

// configFlags are a backend's config flags; patch builds a patch of those
// given on the command line.
type configFlags struct {
	mcq, num, mem, maxHeld                 int
	cpus                                   float64
	hold, graceful                         time.Duration
	resources                              []string
	userConfig                             string
	as                                     meshspec.AutoscalingConfig
	upscale, downscale, lookBack, interval time.Duration
	downscaleToZero                        time.Duration
	off                                    bool
	loadAware                              meshspec.LoadAware
	loadAwareOff                           bool
	queueTimeout, ttftBudget               time.Duration
	firstByte                              time.Duration
	weights                                map[string]string
	picker                                 meshspec.EndpointPicker
}

func (c *configFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&c.mcq, "max-concurrent-queries", 0, "requests one replica serves at once")
	fs.IntVar(&c.num, "num-replicas", 0, "replicas the scheduler should run")
	fs.Float64Var(&c.cpus, "cpus", 0, "CPUs one replica needs")
	fs.IntVar(&c.mem, "memory-mb", 0, "MiB of memory one replica needs")
	fs.StringArrayVar(&c.resources, "resource", nil, "a named resource one replica needs, as NAME=COUNT (gpu=1), offered by nodes' --resource; repeat for each; --resource none for none")
	fs.StringVar(&c.userConfig, "user-config", "", "JSON every replica takes at the backend's --reconfigure-path, without a restart (Ray Serve's user_config)")
	fs.DurationVar(&c.hold, "hold-timeout", 0, "how long a node holds a request while no replica is ready (default "+seconds(meshspec.DefaultHoldTimeoutS)+")")
	fs.DurationVar(&c.graceful, "graceful-shutdown-timeout", 0, "how long a replica being removed (scaled down, replaced, its node drained) may finish its requests in flight, long answer streams included; it stops once they end (default "+seconds(meshspec.DefaultGracefulShutdownTimeoutS)+")")
	fs.DurationVar(&c.firstByte, "first-byte-timeout", 0, "how long one try of a request may wait for its answer to start before it is tried on another replica, whatever its method (a model server that stalls); never once the answer has started; 0: no bound")
	fs.IntVar(&c.maxHeld, "max-held", 0, "most requests a node holds at once while no replica is ready (default "+strconv.Itoa(meshspec.DefaultMaxHeld)+")")
	fs.IntVar(&c.as.MinReplicas, "autoscale-min", 0, "autoscale: fewest replicas")
	fs.IntVar(&c.as.MaxReplicas, "autoscale-max", 0, "autoscale: most replicas (setting it turns autoscaling on)")
	fs.Float64Var(&c.as.TargetInFlight, "autoscale-target", 0, "autoscale: requests in flight per replica to aim for")
	fs.Float64Var(&c.as.TargetQueued, "autoscale-target-queued", 0, "autoscale a load-aware backend on its queue depth too: requests waiting per replica to aim for (in the pickers and the servers' queues)")
	fs.DurationVar(&c.upscale, "autoscale-upscale-delay", 0, "autoscale: how long a need for more replicas must last (default "+seconds(meshspec.DefaultUpscaleDelayS)+")")
	fs.DurationVar(&c.downscale, "autoscale-downscale-delay", 0, "autoscale: how long a need for fewer replicas must last (default "+seconds(meshspec.DefaultDownscaleDelayS)+")")
	fs.DurationVar(&c.downscaleToZero, "autoscale-downscale-to-zero-delay", 0, "autoscale, with --autoscale-min 0: how long a need for no replica must last before the last goes (default: the downscale delay)")
	fs.IntVar(&c.as.InitialReplicas, "autoscale-initial", 0, "autoscale: replicas a new backend starts with (default --autoscale-min)")
	fs.DurationVar(&c.lookBack, "autoscale-look-back", 0, "autoscale: the window the load is averaged over (default "+seconds(meshspec.DefaultLookBackPeriodS)+")")
	fs.DurationVar(&c.interval, "autoscale-interval", 0, "autoscale: how often the load is read (default "+seconds(meshspec.DefaultMetricsIntervalS)+")")
	fs.BoolVar(&c.off, "autoscale-off", false, "turn autoscaling off (num_replicas stays where it is)")
	fs.Bool("load-aware", false, "pick replicas by their load (model servers): each node's agent picks among its replicas (preferring one holding the prompt's prefix in cache), callers weigh nodes by their reports")
	fs.StringVar(&c.loadAware.MetricsPath, "load-metrics-path", "", "load-aware: where replicas serve Prometheus metrics (vLLM: /metrics)")
	fs.StringVar(&c.loadAware.QueueMetric, "load-queue-metric", "", "load-aware: the gauge of waiting requests (vLLM: vllm:num_requests_waiting)")
	fs.StringVar(&c.loadAware.RunningMetric, "load-running-metric", "", "load-aware: the gauge of running requests (vLLM: vllm:num_requests_running)")
	fs.StringVar(&c.loadAware.KVCacheMetric, "load-kv-cache-metric", "", "load-aware: the gauge of KV-cache use, 0 to 1 (vLLM: vllm:kv_cache_usage_perc; its deprecated name is read where a server has only that)")
	fs.IntVar(&c.loadAware.QueueLimit, "load-queue-limit", 0, "load-aware: waiting requests that saturate a replica (sheddable requests are then refused)")
	fs.Float64Var(&c.loadAware.KVCacheLimit, "load-kv-cache-limit", 0, "load-aware: KV-cache use that saturates a replica (default "+strconv.FormatFloat(meshspec.DefaultKVCacheLimit, 'g', -1, 64)+")")
	fs.BoolVar(&c.loadAware.PromptAffinity, "load-prompt-affinity", false, "load-aware: callers choose the node by each prompt's prefix (loads bounded), so it reaches the replica holding it in cache (long shared prompts; not gRPC)")
	fs.IntVar(&c.loadAware.PrefixCacheTokens, "load-prefix-cache-tokens", 0, "load-aware: tokens each replica's prefix (KV) cache holds, so a prompt its home evicted goes where it is still held (default: what vLLM's or SGLang's metrics say, else 262144)")
	fs.StringVar(&c.loadAware.SessionHeader, "load-session-header", "", "load-aware: the request header naming a conversation, kept on the replica that served it while it has room (say x-session-id)")
	fs.IntVar(&c.loadAware.MaxModelsPerReplica, "load-max-models-per-replica", 0, "load-aware: models each replica loads on demand, at most (Ray Serve's max_num_models_per_replica): requests go to a replica with theirs loaded")
	fs.StringVar(&c.loadAware.ModelHeader, "load-model-header", "", "load-aware: the header naming a request's model (default "+meshspec.DefaultModelHeader+"; else the body's \"model\")")
	fs.StringVar(&c.loadAware.TenantHeader, "load-tenant-header", "", "load-aware: the request header naming its tenant; while replicas are saturated, waiting requests of one priority take turns by it (say x-tenant-id)")
	fs.IntVar(&c.loadAware.MaxQueued, "load-max-queued", 0, "load-aware: requests that may wait on a node while its replicas are saturated (default "+strconv.Itoa(meshspec.DefaultMaxQueued)+")")
	fs.BoolVar(&c.loadAware.RefuseLate, "load-refuse-late", false, "load-aware: answer 429 at once a request from inside the mesh that states a time to first token ("+meshspec.TTFTObjectiveHeader+") its replicas cannot meet")
	fs.DurationVar(&c.ttftBudget, "load-ttft-budget", 0, "load-aware: the prefill a replica may have queued and keep a prompt's affinity (llm-d's sticky until saturated; say 500ms): past it, requests go by load")
	fs.DurationVar(&c.queueTimeout, "load-queue-timeout", 0, "load-aware: how long a request may wait for a replica, then 429 (default "+seconds(meshspec.DefaultQueueTimeoutS)+")")
	fs.StringToStringVar(&c.weights, "load-weight", nil, "load-aware: weigh the picker's scorers ("+strings.Join(meshspec.ScorerNames, ", ")+"), as NAME=WEIGHT (prefix=2): 1, the default, as is; 0 leaves one out; repeat or join with commas")
	fs.BoolVar(&c.loadAwareOff, "load-aware-off", false, "stop picking replicas by their load")
	fs.StringVar(&c.picker.Address, "endpoint-picker", "", "IP:port of an external picker of the replicas (the Endpoint Picker Protocol: the Inference Extension's picker, llm-d's router) every calling node asks for each request; not with --load-aware; --unset endpoint_picker removes it")
	fs.BoolVar(&c.picker.FailOpen, "endpoint-picker-fail-open", false, "while the endpoint picker does not answer, send requests to a replica the node picks (else 503)")
	fs.BoolVar(&c.picker.TLS, "endpoint-picker-tls", false, "reach the endpoint picker over TLS, its certificate verified for its IP against the node's system trust store")
}

// loadAwarePatch is the load_aware patch of the --load flags (set: one of
// them was given), or nil for none.
func (c *configFlags) loadAwarePatch(set bool) (*meshspec.LoadAwarePatch, error) {
	switch {
	case set && c.loadAwareOff:
		return nil, errors.New("--load-aware-off goes without the other --load flags")
	case c.loadAwareOff:
		return &meshspec.LoadAwarePatch{Off: true}, nil
	case set:
		p := &meshspec.LoadAwarePatch{LoadAware: c.loadAware}
		p.QueueTimeoutS = c.queueTimeout.Seconds()
		if c.ttftBudget > 0 && c.ttftBudget < time.Millisecond {
			return nil, fmt.Errorf("--load-ttft-budget %s: give at least 1ms, such as 500ms", c.ttftBudget)
		}
		p.TTFTBudgetMs = int(c.ttftBudget.Milliseconds())
		for name, v := range c.weights {
			w, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("--load-weight %s=%q: not a number; give one from 0 to %d, such as %s=2", name, v, meshspec.MaxScorerWeight, name)
			}
			if p.Weights == nil {
				p.Weights = map[string]float64{}
			}
			p.Weights[name] = w
		}
		return p, nil
	}
	return nil, nil
}

// pickerPatch is the endpoint_picker patch of the --endpoint-picker
// flags given, or nil for none.
func (c *configFlags) pickerPatch(fs *pflag.FlagSet) *meshspec.EndpointPickerPatch {
	if !fs.Changed("endpoint-picker") && !fs.Changed("endpoint-picker-fail-open") && !fs.Changed("endpoint-picker-tls") {
		return nil
	}
	p := &meshspec.EndpointPickerPatch{Address: c.picker.Address}
	if fs.Changed("endpoint-picker-fail-open") {
		p.FailOpen = &c.picker.FailOpen
	}
	if fs.Changed("endpoint-picker-tls") {
		p.TLS = &c.picker.TLS
	}
	return p
}

// seconds is a default given in seconds as a flag's duration shows it.
func seconds(s float64) string { return (time.Duration(s) * time.Second).String() }

func (c *configFlags) patch(fs *pflag.FlagSet) (meshspec.BackendConfigPatch, error) {
	var p meshspec.BackendConfigPatch
	autoscale := false
	loadAware := false
	fs.Visit(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Name, "autoscale-") && f.Name != "autoscale-off" {
			autoscale = true
		}
		if f.Name == "load-aware" || strings.HasPrefix(f.Name, "load-") && f.Name != "load-aware-off" {
			loadAware = true
		}
		switch f.Name {
		case "max-concurrent-queries":
			p.MaxConcurrentQueries = &c.mcq
		case "num-replicas":
			p.NumReplicas = &c.num
		case "cpus":
			p.CPUs = &c.cpus
		case "memory-mb":
			p.MemoryMB = &c.mem
		case "hold-timeout":
			s := c.hold.Seconds()
			p.HoldTimeoutS = &s
		case "graceful-shutdown-timeout":
			s := c.graceful.Seconds()
			p.GracefulShutdownTimeoutS = &s
		case "max-held":
			p.MaxHeld = &c.maxHeld
		case "first-byte-timeout":
			s := c.firstByte.Seconds()
			p.FirstByteTimeoutS = &s
		}
	})
	if fs.Changed("user-config") {
		var u meshspec.UserConfig
		if err := json.Unmarshal([]byte(c.userConfig), &u); err != nil {
			return p, fmt.Errorf("--user-config: not JSON (%w); give a JSON value, such as '{\"temperature\": 0.7}'", err)
		}
		p.UserConfig = &u
	}
	if fs.Changed("resource") {
		res := map[string]int{}
		if len(c.resources) != 1 || c.resources[0] != "none" {
			var err error
			if res, err = parseResources(c.resources); err != nil {
				return p, err
			}
		}
		p.Resources = res
	}
	var err error
	if p.LoadAware, err = c.loadAwarePatch(loadAware); err != nil {
		return p, err
	}
	p.EndpointPicker = c.pickerPatch(fs)
	switch {
	case autoscale && c.off:
		return p, errors.New("--autoscale-off goes without the other --autoscale flags")
	case c.off:
		p.Autoscaling = &meshspec.AutoscalingConfig{}
	case autoscale:
		if c.as.MaxReplicas == 0 || c.as.TargetInFlight == 0 {
			return p, errors.New("autoscaling needs at least --autoscale-max and --autoscale-target")
		}
		as := c.as
		as.UpscaleDelayS, as.DownscaleDelayS = c.upscale.Seconds(), c.downscale.Seconds()
		as.LookBackPeriodS, as.MetricsIntervalS = c.lookBack.Seconds(), c.interval.Seconds()
		as.DownscaleToZeroDelayS = c.downscaleToZero.Seconds()
		p.Autoscaling = &as
	}
	return p, nil
}
