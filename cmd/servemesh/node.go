package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/xds/translate"
)

// nodeOptions are the flags that describe one node's Envoy.
type nodeOptions struct {
	id, public, mesh, admin, xds, protocol string
}

func (o *nodeOptions) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&o.id, "node-id", host, "this node's Envoy node id")
	fs.StringVar(&o.public, "public", "0.0.0.0:8080", "address of the public listener serving routed endpoints")
	fs.StringVar(&o.mesh, "mesh", "127.0.0.1:15001", "address of the mesh listener where replicas reach any endpoint by Host header")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:19000", "address of Envoy's admin API (keep it on loopback)")
	fs.StringVar(&o.xds, "xds", "127.0.0.1:18000", "address of the control plane's xDS server, or several comma-separated (HA controllers)")
	fs.StringVar(&o.protocol, "xds-protocol", "sotw", "xDS variant: sotw (state of the world) or delta")
}

func (o *nodeOptions) bootstrapOptions() (bootstrap.Options, error) {
	publicHost, publicPort, err := hostPort("--public", o.public)
	if err != nil {
		return bootstrap.Options{}, err
	}
	meshHost, meshPort, err := hostPort("--mesh", o.mesh)
	if err != nil {
		return bootstrap.Options{}, err
	}
	return bootstrap.Options{
		Node:         translate.Node{ID: o.id, PublicAddress: publicHost, PublicPort: publicPort, MeshAddress: meshHost, MeshPort: meshPort},
		XDSAddress:   o.xds,
		AdminAddress: o.admin,
		Protocol:     bootstrap.Protocol(o.protocol),
	}, nil
}

func hostPort(flagName, addr string) (string, uint32, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: want IP:port, like 127.0.0.1:8080", flagName, addr)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: port must be a number from 1 to 65535", flagName, addr)
	}
	return host, uint32(port), nil
}

func runBootstrap(_ context.Context, _ *slog.Logger, args []string, stdout io.Writer) error {
	var o nodeOptions
	fs := newFlags("bootstrap", "[flags]")
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts, err := o.bootstrapOptions()
	if err != nil {
		return err
	}
	out, err := bootstrap.YAML(opts)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// envoyOptions add how to run Envoy to a node's options.
type envoyOptions struct {
	node        nodeOptions
	binary      string
	workDir     string
	concurrency int
	drain       time.Duration
	logLevel    string
}

func (o *envoyOptions) register(fs *flag.FlagSet) {
	o.node.register(fs)
	fs.StringVar(&o.binary, "envoy", "", "path to the Envoy binary (default: $"+envoy.EnvVar+", .tools/bin/envoy, then $PATH)")
	fs.StringVar(&o.workDir, "work-dir", ".run/envoy", "folder for the bootstrap file and Envoy's log")
	fs.IntVar(&o.concurrency, "concurrency", 0, "Envoy worker threads (default: one per core)")
	fs.DurationVar(&o.drain, "drain", 2*time.Second, "how long listeners drain on shutdown")
	fs.StringVar(&o.logLevel, "envoy-log-level", "warning", "Envoy's log level")
}

// prepare finds and checks Envoy and writes the node's bootstrap.
func (o *envoyOptions) prepare(ctx context.Context, log *slog.Logger) (*envoy.Supervisor, error) {
	binary, err := envoy.Find(o.binary)
	if err != nil {
		return nil, err
	}
	v, err := envoy.CheckVersion(ctx, binary)
	if err != nil {
		return nil, err
	}
	opts, err := o.node.bootstrapOptions()
	if err != nil {
		return nil, err
	}
	yaml, err := bootstrap.YAML(opts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.workDir, 0o755); err != nil {
		return nil, fmt.Errorf("work dir: %w", err)
	}
	bootstrapPath := filepath.Join(o.workDir, "bootstrap.yaml")
	if err := os.WriteFile(bootstrapPath, yaml, 0o644); err != nil {
		return nil, fmt.Errorf("write bootstrap: %w", err)
	}
	log.Info("envoy prepared", "binary", binary, "version", v, "bootstrap", bootstrapPath)
	return &envoy.Supervisor{
		Config: envoy.Config{
			Binary: binary, ConfigPath: bootstrapPath, AdminAddress: o.node.admin,
			LogPath: filepath.Join(o.workDir, "envoy.log"), LogLevel: o.logLevel,
			Concurrency: o.concurrency, DrainTime: o.drain, Logger: log,
		},
		Drain: o.drain,
	}, nil
}

func runEnvoy(ctx context.Context, log *slog.Logger, args []string, _ io.Writer) error {
	var o envoyOptions
	fs := newFlags("envoy", "[flags]")
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sup, err := o.prepare(ctx, log)
	if err != nil {
		return err
	}
	sup.OnStart = func(p *envoy.Process) {
		go func() {
			readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := p.WaitReady(readyCtx); err != nil && !errors.Is(ctx.Err(), context.Canceled) {
				log.Error("envoy not ready", "err", err)
				return
			}
			log.Info("envoy ready", "pid", p.Pid(), "public", o.node.public, "mesh", o.node.mesh, "admin", o.node.admin)
		}()
	}
	return sup.Run(ctx)
}
