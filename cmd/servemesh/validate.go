package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/servemesh/servemesh/controlplane/configfile"
)

func runValidate(_ context.Context, _ *slog.Logger, args []string, stdout io.Writer) error {
	fs := newFlags("validate", "FILE")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("name one config file to validate")
	}
	m, err := configfile.Load(fs.Arg(0))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s is valid: %d backends, %d endpoints\n", fs.Arg(0), len(m.Backends), len(m.Endpoints))
	return err
}
