package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/autoscale"
	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/controlplane/console"
	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/dataplane"
	"github.com/servemesh/servemesh/controlplane/leader"
	"github.com/servemesh/servemesh/controlplane/rollout"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/internal/tracing"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// ControllerOptions configure `servemesh controller`. Consul is reached
// through CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN.
type ControllerOptions struct {
	APIListen, XDSListen string
	// Advertise is the API address other controllers hand to clients when
	// this one leads.
	Advertise    string
	ConsulPrefix string
	ID           string
	// Tokens are the API's bearer tokens by scope; none: no authentication,
	// allowed only on a loopback address unless Insecure.
	Tokens   api.Tokens
	Insecure bool
	// XDSCacheOff turns translation's reuse off (server.Options.CacheOff).
	XDSCacheOff bool
	// AgentToken is sent to agents' status listeners, which read it as their
	// --status-token-file.
	AgentToken string
	// APITLSCert and APITLSKey, if set, are PEM files the API serves HTTPS
	// with; replaced by rename, they are reloaded without a restart.
	APITLSCert, APITLSKey string
	// DebugProfiles serves Go's runtime profiles on the API listener, to
	// the exec scope (api.DebugHandler).
	DebugProfiles bool
	// Plaintext runs the mesh without mTLS, for a single trusted host.
	// Otherwise xDS is served over TLS with the controller's Consul Connect
	// identity, requiring each node's (its id from its certificate), and
	// nodes call each other's replicas over mTLS.
	Plaintext bool
	// InsecureConsul skips, with mTLS, the check that Consul enforces ACLs.
	InsecureConsul       bool
	CrashAfterCheckpoint float64
	DrainGrace           time.Duration
	ReplaceAfter         time.Duration
	// Addresses are the replica addresses users may name (static replicas,
	// external services' instances).
	Addresses meshspec.AddressPolicy
}

// controllerParts are a controller's components, wired together.
type controllerParts struct {
	plane     *Plane
	agents    *agentCalls // how it calls the nodes' agents
	ctl       *controller.Controller
	scaler    *autoscale.Autoscaler
	rollouts  *rollout.Runner
	publisher *dataplane.Publisher
	watcher   *catalog.Watcher
	tracer    *tracing.Tracer // the API's spans
	terms     sync.WaitGroup  // each leadership term's reconcile loop
}

// RunController runs a controller until ctx ends or a component fails:
// its components run in one group (rungroup), the first to stop stops the
// others, and it returns when every one of them has, saying which stopped
// it.
func RunController(ctx context.Context, log *slog.Logger, o ControllerOptions) error {
	if err := proc.CheckDistinct([]proc.Listener{{What: "--xds-listen", Addr: o.XDSListen}, {What: "--api-listen", Addr: o.APIListen}}); err != nil {
		return err
	}
	if err := checkExposure(log, o); err != nil {
		return err
	}
	client, closeConsul, err := consulClient()
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	defer closeConsul()
	p := wireController(log, client, o)
	identities, err := meshMTLS(ctx, log, client, o, p)
	if err != nil {
		return err
	}
	if err := apiTLS(log, o, p.plane); err != nil {
		return err
	}
	if err := p.plane.Listen(ctx, o.XDSListen, o.APIListen); err != nil {
		return err
	}
	g, _ := rungroup.New(ctx)
	if identities != nil {
		g.Go("identities", identities)
	}
	if o.CrashAfterCheckpoint > 0 {
		log.Warn("fault injection on: this controller exits after a checkpoint with some probability", "probability", o.CrashAfterCheckpoint)
	}
	log.Info("controller serving", "api", p.plane.HTTPAddr(), "xds", p.plane.XDSAddr(), "consul_prefix", o.ConsulPrefix, "id", o.ID,
		"version", wire.Version, "protocol", wire.Protocol)
	g.Go("plane", p.plane.Run)
	g.Go("catalog", p.watcher.Run)
	g.Go("dataplane", p.publisher.Run)
	g.Go("autoscaler", p.scaler.Run)
	g.Go("rollouts", p.rollouts.Run)
	g.Go("controller", p.ctl.Run)
	elector := &leader.Elector{Client: client, Key: strings.Trim(o.ConsulPrefix, "/") + "/leader",
		Self: leader.Info{ID: o.ID, API: o.Advertise, Version: wire.Version, Protocol: wire.Protocol}, Logger: log.With("component", "leader")}
	// On the way out the elector releases the lock and deregisters, so
	// others take over at once; Wait waits for it.
	g.Go("leader election", func(ctx context.Context) error {
		return elector.Run(ctx, p.lead(o.Advertise), func(l leader.Info) { p.ctl.Follow(l.API) })
	})
	err = g.Wait()
	p.terms.Wait()
	shutdownTracer(p.tracer, log)
	logStopped(log, "controller", err)
	return err
}

// consulClient is a daemon's Consul client, from CONSUL_HTTP_ADDR and
// CONSUL_HTTP_TOKEN, and what closes its idle connections when the daemon
// stops (their goroutines would outlive it).
func consulClient() (*consulapi.Client, func(), error) {
	cfg := consulapi.DefaultConfig()
	client, err := consulapi.NewClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	return client, func() {
		if cfg.Transport != nil {
			cfg.Transport.CloseIdleConnections()
		}
	}, nil
}

// apiTLS makes the API serve HTTPS when it has a certificate, and warns
// when tokens would cross a network in the clear.
func apiTLS(log *slog.Logger, o ControllerOptions, plane *Plane) error {
	if o.APITLSCert == "" && o.APITLSKey == "" {
		if !httpserver.IsLoopback(o.APIListen) {
			log.Warn("the API is served over plain HTTP beyond loopback: its tokens cross the network in the clear; give --api-tls-cert and --api-tls-key",
				"listen", o.APIListen)
		}
		return nil
	}
	if o.APITLSCert == "" || o.APITLSKey == "" {
		return errors.New("the API's TLS needs both --api-tls-cert and --api-tls-key")
	}
	certs, err := httpserver.LoadCertFiles(o.APITLSCert, o.APITLSKey)
	if err != nil {
		return fmt.Errorf("--api-tls-cert/--api-tls-key: %w", err)
	}
	plane.ServeHTTPOverTLS(certs.TLSConfig())
	log.Info("the API serves HTTPS", "cert", o.APITLSCert)
	return nil
}

// meshMTLS, unless the mesh runs in plaintext, serves xDS over TLS with the
// controller's identity and makes the mesh run mTLS between nodes. It
// returns what keeps that identity fresh, for the daemon's run group (nil
// in plaintext).
func meshMTLS(ctx context.Context, log *slog.Logger, client *consulapi.Client, o ControllerOptions, p *controllerParts) (func(context.Context) error, error) {
	if o.Plaintext {
		log.Warn("PLAINTEXT: any client that reaches the xDS address gets the mesh's config, and calls between nodes are neither "+
			"encrypted nor authenticated; use this on a single trusted host only", "xds", o.XDSListen)
		return nil, nil
	}
	if err := checkConsulACLs(ctx, log, o.InsecureConsul); err != nil {
		return nil, err
	}
	var src *connect.Source
	err := connect.Retry(ctx, log, "the controller's identity", func(ctx context.Context) (err error) {
		src, err = connect.NewSource(ctx, client, connect.ControllerService)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the controller's identity from Consul's service-mesh CA (is Connect on? or run with --plaintext on a single trusted host): %w", err)
	}
	leaf, err := x509.ParseCertificate(src.Bundle().Leaf.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("the controller's leaf certificate: %w", err)
	}
	prefix, ok := connect.IdentityPrefix(leaf)
	if !ok {
		return nil, errors.New("the controller's leaf certificate names no SPIFFE service id")
	}
	if err := p.plane.XDS.RequireMTLS(&translate.MTLS{IdentityPrefix: prefix}); err != nil {
		return nil, err
	}
	p.plane.ServeXDSOverTLS(src.ServerTLS())
	p.agents.useIdentity(src)
	log.Info("mTLS: xDS over TLS, nodes known by their Consul Connect certificates; calls between nodes over mTLS", "identities", prefix)
	return func(ctx context.Context) error { return src.Run(ctx, log.With("component", "connect")) }, nil
}

// wireController builds a controller's components and connects them.
func wireController(log *slog.Logger, client *consulapi.Client, o ControllerOptions) *controllerParts {
	plane := NewPlane(log, o.XDSCacheOff)
	watcher := catalog.NewWatcher(client, log.With("component", "catalog"))
	publisher := dataplane.New(dataplane.Options{Sink: plane.XDS, Instances: watcher,
		Rules:  dataplane.Rules{MTLS: !o.Plaintext, Addresses: o.Addresses, Names: dataplane.NewResolver(nil, 0)},
		Logger: log.With("component", "dataplane"), Registerer: plane.Registry})
	nodes := catalog.Nodes(client, log.With("component", "catalog").Warn)
	ctl := controller.New(controller.Options{
		Logger: log.With("component", "controller"), Store: store.NewConsul(client, o.ConsulPrefix, log.With("component", "store")),
		Publish: publisher.Publish, Registerer: plane.Registry, CrashAfterCheckpoint: o.CrashAfterCheckpoint,
		Nodes: nodes, DrainGrace: o.DrainGrace, ReplaceAfter: o.ReplaceAfter, Healthy: func(backend string) map[string]bool { return watcher.PassingTags(wire.BackendService(backend)) },
		Registered: watcher.RegisteredTags,
		Addresses:  o.Addresses,
		Plaintext:  o.Plaintext,
	})
	scaler := autoscale.New(ctl, nodes, log.With("component", "autoscale"), plane.Registry)
	agents := newAgentCalls(o.AgentToken, 5*time.Second)
	scaler.Agents = agents.get
	rollouts := rollout.New(ctl, scaler.Latest, log.With("component", "rollout"), plane.Registry)
	status := func() api.StatusReport {
		m, _ := ctl.State()
		return api.NewStatusReport(api.StatusInputs{State: m, Backends: scaler.Load(), Endpoints: scaler.EndpointRates(),
			Health: replicaHealth(watcher.Snapshot()), Nodes: plane.XDS.Status(), Problems: problems(ctl, publisher), Configs: scaler.ConfigVersions(),
			Draining: scaler.DrainingInFlight(), Rollouts: rollouts.Live(), Unread: scaler.Unread(), Loads: scaler.Latest()})
	}
	tracer := tracing.New(wire.ControllerTraceService, func() *meshspec.Tracing { t, _ := ctl.Tracing(); return t }, log.With("component", "tracing"))
	served := func(rev uint64, backends []meshspec.Backend) api.ServedReport {
		names := make([]string, len(backends))
		for i, b := range backends {
			names[i] = b.Name
		}
		m, _ := ctl.State()
		var endpoints []meshspec.Endpoint
		if m != nil {
			endpoints = m.Endpoints
		}
		return api.NewServedReport(api.ServedInputs{Revision: rev, Backends: backends, Serving: plane.XDS.Serving(names),
			Health: replicaHealth(watcher.Snapshot()), Problems: problems(ctl, publisher), Refused: publisher.Err(), Configs: scaler.ConfigVersions(),
			Endpoints: endpoints, Loads: scaler.Latest()})
	}
	plane.Mux.Handle("/v1/", api.Handler(ctl, log.With("component", "api"), api.Sources{Status: status, Served: served, Live: rollouts.Live, Draining: scaler.DrainingInFlight, Agents: nodes,
		Logs: agentLogs(nodes, agents), Tracing: tracer.Provider()}))
	plane.Mux.Handle("GET "+console.Path, console.Handler())
	plane.Mux.Handle("GET /ui", http.RedirectHandler(console.Path, http.StatusMovedPermanently))
	if o.DebugProfiles {
		plane.Mux.Handle("/debug/pprof/", api.DebugHandler())
	}
	plane.Mux.Handle("GET "+api.XDSCachePath, api.XDSCacheHandler(func() any { return plane.XDS.CacheView() }))
	plane.Wrap(o.Tokens.Authenticate)
	return &controllerParts{plane: plane, agents: agents, ctl: ctl, scaler: scaler, rollouts: rollouts, publisher: publisher, watcher: watcher, tracer: tracer}
}

// checkExposure refuses an API without a token on an address beyond
// loopback: whoever reaches it could run commands on every node.
func checkExposure(log *slog.Logger, o ControllerOptions) error {
	if len(o.Tokens) > 0 || httpserver.IsLoopback(o.APIListen) {
		return nil
	}
	if !o.Insecure {
		return fmt.Errorf("refusing to serve the API on %s without a token: anyone who reaches it could run commands on every node; give --token-file (and --read-token-file, --write-token-file for narrower scopes), or --insecure to accept that", o.APIListen)
	}
	log.Warn("INSECURE: the API listens beyond loopback without a token; anyone who reaches it can run commands on every node", "api", o.APIListen)
	return nil
}

// problems lists what keeps the data plane from following the stored
// state exactly.
func problems(ctl *controller.Controller, publisher *dataplane.Publisher) []string {
	var out []string
	for _, u := range ctl.StoreProblems() {
		out = append(out, fmt.Sprintf("stored key %s cannot be read and is left out: %s", u.Key, u.Reason))
	}
	for _, d := range publisher.Dropped() {
		out = append(out, fmt.Sprintf("instance %s of backend %s is left out of the data plane: %s", d.Instance, d.Backend, d.Reason))
	}
	if err := publisher.Err(); err != nil {
		out = append(out, err.Error())
	}
	out = append(out, ctl.UnservedSettings()...)
	placing := ctl.PlacementProblems()
	for _, backend := range slices.Sorted(maps.Keys(placing)) {
		out = append(out, api.PlacementProblemPrefix(backend)+placing[backend]+" (servemesh keeps trying)")
	}
	return out
}

// lead is what the controller does each time it wins the election: recover
// and publish the stored state, then keep placements whole.
func (p *controllerParts) lead(self string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := p.ctl.Lead(ctx, self); err != nil {
			return err
		}
		// Finishes half-done work, then keeps placements whole, for the
		// term (ctx); RunController waits for it.
		p.terms.Go(func() { p.ctl.ReconcileLoop(ctx, time.Second) })
		return nil
	}
}

// replicaHealth counts, from the catalog's instances, a process backend's
// running placements that are ready and those not heard from.
func replicaHealth(instances map[string][]catalog.Instance) func(meshspec.Backend) api.ReplicaHealth {
	return func(b meshspec.Backend) api.ReplicaHealth {
		byTag := map[string]catalog.Instance{}
		for _, in := range instances[wire.BackendService(b.Name)] {
			byTag[in.Tag] = in
		}
		var h api.ReplicaHealth
		for _, p := range b.Placements {
			in, registered := byTag[p.Tag]
			r := api.ReplicaStatus{Tag: p.Tag, Node: p.Node, State: p.State, Ready: in.Passing, Unheard: in.Expired, Note: in.Note, Restarts: in.Restarts,
				Address: in.Address, Since: p.Since}
			if !registered {
				r.Note = "not registered by its node's agent yet"
			}
			h.Replicas = append(h.Replicas, r)
			if p.State != meshspec.Running {
				continue
			}
			switch {
			case in.Passing:
				h.Ready++
			case in.Expired:
				h.Unheard++
			}
		}
		return h
	}
}
