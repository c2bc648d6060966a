package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/controlplane/api"
)

// waitFlags are --wait and --wait-timeout, on every command that changes
// the state. --timeout, their earlier name, still works where a command's
// --timeout is not something else (endpoint create's bounds a request),
// deprecated.
// Not waiting is the default, as kubectl's: a script that makes many
// changes waits once, at the end (servemesh status), not after each.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

// WaitTimeout is how long --wait waits by default.
const WaitTimeout = 5 * time.Minute

func (w *waitFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&w.wait, "wait", false, "return when every node serves the change, the backends' replicas all ready (or fail saying why it cannot be)")
	fs.DurationVar(&w.timeout, "wait-timeout", WaitTimeout, "with --wait, how long to wait")
	if fs.Lookup("timeout") == nil {
		// Hidden, and warned of by waitServed on stderr: cobra's own
		// deprecation notice goes where the command's output goes.
		fs.DurationVar(&w.timeout, "timeout", WaitTimeout, deprecatedTimeout)
		_ = fs.MarkHidden("timeout")
	}
}

// deprecatedTimeout is --timeout's usage where it is the wait's bound.
const deprecatedTimeout = "deprecated: --wait-timeout, its name on every command"

// warnOldName says on stderr that --timeout, given for the wait, has a new
// name.
func warnOldName(cmd *cobra.Command) {
	if f := cmd.Flags().Lookup("timeout"); f != nil && f.Changed && f.Usage == deprecatedTimeout {
		fmt.Fprintln(cmd.ErrOrStderr(), "--timeout is deprecated: use --wait-timeout, its name on every command")
	}
}

// waitServed, with --wait, waits until the process backends named are
// ready (waitReady) and then until every connected node serves the state
// as it is now, with the backends named and those the endpoints named
// send to.
func (w waitFlags) waitServed(cmd *cobra.Command, c *api.Client, process []string, q api.ServedQuery) error {
	warnOldName(cmd)
	if !w.wait {
		return nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
	defer cancel()
	if err := w.waitReady(ctx, cmd, c, process); err != nil {
		return err
	}
	last := ""
	err := c.WaitServed(ctx, q, func(r api.ServedReport) {
		if line := strings.Join(r.Waiting, "; "); line != last && line != "" {
			fmt.Fprintln(cmd.ErrOrStderr(), "waiting: "+line)
			last = line
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), "served by every node")
	return nil
}

// waitReady waits for the process backends named, telling their progress
// on stderr: one line rewritten in place on a terminal, a line per change
// otherwise.
func (w waitFlags) waitReady(ctx context.Context, cmd *cobra.Command, c *api.Client, backends []string) error {
	if len(backends) == 0 {
		return nil
	}
	out := cmd.ErrOrStderr()
	terminal := false
	if f, ok := out.(*os.File); ok {
		if info, err := f.Stat(); err == nil {
			terminal = info.Mode()&os.ModeCharDevice != 0
		}
	}
	last := ""
	err := c.WaitReady(ctx, backends, func(ps []api.Progress) {
		parts := make([]string, len(ps))
		for i, p := range ps {
			parts[i] = p.String()
		}
		line := strings.Join(parts, "; ")
		switch {
		case line == last:
		case terminal:
			fmt.Fprintf(out, "\r\033[K%s", line)
		default:
			fmt.Fprintln(out, line)
		}
		last = line
	})
	if terminal && last != "" {
		fmt.Fprintln(out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: ready\n", strings.Join(backends, ", "))
	return nil
}
