package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// columns render objects of one kind as a table: the columns of -o table
// and, for -o wide, more after them.
type columns[T any] struct {
	header string
	row    func(T) string
	// wideHeader and wideRow are -o wide's extra columns; none when empty.
	wideHeader string
	wideRow    func(T) string
	// legend explains the columns, in list's and get's help.
	legend string
}

// help is a read's help: what it does, and the columns' legend.
func (c columns[T]) help(short string) string {
	if c.legend == "" {
		return ""
	}
	return strings.ToUpper(short[:1]) + short[1:] + ".\n\n" + c.legend
}

// write renders items as the output flag asks: a table, a wide one, JSON
// or YAML (all objects, as the API gives them).
func (c columns[T]) write(out io.Writer, f *clientFlags, items []T, whole any) error {
	if done, err := f.structured(out, whole); done {
		return err
	}
	header, row := c.header, c.row
	if f.output == "wide" && c.wideRow != nil {
		header = c.header + "\t" + c.wideHeader
		row = func(x T) string { return c.row(x) + "\t" + c.wideRow(x) }
	}
	return writeTable(out, header, items, row)
}

// listCommand is `<kind> list`: every object, as a table, JSON or YAML.
func listCommand[T any](kind string, f *clientFlags, list func(*api.Client, context.Context) ([]T, error), cols columns[T]) *cobra.Command {
	return &cobra.Command{
		Use: "list", Short: "list " + kind + "s", Long: cols.help("list " + kind + "s"), Args: names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			items, err := list(c, cmd.Context())
			if err != nil {
				return err
			}
			return cols.write(cmd.OutOrStdout(), f, items, items)
		},
	}
}

// getCommand is `<kind> get NAME`: one object, as a table, JSON or YAML,
// once or (-w) until Ctrl-C.
func getCommand[T any](kind string, f *clientFlags, get func(*api.Client, context.Context, string) (T, error), cols columns[T]) *cobra.Command {
	var w watchFlags
	c := &cobra.Command{
		Use: "get NAME", Short: "show one " + kind, Long: cols.help("show one " + kind), Args: names(1, "one "+kind+" name"), ValidArgsFunction: completeKind(kind, f),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			return w.run(cmd, func(out io.Writer) error {
				item, err := get(c, cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return cols.write(out, f, []T{item}, item)
			})
		},
	}
	w.register(c.Flags())
	return c
}

// deleteCommand is `<kind> delete NAME`.
func deleteCommand(kind string, f *clientFlags, del func(*api.Client, context.Context, string) (bool, error)) *cobra.Command {
	return &cobra.Command{
		Use: "delete NAME", Short: "delete " + article(kind) + " " + kind, Args: names(1, "one "+kind+" name"), ValidArgsFunction: completeKind(kind, f),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			changed, err := del(c, cmd.Context(), args[0])
			return report(cmd, kind, args[0], changed, err, "deleted", "was already absent")
		},
	}
}

// article is "a" or "an" before word.
func article(word string) string {
	if strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
}

// completeKind completes the name of a backend or an endpoint.
func completeKind(kind string, f *clientFlags) cobra.CompletionFunc {
	if kind == "endpoint" {
		return completeName(f, endpointNames)
	}
	return completeName(f, backendNames)
}

// report prints what a change did: did, or same when nothing changed.
func report(cmd *cobra.Command, kind, name string, changed bool, err error, did, same string) error {
	if err != nil {
		return err
	}
	msg := did
	if !changed {
		msg = same + "; nothing changed"
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", kind, name, msg)
	return err
}

func writeTable[T any](out io.Writer, header string, items []T, row func(T) string) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, item := range items {
		fmt.Fprintln(tw, row(item))
	}
	return tw.Flush()
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeYAML writes v as YAML, with the field names of its JSON.
func writeYAML(out io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("render YAML: %w", err)
	}
	_, err = out.Write(b)
	return err
}

// outputs are what -o takes: tables for people, JSON and YAML for programs.
var outputs = []string{"table", "wide", "json", "yaml"}

// structured writes v as JSON or YAML if the output flag asks for one,
// and reports whether it did.
func (f *clientFlags) structured(out io.Writer, v any) (bool, error) {
	switch f.output {
	case "json":
		return true, writeJSON(out, v)
	case "yaml":
		return true, writeYAML(out, v)
	}
	return false, nil
}

// backendColumns render backends for list and get; -o wide adds the
// protocol and the nodes their replicas run on.
var backendColumns = columns[meshspec.Backend]{
	header: "NAME\tREPLICAS FROM\tRUNNING/DESIRED\tAUTOSCALE\tMAX_CONCURRENT_QUERIES\tCPUS\tMEMORY_MB", row: backendRow,
	wideHeader: "PROTOCOL\tNODES", wideRow: backendWideRow,
	legend: `Columns:
  REPLICAS FROM            where its replicas come from: a process servemesh runs, a Consul service, or their addresses
  RUNNING/DESIRED          replicas placed and running, and how many are wanted
  AUTOSCALE                min..max @ the requests in flight one replica should carry; - when not autoscaled
  MAX_CONCURRENT_QUERIES   requests one replica is sent at once; the rest wait at its node
  CPUS, MEMORY_MB          what one replica asks of its node's capacity; - asks nothing (it is placed wherever it fits)
  PROTOCOL, NODES (wide)   how Envoy talks to the replicas; the nodes they run on, with how many on each`,
}

// backendWideRow is a backend's protocol and its replicas' nodes, with
// how many run on each.
func backendWideRow(b meshspec.Backend) string {
	count := map[string]int{}
	for _, p := range b.Placements {
		count[p.Node]++
	}
	for _, r := range b.Replicas {
		if r.Node != "" {
			count[r.Node]++
		}
	}
	nodes := make([]string, 0, len(count))
	for _, n := range meshspec.SortedKeys(count) {
		nodes = append(nodes, fmt.Sprintf("%s(%d)", n, count[n]))
	}
	return fmt.Sprintf("%s\t%s", orNone(string(b.Protocol)), orNone(strings.Join(nodes, ",")))
}

func backendRow(b meshspec.Backend) string {
	source, running, desired := replicaSource(b)
	autoscale := "-"
	if as := b.Config.Autoscaling; as != nil {
		autoscale = fmt.Sprintf("%d..%d @%g", as.MinReplicas, as.MaxReplicas, as.TargetInFlight)
	}
	return fmt.Sprintf("%s\t%s\t%d/%d\t%s\t%d\t%s\t%s", b.Name, source, running, desired, autoscale,
		b.Config.EffectiveMaxConcurrentQueries(), asked(b.Config.CPUs), asked(float64(b.Config.MemoryMB)))
}

// asked is what a replica asks of its node, "-" for nothing.
func asked(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%g", x)
}

// replicaSource is where a backend's replicas come from ("process
// <command>", "consul service <name>", or their addresses), with how many
// run and how many are wanted.
func replicaSource(b meshspec.Backend) (source string, running, desired int) {
	source, running, desired = "-", len(b.Replicas), len(b.Replicas)
	switch {
	case b.Process != nil:
		source = "process " + filepath.Base(b.Process.Command)
		running, desired = 0, b.Config.NumReplicas
		for _, p := range b.Placements {
			if p.State == meshspec.Running {
				running++
			}
		}
	case b.External != nil:
		source, running, desired = "consul service "+b.External.Service, 0, 0
	case len(b.Replicas) > 0:
		addrs := make([]string, 0, len(b.Replicas))
		for _, r := range b.Replicas {
			addrs = append(addrs, r.Address)
		}
		source = strings.Join(addrs, ",")
	}
	return source, running, desired
}

// parseWeights reads "name=number" pairs.
func parseWeights(pairs []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range pairs {
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want BACKEND=NUMBER, like model-v1=0.9", p)
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a number", p, value)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("backend %q is given twice", name)
		}
		out[name] = f
	}
	return out, nil
}

func formatWeights(m map[string]float64) string {
	keys := meshspec.SortedKeys(m)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%g", k, m[k]))
	}
	return strings.Join(parts, ",")
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
