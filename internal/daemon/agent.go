package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/agent"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/wire"
)

// AgentOptions configure `servemesh agent`. Consul is reached through
// CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN.
type AgentOptions struct {
	// Node is the node's address and capacity; its ID names the node, and
	// its status address is filled in from StatusListen.
	Node wire.NodeInfo
	// Envoy is how to run the node's Envoy; NoEnvoy runs none.
	Envoy        envoy.Launcher
	NoEnvoy      bool
	ConsulPrefix string
	DrainGrace   time.Duration
	// StatusListen is the agent's status listener (port 0 picks one).
	StatusListen string
	// RunAs is the user replicas run as; see agent.Options.
	RunAs string
	// StatusToken, if set, is the bearer token the status listener asks
	// for; beyond loopback it must be set unless Insecure.
	StatusToken string
	Insecure    bool
	// XDSOverTLS makes the node's Envoy reach the controller over TLS with
	// the node's Consul Connect identity (service servemesh-node-<id>).
	XDSOverTLS bool
}

// RunAgent runs a node's agent and, unless NoEnvoy, its Envoy, until ctx
// ends or either fails.
func RunAgent(ctx context.Context, log *slog.Logger, o AgentOptions) error {
	client, err := consulapi.NewClient(consulapi.DefaultConfig())
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	reg := httpserver.NewRegistry()
	admin := envoy.Admin{Address: o.Envoy.Bootstrap.AdminAddress}
	if !o.NoEnvoy {
		agent.RegisterLoadMetrics(reg, admin, o.Node.ID)
	}
	if o.StatusToken == "" && !httpserver.IsLoopback(o.StatusListen) {
		if !o.Insecure {
			return fmt.Errorf("refusing to serve the agent's status listener on %s without a token: give --status-token-file (and the controller --agent-token-file), or --insecure", o.StatusListen)
		}
		log.Warn("INSECURE: the agent's status listener is beyond loopback without a token", "listen", o.StatusListen)
	}
	status, err := httpserver.Start(ctx, log, o.StatusListen, httpserver.RequireBearer(o.StatusToken, agent.StatusHandler(reg, admin, o.Node.ID)))
	if err != nil {
		return fmt.Errorf("agent status listener: %w", err)
	}
	defer status.Stop()
	o.Node.StatusAddr = status.Addr()
	a, err := agent.New(agent.Options{
		Node: o.Node, Consul: client, Store: store.NewConsul(client, o.ConsulPrefix), Logger: log.With("component", "agent"),
		WorkDir: o.Envoy.WorkDir + "/replicas", Registerer: reg, DrainGrace: o.DrainGrace, RunAs: o.RunAs,
	})
	if err != nil {
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- a.Run(ctx) }()
	if !o.NoEnvoy {
		if o.XDSOverTLS {
			if err := nodeIdentity(ctx, client, &o); err != nil {
				return err
			}
		}
		sup, err := o.Envoy.Supervise(ctx)
		if err != nil {
			return err
		}
		go func() { errs <- sup.Run(ctx) }()
	}
	return firstError(ctx, errs)
}

// nodeIdentity fetches the node's Consul Connect leaf and the CA roots,
// writes them beside its Envoy's bootstrap and points the bootstrap at them.
func nodeIdentity(ctx context.Context, client *consulapi.Client, o *AgentOptions) error {
	b, err := connect.Fetch(ctx, client, connect.NodeService(o.Node.ID))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.Envoy.WorkDir, 0o700); err != nil {
		return fmt.Errorf("envoy work dir: %w", err)
	}
	t := &bootstrap.XDSTLS{CertFile: filepath.Join(o.Envoy.WorkDir, "node-cert.pem"), KeyFile: filepath.Join(o.Envoy.WorkDir, "node-key.pem"),
		CAFile: filepath.Join(o.Envoy.WorkDir, "ca-roots.pem"), ServerSANSuffix: "/svc/" + connect.ControllerService}
	for path, data := range map[string][]byte{t.CertFile: b.CertPEM, t.KeyFile: b.KeyPEM, t.CAFile: b.RootsPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("write the node's identity: %w", err)
		}
	}
	for _, p := range []*string{&t.CertFile, &t.KeyFile, &t.CAFile} {
		if abs, err := filepath.Abs(*p); err == nil {
			*p = abs
		}
	}
	o.Envoy.Bootstrap.XDSTLS = t
	return nil
}

// RunEnvoy supervises one node's Envoy until ctx ends.
func RunEnvoy(ctx context.Context, n envoy.Launcher) error {
	sup, err := n.Supervise(ctx)
	if err != nil {
		return err
	}
	return sup.Run(ctx)
}

// firstError waits until ctx ends (nil) or a component reports an error
// (nil too if it only reports its context's end).
func firstError(ctx context.Context, errs <-chan error) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}
