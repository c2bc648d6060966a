// Command servemesh is the servemesh binary: the control plane, a node's
// Envoy supervisor, the demo and small tools, one subcommand each.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name, summary string
	run           func(ctx context.Context, log *slog.Logger, args []string, stdout io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the control plane: serve a config file to Envoy nodes over xDS", runServe},
		{"envoy", "run and supervise this node's Envoy, bootstrapped to the control plane", runEnvoy},
		{"bootstrap", "print a node's Envoy bootstrap", runBootstrap},
		{"demo", "run everything on this machine with demo replicas (what `make run` does)", runDemo},
		{"demo-replica", "run one demo replica: an HTTP server that says which backend it is", runDemoReplica},
		{"validate", "check a config file and explain what is wrong with it", runValidate},
		{"version", "print the version", func(_ context.Context, _ *slog.Logger, _ []string, out io.Writer) error {
			_, err := fmt.Fprintln(out, "servemesh", version)
			return err
		}},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: servemesh <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `servemesh <command> -h` for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stderr)
		os.Exit(2)
	}
	level := slog.LevelInfo
	if lv := os.Getenv("SERVEMESH_LOG_LEVEL"); lv != "" {
		if err := level.UnmarshalText([]byte(lv)); err != nil {
			fmt.Fprintf(os.Stderr, "servemesh: SERVEMESH_LOG_LEVEL=%q: %v\n", lv, err)
			os.Exit(2)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands() {
		if c.name != os.Args[1] {
			continue
		}
		err := c.run(ctx, log.With("cmd", c.name), os.Args[2:], os.Stdout)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "servemesh %s: %v\n", c.name, err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "servemesh: unknown command %q\n\n", os.Args[1])
	usage(os.Stderr)
	os.Exit(2)
}

// newFlags makes a subcommand's flag set that reports errors instead of exiting.
func newFlags(name, usageLine string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: servemesh %s %s\n\nflags:\n", name, usageLine)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and refuses stray positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; flags go before nothing else", strings.Join(fs.Args(), " "))
	}
	return nil
}
