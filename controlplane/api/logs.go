package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// LogChunk is what one log says, as its node's agent read it: a replica's
// (Replica set) or the node's Envoy's.
type LogChunk struct {
	Replica string `json:"replica,omitempty"`
	Node    string `json:"node"`
	Text    string `json:"text"`
	// Offset is where the next read of the log starts (?offset=).
	Offset int64 `json:"offset"`
	// Error says why the log could not be read, if it could not.
	Error string `json:"error,omitempty"`
}

// LogsReport answers GET /v1/backends/{name}/logs (a chunk per replica)
// and GET /v1/nodes/{name}/logs (the node's Envoy).
type LogsReport struct {
	Logs []LogChunk `json:"logs"`
}

// LogRead is one log to read: from Node's agent, asking wire.LogsPath
// with Query (Replica names a replica's log; "" the node's Envoy's).
type LogRead struct {
	Node, Replica string
	Query         url.Values
}

// AgentLogs reads logs from the nodes' agents, a chunk per read in order;
// a log that cannot be read is a chunk with its Error.
type AgentLogs func(ctx context.Context, reads []LogRead) []LogChunk

// Query parameters of the logs routes.
var (
	logTailParam    = queryParam{"tail", map[string]any{"type": "integer", "minimum": 0, "maximum": wire.MaxLogTail}}
	logOffsetParam  = queryParam{"offset", map[string]any{"type": "integer", "minimum": 0}}
	logReplicaParam = queryParam{"replica", map[string]any{"type": "string", "minLength": 1}}
)

// logsNeedExec refuses a read of logs with a token below the exec scope:
// a replica's log may print its environment (its secrets) and what it was
// sent, and Envoy's, at debug levels, requests' headers; status shows the
// same lines to the exec scope alone (redactLogTails). It reports whether
// it refused.
func logsNeedExec(w http.ResponseWriter, r *http.Request) bool {
	if ScopeOf(r.Context()) >= ScopeExec {
		return false
	}
	writeError(w, http.StatusForbidden, "forbidden",
		"reading logs needs a token of the exec scope: a log may hold a replica's environment, what it was sent and requests' headers", "")
	return true
}

// logQuery is what the agent is asked of one log: the request's tail or
// offset, which it checks.
func logQuery(r *http.Request) url.Values {
	q := url.Values{}
	for _, name := range []string{"tail", "offset"} {
		if v := r.URL.Query().Get(name); v != "" {
			q.Set(name, v)
		}
	}
	return q
}

func (s *server) backendLogs(w http.ResponseWriter, r *http.Request) {
	if logsNeedExec(w, r) {
		return
	}
	b, err := s.c.GetBackend(r.PathValue("name"))
	if err != nil {
		s.answer(w, nil, err)
		return
	}
	if b.Process == nil {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("backend %s's replicas are not run by servemesh: their logs are where they run", b.Name), "")
		return
	}
	only := r.URL.Query().Get("replica")
	if q := r.URL.Query(); only == "" && q.Get("offset") != "" {
		writeError(w, http.StatusBadRequest, "invalid", "offset: give it with replica=TAG (each replica's log has its own)", "")
		return
	}
	var reads []LogRead
	for _, p := range b.Placements {
		if only != "" && p.Tag != only {
			continue
		}
		q := logQuery(r)
		q.Set("replica", p.Tag)
		reads = append(reads, LogRead{Node: p.Node, Replica: p.Tag, Query: q})
	}
	if only != "" && len(reads) == 0 {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("replica %q is not one of backend %s's; %s", only, b.Name, replicaTags(b)), "")
		return
	}
	writeJSON(w, http.StatusOK, LogsReport{Logs: nonNil(s.src.Logs(r.Context(), reads))})
}

func (s *server) nodeLogs(w http.ResponseWriter, r *http.Request) {
	if logsNeedExec(w, r) {
		return
	}
	q := logQuery(r)
	q.Set("envoy", "true")
	writeJSON(w, http.StatusOK, LogsReport{Logs: nonNil(s.src.Logs(r.Context(), []LogRead{{Node: r.PathValue("name"), Query: q}}))})
}

// replicaTags says which replicas a backend has.
func replicaTags(b meshspec.Backend) string {
	if len(b.Placements) == 0 {
		return "it has no replica placed"
	}
	tags := make([]string, len(b.Placements))
	for i, p := range b.Placements {
		tags[i] = p.Tag
	}
	return fmt.Sprintf("its replicas: %v", tags)
}

// BackendLogs reads a backend's replicas' logs (one replica's, if
// replica is set): their last tail lines, or, for one replica, what
// follows offset (offset < 0: none).
func (c *Client) BackendLogs(ctx context.Context, backend, replica string, tail int, offset int64) (LogsReport, error) {
	q := url.Values{"tail": {strconv.Itoa(tail)}}
	if replica != "" {
		q.Set("replica", replica)
	}
	if offset >= 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	var out LogsReport
	return out, c.do(ctx, http.MethodGet, "/v1/backends/"+esc(backend)+"/logs?"+q.Encode(), nil, &out)
}

// NodeLogs reads a node's Envoy's log: its last tail lines, or what
// follows offset (offset < 0: none).
func (c *Client) NodeLogs(ctx context.Context, node string, tail int, offset int64) (LogsReport, error) {
	q := url.Values{"tail": {strconv.Itoa(tail)}}
	if offset >= 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	var out LogsReport
	return out, c.do(ctx, http.MethodGet, NodesPath+"/"+esc(node)+"/logs?"+q.Encode(), nil, &out)
}
