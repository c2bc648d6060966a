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
	"github.com/servemesh/servemesh/wire"
)

// agentLogs reads logs from the live nodes' agents, at their status
// listeners, as the controller reads their load (agentCalls):
// the nodes are listed once a call, and what goes wrong with one log is
// said in its chunk, so one node that does not answer leaves the others'.
func agentLogs(nodes controller.NodeLister, agents *agentCalls) api.AgentLogs {
	return func(ctx context.Context, reads []api.LogRead) []api.LogChunk {
		live, err := nodes(ctx)
		byID := make(map[string]wire.NodeInfo, len(live))
		for _, n := range live {
			byID[n.ID] = n
		}
		out := make([]api.LogChunk, len(reads))
		for i, r := range reads {
			c, rerr := readAgentLog(ctx, agents, byID[r.Node], r)
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

// readAgentLog reads one log from node n's agent (n is zero when the node
// has no live agent).
func readAgentLog(ctx context.Context, agents *agentCalls, n wire.NodeInfo, r api.LogRead) (api.LogChunk, error) {
	node := r.Node
	if n.StatusAddr == "" {
		return api.LogChunk{}, fmt.Errorf("node %s has no live agent that serves its status", node)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := agents.get(ctx, n, wire.LogsPath+"?"+r.Query.Encode())
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
