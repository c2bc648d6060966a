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

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// listCommand is `<kind> list`: every object, as a table or JSON.
func listCommand[T any](kind string, f *clientFlags, list func(*api.Client, context.Context) ([]T, error),
	header string, row func(T) string) *cobra.Command {
	return &cobra.Command{
		Use: "list", Short: "list " + kind + "s", Args: names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			items, err := list(c, cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), items)
			}
			return writeTable(cmd.OutOrStdout(), header, items, row)
		},
	}
}

// getCommand is `<kind> get NAME`: one object, as a table or JSON.
func getCommand[T any](kind string, f *clientFlags, get func(*api.Client, context.Context, string) (T, error),
	header string, row func(T) string) *cobra.Command {
	return &cobra.Command{
		Use: "get NAME", Short: "show one " + kind, Args: names(1, "one "+kind+" name"), ValidArgsFunction: completeKind(kind, f),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			item, err := get(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), item)
			}
			return writeTable(cmd.OutOrStdout(), header, []T{item}, row)
		},
	}
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

// backendHeader and backendRow render backends for list and get.
const backendHeader = "NAME\tREPLICAS FROM\tRUNNING/DESIRED\tAUTOSCALE\tMAX_CONCURRENT_QUERIES\tCPUS\tMEMORY_MB"

func backendRow(b meshspec.Backend) string {
	source, running, desired := "-", len(b.Replicas), len(b.Replicas)
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
	autoscale := "-"
	if as := b.Config.Autoscaling; as != nil {
		autoscale = fmt.Sprintf("%d..%d @%g", as.MinReplicas, as.MaxReplicas, as.TargetInFlight)
	}
	return fmt.Sprintf("%s\t%s\t%d/%d\t%s\t%d\t%g\t%d", b.Name, source, running, desired, autoscale,
		b.Config.EffectiveMaxConcurrentQueries(), b.Config.CPUs, b.Config.MemoryMB)
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
