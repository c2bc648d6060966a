package api

import (
	"context"
	"net/http"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/meshspec"
)

// NodeReport is one node as GET /v1/nodes lists it.
type NodeReport = controller.NodeReport

// NodeAction is cordon, uncordon or drain.
type NodeAction = controller.NodeAction

// The node actions.
const (
	Cordon   = controller.Cordon
	Uncordon = controller.Uncordon
	Drain    = controller.Drain
)

// NodesPath lists the nodes; NodeActionPath cordons, uncordons or drains
// one.
const NodesPath = "/v1/nodes"

// NodePolicyPath is where node's policy is set (PUT) or cleared (DELETE).
func NodePolicyPath(node string) string { return NodesPath + "/" + esc(node) + "/policy" }

// NodeActionPath is where action is taken on node.
func NodeActionPath(node string, action NodeAction) string {
	return NodesPath + "/" + esc(node) + "/" + esc(string(action))
}

func (s *server) listNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.c.Nodes(r.Context())
	if err == nil && s.src.Draining != nil {
		m, _ := s.c.State()
		open := drainingOpenByNode(m, s.src.Draining())
		for i := range nodes {
			nodes[i].DrainingRequests = open[nodes[i].Name]
		}
	}
	s.answer(w, nonNil(nodes), err)
}

// drainingOpenByNode sums, by node, the requests in flight to its draining
// replicas (inFlight, by tag).
func drainingOpenByNode(m *meshspec.Model, inFlight map[string]int) map[string]int {
	out := map[string]int{}
	for _, b := range m.Served() {
		for _, p := range b.Placements {
			if p.State == meshspec.Draining {
				out[p.Node] += inFlight[p.Tag]
			}
		}
	}
	return out
}

func (s *server) actOnNode(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.SetNodeMaintenance(r.Context(), r.PathValue("name"), controller.NodeAction(r.PathValue("action")))
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) setNodePolicy(w http.ResponseWriter, r *http.Request) {
	var p meshspec.NodePolicy
	if !decode(w, r, &p) {
		return
	}
	changed, err := s.c.SetNodePolicy(r.Context(), r.PathValue("name"), &p)
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) clearNodePolicy(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.SetNodePolicy(r.Context(), r.PathValue("name"), nil)
	s.answerChange(w, changed, err, http.StatusOK)
}

// SetNodePolicy sets what the operator grants node; nil clears it.
func (c *Client) SetNodePolicy(ctx context.Context, node string, p *meshspec.NodePolicy) (bool, error) {
	var out Changed
	if p == nil {
		return out.Changed, c.do(ctx, http.MethodDelete, NodePolicyPath(node), nil, &out)
	}
	return out.Changed, c.do(ctx, http.MethodPut, NodePolicyPath(node), p, &out)
}

// Nodes lists the registered nodes and those under maintenance.
func (c *Client) Nodes(ctx context.Context) ([]NodeReport, error) {
	var out []NodeReport
	return out, c.do(ctx, http.MethodGet, NodesPath, nil, &out)
}

// NodeAction cordons, uncordons or drains node.
func (c *Client) NodeAction(ctx context.Context, node string, action NodeAction) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, NodeActionPath(node, action), nil, &out)
}
