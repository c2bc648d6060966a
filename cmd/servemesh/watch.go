package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// watchFlags are -w/--watch and its interval, on the reads worth
// watching (status, rollout status, backend get), as kubectl's -w.
type watchFlags struct {
	on       bool
	interval time.Duration
}

func (w *watchFlags) register(fs *pflag.FlagSet) {
	fs.BoolVarP(&w.on, "watch", "w", false, "keep showing it, read again every --interval, until Ctrl-C")
	fs.DurationVar(&w.interval, "interval", 2*time.Second, "with --watch, how often to read it again")
}

// run shows what show writes once or, with --watch, again every interval
// until the command's context ends (Ctrl-C). On a terminal each reading
// replaces the last; elsewhere (a pipe, a file) a reading is written only
// when it differs from the one before, under the time it was read.
func (w *watchFlags) run(cmd *cobra.Command, show func(io.Writer) error) error {
	out := cmd.OutOrStdout()
	if !w.on {
		return show(out)
	}
	if w.interval < 100*time.Millisecond {
		return fmt.Errorf("--interval %s: at least 100ms", w.interval)
	}
	return watch(cmd.Context(), out, isTerminal(out), w.interval, show)
}

func watch(ctx context.Context, out io.Writer, terminal bool, interval time.Duration, show func(io.Writer) error) error {
	var last []byte
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if ctx.Err() != nil {
			return nil // ended while a tick was due too: no reading after Ctrl-C
		}
		var frame bytes.Buffer
		if err := show(&frame); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !bytes.Equal(frame.Bytes(), last) {
			var err error
			if terminal {
				_, err = fmt.Fprintf(out, "\033[H\033[2J%s", frame.Bytes()) // clear, then draw
			} else {
				_, err = fmt.Fprintf(out, "--- %s\n%s", time.Now().Format(time.TimeOnly), frame.Bytes())
			}
			if err != nil {
				return err
			}
			last = frame.Bytes()
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch; it is not a failure
		case <-tick.C:
		}
	}
}

// isTerminal reports whether out is a terminal (a character device).
func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
