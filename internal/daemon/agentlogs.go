package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/wire"
)

// agentLogs reads logs from the live nodes' agents, at their status
// listeners with the agents' token, as the controller reads their load.
func agentLogs(nodes controller.NodeLister, token string) api.AgentLogs {
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: httpserver.NoRedirects}
	return func(ctx context.Context, node string, q url.Values) (api.LogChunk, error) {
		live, err := nodes(ctx)
		if err != nil {
			return api.LogChunk{}, fmt.Errorf("list the nodes: %w", err)
		}
		addr := ""
		for _, n := range live {
			if n.ID == node {
				addr = n.StatusAddr
			}
		}
		if addr == "" {
			return api.LogChunk{}, fmt.Errorf("node %s has no live agent that serves its status", node)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+wire.LogsPath+"?"+q.Encode(), nil)
		if err != nil {
			return api.LogChunk{}, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return api.LogChunk{}, fmt.Errorf("node %s's agent: %w", node, err)
		}
		defer func() { _ = resp.Body.Close() }()
		text, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxLogBytes))
		if err != nil {
			return api.LogChunk{}, fmt.Errorf("node %s's agent: %w", node, err)
		}
		if resp.StatusCode != http.StatusOK {
			return api.LogChunk{}, fmt.Errorf("node %s's agent: %s", node, strings.TrimSpace(string(text)))
		}
		offset, err := strconv.ParseInt(resp.Header.Get(wire.LogOffsetHeader), 10, 64)
		if err != nil {
			return api.LogChunk{}, fmt.Errorf("node %s's agent named no offset to read on from (an agent older than logs?)", node)
		}
		return api.LogChunk{Text: string(text), Offset: offset}, nil
	}
}
