package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

// nodeDescription is what `node describe` shows: the node as the
// controller knows it (registration, maintenance, claim and policy), its
// Envoy as the xDS server sees it, and the replicas placed on it, as -o
// json and yaml give it too.
type nodeDescription struct {
	Node     api.NodeReport    `json:"node"`
	Envoy    *api.NodeStatus   `json:"envoy,omitempty"`
	Replicas []describedOnNode `json:"replicas"`
	now      time.Time         // the replicas' ages are to it
}

// describedOnNode is one replica placed on the node.
type describedOnNode struct {
	Backend string            `json:"backend"`
	Replica api.ReplicaStatus `json:"replica"`
}

func newNodeDescribeCommand(f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:               "describe NODE",
		Short:             "show a node in full: registration, maintenance, what its agent claims and its policy grants, its Envoy's config, and the replicas placed on it",
		Example:           "  servemesh node describe n1\n  servemesh node describe n1 -o yaml",
		Args:              names(1, "one node id"),
		ValidArgsFunction: completeName(f, nodeNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			status, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			d, err := describeNode(args[0], nodes, status, time.Now())
			if err != nil {
				return err
			}
			if done, err := f.structured(cmd.OutOrStdout(), d); done {
				return err
			}
			return d.write(cmd.OutOrStdout())
		},
	}
}

// describeNode joins a node's report with the status report, at now.
func describeNode(name string, nodes []api.NodeReport, status api.StatusReport, now time.Time) (nodeDescription, error) {
	d := nodeDescription{Replicas: []describedOnNode{}, now: now}
	found := false
	var known []string
	for _, n := range nodes {
		known = append(known, n.Name)
		if n.Name == name {
			d.Node, found = n, true
		}
	}
	if !found {
		return d, fmt.Errorf("no node %q: the controller knows %s; see servemesh node list", name, orNone(strings.Join(known, ", ")))
	}
	for i := range status.Nodes {
		if status.Nodes[i].ID == name {
			d.Envoy = &status.Nodes[i]
		}
	}
	for _, b := range status.Backends {
		for _, r := range b.Replicas {
			if r.Node == name {
				d.Replicas = append(d.Replicas, describedOnNode{Backend: b.Name, Replica: r})
			}
		}
	}
	return d, nil
}

func (d nodeDescription) write(out io.Writer) error {
	n := d.Node
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Name:\t%s\n", n.Name)
	fmt.Fprintf(tw, "Registered:\t%v\n", n.Registered)
	state := "ready for replicas"
	switch {
	case n.Drained:
		state = "drained: its replicas move elsewhere, it gets none"
	case n.Cordoned:
		state = "cordoned: it gets no new replicas"
	}
	fmt.Fprintf(tw, "Maintenance:\t%s\n", state)
	fmt.Fprintf(tw, "Release:\t%s (protocol %d)\n", orNone(n.Version), n.Protocol)
	fmt.Fprintf(tw, "Agent claims:\t%g cpus, %d MB\n", n.CPUs, n.MemoryMB)
	policy := "none: taken at its agent's word"
	if p := n.Policy; p != nil {
		policy = fmt.Sprintf("%g cpus, %d MB, commands %s", p.CPUs, p.MemoryMB, orNone(strings.Join(p.AllowedCommands, ", ")))
	}
	fmt.Fprintf(tw, "Policy:\t%s\n", policy)
	envoy := "not connected to the controller that answered"
	if e := d.Envoy; e != nil {
		envoy = fmt.Sprintf("connected %v, latest config %v, %d NACKs", e.Connected, e.InSync, e.NACKs)
		if e.LastNACK != "" {
			envoy += " (last: " + firstLine(e.LastNACK) + ")"
		}
		if e.RateLimitService != "" {
			envoy += "; its rate limit service cannot be reached: " + e.RateLimitService
		}
		if e.Tracing != "" {
			envoy += "; " + e.Tracing
		}
	}
	fmt.Fprintf(tw, "Envoy:\t%s\n", envoy)
	fmt.Fprintf(tw, "Replicas:\t%d running, %d draining (%d requests in flight to them)\n", n.Replicas, n.Draining, n.DrainingRequests)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nPlaced here:")
	if len(d.Replicas) == 0 {
		_, err := fmt.Fprintln(out, "  no replica")
		return err
	}
	return writeTable(indent(out), "BACKEND\tREPLICA\tADDRESS\tSTATE\tREADY\tAGE", d.Replicas, func(r describedOnNode) string {
		ready := "no"
		if r.Replica.Ready {
			ready = "yes"
		}
		return strings.Join([]string{r.Backend, r.Replica.Tag, orNone(r.Replica.Address), string(r.Replica.State), ready, age(r.Replica.Since, d.now)}, "\t")
	})
}
