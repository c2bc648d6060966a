package translate

import (
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/wire"
)

// What one client may make a listener hold. Envoy's defaults suit a proxy
// among trusted services (a 256 MiB HTTP/2 window per stream, no
// timeout for a request's headers); these follow Envoy's guidance for an
// edge proxy on the public and mesh listeners, where any client (or
// replica) connects. The inbound listener takes only servemesh nodes'
// certificates and carries many streams per connection, so it gets wider
// windows and more streams, still bounded. Each node's overload manager
// (the bootstrap package's Limits) bounds connections and memory across
// them all. The README lists these figures.
type listenerLimits struct {
	// bufferBytes is what a connection buffers each way; model routing
	// reads a request's body within it (see inference.go).
	bufferBytes uint32
	// streams is HTTP/2 streams per connection; streamWindow and
	// connectionWindow its flow-control windows.
	streams, streamWindow, connectionWindow uint32
	headersTimeout, idleTimeout             time.Duration
	maxHeaders                              uint32
}

// The listeners' limits. A connection with no request in flight is closed
// after its listener's idle timeout, shortest where any client connects
// (the public listener: 5 minutes), longer for the node's replicas (the
// mesh listener: 15) and longest for other nodes' pooled connections
// (the inbound listener: an hour, Envoy's edge guidance). A stream in
// flight, a long token stream included, keeps its connection. How many
// connections each listener may hold is the bootstrap's (its Limits'
// listener shares).
var (
	publicLimits = listenerLimits{bufferBytes: 1 << 20, streams: 100, streamWindow: 64 << 10, connectionWindow: 1 << 20,
		headersTimeout: 10 * time.Second, idleTimeout: 5 * time.Minute, maxHeaders: 100}
	meshLimits    = withIdle(publicLimits, 15*time.Minute)
	inboundLimits = listenerLimits{bufferBytes: 1 << 20, streams: 1024, streamWindow: 1 << 20, connectionWindow: 16 << 20,
		headersTimeout: 10 * time.Second, idleTimeout: time.Hour, maxHeaders: 100}
)

// inboundHandshakeTimeout bounds the inbound listener's TLS handshake: a
// connection that has not finished it by then is closed.
const inboundHandshakeTimeout = 10 * time.Second

// withIdle is l with another idle timeout.
func withIdle(l listenerLimits, idle time.Duration) listenerLimits {
	l.idleTimeout = idle
	return l
}

// edgeLimitsOf are the limits of the public or the mesh listener.
func edgeLimitsOf(listener string) listenerLimits {
	if listener == wire.PublicListener {
		return publicLimits
	}
	return meshLimits
}

// bound applies l to an HTTP connection manager.
func (l listenerLimits) bound(m *hcm.HttpConnectionManager) {
	m.RequestHeadersTimeout = durationpb.New(l.headersTimeout)
	m.CommonHttpProtocolOptions = &core.HttpProtocolOptions{
		IdleTimeout:     durationpb.New(l.idleTimeout),
		MaxHeadersCount: wrapperspb.UInt32(l.maxHeaders),
	}
	m.Http2ProtocolOptions = &core.Http2ProtocolOptions{
		MaxConcurrentStreams:        wrapperspb.UInt32(l.streams),
		InitialStreamWindowSize:     wrapperspb.UInt32(l.streamWindow),
		InitialConnectionWindowSize: wrapperspb.UInt32(l.connectionWindow),
	}
}

// applied is m with l applied.
func (l listenerLimits) applied(m *hcm.HttpConnectionManager) *hcm.HttpConnectionManager {
	l.bound(m)
	return m
}
