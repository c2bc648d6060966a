package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

// FilePlaneOptions configure a control plane that serves a config file
// (`servemesh serve`): no Consul, no API.
type FilePlaneOptions struct {
	ConfigPath string
	XDSListen  string
	HTTPListen string
	// BeforeApply, if set, sees every valid model before it is served; an
	// error refuses the model (the demo starts its replicas here).
	BeforeApply func(*meshspec.Model) error
	// XDSCacheOff turns translation's reuse off (server.Options.CacheOff).
	XDSCacheOff bool
}

// FilePlane is a control plane serving a config file: OpenFilePlane
// loads the file and binds the listeners, Run serves until its context
// ends.
type FilePlane struct {
	*Plane
	watcher *configfile.Watcher
	sum     [32]byte

	// stop is StartFilePlane's: it ends its own run.
	stop func()
}

// OpenFilePlane loads the config file (refusing an invalid one), makes it
// the plane's model and binds the plane's listeners.
func OpenFilePlane(ctx context.Context, log *slog.Logger, o FilePlaneOptions) (*FilePlane, error) {
	if o.ConfigPath == "" {
		return nil, fmt.Errorf("--config is required: name the mesh config file to serve")
	}
	m, sum, err := configfile.LoadForWatch(o.ConfigPath)
	if err != nil {
		return nil, err
	}
	if err := FileModeProblems(m); err != nil {
		return nil, fmt.Errorf("config file %s: %w", o.ConfigPath, err)
	}
	p := NewPlane(log, o.XDSCacheOff)
	apply := func(m *meshspec.Model) error {
		if err := FileModeProblems(m); err != nil {
			return err // reported by the watcher; the last good config keeps serving
		}
		if o.BeforeApply != nil {
			if err := o.BeforeApply(m); err != nil {
				return err
			}
		}
		dp, err := ir.Lower(m, nil, ir.Options{}) // a file's mesh runs no mTLS; LoadForWatch validated m
		if err != nil {
			return err
		}
		return p.XDS.SetDataPlane(dp)
	}
	if err := apply(m); err != nil {
		return nil, err
	}
	if err := p.Listen(ctx, o.XDSListen, o.HTTPListen); err != nil {
		return nil, err
	}
	w := &configfile.Watcher{Path: o.ConfigPath, Apply: apply, Logger: log.With("component", "configfile")}
	log.Info("control plane serving", "config", o.ConfigPath, "xds", p.XDSAddr(), "http", p.HTTPAddr())
	return &FilePlane{Plane: p, watcher: w, sum: sum}, nil
}

// Run serves the plane and follows the file's changes until ctx ends or
// either fails.
func (f *FilePlane) Run(ctx context.Context) error {
	g, _ := rungroup.New(ctx)
	g.Go("plane", f.Plane.Run)
	g.Go("config file", func(ctx context.Context) error { return f.watcher.Run(ctx, f.sum) })
	return g.Wait()
}

// StartFilePlane opens a file plane and runs it until Stop, for a caller
// with no run group of its own (tests).
func StartFilePlane(ctx context.Context, log *slog.Logger, o FilePlaneOptions) (*FilePlane, error) {
	f, err := OpenFilePlane(ctx, log, o)
	if err != nil {
		return nil, err
	}
	f.stop = rungroup.Background(ctx, f.Run, func(err error) { log.Error("file plane stopped", "err", err) })
	return f, nil
}

// Stop ends what StartFilePlane began and waits for it.
func (f *FilePlane) Stop() { f.stop() }

// FileModeProblems refuses what a config file served without a controller
// (`servemesh serve`) cannot have: backends whose replicas servemesh would
// run (a process: no agent runs it) or read from Consul (external: no
// catalog is read), which would never have a replica, and rollouts, which
// nothing would judge.
func FileModeProblems(m *meshspec.Model) error {
	var problems []string
	for i, b := range m.Backends {
		field := meshspec.ItemField("backends", i, b.Name, false)
		switch {
		case b.Process != nil:
			problems = append(problems, field+".process: servemesh serve runs no process, so this backend would have no replica; "+
				"list its replicas' addresses (replicas:), or run a controller with agents and apply the file (servemesh apply -f)")
		case b.External != nil:
			problems = append(problems, field+".external: servemesh serve reads no Consul catalog, so this backend would have no replica; "+
				"list its replicas' addresses (replicas:), or run a controller and apply the file (servemesh apply -f)")
		}
	}
	for i, e := range m.Endpoints {
		if e.Rollout != nil {
			problems = append(problems, meshspec.ItemField("endpoints", i, e.Name, false)+".rollout: servemesh serve judges no rollout (it reads no figures and keeps no state), so the rollout would never move; "+
				"set the traffic you want (traffic:), or run a controller with agents and apply the file (servemesh apply -f)")
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return &meshspec.ValidationError{Problems: problems}
}

// ServeFile serves a config file until ctx ends (`servemesh serve`).
func ServeFile(ctx context.Context, log *slog.Logger, o FilePlaneOptions) error {
	f, err := OpenFilePlane(ctx, log, o)
	if err != nil {
		return err
	}
	return f.Run(ctx)
}
