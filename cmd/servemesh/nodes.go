package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

func newNodeCommand() *cobra.Command {
	var f clientFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "list the nodes: registered, cordoned or drained, their replicas and release",
		Args:  names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), nodes)
			}
			return printNodes(cmd.OutOrStdout(), nodes)
		},
	}
	verbs := []*cobra.Command{list}
	for _, a := range []struct {
		action    api.NodeAction
		short     string
		did, same string
	}{
		{api.Cordon, "give a node no new replicas; those it runs stay", "cordoned", "is cordoned already"},
		{api.Uncordon, "let a cordoned or drained node get replicas again (replicas that moved stay where they went)", "uncordoned", "is not cordoned"},
		{api.Drain, "cordon a node and move its replicas elsewhere, each replaced by a ready one before it drains", "draining: its replicas move as their replacements are ready", "is draining already"},
	} {
		verbs = append(verbs, &cobra.Command{
			Use:               string(a.action) + " NODE",
			ValidArgsFunction: completeName(&f, nodeNames),
			Short:             a.short,
			Args:              names(1, "one node id"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := f.client(cmd)
				if err != nil {
					return err
				}
				changed, err := c.NodeAction(cmd.Context(), args[0], a.action)
				return report(cmd, "node", args[0], changed, err, a.did, a.same)
			},
		})
	}
	return nounCommand("node", "list nodes, and take them out for maintenance (cordon, drain) and back (uncordon)", &f, verbs...)
}

// nodeNames lists the nodes, for completion.
func nodeNames(ctx context.Context, c *api.Client) ([]string, error) {
	nodes, err := c.Nodes(ctx)
	return namesOf(nodes, func(n api.NodeReport) string { return n.Name }), err
}

// printNodes renders the node list.
func printNodes(out io.Writer, nodes []api.NodeReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tREPLICAS\tDRAINING\tCPUS\tMEMORY MB\tVERSION")
	for _, n := range nodes {
		state := "ready"
		switch {
		case n.Drained:
			state = "drained"
		case n.Cordoned:
			state = "cordoned"
		}
		if !n.Registered {
			state += ", not registered"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%g\t%d\t%s (protocol %d)\n", n.Name, state, n.Replicas, n.Draining, n.CPUs, n.MemoryMB, orNone(n.Version), n.Protocol)
	}
	return tw.Flush()
}
