package main

import (
	"context"
	"errors"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"

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
			spec, err := declared(cmd.Context(), c)
			if err != nil {
				return err
			}
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

// declared is the controller's declared state, whole (GET /v1/spec). A
// controller of the previous release serves no such path: its state is
// then read part by part, every part it has (backends, endpoints, the
// mesh's tracing).
func declared(ctx context.Context, c *api.Client) (*meshspec.Spec, error) {
	spec, err := c.Spec(ctx)
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		return spec, err
	}
	backends, err := c.ListBackends(ctx)
	if err != nil {
		return nil, err
	}
	endpoints, err := c.ListEndpoints(ctx)
	if err != nil {
		return nil, err
	}
	m := &meshspec.Model{Backends: backends, Endpoints: endpoints}
	switch t, err := c.Tracing(ctx); {
	case err == nil:
		m.Mesh = &meshspec.Mesh{Tracing: t}
	case !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound:
		return nil, err
	}
	return meshspec.SpecOf(m), nil
}
