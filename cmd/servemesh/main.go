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
		{"controller", "run the controller: state in Consul, the /v1/ API, xDS; several elect a leader", runController},
		{"serve", "run a control plane that serves a config file to Envoy nodes (no Consul needed)", runServe},
		{"backend", "create|update|delete|list|get backends through the controller's API", runBackend},
		{"endpoint", "create|delete|list|get endpoints through the controller's API", runEndpoint},
		{"traffic", "set an endpoint's traffic split: traffic set ENDPOINT b1=0.9 b2=0.1", runTraffic},
		{"shadow", "mirror a proportion of an endpoint's requests: shadow set ENDPOINT backend=0.05", runShadow},
		{"status", "show live request and error rates next to the weights, replicas, and each node's config", runStatus},
		{"apply", "make the controller's state equal a config file (--dry-run shows the changes)", runApply},
		{"agent", "run a node's agent: the replicas placed on it, their Consul registration, its Envoy", runAgent},
		{"envoy", "run and supervise this node's Envoy, bootstrapped to the control plane", runEnvoy},
		{"bootstrap", "print a node's Envoy bootstrap", runBootstrap},
		{"demo-stack", "run all of servemesh on this machine with a demo: Consul, controller, agent, Envoy (what `make run` does)", runDemoStack},
		{"demo", "run a file-mode demo: control plane, Envoy and demo replicas, no Consul", runDemo},
		{"demo-replica", "run one demo replica: an HTTP server that says which backend it is", runDemoReplica},
		{"validate", "check a config file and explain what is wrong with it", runValidate},
		{"version", "print the version", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: servemesh <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `servemesh <command> -h` for a command's flags.")
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run executes one subcommand and returns the process exit code: 0 on
// success, 1 when the command failed, 2 for a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		return 2
	}
	level := slog.LevelInfo
	if lv := os.Getenv("SERVEMESH_LOG_LEVEL"); lv != "" {
		if err := level.UnmarshalText([]byte(lv)); err != nil {
			fmt.Fprintf(stderr, "servemesh: SERVEMESH_LOG_LEVEL=%q: %v\n", lv, err)
			return 2
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, log.With("cmd", c.name), args[1:], stdout)
		if errors.Is(err, flag.ErrHelp) {
			return 2
		}
		if err != nil {
			fmt.Fprintf(stderr, "servemesh %s: %v\n", c.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "servemesh: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
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
		return fmt.Errorf("unexpected arguments %q; see `servemesh %s -h`", strings.Join(fs.Args(), " "), fs.Name())
	}
	return nil
}

func runVersion(_ context.Context, _ *slog.Logger, args []string, stdout io.Writer) error {
	if err := parseFlags(newFlags("version", ""), args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, "servemesh", version)
	return err
}
