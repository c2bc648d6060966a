package bootstrap

import (
	"fmt"
	"time"

	overloadv3 "github.com/envoyproxy/go-control-plane/envoy/config/overload/v3"
	connectionsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	heapv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/fixed_heap/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/wire"
)

// Limits bound what clients can make a node's Envoy hold, through its
// overload manager: connections across all its listeners, and its heap.
// Past MaxConnections a new connection is closed at once, and each
// listener has a share of them of its own (listenerShares), so that no
// listener's clients can take another's: idle public connections leave
// the mesh and inbound listeners serving. As the heap
// nears MaxHeapMB, Envoy frees memory, resets the streams that buffer the
// most, stops keep-alive and, at the top, answers new requests 503. The
// listeners' own limits (buffers, streams, header timeouts) are the
// translation's (xds/translate's limits.go).
type Limits struct {
	MaxConnections uint64 // 0: DefaultMaxConnections
	MaxHeapMB      uint64 // 0: DefaultMaxHeapMB
}

// The defaults of Limits, documented in the README.
const (
	DefaultMaxConnections = 10_000
	DefaultMaxHeapMB      = 1024
)

const (
	heapMonitor        = "envoy.resource_monitors.fixed_heap"
	connectionsMonitor = "envoy.resource_monitors.global_downstream_max_connections"
)

// Check says why l cannot be a node's limits.
func (l Limits) Check() error {
	switch {
	case l.MaxConnections > 0 && l.MaxConnections < 16:
		return fmt.Errorf("--envoy-max-connections %d: below 16 the node cannot take its own inbound calls; give at least 16 (default %d)", l.MaxConnections, DefaultMaxConnections)
	case l.MaxHeapMB > 0 && l.MaxHeapMB < 64:
		return fmt.Errorf("--envoy-max-heap-mb %d: Envoy needs about 64 MiB to run at all; give at least 64 (default %d)", l.MaxHeapMB, DefaultMaxHeapMB)
	}
	return nil
}

// listenerShares are the tenths of MaxConnections each listener may hold:
// the public listener 4, the mesh listener (the node's replicas' calls)
// 2, the inbound one (other nodes': a connection per calling node, backend
// and Envoy worker) 4. They add up to the whole, so a listener at its
// share leaves the others theirs.
var listenerShares = []struct {
	listener string
	tenths   uint64
}{{wire.PublicListener, 4}, {wire.MeshListener, 2}, {wire.InboundListener, 4}}

// ListenerConnectionLimits are each listener's connection limit under l.
func (l Limits) ListenerConnectionLimits() map[string]uint64 {
	conns := l.MaxConnections
	if conns == 0 {
		conns = DefaultMaxConnections
	}
	out := make(map[string]uint64, len(listenerShares))
	for _, s := range listenerShares {
		out[s.listener] = conns * s.tenths / 10
	}
	return out
}

// runtimeLimits is the static runtime layer that gives each listener its
// connection limit (Envoy's envoy.resource_limits.listener.<name>.
// connection_limit: past it, a new connection to that listener is closed
// at once, counted in its downstream_cx_overflow).
func runtimeLimits(l Limits) *structpb.Struct {
	fields := map[string]*structpb.Value{}
	for name, limit := range l.ListenerConnectionLimits() {
		fields["envoy.resource_limits.listener."+name+".connection_limit"] = structpb.NewNumberValue(float64(limit))
	}
	return &structpb.Struct{Fields: fields}
}

// overloadManager is the node's overload manager for l.
func overloadManager(l Limits) (*overloadv3.OverloadManager, error) {
	conns, heap := l.MaxConnections, l.MaxHeapMB
	if conns == 0 {
		conns = DefaultMaxConnections
	}
	if heap == 0 {
		heap = DefaultMaxHeapMB
	}
	heapCfg, err := anypb.New(&heapv3.FixedHeapConfig{MaxHeapSizeBytes: heap << 20})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pack the heap monitor: %w", err)
	}
	connCfg, err := anypb.New(&connectionsv3.DownstreamConnectionsConfig{MaxActiveDownstreamConnections: int64(conns)})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pack the connections monitor: %w", err)
	}
	at := func(name string, threshold float64) *overloadv3.OverloadAction {
		return &overloadv3.OverloadAction{Name: name, Triggers: []*overloadv3.Trigger{{Name: heapMonitor,
			TriggerOneof: &overloadv3.Trigger_Threshold{Threshold: &overloadv3.ThresholdTrigger{Value: threshold}}}}}
	}
	reset := &overloadv3.OverloadAction{Name: "envoy.overload_actions.reset_high_memory_stream", Triggers: []*overloadv3.Trigger{{Name: heapMonitor,
		TriggerOneof: &overloadv3.Trigger_Scaled{Scaled: &overloadv3.ScaledTrigger{ScalingThreshold: 0.85, SaturationThreshold: 0.95}}}}}
	return &overloadv3.OverloadManager{
		RefreshInterval: durationpb.New(250 * time.Millisecond),
		ResourceMonitors: []*overloadv3.ResourceMonitor{
			{Name: heapMonitor, ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: heapCfg}},
			{Name: connectionsMonitor, ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: connCfg}},
		},
		Actions: []*overloadv3.OverloadAction{
			at("envoy.overload_actions.shrink_heap", 0.90),
			reset,
			at("envoy.overload_actions.disable_http_keepalive", 0.95),
			at("envoy.overload_actions.stop_accepting_requests", 0.98),
		},
		// Streams that buffer 1 MiB or more are tracked, for
		// reset_high_memory_stream to pick the largest.
		BufferFactoryConfig: &overloadv3.BufferFactoryConfig{MinimumAccountToTrackPowerOfTwo: 20},
	}, nil
}
