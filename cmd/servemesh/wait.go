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

// waitFlags are --wait and --timeout, on the commands that change
// replicas.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (w *waitFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&w.wait, "wait", false, "return when the backend's replicas are all ready on every node (or fail saying why they cannot be)")
	fs.DurationVar(&w.timeout, "timeout", 5*time.Minute, "with --wait, how long to wait")
}

// waitReady, with --wait, waits for the process backends named, telling
// their progress on stderr: one line rewritten in place on a terminal, a
// line per change otherwise.
func (w waitFlags) waitReady(cmd *cobra.Command, c *api.Client, backends []string) error {
	if !w.wait || len(backends) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
	defer cancel()
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
