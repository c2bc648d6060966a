package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/wire"
)

// agentCalls is how a controller calls nodes' agents at their status
// listeners (their load, their logs). An agent that says it takes TLS
// (wire.NodeInfo.StatusTLS) is called over mTLS: the controller presents
// its own Connect certificate and takes only the node's, so no secret
// crosses the network and a listener at an address a node registered
// learns nothing it could use. An agent of a release before that is
// called over plain HTTP with the agents' shared token (--agent-token-
// file), which on an agent of this release reads no log.
type agentCalls struct {
	token   string
	timeout time.Duration
	plain   *http.Client
	// identity is the controller's, once it has one (mTLS).
	identity atomic.Pointer[connect.Source]

	mu      sync.Mutex
	clients map[string]nodeClient // by node id
}

// nodeClient is the mTLS client of one node's agent at one address.
type nodeClient struct {
	addr   string
	client *http.Client
}

func newAgentCalls(token string, timeout time.Duration) *agentCalls {
	return &agentCalls{token: token, timeout: timeout, clients: map[string]nodeClient{},
		plain: &http.Client{Timeout: timeout, CheckRedirect: httpserver.NoRedirects}}
}

// useIdentity makes the controller call agents that take TLS with src.
func (c *agentCalls) useIdentity(src *connect.Source) { c.identity.Store(src) }

// get asks node n's agent for path (with its query).
func (c *agentCalls) get(ctx context.Context, n wire.NodeInfo, path string) (*http.Response, error) {
	if n.StatusAddr == "" {
		return nil, fmt.Errorf("node %s's agent names no status address", n.ID)
	}
	scheme, client := "http", c.plain
	if n.StatusTLS {
		var err error
		if client, err = c.tlsClient(n); err != nil {
			return nil, err
		}
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+n.StatusAddr+path, nil)
	if err != nil {
		return nil, err
	}
	if !n.StatusTLS && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return client.Do(req)
}

// tlsClient is the mTLS client of n's agent, which must show n's identity.
func (c *agentCalls) tlsClient(n wire.NodeInfo) (*http.Client, error) {
	src := c.identity.Load()
	if src == nil {
		return nil, errors.New("node " + n.ID + "'s agent takes only the controller's certificate, and this controller has none (it runs --plaintext, or has no identity from Consul yet)")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc, ok := c.clients[n.ID]; ok && nc.addr == n.StatusAddr {
		return nc.client, nil
	}
	if old, ok := c.clients[n.ID]; ok {
		old.client.CloseIdleConnections()
	}
	client := &http.Client{Timeout: c.timeout, CheckRedirect: httpserver.NoRedirects,
		Transport: &http.Transport{TLSClientConfig: src.ClientTLS(wire.NodeService(n.ID)), ForceAttemptHTTP2: true,
			MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}}
	c.clients[n.ID] = nodeClient{addr: n.StatusAddr, client: client}
	return client, nil
}
