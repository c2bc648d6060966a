package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
)

// runStatus shows per endpoint the live request and error rate of each
// backend next to its configured weight, each backend's replicas, and per
// node whether its Envoy runs the latest config.
func runStatus(ctx context.Context, _ *slog.Logger, args []string, out io.Writer) error {
	var o ctlOptions
	fs := newFlags("status", "[flags]")
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	r, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if o.output == "json" {
		return writeJSONOut(out, r)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tROUTE\tBACKEND\tWEIGHT\tSHADOW\tREQ/S\tERR/S")
	for _, e := range r.Endpoints {
		for i, b := range e.Backends {
			name, route := e.Name, orNone(e.Route)
			if i > 0 {
				name, route = "", ""
			}
			shadow := "-"
			if b.Shadow > 0 {
				shadow = fmt.Sprintf("%g", b.Shadow)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%s\t%.1f\t%.1f\n", name, route, b.Backend, b.Weight, shadow, b.RequestRate, b.ErrorRate)
		}
	}
	fmt.Fprintln(tw, "\nBACKEND\tREPLICAS (RUNNING/DESIRED)\tDRAINING\tAUTOSCALED\tIN FLIGHT\tREQ/S\tERR/S")
	for _, b := range r.Backends {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%v\t%.0f\t%.1f\t%.1f\n", b.Name, b.Running, b.Desired, b.Draining, b.Autoscaled, b.InFlight, b.RequestRate, b.ErrorRate)
	}
	fmt.Fprintln(tw, "\nNODE\tCONNECTED\tLATEST CONFIG\tNACKS")
	for _, n := range r.Nodes {
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\n", n.ID, n.Connected, n.InSync, n.NACKs)
	}
	return tw.Flush()
}
