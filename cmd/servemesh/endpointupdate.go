package main

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

// newEndpointUpdateCommand changes an endpoint's fields in place (PATCH
// /v1/endpoints/{name}): only the flags given, in one change.
func newEndpointUpdateCommand(f *clientFlags) *cobra.Command {
	var route, methods, criticality string
	var priority int
	var traceSampling float64
	var timeout, idle, perTry time.Duration
	var wait waitFlags
	c := &cobra.Command{
		Use:   "update NAME",
		Short: "change an endpoint in place: its route, methods, timeouts, criticality, priority or trace sampling (its traffic: servemesh traffic set)",
		Example: "  servemesh endpoint update chat --route /v2/chat --methods POST\n" +
			"  servemesh endpoint update chat --timeout 0      # no bound on a request again",
		Args:              names(1, "one endpoint name"),
		ValidArgsFunction: completeKind("endpoint", f),
		RunE: func(cmd *cobra.Command, args []string) error {
			patch := map[string]any{}
			set := func(flag, field string, value any) {
				if cmd.Flags().Changed(flag) {
					patch[field] = value
				}
			}
			set("route", "route", route)
			set("methods", "methods", strings.Split(methods, ","))
			set("criticality", "criticality", criticality)
			set("priority", "priority", priority)
			set("timeout", "timeout_s", timeout.Seconds())
			set("idle-timeout", "idle_timeout_s", idle.Seconds())
			set("per-try-timeout", "per_try_timeout_s", perTry.Seconds())
			set("trace-sampling", "tracing", map[string]any{"sampling_percent": traceSampling})
			if len(patch) == 0 {
				return errors.New("name at least one field to change: --route, --methods, --timeout, --idle-timeout, --per-try-timeout, --criticality, --priority or --trace-sampling")
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.PatchEndpoint(cmd.Context(), args[0], patch)
			if err := report(cmd, "endpoint", args[0], changed, err, "updated", "already has these fields"); err != nil {
				return err
			}
			return wait.waitServed(cmd, c, nil, api.ServedQuery{Endpoints: []string{args[0]}})
		},
	}
	fs := c.Flags()
	fs.StringVar(&route, "route", "", "the HTTP path it serves, with its sub-paths (\"\": headless)")
	fs.StringVar(&methods, "methods", "", "comma-separated HTTP methods")
	fs.DurationVar(&timeout, "timeout", 0, "bound on a request, retries included (0: none)")
	fs.DurationVar(&idle, "idle-timeout", 0, "end a request when nothing moved for this long (0: Envoy's 5m)")
	fs.DurationVar(&perTry, "per-try-timeout", 0, "bound on each try (0: none)")
	fs.StringVar(&criticality, "criticality", "", "critical or sheddable")
	fs.IntVar(&priority, "priority", 0, "its requests' priority while a load-aware backend's replicas are saturated")
	fs.Float64Var(&traceSampling, "trace-sampling", 0, "percent of its requests traced that come with no trace decision")
	wait.register(fs)
	return c
}
