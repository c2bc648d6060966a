package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

func newStatusCommand() *cobra.Command {
	var f clientFlags
	var w watchFlags
	c := &cobra.Command{
		Use:     "status",
		Short:   "show live request and error rates next to the weights, replicas, and each node's config",
		Example: "  servemesh status\n  servemesh status -w        # read again every 2s until Ctrl-C",
		Args:    names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			return w.run(cmd, func(out io.Writer) error {
				r, err := c.Status(cmd.Context())
				if err != nil {
					return err
				}
				if done, err := f.structured(out, r); done {
					return err
				}
				return printStatus(out, r)
			})
		},
	}
	addClientFlags(c, &f)
	w.register(c.Flags())
	return c
}

// printStatus renders the report: per endpoint each backend's weight next to
// its live rates, each backend's replicas, and per node whether its Envoy
// runs the latest config.
func printStatus(out io.Writer, r api.StatusReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "(rates per second over the last %gs)\n\n", r.RateWindowS)
	fmt.Fprintln(tw, "ENDPOINT\tROUTE\tREQ/S\tBACKEND\tWEIGHT\tSHADOW (SET/SEEN)\tREQ/S\tERR/S")
	for _, e := range r.Endpoints {
		for i, b := range e.Backends {
			name, route, rate := e.Name, orNone(e.Route), fmt.Sprintf("%.1f", e.RequestRate)
			if i > 0 {
				name, route, rate = "", "", ""
			}
			shadow := "-"
			if b.Shadow > 0 {
				seen := "?"
				if b.ShadowShare != nil {
					seen = fmt.Sprintf("%.2f", *b.ShadowShare)
				}
				shadow = fmt.Sprintf("%g/%s", b.Shadow, seen)
			}
			backend := b.Backend
			if b.Model != "" {
				backend = fmt.Sprintf("%s (model %s)", b.Backend, b.Model)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%.1f\t%.1f\n", name, route, rate, backend, b.Weight, shadow, b.RequestRate, b.ErrorRate)
		}
	}
	printRolloutRows(tw, r)
	printRateLimitRows(tw, r)
	fmt.Fprintln(tw, "\nBACKEND\tREPLICAS (READY/RUNNING/DESIRED)\tDRAINING\tRESTARTS\tAUTOSCALED\tIN FLIGHT\tHELD\tREQ/S\tERR/S")
	for _, b := range r.Backends {
		restarts := 0
		for _, rep := range b.Replicas {
			restarts += rep.Restarts
		}
		fmt.Fprintf(tw, "%s\t%d/%d/%d\t%d\t%d\t%v\t%.0f\t%.0f\t%.1f\t%.1f\n", b.Name, b.Ready, b.Running, b.Desired, b.Draining, restarts, b.Autoscaled, b.InFlight, b.Held, b.RequestRate, b.ErrorRate)
	}
	fmt.Fprintf(tw, "\nNODE\tCONNECTED\tLATEST CONFIG\tNACKS\tSTATE\tVERSION (controller %s, protocol %d)\n", orNone(r.Version), r.Protocol)
	for _, n := range r.Nodes {
		state := "ready"
		switch {
		case n.Drained:
			state = "drained"
		case n.Cordoned:
			state = "cordoned"
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%s\t%s (protocol %d)\n", n.ID, n.Connected, n.InSync, n.NACKs, state, orNone(n.Version), n.Protocol)
	}
	if len(r.Problems) > 0 {
		fmt.Fprintln(tw, "\nPROBLEMS")
		for _, p := range r.Problems {
			fmt.Fprintln(tw, p)
		}
	}
	return tw.Flush()
}

// printRateLimitRows lists the endpoints' rate limits, if any: a row for
// each limit, local (a bucket on each node) or global (one count across
// the mesh), what it counts by and, for a global one, what a node does
// while it cannot check it.
func printRateLimitRows(tw io.Writer, r api.StatusReport) {
	header := false
	row := func(format string, args ...any) {
		if !header {
			fmt.Fprintln(tw, "\nENDPOINT\tRATE LIMIT\tWHERE\tBURST\tPER\tIF UNCHECKED")
			header = true
		}
		fmt.Fprintf(tw, format, args...)
	}
	for _, e := range r.Endpoints {
		l := e.RateLimit
		if l == nil {
			continue
		}
		if l.Local != nil {
			row("%s\t%d/s\teach node\t%d\t%s\t-\n", e.Name, l.Local.RequestsPerSecond, l.Local.EffectiveBurst(), limitKey(l.Local.Header, false))
		}
		if g := l.Global; g != nil {
			row("%s\t%d/%s\tmesh\t-\t%s\t%s\n", e.Name, g.Requests, g.EffectiveUnit(), limitKey(g.Header, g.ClientAddress), failureMode(g.Closed()))
		}
		if q := l.Tokens; q != nil {
			row("%s\t%d tokens/%s\tmesh\t-\t%s\t%s\n", e.Name, q.Tokens, q.EffectiveUnit(), limitKey(q.Header, false), failureMode(q.Closed()))
		}
	}
}

// limitKey says what a limit counts by.
func limitKey(header string, clientAddress bool) string {
	switch {
	case header != "":
		return "value of " + header
	case clientAddress:
		return "client address"
	}
	return "endpoint"
}

// failureMode says what a node does with a global limit's requests while
// its rate limit service cannot answer.
func failureMode(closed bool) string {
	if closed {
		return "refuse (closed)"
	}
	return "let through (open)"
}

// printRolloutRows lists the endpoints' rollouts, if any: stage and live
// figures, or how each ended.
func printRolloutRows(tw io.Writer, r api.StatusReport) {
	header := false
	for _, e := range r.Endpoints {
		ro := e.Rollout
		if ro == nil {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "\nROLLOUT\tCANDIDATE\tPHASE\tSTAGE\tANSWERS\tERRORS\tLATENCY (CANDIDATE/PRIMARY)\tREASON")
			header = true
		}
		answers, errs, lat := "-", "-", "-"
		if l := ro.Live; l != nil {
			answers = fmt.Sprintf("%d/%d", l.Candidate.Requests, l.Primary.Requests)
			errs = fmt.Sprintf("%.2f%%/%.2f%%", 100*l.Candidate.ErrorRate, 100*l.Primary.ErrorRate)
			lat = fmt.Sprintf("%.1f/%.1f ms", l.Candidate.LatencyMs, l.Primary.LatencyMs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, ro.Candidate, ro.Phase, orNone(ro.Stage), answers, errs, lat, orNone(ro.Reason))
	}
}
