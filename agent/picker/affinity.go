package picker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker/placement"
	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/wire"
)

// AffinityBlocks is how many of a prompt's first blocks name its prefix
// for the calling node's choice of node (wire.PromptAffinityHeader): 256
// bytes, what requests sharing a system prompt or a conversation share
// first; a prompt shorter than that has no affinity.
const AffinityBlocks = 4

// maxAffinityKeyBytes bounds a key taken from a request header.
const maxAffinityKeyBytes = 256

// prompt answers an outbound listener's stream, for a route with prompt
// affinity: the request goes on with wire.PromptAffinityHeader set to its
// affinity key (its first affinity header present, else its prompt's
// prefix when it has AffinityBlocks blocks), which the route hashes, and,
// when its route lists its backends' nodes (wire.AffinityRouteHeader),
// the node the key is placed on for each (placeNodes), which the
// backends' clusters follow.
func (s *Server) prompt(stream extproc.ExternalProcessor_ProcessServer, md metadata.MD) error {
	var route wire.AffinityRoute
	if v := md.Get(wire.AffinityRouteHeader); len(v) > 0 {
		var err error
		if route, err = wire.ParseAffinityRoute(v[0]); err != nil {
			s.log.Warn("picker: a route's affinity nodes are unreadable; its requests go by hash alone", "err", err)
		}
	}
	key := ""
	return answerEach(stream, func(req *extproc.ProcessingRequest) (*extproc.ProcessingResponse, error) {
		switch r := req.Request.(type) {
		case *extproc.ProcessingRequest_RequestHeaders:
			key = headerKey(r.RequestHeaders.GetHeaders(), route.Headers)
			if !r.RequestHeaders.GetEndOfStream() || key == "" {
				return headersAnswer(), nil // the key comes with the body
			}
			return s.withNodes(headersAnswer(), route, key), nil
		case *extproc.ProcessingRequest_RequestBody:
			if key == "" {
				key, _ = affinityKey(prefix.Blocks(r.RequestBody.GetBody(), prefix.BlockBytes))
			}
			resp := bodyAnswer()
			if key == "" {
				return resp, nil
			}
			resp.GetRequestBody().Response = &extproc.CommonResponse{HeaderMutation: &extproc.HeaderMutation{SetHeaders: []*core.HeaderValueOption{{
				Header:       &core.HeaderValue{Key: wire.PromptAffinityHeader, RawValue: []byte(key)},
				AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, // never the client's own
			}}}}
			return s.withNodes(resp, route, key), nil
		default:
			return nil, fmt.Errorf("picker: asked about %T, which the prompt filter does not send", r)
		}
	})
}

// headerKey is the affinity key a request's headers name: the first of
// names present, with its name, or "".
func headerKey(h *core.HeaderMap, names []string) string {
	for _, name := range names {
		if v := headerValue(h, name); v != "" {
			return truncate(name+":"+v, maxAffinityKeyBytes)
		}
	}
	return ""
}

// withNodes adds to resp the node each of route's backends places key
// on, in dynamic metadata (wire.PromptNodeKey).
func (s *Server) withNodes(resp *extproc.ProcessingResponse, route wire.AffinityRoute, key string) *extproc.ProcessingResponse {
	if nodes := s.picker.placeNodes(route, key); nodes != "" {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			wire.PickerNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				wire.PromptNodeKey: structpb.NewStringValue(nodes)}}),
		}}
	}
	return resp
}

// placeNodes are the nodes key is placed on, one per backend of route
// (placement.Table), comma separated, without repeats: the cluster of
// nodes of whichever backend the route picks takes the first address it
// lists (a route split over backends on the same nodes may so take
// another backend's choice: still a node of its own).
func (p *Picker) placeNodes(route wire.AffinityRoute, key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var out []string
	for _, b := range route.Backends {
		nodes := make([]placement.Node, 0, len(b.Nodes))
		for _, n := range b.Nodes {
			nodes = append(nodes, placement.Node{Addr: n.Inbound, Weight: n.Replicas})
		}
		if addr := table(p.placements, b.Name, p.desired(), placement.NewTable).Place(key, nodes, now); addr != "" && !slices.Contains(out, addr) {
			out = append(out, addr)
		}
	}
	return strings.Join(out, ",")
}

// affinityKey names a prompt's prefix by its first AffinityBlocks
// blocks, if it has that many.
func affinityKey(blocks []uint64) (string, bool) {
	if len(blocks) < AffinityBlocks {
		return "", false
	}
	return strconv.FormatUint(blocks[AffinityBlocks-1], 16), true
}

// spread is backend's placement of prefixes over its replicas here.
// Called with mu held.
func (p *Picker) spread(backend string) *placement.Table {
	return table(p.spreads, backend, p.desired(), placement.NewTable)
}

// replicaNodes are ready, as nodes of a placement, one share each.
func replicaNodes(ready []*replicaLoad) []placement.Node {
	out := make([]placement.Node, len(ready))
	for i, r := range ready {
		out[i] = placement.Node{Addr: r.tag, Weight: 1}
	}
	return out
}

// table is tables' entry for backend; a new one (made by newT) first
// drops those of backends gone from the desired state.
func table[T any](tables map[string]*T, backend string, desired *nodeview.View, newT func() *T) *T {
	t, ok := tables[backend]
	if !ok {
		for name := range tables {
			if _, ok := desired.Backend(name); !ok {
				delete(tables, name)
			}
		}
		t = newT()
		tables[backend] = t
	}
	return t
}
