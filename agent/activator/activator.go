package activator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/internal/tracing"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Activator holds the requests a node's Envoy has for a process backend
// while none of the backend's replicas can take them: it is just created,
// its only replica restarts, or it is scaled to zero. (A static or
// external backend with no healthy replica is answered 503 at once: none
// of its replicas is servemesh's to start.) Envoy sends it a backend's
// requests only then (the translation lists it after the replicas, see
// xds/translate's activator.go), naming the backend in wire.BackendHeader.
// It holds each request until the node's Envoy has a ready replica of the
// backend, then answers with wire.UnreachedHeader, on which Envoy retries
// the request on that replica; or, past the backend's hold_timeout_s or
// beyond its max_held, with a 503 saying why. A held request is in flight
// in Envoy's statistics for the backend, which is the demand the
// autoscaler sees: a backend scaled to zero comes back with its first
// request. This is Knative's activator, inside each node's agent.
//
// It listens on two unix sockets in the Envoy's folder: wire.ActivatorSocket
// for the backends' clusters, wire.ActivatorInboundSocket for the node's
// inbound clusters, where it holds a request only while a replica of the
// backend is placed on this node (otherwise the calling node should try
// another node, and is told so at once).
type Activator struct {
	admin   envoy.Admin
	node    string
	desired func() *nodeview.View
	log     *slog.Logger
	poll    time.Duration

	mu    sync.Mutex
	held  map[string]int          // by backend
	ready map[string]readyReading // by Envoy cluster

	heldNow  *prometheus.GaugeVec
	outcomes *prometheus.CounterVec
	tracer   *tracing.Tracer
}

// readyReading is when the Envoy last said whether a cluster had a ready
// replica.
type readyReading struct {
	at    time.Time
	ready bool
}

// Options configure an Activator.
type Options struct {
	Admin envoy.Admin // the node's Envoy
	Node  string      // the node's ID
	// Desired is the node's view of the latest desired state the agent
	// has read (nil: none yet). A nil Desired (an Envoy run without an
	// agent) holds the requests of any backend within the default bounds.
	Desired func() *nodeview.View
	Logger  *slog.Logger
	// Registerer receives the activator's metrics; nil skips them.
	Registerer prometheus.Registerer
	// Tracer receives a span per held request; nil: none.
	Tracer *tracing.Tracer
}

// Outcomes of a held request, as counted.
const (
	HeldReleased = "released" // a replica became ready: Envoy sent it there
	HeldTimeout  = "timeout"  // none was ready within hold_timeout_s
	HeldNotOurs  = "not_ours" // a static or external backend: answered 503 at once
	HeldFull     = "full"     // max_held requests were held already
	HeldGone     = "gone"     // the client went away first
)

// New returns an activator; Serve runs it.
func New(o Options) *Activator {
	a := &Activator{admin: o.Admin, node: o.Node, desired: o.Desired, log: o.Logger, poll: 50 * time.Millisecond, tracer: o.Tracer,
		held: map[string]int{}, ready: map[string]readyReading{},
		heldNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "servemesh_held_requests",
			Help: "Requests this node holds for a backend with no ready replica.",
		}, []string{"backend"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_held_requests_total",
			Help: "Requests this node held for a backend with no ready replica, by outcome: released (to a replica once ready), timeout, full (max_held reached), gone (the client left).",
		}, []string{"backend", "outcome"}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(a.heldNow, a.outcomes)
	}
	return a
}

// Held is how many requests the activator holds now, by backend.
func (a *Activator) Held() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.held))
	for b, n := range a.held {
		if n > 0 {
			out[b] = n
		}
	}
	return out
}

// Serve listens on the activator's sockets in dir (the folder the node's
// Envoy runs in) and serves until ctx ends.
func (a *Activator) Serve(ctx context.Context, dir string) error {
	var listeners []net.Listener
	for _, name := range []string{wire.ActivatorSocket, wire.ActivatorInboundSocket} {
		l, _, err := envoy.ListenSocket(ctx, dir, name)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("activator: %w", err)
		}
		listeners = append(listeners, l)
	}
	g, _ := rungroup.New(ctx)
	for i, l := range listeners {
		srv := &http.Server{Handler: a.handler(i == 1), ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true) // the clusters of HTTP/2 and gRPC backends speak it
		g.Go(l.Addr().String(), func(ctx context.Context) error {
			return rungroup.Serve(ctx, func() error {
				if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
					return err
				}
				return nil
			}, func() { _ = srv.Close() })
		})
	}
	a.log.Info("activator serving: requests for a backend with no ready replica wait here", "dir", dir)
	if err := g.Wait(); err != nil {
		return fmt.Errorf("activator: %w", err)
	}
	return nil
}

// handler holds the requests of the backends' clusters, or with inbound,
// of the node's inbound clusters, each in a span ("hold <backend>", the
// child of the Envoy's upstream span): what became of it and how long it
// was held.
func (a *Activator) handler(inbound bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get(wire.BackendHeader)
		ctx, span := a.tracer.Start(r.Context(), "hold "+name, propagation.HeaderCarrier(r.Header), trace.SpanKindServer,
			attribute.String(wire.TagBackend, name), attribute.String(wire.TagNode, a.node), attribute.Bool("servemesh.inbound", inbound))
		defer span.End()
		start := time.Now()
		outcome := a.hold(w, r.WithContext(ctx), name, inbound)
		span.SetAttributes(attribute.String(wire.TagOutcome, outcome), attribute.Float64(wire.TagHeldMS, float64(time.Since(start).Microseconds())/1000))
	})
}

// Outcomes of a request not held, as its span says (not counted).
const (
	heldUnknown   = "unknown_backend" // the backend is not in the desired state
	heldElsewhere = "elsewhere"       // inbound, with no replica placed here: the caller tries another node
)

// hold holds one request for backend name until one of its replicas is
// ready, and says what became of it.
func (a *Activator) hold(w http.ResponseWriter, r *http.Request, name string, inbound bool) string {
	b, ok := a.backend(name)
	if !ok {
		http.Error(w, fmt.Sprintf("servemesh: no backend %q to hold the request for", name), http.StatusServiceUnavailable)
		return heldUnknown
	}
	if b.Process == nil && a.desired != nil {
		// Static or external: no replica of it is servemesh's to start,
		// so holding would only delay the answer by hold_timeout_s.
		a.outcomes.WithLabelValues(name, HeldNotOurs).Inc()
		http.Error(w, fmt.Sprintf("servemesh: backend %q has no healthy replica, and its replicas are not servemesh's to start (static or external); see `servemesh status` for why", name),
			http.StatusServiceUnavailable)
		return HeldNotOurs
	}
	cluster := wire.ClusterName(name)
	if inbound {
		if !a.placedHere(b) {
			unreached(w) // the calling node tries another
			return heldElsewhere
		}
		cluster = wire.InboundClusterName(name)
	}
	if !a.admit(name, b.Config.EffectiveMaxHeld()) {
		a.outcomes.WithLabelValues(name, HeldFull).Inc()
		http.Error(w, fmt.Sprintf("servemesh: backend %q has no ready replica, and this node already holds %d requests for it (its config.max_held); raise max_held or give it replicas",
			name, b.Config.EffectiveMaxHeld()), http.StatusServiceUnavailable)
		return HeldFull
	}
	defer a.release(name)
	timeout := b.Config.EffectiveHoldTimeout()
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	outcome := HeldTimeout
	switch err := a.waitReady(ctx, cluster); {
	case err == nil:
		outcome = HeldReleased
		unreached(w)
	case r.Context().Err() != nil:
		outcome = HeldGone
	default:
		http.Error(w, fmt.Sprintf("servemesh: backend %q had no ready replica for %s (its config.hold_timeout_s); see `servemesh status` for why",
			name, timeout), http.StatusServiceUnavailable)
	}
	a.outcomes.WithLabelValues(name, outcome).Inc()
	return outcome
}

// unreached answers that the request reached no replica, which the route
// retries (on a ready replica, if it has one now).
func unreached(w http.ResponseWriter) {
	w.Header().Set(wire.UnreachedHeader, "1")
	w.WriteHeader(http.StatusServiceUnavailable)
}

// backend is the backend named name in the latest desired state; with no
// source of it (a node's Envoy run without an agent), any named backend,
// with the default bounds.
func (a *Activator) backend(name string) (meshspec.Backend, bool) {
	if a.desired == nil {
		return meshspec.Backend{Name: name}, name != ""
	}
	return a.desired().Backend(name)
}

// placedHere reports whether a replica of b is to run on this node.
func (a *Activator) placedHere(b meshspec.Backend) bool { return a.desired().PlacedHere(b.Name) }

func (a *Activator) admit(backend string, limit int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held[backend] >= limit {
		return false
	}
	a.held[backend]++
	a.heldNow.WithLabelValues(backend).Set(float64(a.held[backend]))
	return true
}

func (a *Activator) release(backend string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[backend]--
	a.heldNow.WithLabelValues(backend).Set(float64(a.held[backend]))
	if a.held[backend] == 0 {
		delete(a.held, backend)
	}
}

// waitReady waits until the node's Envoy has a ready replica in cluster,
// or ctx ends.
func (a *Activator) waitReady(ctx context.Context, cluster string) error {
	for {
		if a.isReady(ctx, cluster) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(a.poll):
		}
	}
}

// isReady reports whether the node's Envoy has, in cluster, a host that
// is healthy, or of unknown health (DEGRADED) other than the activator
// itself. One reading serves every request held for the cluster for a poll
// interval.
func (a *Activator) isReady(ctx context.Context, cluster string) bool {
	a.mu.Lock()
	last, ok := a.ready[cluster]
	a.mu.Unlock()
	if ok && time.Since(last.at) < a.poll {
		return last.ready
	}
	prefix := "cluster." + cluster + ".membership_"
	stats, err := a.admin.Stats(ctx, "^"+regexp.QuoteMeta(prefix)+"(healthy|degraded)$")
	ready := err == nil && (stats[prefix+"healthy"] > 0 || stats[prefix+"degraded"] > 1)
	a.mu.Lock()
	a.ready[cluster] = readyReading{at: time.Now(), ready: ready}
	if len(a.ready) > 10_000 { // clusters come and go: forget old readings
		clear(a.ready)
	}
	a.mu.Unlock()
	return ready
}
