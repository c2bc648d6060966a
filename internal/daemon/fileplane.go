package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/controlplane/model"
)

// FilePlaneOptions configure a control plane that serves a config file
// (`servemesh serve`): no Consul, no API.
type FilePlaneOptions struct {
	ConfigPath string
	XDSListen  string
	HTTPListen string
	// BeforeApply, if set, sees every valid model before it is served; an
	// error refuses the model (the demo starts its replicas here).
	BeforeApply func(*model.Model) error
}

// StartFilePlane loads the config file (refusing to start on an invalid
// one), starts the plane and follows the file's changes until ctx ends.
func StartFilePlane(ctx context.Context, log *slog.Logger, o FilePlaneOptions) (*Plane, error) {
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
	p := NewPlane(log)
	apply := func(m *model.Model) error {
		if err := FileModeProblems(m); err != nil {
			return err // reported by the watcher; the last good config keeps serving
		}
		if o.BeforeApply != nil {
			if err := o.BeforeApply(m); err != nil {
				return err
			}
		}
		return p.XDS.SetModel(m)
	}
	if err := apply(m); err != nil {
		return nil, err
	}
	if err := p.Start(ctx, log, o.XDSListen, o.HTTPListen); err != nil {
		return nil, err
	}
	w := &configfile.Watcher{Path: o.ConfigPath, Apply: apply, Logger: log.With("component", "configfile")}
	go w.Run(ctx, sum)
	log.Info("control plane serving", "config", o.ConfigPath, "xds", p.XDSAddr(), "http", p.HTTPAddr())
	return p, nil
}

// FileModeProblems refuses what a config file served without a controller
// (`servemesh serve`) cannot have: backends whose replicas servemesh would
// run (a process: no agent runs it) or read from Consul (external: no
// catalog is read), which would never have a replica, and rollouts, which
// nothing would judge.
func FileModeProblems(m *model.Model) error {
	var problems []string
	for i, b := range m.Backends {
		field := fmt.Sprintf("backends[%d] (%q)", i, b.Name)
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
			problems = append(problems, fmt.Sprintf("endpoints[%d] (%q).rollout: servemesh serve judges no rollout (it reads no figures and keeps no state), so the rollout would never move; "+
				"set the traffic you want (traffic:), or run a controller with agents and apply the file (servemesh apply -f)", i, e.Name))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return &model.ValidationError{Problems: problems}
}

// ServeFile runs StartFilePlane until ctx ends.
func ServeFile(ctx context.Context, log *slog.Logger, o FilePlaneOptions) error {
	p, err := StartFilePlane(ctx, log, o)
	if err != nil {
		return err
	}
	<-ctx.Done()
	p.Stop()
	return nil
}
