package rayserve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/meshspec"
)

// Options say how the replicas run servemesh's Python runtime.
type Options struct {
	// Python is the interpreter the replicas run (the agents'
	// --allow-command must name it); "" is /usr/bin/python3.
	Python string
	// Runtime is the replica runtime's script (servemesh/replica.py);
	// "" runs `python -m servemesh.replica`, which needs the servemesh
	// package installed in Python.
	Runtime string
	// Paths are folders every replica also finds modules in (--path): the
	// servemesh package's, say, when it is not installed.
	Paths []string
	// Dir is the config file's folder: a relative working_dir is read from
	// it, and it holds the applications' modules when none is named.
	Dir string
}

// DefaultPython is the interpreter replicas run when Options name none.
const DefaultPython = "/usr/bin/python3"

// AllMethods are the methods an application's endpoint takes: Ray Serve's
// proxy passes any.
var AllMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// IsConfig reports whether a YAML or JSON document is a Ray Serve config
// file: a mapping with applications.
func IsConfig(doc []byte) bool {
	var head map[string]json.RawMessage
	js, err := yaml.YAMLToJSON(doc)
	if err != nil || json.Unmarshal(js, &head) != nil {
		return false
	}
	_, ok := head["applications"]
	return ok && head["backends"] == nil && head["endpoints"] == nil
}

type config struct {
	HTTPOptions  *httpOptions  `json:"http_options"`
	Applications []application `json:"applications"`
}

type httpOptions struct {
	RequestTimeoutS float64 `json:"request_timeout_s"`
}

type application struct {
	Name        string       `json:"name"`
	RoutePrefix *string      `json:"route_prefix"`
	ImportPath  string       `json:"import_path"`
	RuntimeEnv  *runtimeEnv  `json:"runtime_env"`
	Deployments []deployment `json:"deployments"`
}

type runtimeEnv struct {
	WorkingDir string            `json:"working_dir"`
	EnvVars    map[string]string `json:"env_vars"`
}

type deployment struct {
	Name                 string             `json:"name"`
	NumReplicas          json.RawMessage    `json:"num_replicas"`
	MaxOngoingRequests   int                `json:"max_ongoing_requests"`
	MaxConcurrentQueries int                `json:"max_concurrent_queries"`
	UserConfig           json.RawMessage    `json:"user_config"`
	AutoscalingConfig    *autoscalingConfig `json:"autoscaling_config"`
	RayActorOptions      *rayActorOptions   `json:"ray_actor_options"`
}

type autoscalingConfig struct {
	MinReplicas                        *int     `json:"min_replicas"`
	MaxReplicas                        *int     `json:"max_replicas"`
	InitialReplicas                    *int     `json:"initial_replicas"`
	TargetOngoingRequests              *float64 `json:"target_ongoing_requests"`
	TargetNumOngoingRequestsPerReplica *float64 `json:"target_num_ongoing_requests_per_replica"`
	UpscaleDelayS                      float64  `json:"upscale_delay_s"`
	DownscaleDelayS                    float64  `json:"downscale_delay_s"`
	DownscaleToZeroDelayS              float64  `json:"downscale_to_zero_delay_s"`
	MetricsIntervalS                   float64  `json:"metrics_interval_s"`
	LookBackPeriodS                    float64  `json:"look_back_period_s"`
}

type rayActorOptions struct {
	NumCPUs    *float64           `json:"num_cpus"`
	NumGPUs    float64            `json:"num_gpus"`
	Memory     float64            `json:"memory"`
	Resources  map[string]float64 `json:"resources"`
	RuntimeEnv *runtimeEnv        `json:"runtime_env"`
}

// The keys each level has an equivalent for; any other is a note.
var known = map[string][]string{
	"":                  {"http_options", "applications"},
	"http_options":      {"request_timeout_s"},
	"application":       {"name", "route_prefix", "import_path", "runtime_env", "deployments"},
	"runtime_env":       {"working_dir", "env_vars"},
	"deployment":        {"name", "num_replicas", "max_ongoing_requests", "max_concurrent_queries", "user_config", "autoscaling_config", "ray_actor_options"},
	"autoscaling":       {"min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests", "target_num_ongoing_requests_per_replica", "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s", "metrics_interval_s", "look_back_period_s"},
	"ray_actor_options": {"num_cpus", "num_gpus", "memory", "resources", "runtime_env"},
}

// hints say, of settings servemesh has no equivalent for, what does their
// work instead.
var hints = map[string]string{
	"proxy_location":              "every node's Envoy serves the endpoints, at its --public address",
	"host":                        "each node's --public sets where it listens",
	"port":                        "each node's --public sets where it listens",
	"pip":                         "install the packages into the replicas' Python",
	"conda":                       "install the packages into the replicas' Python",
	"py_modules":                  "name their folders with --path",
	"health_check_period_s":       "the agent probes the runtime's health path itself",
	"health_check_timeout_s":      "the agent probes the runtime's health path itself",
	"graceful_shutdown_timeout_s": "the agent's --stop-grace bounds a replica's shutdown, and the runtime finishes requests in flight",
	"max_queued_requests":         "a node holds requests while no replica is ready (hold_timeout_s, max_held)",
	"args":                        "the runtime makes each class with no arguments; read settings from user_config",
	"logging_config":              "each replica's output goes to its log, which `servemesh logs` reads",
	"accelerator_type":            "offer the device as a node's --resource and ask for it by name",
}

// Convert reads a Ray Serve config file into a servemesh spec, with a note
// for each setting servemesh has no equivalent for, or a choice it made.
func Convert(doc []byte, o Options) (*meshspec.Spec, []string, error) {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("the Ray Serve config: %w", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, nil, fmt.Errorf("the Ray Serve config is not a mapping: %w", err)
	}
	var c config
	dec := json.NewDecoder(bytes.NewReader(js))
	if err := dec.Decode(&c); err != nil {
		return nil, nil, fmt.Errorf("the Ray Serve config: %w", err)
	}
	if len(c.Applications) == 0 {
		return nil, nil, errors.New("the Ray Serve config's applications: none; list at least one")
	}
	cv := converter{o: o, notes: unknownKeys(raw)}
	if cv.o.Python == "" {
		cv.o.Python = DefaultPython
	}
	spec := &meshspec.Spec{}
	for i, app := range c.Applications {
		bs, es, err := cv.application(i, app, c.HTTPOptions)
		if err != nil {
			return nil, nil, err
		}
		spec.Backends = append(spec.Backends, bs...)
		spec.Endpoints = append(spec.Endpoints, es...)
	}
	return spec, cv.notes, nil
}

type converter struct {
	o     Options
	notes []string
}

func (cv *converter) note(format string, args ...any) {
	cv.notes = append(cv.notes, fmt.Sprintf(format, args...))
}

func (cv *converter) application(i int, app application, http *httpOptions) ([]meshspec.BackendSpec, []meshspec.Endpoint, error) {
	at := fmt.Sprintf("applications[%d]", i)
	if app.Name == "" {
		app.Name = "default"
	}
	module, attr, ok := strings.Cut(app.ImportPath, ":")
	if !ok || module == "" || attr == "" {
		module, attr, ok = cutLastDot(app.ImportPath)
		if !ok {
			return nil, nil, fmt.Errorf("%s.import_path %q: want module:attribute (module.attribute), as Ray Serve's", at, app.ImportPath)
		}
	}
	if len(app.Deployments) == 0 {
		return nil, nil, fmt.Errorf("%s (%s).deployments: none; servemesh runs the deployments the file lists, each a class of %s named as the deployment", at, app.Name, module)
	}
	dir, err := cv.moduleDir(at, app.RuntimeEnv)
	if err != nil {
		return nil, nil, err
	}
	ingress := len(app.Deployments) - 1
	if j := slices.IndexFunc(app.Deployments, func(d deployment) bool { return d.Name == attr }); j >= 0 {
		ingress = j
	} else if len(app.Deployments) > 1 {
		cv.note("%s (%s): its ingress is taken as deployment %s, the last listed (as serve build writes them; import_path naming a deployment chooses it); the others are headless endpoints, called with servemesh.get_handle",
			at, app.Name, app.Deployments[ingress].Name)
	}
	var backends []meshspec.BackendSpec
	var endpoints []meshspec.Endpoint
	for j, d := range app.Deployments {
		b, err := cv.backend(fmt.Sprintf("%s.deployments[%d]", at, j), app, module, dir, d)
		if err != nil {
			return nil, nil, err
		}
		backends = append(backends, b)
		if j != ingress {
			endpoints = append(endpoints, meshspec.Endpoint{Name: b.Name, Methods: AllMethods, Traffic: map[string]float64{b.Name: 1}})
		}
	}
	e := meshspec.Endpoint{Name: name(app.Name), Methods: AllMethods, Traffic: map[string]float64{backends[ingress].Name: 1}}
	if app.RoutePrefix != nil {
		e.Route = *app.RoutePrefix
	} else {
		cv.note("%s (%s): no route_prefix: its endpoint is headless, reached in the mesh only", at, app.Name)
	}
	if http != nil {
		e.TimeoutS = http.RequestTimeoutS
	}
	return backends, append([]meshspec.Endpoint{e}, endpoints...), nil
}

func (cv *converter) moduleDir(at string, env *runtimeEnv) (string, error) {
	dir := cv.o.Dir
	if env == nil || env.WorkingDir == "" {
		return dir, nil
	}
	if strings.Contains(env.WorkingDir, "://") {
		cv.note("%s.runtime_env.working_dir %q: servemesh does not fetch code; the replicas read their modules from %s (copy them there, or run from a local folder)", at, env.WorkingDir, dir)
		return dir, nil
	}
	if filepath.IsAbs(env.WorkingDir) {
		return env.WorkingDir, nil
	}
	return filepath.Join(dir, env.WorkingDir), nil
}

func (cv *converter) backend(at string, app application, module, dir string, d deployment) (meshspec.BackendSpec, error) {
	if d.Name == "" {
		return meshspec.BackendSpec{}, fmt.Errorf("%s.name: empty; name each deployment", at)
	}
	args := []string{"-m", "servemesh.replica"}
	if cv.o.Runtime != "" {
		args = []string{cv.o.Runtime}
	}
	paths := append([]string{dir}, cv.o.Paths...)
	env := map[string]string{}
	for _, e := range []*runtimeEnv{app.RuntimeEnv, actorEnv(d.RayActorOptions)} {
		if e == nil {
			continue
		}
		for k, v := range e.EnvVars {
			if k == "PYTHONPATH" {
				paths = append(paths, filepath.SplitList(v)...)
				cv.note("%s: env_vars PYTHONPATH becomes the replicas' --path folders (servemesh refuses PYTHONPATH in a backend's env)", at)
				continue
			}
			env[k] = v
		}
	}
	for _, p := range paths {
		args = append(args, "--path", p)
	}
	args = append(args, "--host", "${HOST}", "--port", "${PORT}", module+":"+d.Name)
	b := meshspec.BackendSpec{Name: name(app.Name + "-" + d.Name),
		Process: &meshspec.ProcessSpec{Command: cv.o.Python, Args: args, HealthPath: "/-/healthz", ReconfigurePath: "/-/reconfigure"}}
	if len(env) > 0 {
		b.Process.Env = env
	}
	config, err := cv.config(at, d)
	if err != nil {
		return meshspec.BackendSpec{}, err
	}
	b.Config = config
	return b, nil
}

func actorEnv(o *rayActorOptions) *runtimeEnv {
	if o == nil {
		return nil
	}
	return o.RuntimeEnv
}

func (cv *converter) config(at string, d deployment) (meshspec.BackendConfig, error) {
	c := meshspec.BackendConfig{CPUs: 1, MaxConcurrentQueries: max(d.MaxOngoingRequests, d.MaxConcurrentQueries)}
	switch n := strings.TrimSpace(string(d.NumReplicas)); n {
	case "", "null":
		if d.AutoscalingConfig == nil {
			c.NumReplicas = 1
		}
	case `"auto"`:
		c.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 100, TargetInFlight: 2}
	default:
		if err := json.Unmarshal(d.NumReplicas, &c.NumReplicas); err != nil || c.NumReplicas < 0 {
			return c, fmt.Errorf("%s.num_replicas %s: want a count, or \"auto\"", at, n)
		}
	}
	if a := d.AutoscalingConfig; a != nil {
		c.NumReplicas, c.Autoscaling = 0, autoscaling(*a)
	}
	if len(d.UserConfig) > 0 && string(d.UserConfig) != "null" {
		if err := c.UserConfig.UnmarshalJSON(d.UserConfig); err != nil {
			return c, fmt.Errorf("%s.user_config: %w", at, err)
		}
	}
	if o := d.RayActorOptions; o != nil {
		cv.actorOptions(at, o, &c)
	}
	return c, nil
}

func autoscaling(a autoscalingConfig) *meshspec.AutoscalingConfig {
	out := &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 1, TargetInFlight: 2, UpscaleDelayS: a.UpscaleDelayS, DownscaleDelayS: a.DownscaleDelayS,
		DownscaleToZeroDelayS: a.DownscaleToZeroDelayS, MetricsIntervalS: a.MetricsIntervalS, LookBackPeriodS: a.LookBackPeriodS}
	if a.MinReplicas != nil {
		out.MinReplicas = *a.MinReplicas
	}
	if a.MaxReplicas != nil {
		out.MaxReplicas = *a.MaxReplicas
	}
	if a.InitialReplicas != nil {
		out.InitialReplicas = *a.InitialReplicas
	}
	for _, t := range []*float64{a.TargetNumOngoingRequestsPerReplica, a.TargetOngoingRequests} {
		if t != nil {
			out.TargetInFlight = *t
		}
	}
	return out
}

func (cv *converter) actorOptions(at string, o *rayActorOptions, c *meshspec.BackendConfig) {
	if o.NumCPUs != nil {
		c.CPUs = *o.NumCPUs
	}
	if o.Memory > 0 {
		c.MemoryMB = int(math.Ceil(o.Memory / (1 << 20)))
	}
	resources := map[string]float64{}
	for k, v := range o.Resources {
		resources[k] = v
	}
	if o.NumGPUs > 0 {
		resources["gpu"] = o.NumGPUs
	}
	for _, k := range slices.Sorted(maps.Keys(resources)) {
		v := resources[k]
		if c.Resources == nil {
			c.Resources = map[string]int{}
		}
		c.Resources[k] = int(math.Ceil(v))
		if float64(c.Resources[k]) != v {
			cv.note("%s.ray_actor_options: %g of resource %s becomes %d: servemesh gives each replica whole devices", at, v, k, c.Resources[k])
		}
	}
}

// unknownKeys notes every key of raw servemesh has no equivalent for.
func unknownKeys(raw map[string]any) []string {
	var notes []string
	check := func(at, level string, m map[string]any) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if !slices.Contains(known[level], k) {
				note := fmt.Sprintf("%s%s: servemesh has no equivalent; left out", at, k)
				if hint := hints[k]; hint != "" {
					note += " (" + hint + ")"
				}
				notes = append(notes, note)
			}
		}
	}
	check("", "", raw)
	if h, ok := raw["http_options"].(map[string]any); ok {
		check("http_options.", "http_options", h)
	}
	apps, _ := raw["applications"].([]any)
	for i, a := range apps {
		app, _ := a.(map[string]any)
		at := fmt.Sprintf("applications[%d].", i)
		check(at, "application", app)
		if env, ok := app["runtime_env"].(map[string]any); ok {
			check(at+"runtime_env.", "runtime_env", env)
		}
		deps, _ := app["deployments"].([]any)
		for j, d := range deps {
			dep, _ := d.(map[string]any)
			dat := fmt.Sprintf("%sdeployments[%d].", at, j)
			check(dat, "deployment", dep)
			if as, ok := dep["autoscaling_config"].(map[string]any); ok {
				check(dat+"autoscaling_config.", "autoscaling", as)
			}
			if ao, ok := dep["ray_actor_options"].(map[string]any); ok {
				check(dat+"ray_actor_options.", "ray_actor_options", ao)
				if env, ok := ao["runtime_env"].(map[string]any); ok {
					check(dat+"ray_actor_options.runtime_env.", "runtime_env", env)
				}
			}
		}
	}
	return notes
}

var invalid = regexp.MustCompile(`[^a-z0-9._-]+`)

// name is s as a servemesh name: lowercase, other characters dashes.
func name(s string) string {
	return strings.Trim(invalid.ReplaceAllString(strings.ToLower(s), "-"), "-._")
}

func cutLastDot(s string) (string, string, bool) {
	i := strings.LastIndex(s, ".")
	if i <= 0 || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
