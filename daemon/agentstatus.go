package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/wire"
)

// listenStatus binds the agent's status listener. In plaintext it is
// plain HTTP behind the status token. With mTLS it also takes TLS, with
// the node's Connect identity (wire.NodeInfo.StatusTLS), and statusAccess
// decides who reads what.
func listenStatus(ctx context.Context, o AgentOptions, identity *nodeIdentity, h http.Handler) (*httpserver.Server, error) {
	if o.Plaintext {
		return httpserver.Listen(ctx, o.StatusListen, httpserver.RequireBearer(o.StatusToken, h), httpserver.DefaultLimits, nil)
	}
	return httpserver.ListenTLSOrPlain(ctx, o.StatusListen, statusAccess(o.StatusToken, identity.isController, h),
		httpserver.DefaultLimits, identity.serverTLS())
}

// statusAccess guards an mTLS node's status listener: the controller,
// known by its certificate, reads everything; anyone else only what the
// status token allows (the metrics Prometheus scrapes, and the load and
// Envoy's versions a previous release's controller reads), and no log. A
// token captured on its way to an address a node registered (issue 58,
// M2) reads no log of any node.
func statusAccess(token string, isController func(*http.Request) bool, next http.Handler) http.Handler {
	withToken := httpserver.RequireBearer(token, next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case isController(r):
			next.ServeHTTP(w, r)
		case r.URL.Path == wire.LogsPath:
			http.Error(w, "this agent serves logs only to the controller, known by its certificate over TLS", http.StatusForbidden)
		default:
			withToken.ServeHTTP(w, r)
		}
	})
}

// nodeIdentity is the node's Connect identity for its status listener,
// once it has one: the certificate it shows, and how it knows the
// controller's.
type nodeIdentity struct {
	src atomic.Pointer[connect.Source]
}

// follow gets the node's identity (retrying while Consul does not answer)
// and keeps it fresh in g.
func (n *nodeIdentity) follow(ctx context.Context, g *rungroup.Group, log *slog.Logger, client *consulapi.Client, node string) error {
	var src *connect.Source
	err := connect.Retry(ctx, log, "the node's identity for its status listener", func(ctx context.Context) (err error) {
		src, err = connect.NewSource(ctx, client, wire.NodeService(node))
		return err
	})
	if err != nil {
		return err
	}
	n.src.Store(src)
	g.Go("status listener identity", func(ctx context.Context) error { return src.Run(ctx, log.With("component", "connect")) })
	return nil
}

// serverTLS presents the node's current leaf; a handshake before the node
// has one fails.
func (n *nodeIdentity) serverTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		src := n.src.Load()
		if src == nil {
			return nil, errors.New("the node has no identity yet")
		}
		return src.ServerTLSForPeers().GetConfigForClient(hello)
	}}
}

// isController reports whether r came over TLS from the controller.
func (n *nodeIdentity) isController(r *http.Request) bool {
	src := n.src.Load()
	return src != nil && r.TLS != nil && connect.PeerIs(r.TLS, src.Identity(connect.ControllerService))
}
