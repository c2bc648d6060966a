package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/controlplane/model"
)

// ctlOptions are the flags every API command takes.
type ctlOptions struct {
	server, tokenFile, output string
}

func (o *ctlOptions) register(fs *flag.FlagSet) {
	server := os.Getenv("SERVEMESH_SERVER")
	if server == "" {
		server = "127.0.0.1:18001"
	}
	fs.StringVar(&o.server, "server", server, "the controller's API address (default $SERVEMESH_SERVER or 127.0.0.1:18001)")
	fs.StringVar(&o.tokenFile, "token-file", os.Getenv("SERVEMESH_TOKEN_FILE"), "file with the API bearer token (default $SERVEMESH_TOKEN_FILE)")
	fs.StringVar(&o.output, "o", "table", "output of reads: table or json")
}

func (o *ctlOptions) client() (*api.Client, error) {
	if o.output != "table" && o.output != "json" {
		return nil, fmt.Errorf("-o %q: use table or json", o.output)
	}
	token, err := readToken(o.tokenFile)
	if err != nil {
		return nil, err
	}
	return api.NewClient(o.server, token), nil
}

// parseOne parses a command's flags and its one NAME, and returns the name
// with an API client.
func (o *ctlOptions) parseOne(fs *flag.FlagSet, args []string, kind string) (string, *api.Client, error) {
	names, err := parseNamed(fs, args, 1, "one "+kind+" name")
	if err != nil {
		return "", nil, err
	}
	c, err := o.client()
	return names[0], c, err
}

// parseNamed parses "NAME [flags]" or "[flags] NAME" with exactly want
// positional arguments, returned in order.
func parseNamed(fs *flag.FlagSet, args []string, want int, what string) ([]string, error) {
	var positional []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) > 0 {
			positional = append(positional, args[0])
			args = args[1:]
		}
	}
	if len(positional) != want {
		return nil, fmt.Errorf("want %s; see `servemesh %s -h`", what, fs.Name())
	}
	return positional, nil
}

func runBackend(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("want a verb: backend create|update|delete|list|get")
	}
	var o ctlOptions
	verb, args := args[0], args[1:]
	fs := newFlags("backend "+verb, "NAME [flags]")
	o.register(fs)
	switch verb {
	case "create":
		var replicas, cmdArgs, envs multiFlag
		fs.Var(&replicas, "replica", "a static replica's IP:port (repeat the flag for several)")
		command := fs.String("command", "", "run replicas of this program on servemesh's nodes (with --num-replicas)")
		fs.Var(&cmdArgs, "arg", "an argument of --command (repeat in order); ${PORT} and ${HOST} expand per replica, so quote them: '--arg=${HOST}:${PORT}'")
		fs.Var(&envs, "env", "an environment variable of --command, as KEY=VALUE (repeat)")
		health := fs.String("health-path", "", "HTTP path that answers 2xx when a replica is healthy (default: a TCP probe)")
		external := fs.String("external", "", "route to this Consul service, run by something else")
		patch := registerConfigFlags(fs)
		name, c, err := o.parseOne(fs, args, "backend")
		if err != nil {
			return err
		}
		p, err := patch(fs)
		if err != nil {
			return err
		}
		b := model.Backend{Name: name, Config: p.Apply(model.BackendConfig{})}
		for _, r := range replicas {
			b.Replicas = append(b.Replicas, model.Replica{Address: r})
		}
		if *command != "" {
			b.Process = &model.ProcessSpec{Command: *command, Args: cmdArgs, HealthPath: *health}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--env %q: want KEY=VALUE", kv)
				}
				if b.Process.Env == nil {
					b.Process.Env = map[string]string{}
				}
				b.Process.Env[k] = v
			}
		} else if len(cmdArgs) > 0 || len(envs) > 0 || *health != "" {
			return errors.New("--arg, --env and --health-path go with --command")
		}
		if *external != "" {
			b.External = &model.ExternalSpec{Service: *external}
		}
		changed, err := c.CreateBackend(ctx, b)
		return report(out, "backend", name, changed, err, "created", "already exists with this spec")
	case "update":
		patch := registerConfigFlags(fs)
		name, c, err := o.parseOne(fs, args, "backend")
		if err != nil {
			return err
		}
		p, err := patch(fs)
		if err != nil {
			return err
		}
		changed, err := c.UpdateBackend(ctx, name, p)
		return report(out, "backend", name, changed, err, "updated", "already has this config")
	case "delete":
		return deleteObject(ctx, &o, fs, args, "backend", out, (*api.Client).DeleteBackend)
	case "list", "get":
		return readObjects(ctx, &o, fs, args, verb, "backend", out, (*api.Client).GetBackend, (*api.Client).ListBackends,
			"NAME\tREPLICAS FROM\tRUNNING/DESIRED\tAUTOSCALE\tMAX_CONCURRENT_QUERIES\tCPUS\tMEMORY_MB", backendRow)
	}
	return fmt.Errorf("unknown verb %q: use backend create|update|delete|list|get", verb)
}

// registerConfigFlags adds the backend config flags and returns a function
// that builds a patch of the ones given on the command line.
func registerConfigFlags(fs *flag.FlagSet) func(*flag.FlagSet) (model.BackendConfigPatch, error) {
	mcq := fs.Int("max-concurrent-queries", 0, "requests one replica serves at once")
	num := fs.Int("num-replicas", 0, "replicas the scheduler should run")
	cpus := fs.Float64("cpus", 0, "CPUs one replica needs")
	mem := fs.Int("memory-mb", 0, "MiB of memory one replica needs")
	var as model.AutoscalingConfig
	fs.IntVar(&as.MinReplicas, "autoscale-min", 0, "autoscale: fewest replicas")
	fs.IntVar(&as.MaxReplicas, "autoscale-max", 0, "autoscale: most replicas (setting it turns autoscaling on)")
	fs.Float64Var(&as.TargetInFlight, "autoscale-target", 0, "autoscale: requests in flight per replica to aim for")
	upscale := fs.Duration("autoscale-upscale-delay", 0, "autoscale: how long a need for more replicas must last (default 30s)")
	downscale := fs.Duration("autoscale-downscale-delay", 0, "autoscale: how long a need for fewer replicas must last (default 10m)")
	lookBack := fs.Duration("autoscale-look-back", 0, "autoscale: the window the load is averaged over (default 30s)")
	interval := fs.Duration("autoscale-interval", 0, "autoscale: how often the load is read (default 10s)")
	off := fs.Bool("autoscale-off", false, "turn autoscaling off (num_replicas stays where it is)")
	return func(fs *flag.FlagSet) (model.BackendConfigPatch, error) {
		var p model.BackendConfigPatch
		autoscale := false
		fs.Visit(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "autoscale-") && f.Name != "autoscale-off" {
				autoscale = true
			}
			switch f.Name {
			case "max-concurrent-queries":
				p.MaxConcurrentQueries = mcq
			case "num-replicas":
				p.NumReplicas = num
			case "cpus":
				p.CPUs = cpus
			case "memory-mb":
				p.MemoryMB = mem
			}
		})
		switch {
		case autoscale && *off:
			return p, errors.New("--autoscale-off goes without the other --autoscale flags")
		case *off:
			p.Autoscaling = &model.AutoscalingConfig{}
		case autoscale:
			if as.MaxReplicas == 0 || as.TargetInFlight == 0 {
				return p, errors.New("autoscaling needs at least --autoscale-max and --autoscale-target")
			}
			as.UpscaleDelayS, as.DownscaleDelayS = upscale.Seconds(), downscale.Seconds()
			as.LookBackPeriodS, as.MetricsIntervalS = lookBack.Seconds(), interval.Seconds()
			p.Autoscaling = &as
		}
		return p, nil
	}
}

func runEndpoint(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("want a verb: endpoint create|delete|list|get")
	}
	var o ctlOptions
	verb, args := args[0], args[1:]
	fs := newFlags("endpoint "+verb, "NAME [flags]")
	o.register(fs)
	switch verb {
	case "create":
		route := fs.String("route", "", "the HTTP path it serves, with its sub-paths (none: headless)")
		methods := fs.String("methods", "", "comma-separated HTTP methods (default GET)")
		backend := fs.String("backend", "", "send all traffic to this backend")
		traffic := fs.String("traffic", "", "weights, as b1=0.9,b2=0.1 (instead of --backend)")
		names, err := parseNamed(fs, args, 1, "one endpoint name")
		if err != nil {
			return err
		}
		name := names[0]
		e := model.Endpoint{Name: name, Route: *route}
		if *methods != "" {
			e.Methods = strings.Split(*methods, ",")
		}
		switch {
		case *backend != "" && *traffic != "":
			return errors.New("give --backend or --traffic, not both")
		case *backend != "":
			e.Traffic = map[string]float64{*backend: 1}
		case *traffic != "":
			if e.Traffic, err = parseWeights(strings.Split(*traffic, ",")); err != nil {
				return err
			}
		default:
			return errors.New("an endpoint needs traffic: give --backend NAME or --traffic b1=0.9,b2=0.1")
		}
		c, err := o.client()
		if err != nil {
			return err
		}
		changed, err := c.CreateEndpoint(ctx, e)
		return report(out, "endpoint", name, changed, err, "created", "already exists with this spec")
	case "delete":
		return deleteObject(ctx, &o, fs, args, "endpoint", out, (*api.Client).DeleteEndpoint)
	case "list", "get":
		return readObjects(ctx, &o, fs, args, verb, "endpoint", out, (*api.Client).GetEndpoint, (*api.Client).ListEndpoints,
			"NAME\tROUTE\tMETHODS\tTRAFFIC\tSHADOWS", func(e model.Endpoint) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", e.Name, orNone(e.Route), strings.Join(e.AllowedMethods(), ","),
					formatWeights(e.Traffic), orNone(formatWeights(e.Shadows)))
			})
	}
	return fmt.Errorf("unknown verb %q: use endpoint create|delete|list|get", verb)
}

func runTraffic(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "set" {
		return errors.New("want: traffic set ENDPOINT b1=0.9 b2=0.1")
	}
	var o ctlOptions
	fs := newFlags("traffic set", "ENDPOINT BACKEND=WEIGHT...")
	o.register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() < 2 {
		return errors.New("want: traffic set ENDPOINT b1=0.9 b2=0.1")
	}
	weights, err := parseWeights(fs.Args()[1:])
	if err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	changed, err := c.SetTraffic(ctx, fs.Arg(0), weights)
	return report(out, "endpoint", fs.Arg(0), changed, err, "traffic set", "already has this traffic")
}

func runShadow(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "set" {
		return errors.New("want: shadow set ENDPOINT BACKEND=PROPORTION")
	}
	var o ctlOptions
	fs := newFlags("shadow set", "ENDPOINT BACKEND=PROPORTION")
	o.register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("want: shadow set ENDPOINT BACKEND=PROPORTION (0 removes the shadow)")
	}
	p, err := parseWeights(fs.Args()[1:])
	if err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	for backend, proportion := range p {
		changed, err := c.SetShadow(ctx, fs.Arg(0), backend, proportion)
		return report(out, "endpoint", fs.Arg(0), changed, err, "shadow to "+backend+" set", "already has this shadow")
	}
	return nil
}

func runApply(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	var o ctlOptions
	fs := newFlags("apply", "-f FILE [--dry-run]")
	o.register(fs)
	file := fs.String("f", "", "the config file to apply (the format of `servemesh serve --config`)")
	dryRun := fs.Bool("dry-run", false, "print what would change, change nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *file == "" {
		return errors.New("-f FILE is required")
	}
	m, err := configfile.Load(*file)
	if err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	res, err := c.Apply(ctx, m, *dryRun)
	if err != nil {
		return err
	}
	if o.output == "json" {
		return writeJSONOut(out, res)
	}
	if len(res.Changes) == 0 {
		_, err = fmt.Fprintf(out, "%s: no changes\n", *file)
		return err
	}
	prefix := ""
	if *dryRun {
		prefix = "(dry run) would "
	}
	for _, line := range res.Changes {
		fmt.Fprintf(out, "%s%s\n", prefix, line)
	}
	return nil
}

// backendRow renders one backend for `backend list`.
func backendRow(b model.Backend) string {
	source, running, desired := "-", len(b.Replicas), len(b.Replicas)
	switch {
	case b.Process != nil:
		source = "process " + filepath.Base(b.Process.Command)
		running, desired = 0, b.Config.NumReplicas
		for _, p := range b.Placements {
			if p.State == model.Running {
				running++
			}
		}
	case b.External != nil:
		source, running, desired = "consul service "+b.External.Service, 0, 0
	case len(b.Replicas) > 0:
		var addrs []string
		for _, r := range b.Replicas {
			addrs = append(addrs, r.Address)
		}
		source = strings.Join(addrs, ",")
	}
	autoscale := "-"
	if as := b.Config.Autoscaling; as != nil {
		autoscale = fmt.Sprintf("%d..%d @%g", as.MinReplicas, as.MaxReplicas, as.TargetInFlight)
	}
	return fmt.Sprintf("%s\t%s\t%d/%d\t%s\t%d\t%g\t%d", b.Name, source, running, desired, autoscale,
		b.Config.EffectiveMaxConcurrentQueries(), b.Config.CPUs, b.Config.MemoryMB)
}

// readObjects runs `list`, or `get NAME`, for one kind of object: JSON as
// the API answers it with -o json, else a table.
func readObjects[T any](ctx context.Context, o *ctlOptions, fs *flag.FlagSet, args []string, verb, kind string, out io.Writer,
	get func(*api.Client, context.Context, string) (T, error), list func(*api.Client, context.Context) ([]T, error),
	header string, row func(T) string) error {
	want, what := 0, "no arguments"
	if verb == "get" {
		want, what = 1, "one "+kind+" name"
	}
	names, err := parseNamed(fs, args, want, what)
	if err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	var items []T
	if verb == "get" {
		item, err := get(c, ctx, names[0])
		if err != nil {
			return err
		}
		if o.output == "json" {
			return writeJSONOut(out, item)
		}
		items = []T{item}
	} else {
		if items, err = list(c, ctx); err != nil {
			return err
		}
		if o.output == "json" {
			return writeJSONOut(out, items)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, item := range items {
		fmt.Fprintln(tw, row(item))
	}
	return tw.Flush()
}

// deleteObject runs `delete NAME` for one kind of object.
func deleteObject(ctx context.Context, o *ctlOptions, fs *flag.FlagSet, args []string, kind string, out io.Writer,
	del func(*api.Client, context.Context, string) (bool, error)) error {
	name, c, err := o.parseOne(fs, args, kind)
	if err != nil {
		return err
	}
	changed, err := del(c, ctx, name)
	return report(out, kind, name, changed, err, "deleted", "was already absent")
}

// parseWeights reads "name=number" pairs.
func parseWeights(pairs []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range pairs {
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want BACKEND=NUMBER, like model-v1=0.9", p)
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a number", p, value)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("backend %q is given twice", name)
		}
		out[name] = f
	}
	return out, nil
}

func formatWeights(m map[string]float64) string {
	keys := model.SortedKeys(m)
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%g", k, m[k]))
	}
	return strings.Join(parts, ",")
}

func report(out io.Writer, kind, name string, changed bool, err error, did, same string) error {
	if err != nil {
		return err
	}
	msg := did
	if !changed {
		msg = same + "; nothing changed"
	}
	_, err = fmt.Fprintf(out, "%s %s %s\n", kind, name, msg)
	return err
}

func writeJSONOut(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
