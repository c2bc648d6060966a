package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// completionWait bounds a completion's call to the controller: a shell
// waits for it.
const completionWait = 2 * time.Second

// backendNames and endpointNames list names for completion.
func backendNames(ctx context.Context, c *api.Client) ([]string, error) {
	bs, err := c.ListBackends(ctx)
	return namesOf(bs, func(b meshspec.Backend) string { return b.Name }), err
}

func endpointNames(ctx context.Context, c *api.Client) ([]string, error) {
	es, err := c.ListEndpoints(ctx)
	return namesOf(es, func(e meshspec.Endpoint) string { return e.Name }), err
}

// namesOf returns the names of items.
func namesOf[T any](items []T, name func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, item := range items {
		out = append(out, name(item))
	}
	return out
}

// namesFrom asks the controller the flags name for names, starting with
// prefix; nothing (and no files) when it cannot.
func namesFrom(cmd *cobra.Command, f *clientFlags, list func(context.Context, *api.Client) ([]string, error), prefix, suffix string) []string {
	f.failoverWait = 0
	c, err := f.client(cmd)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), completionWait)
	defer cancel()
	names, err := list(ctx, c)
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n+suffix)
		}
	}
	return out
}

// completeName completes a command's one argument with names from list.
func completeName(f *clientFlags, list func(context.Context, *api.Client) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return namesFrom(cmd, f, list, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeSplit completes `ENDPOINT BACKEND=VALUE...`: an endpoint first,
// then backends followed by "=".
func completeSplit(f *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return namesFrom(cmd, f, endpointNames, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
		}
		if strings.Contains(toComplete, "=") {
			return nil, cobra.ShellCompDirectiveNoFileComp // a weight: nothing to offer
		}
		return namesFrom(cmd, f, backendNames, toComplete, "="), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}
