package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

func newStatusCommand() *cobra.Command {
	var f clientFlags
	var w watchFlags
	c := &cobra.Command{
		Use:     "status",
		Short:   "show live request and error rates next to the weights, replicas, and each node's config",
		Long:    "Show live request and error rates next to the weights, replicas, and each node's config.\n\n" + statusLegend,
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
				if strings.Contains(f.server, ",") {
					// In HA each controller knows only the nodes connected
					// to it; those it cannot read stay as the report has them.
					api.MergeNodes(&r, c.NodesOfEach(cmd.Context()))
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

// statusLegend explains status's columns (status --help).
const statusLegend = `Columns:
  REQ/S, ERR/S        requests and 5xx answers a second, over the window named on top; a "?" after a
                      figure: it leaves out a node whose figures could not be read (NODE's FIGURES says why)
  WEIGHT              the backend's share of the endpoint's requests (its split; fractions summing to 1)
  SHADOW (SET/SEEN)   the proportion of the endpoint's requests mirrored to the backend, as set / as
                      measured ("?": not measured yet, no request seen in the window)
  REPLICAS            READY/RUNNING/DESIRED: ready (passing health checks) of the replicas running, and
                      how many are wanted
  DRAINING            replicas finishing their requests before they stop
  RESTARTS            times the agents restarted the backend's replicas after they exited
  IN FLIGHT           requests in flight or queued now, over every node
  HELD                of those, requests nodes hold while the backend has no ready replica (scaled to
                      zero, starting); they are sent once one is ready
  CONNECTED           the node's Envoy holds its stream to the controller that answered, or, with several
                      controllers given (--server a,b), to the one named
  LATEST CONFIG       the node's Envoy runs the latest configuration the controller made
  NACKS               configurations the node's Envoy refused (PROBLEMS says why)
  STATE               ready, cordoned (takes no new replicas) or drained (its replicas moved away)
  FIGURES             read, or "?" and why the controller could not read the node's figures`

// printStatus renders the report: per endpoint each backend's weight next to
// its live rates, each backend's replicas, and per node whether its Envoy
// runs the latest config.
func printStatus(out io.Writer, r api.StatusReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	partial := partialRates(r)
	fmt.Fprintf(tw, "(rates per second over the last %gs", r.RateWindowS)
	if partial.unread != "" {
		fmt.Fprintf(tw, "; ?: without node %s, whose figures could not be read", partial.unread)
	}
	fmt.Fprint(tw, ")\n\n")
	fmt.Fprintln(tw, "ENDPOINT\tROUTE\tREQ/S\tBACKEND\tWEIGHT\tSHADOW (SET/SEEN)\tREQ/S\tERR/S")
	for _, e := range r.Endpoints {
		for i, b := range e.Backends {
			name, route, rate := e.Name, orNone(e.Route), partial.rate(e.RequestRate)
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\t%s\n", name, route, rate, backend, b.Weight, shadow, partial.rate(b.RequestRate), partial.rate(b.ErrorRate))
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
		name := b.Name
		if b.Retiring {
			name += " (deleted, retiring)"
		}
		fmt.Fprintf(tw, "%s\t%d/%d/%d\t%d\t%d\t%v\t%s\t%s\t%s\t%s\n", name, b.Ready, b.Running, b.Desired, b.Draining, restarts, b.Autoscaled,
			partial.count(b.InFlight), partial.count(b.Held), partial.rate(b.RequestRate), partial.rate(b.ErrorRate))
	}
	fmt.Fprintf(tw, "\nNODE\tCONNECTED\tLATEST CONFIG\tNACKS\tSTATE\tFIGURES\tVERSION (controller %s, protocol %d)\n", orNone(r.Version), r.Protocol)
	for _, n := range r.Nodes {
		state := "ready"
		switch {
		case n.Drained:
			state = "drained"
		case n.Cordoned:
			state = "cordoned"
		}
		figures := "read"
		if n.FiguresUnread != "" {
			figures = "? " + n.FiguresUnread
		}
		connected := fmt.Sprint(n.Connected)
		if n.Controller != "" {
			connected += " (to " + n.Controller + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\t%s\t%s (protocol %d)\n", n.ID, connected, n.InSync, n.NACKs, state, figures, orNone(n.Version), n.Protocol)
	}
	if len(r.Problems) > 0 {
		fmt.Fprintln(tw, "\nPROBLEMS")
		for _, p := range r.Problems {
			fmt.Fprintln(tw, p)
		}
	}
	return tw.Flush()
}

// partial marks figures that leave out nodes whose own could not be read.
type partial struct{ unread string } // the nodes, comma-separated; "" none

func partialRates(r api.StatusReport) partial {
	var ids []string
	for _, n := range r.Nodes {
		if n.FiguresUnread != "" {
			ids = append(ids, n.ID)
		}
	}
	return partial{unread: strings.Join(ids, ", ")}
}

// rate is a rate, "?"-marked when it leaves nodes out.
func (p partial) rate(x float64) string { return p.mark(fmt.Sprintf("%.1f", x)) }

// count is a count of requests, "?"-marked when it leaves nodes out.
func (p partial) count(x float64) string { return p.mark(fmt.Sprintf("%.0f", x)) }

func (p partial) mark(s string) string {
	if p.unread != "" {
		return s + "?"
	}
	return s
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
			row("%s\t%d tokens/%s%s\tmesh\t-\t%s\t%s\n", e.Name, q.Tokens, q.EffectiveUnit(), tokenQuotaNote(*q, e.TokenQuotaShadowed),
				limitKey(q.Header, false), failureMode(q.Closed()))
		}
	}
}

// tokenQuotaNote says how a token quota counts, when not by total
// tokens, and, in shadow mode, what it would have refused.
func tokenQuotaNote(q meshspec.TokenQuota, shadowed uint64) string {
	note := ""
	if q.PerModel {
		note += " per model"
	}
	if w := q.Weights; w != (meshspec.TokenWeights{}) {
		note += fmt.Sprintf(" (weighed: input %g, output %g, cached %g)", w.Input, w.Output, w.Cached)
	}
	if q.Shadow {
		note += fmt.Sprintf(" (shadow: would have refused %d)", shadowed)
	}
	return note
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
