package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/controlplane/rayserve"
	"github.com/servemesh/servemesh/daemon"
	"github.com/servemesh/servemesh/meshspec"
)

// maxAppliedFile is the most apply reads from standard input: the API's
// limit on an apply's body.
const maxAppliedFile = 16 << 20

// loadApplied reads the config file apply -f names, or standard input for
// "-" (a Ray Serve config's relative paths then start in the working
// folder).
func loadApplied(stdin io.Reader, file string, ray rayserve.Options) (configfile.Loaded, error) {
	if file != "-" {
		return configfile.LoadAny(file, ray)
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxAppliedFile+1))
	if err != nil {
		return configfile.Loaded{}, fmt.Errorf("read standard input: %w", err)
	}
	if len(data) > maxAppliedFile {
		return configfile.Loaded{}, fmt.Errorf("standard input holds more than %d MiB, the most an apply takes; split the config", maxAppliedFile>>20)
	}
	if ray.Dir == "" {
		if ray.Dir, err = os.Getwd(); err != nil {
			return configfile.Loaded{}, err
		}
	}
	return configfile.ParseAny("from standard input", data, ray)
}

func newApplyCommand() *cobra.Command {
	var f clientFlags
	var file string
	var dryRun, prune, merge bool
	var wait waitFlags
	var ray rayFlags
	c := &cobra.Command{
		Use:   "apply -f FILE [--dry-run]",
		Short: "make the controller's state equal a config file (--dry-run shows the changes)",
		Args:  names(0, "no arguments besides -f FILE"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("-f FILE is required (-f - reads it from standard input)")
			}
			loaded, err := loadApplied(cmd.InOrStdin(), file, ray.options())
			if err != nil {
				return err
			}
			m := loaded.Spec
			for _, n := range loaded.Notes {
				fmt.Fprintln(cmd.ErrOrStderr(), "note: "+n)
			}
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			if loaded.Ray && !cmd.Flags().Changed("merge") {
				merge = true // its applications, not the whole mesh
				fmt.Fprintln(cmd.ErrOrStderr(), "note: a Ray Serve config is merged into the mesh: its applications' backends and endpoints are created or replaced, the rest kept (--merge=false makes the mesh exactly the file)")
			}
			if merge {
				if err := canMerge(cmd.Context(), c); err != nil {
					return err
				}
			}
			res, err := c.Apply(cmd.Context(), m, api.ApplyOptions{DryRun: dryRun, PruneRollouts: prune, Merge: merge})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if done, err := f.structured(out, res); done {
				return err
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
	c.Flags().StringVarP(&file, "filename", "f", "", "the config `FILE` to apply, in the format servemesh serve --config reads, or a Ray Serve config file (serve deploy's); - reads it from standard input")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print what would change, change nothing")
	c.Flags().BoolVar(&merge, "merge", false, "keep what the file does not name (backends and endpoints of other names, and the mesh's settings if it has none) instead of making the mesh exactly the file; the default for a Ray Serve config")
	c.Flags().BoolVar(&prune, "prune-rollouts", false, "remove the records of ended rollouts the file does not declare (their stages and verdicts); without it they are kept")
	ray.register(c.Flags())
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

// rayFlags say how a Ray Serve config file's deployments run servemesh's
// Python replica runtime (rayserve.Options).
type rayFlags struct {
	python, runtime string
	paths           []string
}

func (r *rayFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&r.python, "python", rayserve.DefaultPython, "for a Ray Serve config: the Python the replicas run (the agents' --allow-command must name it)")
	fs.StringVar(&r.runtime, "runtime", "", "for a Ray Serve config: the replica runtime's script (servemesh/replica.py); default: python -m servemesh.replica, servemesh installed in that Python")
	fs.StringArrayVar(&r.paths, "path", nil, "for a Ray Serve config: a folder more the replicas find modules in (repeat); the applications' own come from runtime_env.working_dir, else the file's folder")
}

func (r rayFlags) options() rayserve.Options {
	return rayserve.Options{Python: r.python, Runtime: r.runtime, Paths: r.paths}
}

func newImportCommand() *cobra.Command {
	var file string
	var ray rayFlags
	rayCmd := &cobra.Command{
		Use:   "ray -f FILE",
		Short: "print the servemesh config of a Ray Serve config file (serve deploy's), with notes on what has no equivalent",
		Example: "  servemesh import ray -f serve_config.yaml > mesh.yaml\n" +
			"  servemesh apply -f serve_config.yaml      # the same, applied",
		Args: names(0, "no arguments besides -f FILE"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("-f FILE is required")
			}
			if data, err := os.ReadFile(file); err != nil || !rayserve.IsConfig(data) {
				if err != nil {
					return fmt.Errorf("read config file: %w", err)
				}
				return fmt.Errorf("%s is not a Ray Serve config (it has no applications): a servemesh config is applied as it is", file)
			}
			loaded, err := configfile.LoadAny(file, ray.options())
			if err != nil {
				return err
			}
			out, err := meshspec.MarshalSpec(loaded.Spec)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "# servemesh config of the Ray Serve config %s (servemesh import ray)\n", file)
			for _, n := range loaded.Notes {
				fmt.Fprintf(w, "# note: %s\n", n)
			}
			_, err = w.Write(out)
			return err
		},
	}
	rayCmd.Flags().StringVarP(&file, "filename", "f", "", "the Ray Serve config `FILE`")
	_ = rayCmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	ray.register(rayCmd.Flags())
	c := &cobra.Command{Use: "import", Short: "read another system's config into servemesh's"}
	c.AddCommand(rayCmd)
	return c
}

// canMerge refuses a merge a controller of the previous release would
// take for a whole apply (it ignores ?merge and would delete what the file
// does not name); GET /v1/spec came with merging.
func canMerge(ctx context.Context, c *api.Client) error {
	_, err := c.Spec(ctx)
	var apiErr *api.Error
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
		return errors.New("the controller runs a release that cannot merge a file into the mesh (it would apply it as the whole mesh): upgrade the controllers, or apply with --merge=false to make the mesh exactly the file")
	}
	return err
}
