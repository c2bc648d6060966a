package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/wire"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// usageError is a command line naming no command, or one that does not
// exist: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// run executes one command line and returns the process exit code: 0 on
// success (help included), 1 when the command or its flags failed, 2 when
// no command or an unknown one was named.
func run(args []string, stdout, stderr io.Writer) int {
	log, err := newLogger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "servemesh: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand(log)
	if args == nil {
		args = []string{} // cobra reads os.Args for nil: the test binary's flags, under go test
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	initCompletion(root) // after SetOut: the completion commands keep the writer they see now
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v%s\n", cmd.CommandPath(), err, detail(cmd, err))
	if errors.As(err, new(usageError)) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	return 1
}

// detail is what --verbose adds to a controller's error: its HTTP status
// and kind, which the message itself leaves out.
func detail(cmd *cobra.Command, err error) string {
	var apiErr *api.Error
	if verbose, _ := cmd.Flags().GetBool("verbose"); !verbose || !errors.As(err, &apiErr) {
		return ""
	}
	return " (" + apiErr.Detail() + ")"
}

// newLogger logs text to stderr at $SERVEMESH_LOG_LEVEL (info by default).
func newLogger(stderr io.Writer) (*slog.Logger, error) {
	level := slog.LevelInfo
	if lv := os.Getenv("SERVEMESH_LOG_LEVEL"); lv != "" {
		if err := level.UnmarshalText([]byte(lv)); err != nil {
			return nil, fmt.Errorf("SERVEMESH_LOG_LEVEL=%q: %w", lv, err)
		}
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})), nil
}

// newRootCommand builds the whole command tree.
func newRootCommand(log *slog.Logger) *cobra.Command {
	root := &cobra.Command{
		Use:   "servemesh",
		Short: "servemesh shifts, splits and mirrors live traffic between versions of a service, on Envoy",
		Long: "servemesh shifts, splits and mirrors live traffic between versions of a service, on Envoy.\n\n" +
			"The API commands (backend, endpoint, traffic, shadow, rollout, apply, status) talk to a controller;\n" +
			"the others run servemesh's processes.",
		Version:       wire.Version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE:          needSubcommand,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.AddGroup(&cobra.Group{ID: "api", Title: "Change and read the mesh (through a controller's API):"},
		&cobra.Group{ID: "run", Title: "Run servemesh:"})
	for _, c := range []*cobra.Command{newBackendCommand(), newEndpointCommand(), newTrafficCommand(),
		newShadowCommand(), newRolloutCommand(), newApplyCommand(), newStatusCommand(), newNodeCommand(), newExportCommand(), newImportCommand(), newTracingCommand(),
		newLogsCommand()} {
		c.GroupID = "api"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newControllerCommand(log), newAgentCommand(log), newServeCommand(log),
		newEnvoyCommand(log), newBootstrapCommand(), newDemoStackCommand(log), newDemoCommand(log),
		newDemoReplicaCommand(log), newModelServerCommand(log), newValidateCommand()} {
		c.GroupID = "run"
		root.AddCommand(c)
	}
	root.AddCommand(newEnvoyParentCommand())
	root.SetVersionTemplate("servemesh {{.Version}}\n") // as `servemesh version` prints it
	root.AddCommand(newVersionCommand())
	return root
}

// newVersionCommand is `servemesh version`: the release and the protocol
// it speaks with controllers and agents (the skew policy's), as text, JSON
// or YAML.
func newVersionCommand() *cobra.Command {
	var f clientFlags
	c := &cobra.Command{Use: "version", Short: "print the version", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains([]string{"table", "json", "yaml"}, f.output) {
				return fmt.Errorf("-o %q: use json or yaml, or leave it out", f.output)
			}
			v := struct {
				Version  string `json:"version"`
				Protocol int    `json:"protocol"`
				Go       string `json:"go"`
				Platform string `json:"platform"`
			}{wire.Version, wire.Protocol, runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}
			if done, err := f.structured(cmd.OutOrStdout(), v); done {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "servemesh %s (protocol %d)\n", wire.Version, wire.Protocol)
			return err
		}}
	c.Flags().StringVarP(&f.output, "output", "o", "table", "json or yaml for programs; text when left out")
	return c
}

// initCompletion adds cobra's completion command, on which an unknown
// shell is a usage error rather than help and success.
func initCompletion(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args, c.RunE = cobra.ArbitraryArgs, needSubcommand
			c.SuggestionsMinimumDistance = 1 // a typo of a shell; tcsh is no typo of bash
		}
	}
}

// needSubcommand is the RunE of a command that only groups others: with no
// argument it prints its help, with one it names the unknown command;
// either is a usage error.
func needSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		_ = cmd.Help()
		return usageError{"name a command"}
	}
	msg := fmt.Sprintf("unknown command %q", args[0])
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only on its own path
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return usageError{msg}
}

// names checks that a command got exactly n positional arguments, saying
// what they are (what: "one backend name").
func names(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("want %s; see `%s --help`", what, cmd.CommandPath())
		}
		return nil
	}
}
