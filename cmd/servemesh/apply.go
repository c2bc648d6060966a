package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/internal/daemon"
	"github.com/servemesh/servemesh/meshspec"
)

func newApplyCommand() *cobra.Command {
	var f clientFlags
	var file string
	var dryRun bool
	var wait waitFlags
	c := &cobra.Command{
		Use:   "apply -f FILE [--dry-run]",
		Short: "make the controller's state equal a config file (--dry-run shows the changes)",
		Args:  names(0, "no arguments besides -f FILE"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("-f FILE is required")
			}
			m, err := configfile.LoadSpec(file)
			if err != nil {
				return err
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			res, err := c.Apply(cmd.Context(), m, dryRun)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.output == "json" {
				return writeJSON(out, res)
			}
			if len(res.Changes) == 0 {
				if _, err := fmt.Fprintf(out, "%s: no changes\n", file); err != nil || dryRun {
					return err
				}
				return wait.waitServed(cmd, c, processBackends(m), api.ServedQuery{Backends: specBackends(m)})
			}
			prefix := ""
			if dryRun {
				prefix = "(dry run) would "
			}
			for _, ch := range res.Diff {
				fmt.Fprintf(out, "%s%s\n", prefix, ch)
				for _, f := range ch.Fields {
					fmt.Fprintf(out, "    %s\n", f)
				}
			}
			if dryRun {
				return nil
			}
			return wait.waitServed(cmd, c, processBackends(m), api.ServedQuery{Backends: specBackends(m)})
		},
	}
	wait.register(c.Flags())
	addClientFlags(c, &f)
	c.Flags().StringVarP(&file, "filename", "f", "", "the config `FILE` to apply, in the format servemesh serve --config reads")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print what would change, change nothing")
	_ = c.MarkFlagFilename("filename", "yaml", "yml", "json")
	return c
}

func newValidateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "check a config file and explain what is wrong with it",
		Args:  names(1, "one config file to validate; name one config file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := configfile.Load(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if _, err := fmt.Fprintf(out, "%s is valid: %d backends, %d endpoints\n", args[0], len(m.Backends), len(m.Endpoints)); err != nil {
				return err
			}
			var ve *meshspec.ValidationError
			if errors.As(daemon.FileModeProblems(m), &ve) {
				fmt.Fprintf(out, "for servemesh apply -f only; servemesh serve would refuse it:\n")
				for _, p := range ve.Problems {
					fmt.Fprintf(out, "  - %s\n", p)
				}
			}
			return nil
		},
	}
}

// processBackends are the backends of m whose replicas servemesh runs.
// specBackends names every backend of m.
func specBackends(m *meshspec.Spec) []string {
	out := make([]string, len(m.Backends))
	for i, b := range m.Backends {
		out[i] = b.Name
	}
	return out
}

func processBackends(m *meshspec.Spec) []string {
	var out []string
	for _, b := range m.Backends {
		if b.Process != nil {
			out = append(out, b.Name)
		}
	}
	return out
}
