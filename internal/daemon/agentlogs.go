package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/wire"
)

// agentLogs reads logs from the live nodes' agents, at their status
// listeners with the agents' token, as the controller reads their load:
// the nodes are listed once a call, and what goes wrong with one log is
// said in its chunk, so one node that does not answer leaves the others'.
func agentLogs(nodes controller.NodeLister, token string) api.AgentLogs {
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: httpserver.NoRedirects}
	return func(ctx context.Context, reads []api.LogRead) []api.LogChunk {
		live, err := nodes(ctx)
		addrs := make(map[string]string, len(live))
		for _, n := range live {
			addrs[n.ID] = n.StatusAddr
		}
		out := make([]api.LogChunk, len(reads))
		for i, r := range reads {
			c, rerr := readAgentLog(ctx, client, token, addrs[r.Node], r)
			switch {
			case err != nil:
				c.Error = fmt.Sprintf("list the nodes: %v", err)
			case rerr != nil:
				c.Error = rerr.Error()
			}
			c.Node, c.Replica = r.Node, r.Replica
			out[i] = c
		}
		return out
	}
}

// readAgentLog reads one log from the agent at addr ("": the node has no
// live agent).
func readAgentLog(ctx context.Context, client *http.Client, token, addr string, r api.LogRead) (api.LogChunk, error) {
	node := r.Node
	if addr == "" {
		return api.LogChunk{}, fmt.Errorf("node %s has no live agent that serves its status", node)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+wire.LogsPath+"?"+r.Query.Encode(), nil)
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
