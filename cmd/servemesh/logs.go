package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

// logsFlags are servemesh logs's flags.
type logsFlags struct {
	node, replica string
	tail          int
	follow        bool
	interval      time.Duration
}

func newLogsCommand() *cobra.Command {
	var f clientFlags
	var lf logsFlags
	c := &cobra.Command{
		Use:   "logs BACKEND | logs --node NODE",
		Short: "print a backend's replicas' logs, or a node's Envoy's, as their agents read them (-f to follow)",
		Example: "  servemesh logs model-v2                    # each replica's last 20 lines, each line after its replica's tag\n" +
			"  servemesh logs model-v2 --replica 'model-v2#1a2b3c' -f\n" +
			"  servemesh logs --node demo-node --tail 50   # the node's Envoy",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeKind("backend", &f),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (lf.node != "") {
				return usageError{"name a backend, or give --node NODE for a node's Envoy"}
			}
			if lf.interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: at least 100ms", lf.interval)
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			read := func(ctx context.Context, tag string, tail int, offset int64) (api.LogsReport, error) {
				if lf.node != "" {
					return c.NodeLogs(ctx, lf.node, tail, offset)
				}
				return c.BackendLogs(ctx, args[0], tag, tail, offset)
			}
			return lf.show(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), read)
		},
	}
	addClientFlags(c, &f)
	fs := c.Flags()
	fs.StringVar(&lf.node, "node", "", "print this node's Envoy's log instead of a backend's replicas'")
	fs.StringVar(&lf.replica, "replica", "", "print this replica's log alone (its tag, as backend describe lists it)")
	fs.IntVar(&lf.tail, "tail", 20, "lines of each log to print first")
	fs.BoolVarP(&lf.follow, "follow", "f", false, "keep printing what the logs add, until Ctrl-C")
	fs.DurationVar(&lf.interval, "interval", time.Second, "with --follow, how often to read the logs again")
	return c
}

// logReader reads logs: a backend's replicas' (tag "": every one) or a
// node's Envoy's, their last tail lines or what follows offset (< 0: none).
type logReader func(ctx context.Context, tag string, tail int, offset int64) (api.LogsReport, error)

// show prints the logs' last lines and, with --follow, what they add
// until ctx ends (Ctrl-C, which is no failure). A log that cannot be read
// is said on errOut; the others are printed all the same.
func (lf logsFlags) show(ctx context.Context, out, errOut io.Writer, read logReader) error {
	first, err := read(ctx, lf.replica, lf.tail, -1)
	if err != nil {
		return err
	}
	prefixed := len(first.Logs) > 1 || lf.follow && lf.replica == "" && lf.node == ""
	offsets := map[string]int64{}
	for _, l := range first.Logs {
		offsets[l.Replica] = printLog(out, errOut, l, prefixed)
		if l.Error == "" && l.Offset == 0 {
			fmt.Fprintf(errOut, "servemesh logs: %s has logged nothing yet%s\n", logName(l), quietEnvoy(l))
		}
	}
	if len(first.Logs) == 0 {
		fmt.Fprintln(errOut, "servemesh logs: the backend has no replica placed, so no log")
	}
	if failed := slices.IndexFunc(first.Logs, func(l api.LogChunk) bool { return l.Error == "" }) < 0; failed && len(first.Logs) > 0 {
		return errors.New("no log could be read")
	}
	for rounds := 1; lf.follow; rounds++ {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(lf.interval):
		}
		if rounds%5 == 0 && lf.replica == "" && lf.node == "" {
			lf.notice(ctx, read, offsets) // replicas placed since
		}
		for tag, offset := range offsets {
			select {
			case <-ctx.Done():
				return nil // Ctrl-C ends following; it is not a failure
			default:
			}
			r, err := read(ctx, tag, 0, offset)
			if err == nil && len(r.Logs) != 1 {
				err = fmt.Errorf("the controller answered %d logs, not one", len(r.Logs))
			}
			if err != nil {
				if ctx.Err() == nil {
					fmt.Fprintf(errOut, "servemesh logs: %s: %v\n", orNone(tag), err)
				}
				continue
			}
			offsets[tag] = printLog(out, errOut, r.Logs[0], prefixed)
		}
	}
	return nil
}

// notice adds the replicas placed since the logs were first read, from
// the start of their logs.
func (lf logsFlags) notice(ctx context.Context, read logReader, offsets map[string]int64) {
	r, err := read(ctx, "", 0, -1)
	if err != nil {
		return
	}
	for _, l := range r.Logs {
		if _, known := offsets[l.Replica]; !known {
			offsets[l.Replica] = 0
		}
	}
}

// logName names a log: "replica m#1a2b3c on node n1", "node n1's Envoy".
func logName(l api.LogChunk) string {
	if l.Replica != "" {
		return "replica " + l.Replica + " on node " + l.Node
	}
	return "node " + l.Node + "'s Envoy"
}

// quietEnvoy says why a node's Envoy's log may be empty.
func quietEnvoy(l api.LogChunk) string {
	if l.Replica != "" {
		return ""
	}
	return " (it logs warnings and errors; the agent's --envoy-log-level info logs more)"
}

// printLog writes a log's text, each line after its replica's tag if
// prefixed, or its error; it returns the offset to read on from.
func printLog(out, errOut io.Writer, l api.LogChunk, prefixed bool) int64 {
	if l.Error != "" {
		fmt.Fprintf(errOut, "servemesh logs: %s: %s\n", logName(l), l.Error)
		return l.Offset
	}
	for line := range strings.Lines(l.Text) {
		if prefixed {
			fmt.Fprintf(out, "[%s] ", l.Replica)
		}
		fmt.Fprint(out, line)
		if !strings.HasSuffix(line, "\n") {
			fmt.Fprintln(out)
		}
	}
	return l.Offset
}
