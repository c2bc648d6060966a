package server

import (
	"context"
	"fmt"
	"log/slog"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/servemesh/servemesh/internal/connect"
)

// callbacks hook the ADS server's stream events: they learn nodes, track what
// was sent and ACKed, and catch NACKs.
type callbacks struct{ s *Server }

// sotw and delta name a stream of either kind.
func sotw(id int64) streamKey  { return streamKey{id: id} }
func delta(id int64) streamKey { return streamKey{delta: true, id: id} }

func (c *callbacks) OnStreamOpen(ctx context.Context, id int64, _ string) error {
	c.s.openStream(sotw(id), c.s.peerIdentity(ctx))
	return nil
}

func (c *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	c.s.openStream(delta(id), c.s.peerIdentity(ctx))
	return nil
}

// identity is what a stream's TLS client certificate says of its node.
type identity struct {
	tls  bool   // the stream came over TLS with a verified client certificate
	node string // the node id its certificate names; "" if it names none
}

// peerIdentity reads a stream's client certificate, if it came over TLS:
// the node it names in the mesh's trust domain and datacenter.
func (s *Server) peerIdentity(ctx context.Context) identity {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return identity{}
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return identity{}
	}
	s.mu.Lock()
	prefix := ""
	if s.mtls != nil {
		prefix = s.mtls.IdentityPrefix
	}
	s.mu.Unlock()
	var node string
	if prefix != "" {
		node, _ = connect.NodeOf(info.State.VerifiedChains[0][0], prefix)
	}
	return identity{tls: true, node: node}
}

func (c *callbacks) OnStreamClosed(id int64, _ *core.Node)      { c.s.closeStream(sotw(id)) }
func (c *callbacks) OnDeltaStreamClosed(id int64, _ *core.Node) { c.s.closeStream(delta(id)) }

func (c *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	_, nacked := c.s.onRequest(sotw(id), req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail())
	if nacked != "" {
		// Envoy NACKs by repeating the last version it accepted. The snapshot
		// cache would see that version differ from the current one and send
		// the rejected config straight back, forever. Treat the rejected
		// version as the node's, so the next send is the next real change.
		req.VersionInfo = nacked
	} else if err := c.s.nodeError(sotw(id)); err != nil {
		return err
	}
	if req.GetTypeUrl() == resource.EndpointType {
		c.s.assignmentsRequest(sotw(id), nil, nil)
	}
	return nil
}

func (c *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	// Delta tracks versions per resource, so a NACK causes no resend loop.
	// A reconnecting delta node states per-resource versions, not a system
	// version: the cache answers its first request of each type even when
	// it holds all it should (deltaCache.whole), and that answer's ACK
	// records the version.
	c.s.onRequest(delta(id), req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail())
	c.s.demand(delta(id), req.GetTypeUrl(), req.GetResourceNamesSubscribe())
	if req.GetTypeUrl() == resource.EndpointType {
		c.s.assignmentsRequest(delta(id), req.GetInitialResourceVersions(), req.GetResourceNamesUnsubscribe())
	}
	return c.s.nodeError(delta(id))
}

func (c *callbacks) OnStreamResponse(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	c.s.onResponse(sotw(id), resp.GetTypeUrl(), resp.GetNonce(), resp.GetVersionInfo(), sotwAssignments(resp))
}

func (c *callbacks) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	c.s.onResponse(delta(id), resp.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo(), deltaAssignments(resp))
}

func (c *callbacks) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error {
	return fmt.Errorf("REST xDS is not served; use ADS over gRPC")
}

func (c *callbacks) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

// cacheLogger adapts slog to go-control-plane's logger. The caches' own
// chatter is debug-level; warnings and errors keep their level.
type cacheLogger struct{ log *slog.Logger }

// Debugf formats only when debug logs are wanted: the caches log every
// answer with its resources' names, which costs more to format than to
// send at a thousand endpoints.
func (l cacheLogger) Debugf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...))
	}
}
func (l cacheLogger) Infof(format string, args ...any)  { l.Debugf(format, args...) }
func (l cacheLogger) Warnf(format string, args ...any)  { l.log.Warn(fmt.Sprintf(format, args...)) }
func (l cacheLogger) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
