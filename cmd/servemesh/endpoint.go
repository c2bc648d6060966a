package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

func newEndpointCommand() *cobra.Command {
	var f clientFlags
	return nounCommand("endpoint", "create, update, delete, list and get endpoints", &f,
		newEndpointCreateCommand(&f),
		newEndpointUpdateCommand(&f),
		deleteCommand("endpoint", &f, (*api.Client).DeleteEndpoint),
		listCommand("endpoint", &f, (*api.Client).ListEndpoints, endpointColumns),
		getCommand("endpoint", &f, (*api.Client).GetEndpoint, endpointColumns))
}

func newEndpointCreateCommand(f *clientFlags) *cobra.Command {
	var route, methods, backend, traffic, criticality string
	var priority int
	var traceSampling float64
	var limits rateLimitFlags
	var timeout, idle, perTry time.Duration
	var wait waitFlags
	c := &cobra.Command{
		Use:   "create NAME",
		Short: "create an endpoint: a route (or none: headless), its traffic and its timeouts",
		Args:  names(1, "one endpoint name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			e := meshspec.Endpoint{Name: args[0], Route: route, Criticality: meshspec.Criticality(criticality), Priority: priority,
				TimeoutS: timeout.Seconds(), IdleTimeoutS: idle.Seconds(), PerTryTimeoutS: perTry.Seconds()}
			if methods != "" {
				e.Methods = strings.Split(methods, ",")
			}
			if cmd.Flags().Changed("trace-sampling") {
				e.Tracing = &meshspec.EndpointTracing{SamplingPercent: traceSampling}
			}
			var err error
			if e.RateLimit, err = limits.limit(); err != nil {
				return err
			}
			switch {
			case backend != "" && traffic != "":
				return errors.New("give --backend or --traffic, not both")
			case backend != "":
				e.Traffic = map[string]float64{backend: 1}
			case traffic != "":
				if e.Traffic, err = parseWeights(strings.Split(traffic, ",")); err != nil {
					return err
				}
			default:
				return errors.New("an endpoint needs traffic: give --backend NAME or --traffic b1=0.9,b2=0.1")
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.CreateEndpoint(cmd.Context(), e)
			if err := report(cmd, "endpoint", e.Name, changed, err, "created", "already exists with this spec"); err != nil {
				return err
			}
			return wait.waitServed(cmd, c, nil, api.ServedQuery{Endpoints: []string{e.Name}})
		},
	}
	fs := c.Flags()
	fs.StringVar(&route, "route", "", "the HTTP path it serves, with its sub-paths (none: headless)")
	fs.StringVar(&methods, "methods", "", "comma-separated HTTP methods (default GET)")
	fs.StringVar(&backend, "backend", "", "send all traffic to this backend")
	fs.StringVar(&traffic, "traffic", "", "weights, as b1=0.9,b2=0.1 (instead of --backend)")
	fs.DurationVar(&timeout, "timeout", 0, "bound on a request, retries included, such as 30s (default: none, as a long generation needs)")
	fs.DurationVar(&idle, "idle-timeout", 0, "end a request when nothing moved for this long, such as 1m (default: Envoy's 5m)")
	fs.StringVar(&criticality, "criticality", "", "what its requests are when they carry no "+meshspec.CriticalityHeader+" header: critical (the default) or sheddable (refused with 429 while a load-aware backend's replicas are saturated)")
	fs.IntVar(&priority, "priority", 0, "its requests' priority while a load-aware backend's replicas are saturated, and the most they may ask for with "+meshspec.PriorityHeader+": higher first, below 0 sheddable (default: 0, or -1 when sheddable)")
	fs.DurationVar(&perTry, "per-try-timeout", 0, "bound on each try; a GET whose try runs out is retried on another replica (default: none)")
	fs.Float64Var(&traceSampling, "trace-sampling", 0, "percent of its requests traced that come with no trace decision, instead of the mesh's (servemesh tracing set)")
	limits.add(fs)
	wait.register(fs)
	return c
}

func newTrafficCommand() *cobra.Command {
	var f clientFlags
	var wait waitFlags
	var model string
	set := &cobra.Command{
		Use:               "set ENDPOINT BACKEND=WEIGHT...",
		ValidArgsFunction: completeSplit(&f),
		Short:             "set an endpoint's traffic split",
		Example:           "  servemesh traffic set model model-v1=0.9 model-v2=0.1\n  servemesh traffic set chat --model mistral-7b mistral=0.5 mistral-v2=0.5   # one model's split",
		Args:              cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			weights, err := parseWeights(args[1:])
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.SetModelTraffic(cmd.Context(), args[0], model, weights)
			if err := report(cmd, "endpoint", args[0], changed, err, "traffic set", "already has this traffic"); err != nil {
				return err
			}
			return wait.waitServed(cmd, c, nil, api.ServedQuery{Endpoints: []string{args[0]}})
		},
	}
	wait.register(set.Flags())
	set.Flags().StringVar(&model, "model", "", "for an endpoint routed by model: the model whose split this is")
	get := &cobra.Command{
		Use:               "get ENDPOINT",
		ValidArgsFunction: completeKind("endpoint", &f),
		Short:             "show an endpoint's traffic split and shadows (by model, for an endpoint routed by model)",
		Example:           "  servemesh traffic get model\n  servemesh traffic get model -o yaml",
		Args:              names(1, "one endpoint name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			e, err := c.GetEndpoint(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			split := trafficSplitOf(e)
			if done, err := f.structured(cmd.OutOrStdout(), split); done {
				return err
			}
			return writeTable(cmd.OutOrStdout(), "MODEL\tBACKEND\tWEIGHT\tSHADOW", split.rows(), func(r splitRow) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s", orNone(r.model), r.backend, r.weight, r.shadow)
			})
		},
	}
	return nounCommand("traffic", "set and show an endpoint's traffic split", &f, set, get)
}

// trafficSplit is what `traffic get` shows: an endpoint's traffic and
// shadows, or each model's, as the API stores them.
type trafficSplit struct {
	Endpoint string                            `json:"endpoint"`
	Traffic  map[string]float64                `json:"traffic,omitempty"`
	Shadows  map[string]float64                `json:"shadows,omitempty"`
	Models   map[string]meshspec.TrafficPolicy `json:"models,omitempty"`
}

func trafficSplitOf(e meshspec.Endpoint) trafficSplit {
	out := trafficSplit{Endpoint: e.Name, Traffic: e.Traffic, Shadows: e.Shadows}
	if e.ModelRouting != nil {
		out.Models = e.ModelRouting.Models
	}
	return out
}

// splitRow is one backend of a split: its weight and the proportion of the
// requests mirrored to it ("-" for none of either).
type splitRow struct{ model, backend, weight, shadow string }

func (s trafficSplit) rows() []splitRow {
	if s.Models == nil {
		return policyRows("", s.Traffic, s.Shadows)
	}
	var out []splitRow
	for _, model := range meshspec.SortedKeys(s.Models) {
		out = append(out, policyRows(model, s.Models[model].Traffic, s.Models[model].Shadows)...)
	}
	return out
}

func policyRows(model string, traffic, shadows map[string]float64) []splitRow {
	backends := map[string]bool{}
	for b := range traffic {
		backends[b] = true
	}
	for b := range shadows {
		backends[b] = true
	}
	rows := make([]splitRow, 0, len(backends))
	for _, b := range meshspec.SortedKeys(backends) {
		r := splitRow{model: model, backend: b, weight: "-", shadow: "-"}
		if w, ok := traffic[b]; ok {
			r.weight = fmt.Sprintf("%g", w)
		}
		if p, ok := shadows[b]; ok {
			r.shadow = fmt.Sprintf("%g", p)
		}
		rows = append(rows, r)
	}
	return rows
}

func newShadowCommand() *cobra.Command {
	var f clientFlags
	var wait waitFlags
	set := &cobra.Command{
		Use:               "set ENDPOINT BACKEND=PROPORTION",
		ValidArgsFunction: completeSplit(&f),
		Short:             "mirror a proportion of an endpoint's requests to a backend (0 removes the shadow)",
		Example:           "  servemesh shadow set model model-v3=0.05",
		Args:              cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parseWeights(args[1:])
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			backend, proportion := firstPair(p)
			changed, err := c.SetShadow(cmd.Context(), args[0], backend, proportion)
			did, same := fmt.Sprintf("shadow to %s set to %g", backend, proportion), "already has this shadow"
			if proportion == 0 {
				did, same = "shadow to "+backend+" removed", "has no shadow to "+backend
			}
			if err := report(cmd, "endpoint", args[0], changed, err, did, same); err != nil {
				return err
			}
			return wait.waitServed(cmd, c, nil, api.ServedQuery{Endpoints: []string{args[0]}})
		},
	}
	wait.register(set.Flags())
	return nounCommand("shadow", "mirror a proportion of an endpoint's requests", &f, set)
}

// firstPair returns the one pair of a one-entry map.
func firstPair(m map[string]float64) (string, float64) {
	for k, v := range m {
		return k, v
	}
	return "", 0
}

// endpointColumns render endpoints for list and get; -o wide adds their
// priority, rate limits, match rules and tracing.
var endpointColumns = columns[meshspec.Endpoint]{
	header: "NAME\tROUTE\tMETHODS\tTRAFFIC\tSHADOWS\tTIMEOUTS", row: endpointRow,
	wideHeader: "CRITICALITY/PRIORITY\tRATE_LIMITS\tMATCH_RULES\tTRACING", wideRow: endpointWideRow,
}

func endpointRow(e meshspec.Endpoint) string {
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", e.Name, orNone(e.Route), strings.Join(e.AllowedMethods(), ","),
		trafficOf(e), orNone(shadowsOf(e)), timeouts(e))
}

func endpointWideRow(e meshspec.Endpoint) string {
	var limits []string
	if rl := e.RateLimit; rl != nil {
		if rl.Local != nil {
			limits = append(limits, "local")
		}
		if rl.Global != nil {
			limits = append(limits, "global")
		}
		if rl.Tokens != nil {
			limits = append(limits, "tokens")
		}
	}
	tracing := "-"
	if e.Tracing != nil {
		tracing = fmt.Sprintf("%g%%", e.Tracing.SamplingPercent)
	}
	return fmt.Sprintf("%s/%d\t%s\t%d\t%s", e.EffectiveCriticality(), e.Priority, orNone(strings.Join(limits, ",")), len(e.Match), tracing)
}

// trafficOf is an endpoint's split: its traffic, or, for an endpoint
// routed by the model its requests name, each model's split
// ("model mistral-7b: llm-a=1; model llama-3: ...").
func trafficOf(e meshspec.Endpoint) string {
	if e.ModelRouting == nil {
		return formatWeights(e.Traffic)
	}
	return byModel(e.ModelRouting, func(p meshspec.TrafficPolicy) string { return formatWeights(p.Traffic) })
}

// shadowsOf is an endpoint's shadows, by model where it is routed by model.
func shadowsOf(e meshspec.Endpoint) string {
	if e.ModelRouting == nil {
		return formatWeights(e.Shadows)
	}
	return byModel(e.ModelRouting, func(p meshspec.TrafficPolicy) string { return formatWeights(p.Shadows) })
}

// byModel renders what of each model's policy part gives, in model order,
// leaving out models where it gives nothing.
func byModel(r *meshspec.ByModel, part func(meshspec.TrafficPolicy) string) string {
	var out []string
	for _, model := range meshspec.SortedKeys(r.Models) {
		if s := part(r.Models[model]); s != "" {
			out = append(out, "model "+model+": "+s)
		}
	}
	return strings.Join(out, "; ")
}

// timeouts renders an endpoint's timeouts: "120s, idle 30s, try 60s", or "-".
func timeouts(e meshspec.Endpoint) string {
	var parts []string
	for _, t := range []struct {
		label string
		s     float64
	}{{"", e.TimeoutS}, {"idle ", e.IdleTimeoutS}, {"try ", e.PerTryTimeoutS}} {
		if t.s > 0 {
			parts = append(parts, t.label+(time.Duration(t.s*float64(time.Second))).String())
		}
	}
	return orNone(strings.Join(parts, ", "))
}
