package main

import (
	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/meshspec"
)

func newExportCommand() *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "export",
		Short: "write the live desired state as a config file (YAML; -o json for JSON) that apply -f takes back unchanged",
		Example: "  servemesh export > mesh.yaml\n" +
			"  servemesh apply -f mesh.yaml --dry-run   # no changes",
		Args: names(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd)
			if err != nil {
				return err
			}
			backends, err := c.ListBackends(cmd.Context())
			if err != nil {
				return err
			}
			endpoints, err := c.ListEndpoints(cmd.Context())
			if err != nil {
				return err
			}
			spec := meshspec.SpecOf(&meshspec.Model{Backends: backends, Endpoints: endpoints})
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), spec)
			}
			// Anything else is the config file apply -f takes, which is YAML.
			out, err := meshspec.MarshalSpec(spec)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	addClientFlags(c, &f)
	return c
}
