package picker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"

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

// prompt answers an outbound listener's stream, for a route that asks
// the calling node's picker (wire.PickerPromptHeader). With prompt
// affinity, the request goes on with wire.PromptAffinityHeader set to its
// affinity key (its first affinity header present, else its prompt's
// prefix when it has AffinityBlocks blocks), which the route hashes, and,
// when its route lists its backends' nodes (wire.AffinityRouteHeader),
// the node the key is placed on for each (placeNodes), which the
// backends' clusters follow. With a model rewrite (wire.ModelRewriteHeader)
// its body's model is rewritten first (rewriteModel).
func (s *Server) prompt(stream extproc.ExternalProcessor_ProcessServer, md metadata.MD) error {
	var route wire.AffinityRoute
	if v := md.Get(wire.AffinityRouteHeader); len(v) > 0 {
		var err error
		if route, err = parsed(&s.meta, s.meta.routes, v[0], wire.ParseAffinityRoute); err != nil {
			s.log.Warn("picker: a route's affinity nodes are unreadable; its requests go by hash alone", "err", err)
		}
	}
	var rewrite *wire.ModelRewrite
	if v := md.Get(wire.ModelRewriteHeader); len(v) > 0 {
		rw, err := parsed(&s.meta, s.meta.rewrites, v[0], wire.ParseModelRewrite)
		if err != nil {
			s.log.Warn("picker: a route's model rewrite is unreadable; its requests go on as they are", "err", err)
		} else {
			rewrite = &rw
		}
	}
	key := ""
	var waits []placed                          // the nodes the request waits on for its answer
	defer func() { s.picker.answered(waits) }() // none came (a reset, a timeout)
	return answerEach(stream, func(req *extproc.ProcessingRequest) (*extproc.ProcessingResponse, error) {
		switch r := req.Request.(type) {
		case *extproc.ProcessingRequest_RequestHeaders:
			key = headerKey(r.RequestHeaders.GetHeaders(), route.Headers)
			if !r.RequestHeaders.GetEndOfStream() || key == "" {
				return headersAnswer(), nil // the key comes with the body
			}
			var resp *extproc.ProcessingResponse
			resp, waits = s.withNodes(headersAnswer(), route, key)
			return resp, nil
		case *extproc.ProcessingRequest_RequestBody:
			var resp *extproc.ProcessingResponse
			resp, waits = s.promptBody(r.RequestBody, route, rewrite, key)
			return resp, nil
		case *extproc.ProcessingRequest_ResponseHeaders:
			s.picker.answered(waits)
			waits = nil
			return &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extproc.HeadersResponse{}}}, nil
		default:
			return nil, fmt.Errorf("picker: asked about %T, which the caller picker filter does not send", r)
		}
	})
}

// promptBody answers a prompt stream's body: rewritten (rewrite, if any:
// drawn by the conversation's key when the request names one, so a
// conversation keeps its model), then the affinity key's header and node,
// and the nodes placed (withNodes).
func (s *Server) promptBody(b *extproc.HttpBody, route wire.AffinityRoute, rewrite *wire.ModelRewrite, key string) (*extproc.ProcessingResponse, []placed) {
	resp := bodyAnswer()
	common := &extproc.CommonResponse{}
	body := b.GetBody()
	if rewrite != nil {
		switch {
		case !b.GetEndOfStream():
			s.log.Warn("picker: a body too long to buffer whole goes on without its model rewritten", "bytes", len(body))
		default:
			draw := rand.Float64()
			if key != "" {
				draw = unit(key)
			}
			if out, from, to, ok := rewriteModel(body, *rewrite, draw); ok {
				body = out
				common.BodyMutation = &extproc.BodyMutation{Mutation: &extproc.BodyMutation_Body{Body: out}}
				s.rewrites.WithLabelValues(from, to).Inc()
			}
		}
	}
	// A route without affinity asks for its rewrite alone (one that
	// lists no nodes, from the previous release, for the key alone).
	affinity := rewrite == nil || len(route.Backends) > 0
	if key == "" && affinity {
		key, _ = affinityKey(prefix.Blocks(body, prefix.BlockBytes))
	}
	var waits []placed
	if key != "" && affinity {
		common.HeaderMutation = &extproc.HeaderMutation{SetHeaders: []*core.HeaderValueOption{{
			Header:       &core.HeaderValue{Key: wire.PromptAffinityHeader, RawValue: []byte(key)},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, // never the client's own
		}}}
		resp, waits = s.withNodes(resp, route, key)
	}
	if common.BodyMutation != nil || common.HeaderMutation != nil {
		resp.GetRequestBody().Response = common
	}
	return resp, waits
}

// rewriteModel is body with its top-level field (rw.Field) set to the
// name of rw's targets that draw (from 0 to 1) falls on by weight, and the
// names from and to, if body is a JSON object whose field is a string;
// otherwise false. Other fields keep their values (their order is not
// kept).
func rewriteModel(body []byte, rw wire.ModelRewrite, draw float64) ([]byte, string, string, bool) {
	var obj map[string]json.RawMessage
	var from string
	if json.Unmarshal(body, &obj) != nil || json.Unmarshal(obj[rw.Field], &from) != nil {
		return body, "", "", false
	}
	total := 0.0
	for _, t := range rw.Targets {
		total += t.Weight
	}
	to, at := rw.Targets[len(rw.Targets)-1].Name, draw*total
	for _, t := range rw.Targets {
		if at < t.Weight {
			to = t.Name
			break
		}
		at -= t.Weight
	}
	name, err := json.Marshal(to)
	if err != nil {
		return body, "", "", false
	}
	obj[rw.Field] = name
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the prompt's bytes as they came
	if enc.Encode(obj) != nil {
		return body, "", "", false
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), from, to, true
}

// unit maps key to [0, 1), evenly.
func unit(key string) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return float64(h.Sum64()>>11) / (1 << 53)
}

// routeMeta is what routes told the picker, parsed, by its text: every
// prompt stream carries it, and a route's text changes only with its
// config, so it is parsed once (up to maxRouteMeta texts, then afresh).
type routeMeta struct {
	mu       sync.Mutex
	routes   map[string]wire.AffinityRoute
	rewrites map[string]wire.ModelRewrite
}

const maxRouteMeta = 256

func newRouteMeta() routeMeta {
	return routeMeta{routes: map[string]wire.AffinityRoute{}, rewrites: map[string]wire.ModelRewrite{}}
}

// parsed is text parsed by parse, from cache (one of c's maps) when it
// was parsed before; a text that does not parse is not kept.
func parsed[T any](c *routeMeta, cache map[string]T, text string, parse func(string) (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := cache[text]; ok {
		return v, nil
	}
	v, err := parse(text)
	if err != nil {
		return v, err
	}
	if len(cache) >= maxRouteMeta {
		clear(cache)
	}
	cache[text] = v
	return v, nil
}

// headerKey is the affinity key a request's headers name: the first of
// names present, with its name, hashed (the key is sent on to Envoy,
// which hashes it again, and kept in the picker's checkpoint: a session
// id is not), or "".
func headerKey(h *core.HeaderMap, names []string) string {
	for _, name := range names {
		if v := headerValue(h, name); v != "" {
			return "h" + sessionHash(truncate(name+":"+v, maxAffinityKeyBytes))
		}
	}
	return ""
}

// withNodes adds to resp the node each of route's backends places key
// on, in dynamic metadata (wire.PromptNodeKey); the request waits on
// those (placed) until its answer begins.
func (s *Server) withNodes(resp *extproc.ProcessingResponse, route wire.AffinityRoute, key string) (*extproc.ProcessingResponse, []placed) {
	waits := s.picker.placeNodes(route, key)
	var nodes []string
	for _, w := range waits {
		if !slices.Contains(nodes, w.node) {
			nodes = append(nodes, w.node)
		}
	}
	if len(nodes) > 0 {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			wire.PickerNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				wire.PromptNodeKey: structpb.NewStringValue(strings.Join(nodes, ","))}}),
		}}
	}
	return resp, waits
}

// placed is a node a backend's placement sent a request to.
type placed struct{ backend, node string }

// placeNodes are the nodes key is placed on, one per backend of route
// (placement.Table); the metadata lists them without repeats, and the
// cluster of nodes of whichever backend the route picks takes the first
// address it lists (a route split over backends on the same nodes may so
// take another backend's choice: still a node of its own). Each backend's
// placement counts the request as waiting on its node until answered: on
// a route split over backends, one that did not take the request too.
func (p *Picker) placeNodes(route wire.AffinityRoute, key string) []placed {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var out []placed
	for _, b := range route.Backends {
		nodes := make([]placement.Node, 0, len(b.Nodes))
		for _, n := range b.Nodes {
			nodes = append(nodes, placement.Node{Addr: n.Inbound, Weight: n.Replicas})
		}
		if addr := table(p.placements, b.Name, p.desired(), placement.NewTable).Place(key, nodes, now); addr != "" {
			out = append(out, placed{b.Name, addr})
		}
	}
	if len(out) > 0 {
		p.changed()
	}
	return out
}

// answered ends the waits of a request placeNodes placed: its answer
// began, or it ended without one.
func (p *Picker) answered(waits []placed) {
	if len(waits) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range waits {
		if t, ok := p.placements[w.backend]; ok {
			t.Answered(w.node)
		}
	}
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
	if _, ok := tables[backend]; !ok {
		for name := range tables {
			if _, ok := desired.Backend(name); !ok {
				delete(tables, name)
			}
		}
	}
	return entryOf(tables, backend, newT)
}
