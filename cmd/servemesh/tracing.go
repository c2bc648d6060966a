package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/meshspec"
)

// newTracingCommand reads and changes the mesh's tracing.
func newTracingCommand() *cobra.Command {
	var f clientFlags
	var t meshspec.Tracing
	var sampling float64
	set := &cobra.Command{
		Use:   "set --collector HOST:PORT",
		Short: "trace the mesh's requests: every node's Envoy sends spans to an OTLP/gRPC collector (a new collector needs the exec scope)",
		Example: "  servemesh tracing set --collector 127.0.0.1:4317 --sampling 1\n" +
			"  servemesh endpoint create chat --route /chat --backend model-v1 --trace-sampling 100",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("sampling") {
				t.SamplingPercent = &sampling
			}
			changed, err := c.SetTracing(cmd.Context(), &t)
			return report(cmd, "mesh", "tracing", changed, err, fmt.Sprintf("sends spans to %s, sampling %g%%", t.Collector, t.Sampling()), "is so already")
		},
	}
	set.Flags().StringVar(&t.Collector, "collector", "", "host:port of the OTLP/gRPC collector (Jaeger v2, the OpenTelemetry Collector)")
	set.Flags().Float64Var(&sampling, "sampling", meshspec.DefaultSamplingPercent, "percent of the requests traced that come with no trace decision (an endpoint's --trace-sampling overrides it)")
	get := &cobra.Command{
		Use:   "get",
		Short: "show where the mesh sends its spans and how many requests it traces",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			got, err := c.Tracing(cmd.Context())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "COLLECTOR\tSAMPLING\n%s\t%g%%\n", got.Collector, got.Sampling())
			return err
		},
	}
	off := &cobra.Command{
		Use:   "off",
		Short: "stop tracing the mesh's requests (endpoints that set their own sampling refuse it until theirs is removed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := c.SetTracing(cmd.Context(), nil)
			return report(cmd, "mesh", "tracing", changed, err, "is off", "is off already")
		},
	}
	return nounCommand("tracing", "trace the mesh's requests with OpenTelemetry: where spans go and how many requests are traced", &f, set, get, off)
}
