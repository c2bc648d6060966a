package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/agent"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/autoscale"
	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/leader"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/xds/server"
)

// FaultEnv names the environment variable that sets the probability of
// exiting right after a checkpoint (fault injection for tests).
const FaultEnv = "SERVEMESH_FAULT_CRASH_AFTER_CHECKPOINT"

func runController(ctx context.Context, log *slog.Logger, args []string, _ io.Writer) error {
	fs := newFlags("controller", "[flags]")
	apiListen := fs.String("api-listen", "127.0.0.1:18001", "address of the HTTP API (/v1/), /metrics and /healthz; keep it on loopback unless a token protects it")
	xdsListen := fs.String("xds-listen", "127.0.0.1:18000", "address of the xDS gRPC server Envoy nodes connect to")
	advertise := fs.String("advertise", "", "API address other controllers hand to clients when this one leads (default: --api-listen)")
	prefix := fs.String("consul-prefix", "servemesh", "Consul KV prefix of the stored state; Consul is reached through CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN")
	id := fs.String("id", "", "this controller's id among controllers (default: host name and API port)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token every API call must carry (default: no token)")
	crash := fs.Float64("fault-crash-after-checkpoint", 0, "fault injection: probability of exiting right after a checkpoint (also $"+FaultEnv+")")
	drain := fs.Duration("drain-grace", 5*time.Second, "how long a draining replica serves in-flight requests before its agent stops it")
	replaceAfter := fs.Duration("replace-after", 30*time.Second, "how long a node may be gone before its replicas are placed elsewhere")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if v := os.Getenv(FaultEnv); v != "" && *crash == 0 {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("$%s=%q: want a probability between 0 and 1", FaultEnv, v)
		}
		*crash = p
	}
	if *crash < 0 || *crash > 1 {
		return fmt.Errorf("--fault-crash-after-checkpoint %v: want a probability between 0 and 1", *crash)
	}
	token, err := readToken(*tokenFile)
	if err != nil {
		return err
	}
	if *advertise == "" {
		*advertise = *apiListen
	}
	if *id == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(*apiListen)
		*id = host + "-" + port
	}
	client, err := consulapi.NewClient(consulapi.DefaultConfig())
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}

	ps, err := startServers(ctx, log, *xdsListen, *apiListen)
	if err != nil {
		return err
	}
	defer ps.stop()
	dp := &dataPlane{xds: ps.xds, ctx: ctx}
	dp.watcher = catalog.NewWatcher(client, log.With("component", "catalog"), dp.refresh)
	healthy := func(backend string) map[string]bool {
		out := map[string]bool{}
		for _, in := range dp.watcher.Snapshot()[backend] {
			out[in.Tag] = in.Passing
		}
		return out
	}
	ctl := controller.New(controller.Options{
		Logger: log.With("component", "controller"), Store: store.NewConsul(client, *prefix),
		Publish: dp.publish, Registerer: ps.reg, CrashAfterCheckpoint: *crash,
		Nodes: agent.ListNodes(client), DrainGrace: *drain, ReplaceAfter: *replaceAfter, Healthy: healthy,
	})
	scaler := autoscale.New(ctl, agent.ListNodes(client), log.With("component", "autoscale"), ps.reg)
	go scaler.Run(ctx)
	ps.mux.Handle("/v1/", api.Handler(ctl, token, log.With("component", "api"),
		func() api.StatusReport { return statusReport(ctl, scaler, ps.xds) }))
	if *crash > 0 {
		log.Warn("fault injection on: this controller exits after a checkpoint with some probability", "probability", *crash)
	}
	log.Info("controller serving", "api", ps.httpAddr, "xds", ps.xdsAddr, "consul_prefix", *prefix, "id", *id)

	errs := make(chan error, 2)
	go func() { errs <- ctl.Run(ctx) }()
	elector := &leader.Elector{Client: client, Key: strings.Trim(*prefix, "/") + "/leader",
		Self: leader.Info{ID: *id, API: *advertise}, Logger: log.With("component", "leader")}
	go func() {
		errs <- elector.Run(ctx,
			func(ctx context.Context) error {
				if err := ctl.Lead(ctx, *advertise); err != nil {
					return err
				}
				go ctl.ReconcileLoop(ctx, time.Second) // finishes half-done work, then keeps placements whole
				return nil
			},
			func(l leader.Info) { ctl.Follow(l.API) })
	}()
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

// dataPlane publishes the desired state merged with Consul's health view of
// the replicas: what Envoy should route to.
type dataPlane struct {
	xds     *server.Server
	watcher *catalog.Watcher
	ctx     context.Context

	mu    sync.Mutex
	model *model.Model
}

// publish and refresh hold mu while they compute the view and hand it to
// the xDS server, so a refresh computed from an older model can never be
// published after a newer one.
func (d *dataPlane) publish(m *model.Model) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.model = m
	d.watcher.Sync(d.ctx, catalog.Services(m))
	return d.xds.SetModel(catalog.DataPlaneView(m, d.watcher.Snapshot()))
}

// refresh republishes after the health view changed.
func (d *dataPlane) refresh() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.model == nil {
		return
	}
	_ = d.xds.SetModel(catalog.DataPlaneView(d.model, d.watcher.Snapshot()))
}

// statusReport joins the configured state, the live load and the nodes'
// config currency.
func statusReport(ctl *controller.Controller, scaler *autoscale.Autoscaler, xds *server.Server) api.StatusReport {
	m, _ := ctl.State()
	load := scaler.Load()
	r := api.StatusReport{Endpoints: []api.EndpointStatus{}, Backends: []api.BackendStatus{}, Nodes: []api.NodeStatus{}}
	for _, e := range m.Endpoints {
		es := api.EndpointStatus{Name: e.Name, Route: e.Route}
		names := map[string]bool{}
		for b := range e.Traffic {
			names[b] = true
		}
		for b := range e.Shadows {
			names[b] = true
		}
		for _, b := range model.SortedKeys(names) {
			l := load[b]
			es.Backends = append(es.Backends, api.EndpointBackendStatus{Backend: b, Weight: e.Traffic[b], Shadow: e.Shadows[b],
				RequestRate: l.RequestRate, ErrorRate: l.ErrorRate})
		}
		r.Endpoints = append(r.Endpoints, es)
	}
	for _, b := range m.Backends {
		bs := api.BackendStatus{Name: b.Name, Desired: b.Config.NumReplicas, Autoscaled: b.Config.Autoscaling != nil,
			InFlight: load[b.Name].InFlight, RequestRate: load[b.Name].RequestRate, ErrorRate: load[b.Name].ErrorRate}
		for _, p := range b.Placements {
			if p.State == model.Running {
				bs.Running++
			} else {
				bs.Draining++
			}
		}
		if b.Process == nil {
			bs.Desired, bs.Running = len(b.Replicas), len(b.Replicas)
		}
		r.Backends = append(r.Backends, bs)
	}
	for _, n := range xds.Status() {
		r.Nodes = append(r.Nodes, api.NodeStatus{ID: n.ID, Connected: n.Connected, InSync: n.InSync, NACKs: n.NACKs, LastNACK: n.LastNACK})
	}
	return r
}

// readToken reads a bearer token file; an empty path means no token.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty; put the token in it", path)
	}
	return token, nil
}
