package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/xds/cache"
	"github.com/servemesh/servemesh/xds/translate"
)

// Options tune a Server. The zero value of every field but Logger is usable.
type Options struct {
	// Logger receives the server's logs; required.
	Logger *slog.Logger
	// Registerer receives the server's Prometheus metrics; nil skips them.
	Registerer prometheus.Registerer
	// HoldOff is how long the publisher waits for more changes after one
	// arrives before it rebuilds; 20ms when zero.
	HoldOff time.Duration
	// MaxHoldOff caps the wait during a steady stream of changes; 250ms when zero.
	MaxHoldOff time.Duration
	// ForgetNodesAfter is how long a node without an open stream is kept
	// (its snapshot and status); 10 minutes when zero.
	ForgetNodesAfter time.Duration
	// MaxGoneNodes is how many nodes without an open stream are kept at
	// most; the longest gone are forgotten first. 256 when zero.
	MaxGoneNodes int
	// CacheOff makes translation reuse nothing it built
	// (translate.Uncached), and each publish nothing of the last one's
	// (encodings, kinds, cuts, nodes' snapshots): each change is
	// translated and encoded whole, and compared with what was sent. The
	// off switch for a suspected cache fault ($SERVEMESH_XDS_CACHE=off).
	CacheOff bool
}

// Server holds the last good model and serves it to every connected node.
type Server struct {
	log         *slog.Logger
	metrics     *metrics
	snapshots   map[string]cachev3.SnapshotCache // by type URL (snapshotTypes), for state-of-the-world streams
	deltas      map[string]*deltaCache           // by type URL (snapshotTypes), for delta streams
	assignments *cachev3.LinearCache
	ads         serverv3.Server
	holdOff     time.Duration
	maxHoldOff  time.Duration
	forgetAfter time.Duration
	maxGone     int
	cacheOff    bool // Options.CacheOff
	wake        chan struct{}
	// urgent wakes the publisher without coalescing: a request is
	// waiting for what a node asked for on demand (demand.go).
	urgent chan struct{}

	// setting serialises SetDataPlane: each validates what changed since
	// the data plane it replaces.
	setting sync.Mutex

	mu        sync.Mutex
	dataPlane *ir.DataPlane
	// taken is the generation of the data plane the last publish took; a
	// later one is pending, and the change of the next is added to its.
	taken      uint64
	mtls       *translate.MTLS // nil: plaintext between nodes
	generation uint64
	acceptedAt map[uint64]time.Time // when each recent generation was accepted
	nodes      map[string]*nodeState
	streams    map[streamKey]*streamState

	newNodes map[string]bool // connected since the last publish
	// skewed are the nodes whose streams are refused for their protocol,
	// by id, as they last announced themselves.
	skewed map[string]skewedNode

	// publishedAssignments are the assignments in the cache, name ->
	// version: written by the publisher goroutine, under mu (Serving
	// reads it).
	publishedAssignments map[string]string

	// Owned by the publisher goroutine, but for retiring.
	// retiring are the assignments no longer built, by the generation
	// whose publish first left them out: each is removed once every
	// connected node has ACKed clusters of that generation or later
	// (removeRetired), so a cluster still using one never loses its
	// replicas before its new version reaches the node. Under mu.
	retiring map[string]uint64
	built    *sharedResources // the last generation's resources
	builtGen uint64
	builder  *translate.Builder // incremental translation, for the current mTLS
	// cache is the one cache of the xDS wing: the builder's parts and the
	// server's kinds (KindSnapshotKinds); safe for concurrent use, so the
	// debug view reads it from the API's goroutines.
	cache *cache.Cache
}

// New builds a Server. Call Register to expose it on a gRPC server and Run to
// start publishing.
func New(opts Options) *Server {
	s := &Server{
		log:                  opts.Logger,
		cacheOff:             opts.CacheOff,
		holdOff:              opts.HoldOff,
		maxHoldOff:           opts.MaxHoldOff,
		forgetAfter:          opts.ForgetNodesAfter,
		maxGone:              opts.MaxGoneNodes,
		wake:                 make(chan struct{}, 1),
		urgent:               make(chan struct{}, 1),
		nodes:                map[string]*nodeState{},
		acceptedAt:           map[uint64]time.Time{},
		streams:              map[streamKey]*streamState{},
		newNodes:             map[string]bool{},
		skewed:               map[string]skewedNode{},
		publishedAssignments: map[string]string{},
		retiring:             map[string]uint64{},
	}
	s.metrics = newMetrics(opts.Registerer, s.outOfSync)
	if s.cacheOff {
		s.log.Info("translation's cache is off: each change is translated whole and compared with what was sent")
	}
	if s.holdOff == 0 {
		s.holdOff = 20 * time.Millisecond
	}
	if s.maxHoldOff == 0 {
		s.maxHoldOff = 250 * time.Millisecond
	}
	if s.forgetAfter == 0 {
		s.forgetAfter = 10 * time.Minute
	}
	if s.maxGone == 0 {
		s.maxGone = 256
	}
	cacheLog := cacheLogger{s.log}
	// ads=false: in ADS mode the cache answers a route request only if it
	// names every route configuration in the snapshot, so a node whose public
	// listener failed (say, its port was taken) would never get the routes of
	// its working mesh listener. Envoy sequences ADS updates itself.
	caches := map[string]cachev3.Cache{}
	s.cache = cache.New(cache.Mode(!s.cacheOff))
	s.snapshots = make(map[string]cachev3.SnapshotCache, len(snapshotTypes))
	s.deltas = make(map[string]*deltaCache, len(snapshotTypes))
	for _, typ := range snapshotTypes {
		c := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, cacheLog)
		s.snapshots[typ], caches[typ] = c, c
		s.deltas[typ] = newDeltaCache(typ)
		caches[deltaKey(typ)] = s.deltas[typ]
	}
	s.assignments = cachev3.NewLinearCache(resource.EndpointType, cachev3.WithLogger(cacheLog))
	caches[resource.EndpointType] = s.assignments
	mux := &cachev3.MuxCache{
		Classify: func(r *cachev3.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string {
			if typ := classify(r.GetTypeUrl()); typ != resource.EndpointType {
				return deltaKey(typ)
			}
			return resource.EndpointType
		},
		Caches: caches,
	}
	s.ads = serverv3.NewServer(context.Background(), mux, &callbacks{s: s})
	return s
}

// snapshotTypes are the types served from per-node snapshots, two caches
// each (a deltaCache, a snapshot cache for state of the world), in the
// order a change sets them: clusters and listeners before the routes
// they name. A cache is set for a node only with the types that changed
// for it: go-control-plane's snapshot cache compares every resource of
// a snapshot with what each of the node's streams holds, so one cache for
// every type would compare every cluster of every node on a traffic
// change.
var snapshotTypes = []string{resource.ClusterType, resource.ListenerType, resource.ScopedRouteType, resource.RouteType}

// classify names the cache of a type: assignments come from the linear
// cache; a type servemesh does not serve goes to the listeners' cache,
// which has none of it.
func classify(typeURL string) string {
	if typeURL == resource.EndpointType || slices.Contains(snapshotTypes, typeURL) {
		return typeURL
	}
	return resource.ListenerType
}

// deltaKey names a type's cache for delta streams (deltacache.go) in the
// MuxCache; state-of-the-world streams of the type go to its snapshot cache.
func deltaKey(typeURL string) string { return "delta " + typeURL }

// Register exposes the aggregated discovery service (state-of-the-world and
// delta) on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s.ads)
}

// SetDataPlane makes dp, an IR as ir.Lower makes it, the data plane every
// node is served; the caller must not modify it afterwards. The server
// checks the IR's invariants (DataPlane.Validate, which Lower ran already;
// only what changed when dp's Changes follow the last data plane) before
// translation, which trusts them: an IR that breaks them is refused and
// the last good one keeps serving. A data plane that replaces one no
// publish took yet carries both changes (ir.Delta.Then), so the next
// build still rebuilds only what changed.
func (s *Server) SetDataPlane(dp *ir.DataPlane) error {
	s.setting.Lock()
	defer s.setting.Unlock()
	s.mu.Lock()
	prev := s.dataPlane
	s.mu.Unlock()
	err := errors.New("nil")
	if dp != nil {
		err = dp.ValidateSince(prev)
	}
	if err != nil {
		s.metrics.rejected.Inc()
		return fmt.Errorf("data plane refused, the last good one keeps serving: %w", err)
	}
	s.mu.Lock()
	if prev != nil && s.taken != s.generation && dp.Changes != nil {
		merged := *dp
		merged.Changes = prev.Changes.Then(prev.Seq, dp.Changes)
		dp = &merged
	}
	s.dataPlane = dp
	s.generation++
	gen := s.generation
	s.acceptedAt[gen] = time.Now()
	delete(s.acceptedAt, gen-1000) // keep the recent ones
	s.mu.Unlock()
	s.metrics.modelVersion.Set(float64(gen))
	s.log.Info("accepted data plane", "generation", gen, "backends", len(dp.Backends), "endpoints", len(dp.Endpoints))
	s.kick()
	return nil
}

// RequireMTLS makes the mesh run mTLS between nodes (translate.MTLS): each
// node's snapshot then has its inbound listener and calls other nodes over
// mTLS, and a node that announces no inbound listener gets no snapshot.
// Call it before nodes connect.
func (s *Server) RequireMTLS(t *translate.MTLS) error {
	if err := t.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.mtls = t
	s.mu.Unlock()
	s.kick()
	return nil
}

// Generation returns the number of models accepted so far.
func (s *Server) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.generation
}

func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// kickNow has the publisher run at once, for a request that waits.
func (s *Server) kickNow() {
	select {
	case s.urgent <- struct{}{}:
	default:
	}
}

// Run publishes every accepted change until ctx ends. Bursts of changes are
// coalesced: after a change it waits until HoldOff passes without another
// one, or MaxHoldOff passes in all, then rebuilds once; what a node asked
// for on demand (kickNow) is published without waiting.
func (s *Server) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.urgent:
			s.publish(ctx)
			continue
		case <-s.wake:
		}
		if ended := s.coalesce(ctx); ended {
			return nil
		}
		s.publish(ctx)
	}
}

// coalesce waits, after a change, until HoldOff passes without another,
// MaxHoldOff passes in all, or a request waits (kickNow); it reports
// whether ctx ended first.
func (s *Server) coalesce(ctx context.Context) (ended bool) {
	deadline := time.NewTimer(s.maxHoldOff)
	quiet := time.NewTimer(s.holdOff)
	defer deadline.Stop()
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-s.wake:
			quiet.Reset(s.holdOff)
		case <-s.urgent:
			return false
		case <-quiet.C:
			return false
		case <-deadline.C:
			return false
		}
	}
}

// CacheView is the one cache's debug view (GET /debug/xds/cache on the
// controller's API): whether it is on, each kind's entries and how its
// lookups went, and every entry's key.
type CacheView struct {
	On    bool              `json:"on"`
	Kinds []cache.KindStats `json:"kinds"`
	Keys  []cache.Key       `json:"keys"`
}

// CacheView lists what the cache holds now; safe to call from any
// goroutine.
func (s *Server) CacheView() CacheView {
	return CacheView{On: s.cache.On(), Kinds: s.cache.Stats(), Keys: s.cache.Keys()}
}
