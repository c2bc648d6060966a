package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
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
			if done, err := f.structured(cmd.OutOrStdout(), nodes); done {
				return err
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
	verbs = append(verbs, newNodeDescribeCommand(&f), newNodePolicyCommand(&f))
	return nounCommand("node", "list nodes, set what the operator grants them (policy), and take them out for maintenance (cordon, drain) and back (uncordon)", &f, verbs...)
}

// newNodePolicyCommand sets or clears a node's policy.
func newNodePolicyCommand(f *clientFlags) *cobra.Command {
	var p meshspec.NodePolicy
	var resources []string
	var clear bool
	c := &cobra.Command{
		Use:               "policy NODE",
		ValidArgsFunction: completeName(f, nodeNames),
		Short:             "grant a node at most these CPUs, memory, resources and commands, whatever its agent claims (or --clear); needs the exec scope",
		Args:              names(1, "one node id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			if clear {
				changed, err := c.SetNodePolicy(cmd.Context(), args[0], nil)
				return report(cmd, "node", args[0], changed, err, "policy cleared: taken at its agent's word", "has no policy")
			}
			if p.Resources, err = parseResources(resources); err != nil {
				return err
			}
			changed, err := c.SetNodePolicy(cmd.Context(), args[0], &p)
			return report(cmd, "node", args[0], changed, err, "policy set", "has this policy already")
		},
	}
	fs := c.Flags()
	fs.Float64Var(&p.CPUs, "cpus", 0, "the most CPUs the node's replicas may take")
	fs.IntVar(&p.MemoryMB, "memory-mb", 0, "the most MiB of memory the node's replicas may take")
	fs.StringArrayVar(&resources, "resource", nil, "the most of a named resource, as NAME=COUNT (gpu=2); repeat for each")
	fs.StringArrayVar(&p.AllowedCommands, "allow-command", nil, "a command (or pattern) the node may run as replicas, if its agent allows it too; repeat for each")
	fs.BoolVar(&clear, "clear", false, "clear the node's policy")
	return c
}

// nodeNames lists the nodes, for completion.
func nodeNames(ctx context.Context, c *api.Client) ([]string, error) {
	nodes, err := c.Nodes(ctx)
	return namesOf(nodes, func(n api.NodeReport) string { return n.Name }), err
}

// printNodes renders the node list.
func printNodes(out io.Writer, nodes []api.NodeReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tREPLICAS\tDRAINING\tCPUS\tMEMORY MB\tPOLICY\tVERSION")
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
		policy := "none: self-reported"
		if p := n.Policy; p != nil {
			policy = fmt.Sprintf("cpus %g, memory %d MB, %d commands", p.CPUs, p.MemoryMB, len(p.AllowedCommands))
		}
		draining := strconv.Itoa(n.Draining)
		if n.DrainingRequests > 0 {
			draining += fmt.Sprintf(" (%d in flight)", n.DrainingRequests)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%g\t%d\t%s\t%s (protocol %d)\n", n.Name, state, n.Replicas, draining, n.CPUs, n.MemoryMB, policy, orNone(n.Version), n.Protocol)
	}
	return tw.Flush()
}
