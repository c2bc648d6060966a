package server

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"sync"
	"weak"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// deltaCache answers the delta xDS streams of one type from each node's
// kind, as go-control-plane's SnapshotCache does, but at the cost of what
// changed rather than of what a node holds.
//
// go-control-plane's snapshot cache compares every resource of a node's
// snapshot with what each stream was sent, twice per change (when the
// snapshot is set, and again when the node's ACK opens its next watch),
// and builds the stream's whole version map anew each time: at 1,000
// public nodes of a 1,000-endpoint mesh, four million map operations for
// one `traffic set`. This cache remembers, for each stream, the kind it
// last answered from and the version map it handed the server for the
// stream's state (held). While the server still keeps that map and the
// stream's subscription has not changed since, the stream holds that
// kind's resources (cut to its subscription), so:
//   - an ACK with nothing new opens a watch without comparing anything;
//   - a new kind sends the names the two kinds differ in (kindDiff,
//     computed once for each pair of kinds and shared by every node that
//     holds the same ones, which nodes of the same role do).
//
// A stream whose state the cache does not know (its first request, a
// request that subscribes or unsubscribes, a version map the server
// replaced) is compared whole, as go-control-plane would. The maps the
// server keeps are never altered: a changed state is a new map.
//
// A stream subscribed to everything of its type and nothing by name
// (Envoy's clusters, listeners and scopes) holds, once answered, every
// resource of its node's kind: what it holds is the kind's own version
// map, shared with every other such stream, and the server keeps a small
// marker map as its state (held). A version map per stream was a fifth of
// a 10,000-endpoint controller's memory: ten public nodes with 30,000
// clusters each and ninety nodes with 10,000 scopes each.
//
// State of the world streams keep go-control-plane's SnapshotCache
// (server.go's MuxCache routes by protocol).
type deltaCache struct {
	typeURL string
	budget  *answerBudget // large answers' (LargeAnswersBudget)

	mu    sync.Mutex
	nodes map[string]*deltaNode
}

// deltaStream names one stream's watches of this cache's type: the
// channel go-control-plane's server gives each stream's watches.
type deltaStream = chan cachev3.DeltaResponse

type deltaNode struct {
	kind    *kind                      // nil until the node's first kind is set
	watches map[deltaStream]deltaWatch // open, one per stream at most
	held    map[deltaStream]*held      // what each stream holds, where known
}

type deltaWatch struct {
	req *cachev3.DeltaRequest
	sub cachev3.Subscription
	// holds is what the stream holds where its server state is a marker
	// (held.state) whose stream changed its subscription: the versions
	// the cache knew, with the subscription's change made to them as the
	// server would have made it (unsubscribed). Else nil: the server's
	// state says.
	holds map[string]string
}

// held is what a stream holds: kind's resources that its subscription
// names, with their versions in returned; state is the map the server was
// given as the stream's state: returned itself, or, when the stream holds
// all of kind (returned is kind.versions, shared), a marker of its own
// (heldAll), which go-control-plane may alter but the cache never reads.
type held struct {
	kind            *kind
	returned, state map[string]string
}

// heldAllMarker is the one name in the state of a stream that holds all
// of a kind (held): no resource is named so.
const heldAllMarker = "\x00servemesh: the stream holds all of its kind"

func heldAll() map[string]string { return map[string]string{heldAllMarker: ""} }

func isHeldAll(state map[string]string) bool {
	_, ok := state[heldAllMarker]
	return ok
}

// holdsAll reports whether w's stream, once answered, holds all of its
// node's kind: it is subscribed to everything, and to nothing by name.
func holdsAll(w deltaWatch) bool {
	return w.sub.IsWildcard() && len(w.sub.SubscribedResources()) == 0
}

// unsubscribed is what a stream holds after a request unsubscribing
// names, as go-control-plane's Subscription changes the state it keeps:
// a wildcard stream's names are marked to be sent again or removed, the
// others' dropped.
func unsubscribed(holds map[string]string, names []string, wildcard bool) map[string]string {
	out := maps.Clone(holds)
	for _, name := range names {
		if wildcard {
			out[name] = ""
		} else {
			delete(out, name)
		}
	}
	return out
}

// maxHeld bounds the streams remembered for a node: a node has one ADS
// stream, and the records of streams that closed are dropped past this.
const maxHeld = 8

var _ cachev3.Cache = (*deltaCache)(nil)

func newDeltaCache(typeURL string) *deltaCache {
	return &deltaCache{typeURL: typeURL, budget: answers, nodes: map[string]*deltaNode{}}
}

func (c *deltaCache) node(id string) *deltaNode {
	n := c.nodes[id]
	if n == nil {
		n = &deltaNode{watches: map[deltaStream]deltaWatch{}, held: map[deltaStream]*held{}}
		c.nodes[id] = n
	}
	return n
}

// set makes k the node's resources of this type and answers its open
// watches with what changed for each.
func (c *deltaCache) set(ctx context.Context, node string, k *kind) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k == nil {
		k = &kind{} // none of this type: a stream holding some has them removed
	}
	n := c.node(node)
	n.kind = k
	for ch, w := range n.watches {
		resp := c.answer(n, ch, w)
		if resp == nil {
			continue
		}
		delete(n.watches, ch)
		select {
		case ch <- resp:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// clear forgets a node.
func (c *deltaCache) clear(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, node)
}

// CreateDeltaWatch answers a delta request at once if the node's kind has
// something the stream lacks, else opens a watch that set answers.
func (c *deltaCache) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, ch chan cachev3.DeltaResponse) (func(), error) {
	id := req.GetNode().GetId()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.node(id)
	w := deltaWatch{req: req, sub: sub}
	h := n.held[ch]
	if h != nil && (len(req.GetResourceNamesSubscribe()) > 0 || len(req.GetResourceNamesUnsubscribe()) > 0 || !sameMap(sub.ReturnedResources(), h.state)) {
		delete(n.held, ch) // the server changed the stream's state: compare it whole
		if isHeldAll(h.state) {
			w.holds = unsubscribed(h.returned, req.GetResourceNamesUnsubscribe(), sub.IsWildcard())
		}
	} else if h == nil && isHeldAll(sub.ReturnedResources()) {
		// A marker whose stream the cache forgot (maxHeld): what the
		// stream holds is unknown, so what to remove from it too.
		return nil, errors.New("delta cache: this stream's state is no longer known; reconnect")
	}
	if n.kind != nil {
		if resp := c.answer(n, ch, w); resp != nil {
			ch <- resp // the server's channel has room for one answer a type
			return nil, nil
		}
	}
	n.watches[ch] = w
	n.forgetClosed()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if n := c.nodes[id]; n != nil {
			delete(n.watches, ch)
		}
	}, nil
}

// forgetClosed drops, past maxHeld, what the node's streams without an
// open watch held: closed streams, most likely.
func (n *deltaNode) forgetClosed() {
	if len(n.held) <= maxHeld {
		return
	}
	for ch := range n.held {
		if _, open := n.watches[ch]; !open {
			delete(n.held, ch)
		}
	}
}

// answer is the response a stream's watch gets from the node's kind, or
// nil if the stream has it all; it records what the stream then holds.
func (c *deltaCache) answer(n *deltaNode, ch deltaStream, w deltaWatch) *deltaResponse {
	k := n.kind
	h := n.held[ch]
	var resp *deltaResponse
	if h != nil {
		if h.kind == k {
			return nil
		}
		resp = c.fromDiff(k, h, w)
	} else {
		resp = c.whole(k, w)
	}
	if resp == nil {
		// The stream holds k's resources already: what it was last
		// answered, or, compared whole, what the server says it has.
		if h == nil {
			h = &held{returned: w.holds, state: w.sub.ReturnedResources()}
			if h.returned == nil {
				h.returned = h.state
			}
			n.held[ch] = h
		}
		h.kind = k
		return nil
	}
	n.held[ch] = &held{kind: k, returned: resp.returned, state: resp.state}
	return resp
}

// fromDiff answers a stream that holds h from the names h's kind and k
// differ in.
func (c *deltaCache) fromDiff(k *kind, h *held, w deltaWatch) *deltaResponse {
	d := k.diffFrom(h.kind)
	resp := c.response(k, w)
	subscribed, wildcard := w.sub.SubscribedResources(), w.sub.IsWildcard()
	for _, name := range d.changed {
		if _, ok := subscribed[name]; ok || wildcard {
			resp.add(name, k)
		}
	}
	for _, name := range d.removed {
		if _, ok := h.returned[name]; ok {
			resp.removed = append(resp.removed, name)
		}
	}
	if len(resp.names) == 0 && len(resp.removed) == 0 {
		return nil
	}
	if isHeldAll(h.state) && wildcard && len(subscribed) == 0 {
		resp.returned, resp.state = k.allVersions(), heldAll() // all of h's kind, and now all of k
		return resp
	}
	resp.returned = maps.Clone(h.returned)
	for _, name := range resp.names {
		resp.returned[name], _ = k.versionOf(name)
	}
	for _, name := range resp.removed {
		delete(resp.returned, name)
	}
	resp.state = resp.returned
	return resp
}

// whole answers a stream whose state is the server's alone, comparing
// every resource it holds or subscribes to, as go-control-plane does.
func (c *deltaCache) whole(k *kind, w deltaWatch) *deltaResponse {
	resp := c.response(k, w)
	returned := w.holds
	if returned == nil {
		returned = w.sub.ReturnedResources()
	}
	if w.sub.IsWildcard() {
		all := holdsAll(w)
		versions := k.allVersions()
		if all {
			resp.returned, resp.state = versions, heldAll()
		} else {
			resp.returned = make(map[string]string, len(versions))
		}
		for name, version := range versions {
			if !all {
				resp.returned[name] = version
			}
			if prev, ok := returned[name]; !ok || prev != version {
				resp.add(name, k)
			}
		}
		for name := range returned {
			if _, ok := versions[name]; !ok {
				resp.removed = append(resp.removed, name)
			}
		}
	} else {
		resp.returned = make(map[string]string, len(w.sub.SubscribedResources()))
		for name := range w.sub.SubscribedResources() {
			prev, had := returned[name]
			if version, ok := k.versionOf(name); ok {
				resp.returned[name] = version
				if !had || prev != version {
					resp.add(name, k)
				}
			} else if had {
				resp.removed = append(resp.removed, name)
			}
		}
	}
	// A request that ACKs nothing (a stream's first of its type, or one
	// changing its subscription) is answered even when it holds all it
	// should: Envoy waits for a wildcard type's first answer to finish
	// initialising, and the answer's ACK is how the server learns that a
	// node which reconnected stating what it holds (its controller failed
	// over, say) holds its node's kind; unanswered, the node was reported
	// out of sync until the type next changed.
	if len(resp.names) == 0 && len(resp.removed) == 0 && w.req.GetResponseNonce() != "" {
		return nil
	}
	if resp.state == nil {
		resp.state = resp.returned
	}
	return resp
}

func (c *deltaCache) response(k *kind, w deltaWatch) *deltaResponse {
	return &deltaResponse{req: w.req, typeURL: c.typeURL, version: k.version, budget: c.budget}
}

// CreateWatch is not served: state of the world streams go to the
// snapshot caches.
func (c *deltaCache) CreateWatch(*cachev3.Request, cachev3.Subscription, chan cachev3.Response) (func(), error) {
	return nil, errors.New("delta cache: state of the world requests are not served here")
}

// Fetch is not served: REST xDS is refused (callbacks.OnFetchRequest).
func (c *deltaCache) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("delta cache: fetch is not served")
}

// sameMap reports whether a and b are the same map, not equal ones.
func sameMap(a, b map[string]string) bool {
	return a != nil && b != nil && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// kindDiff is what changes from one kind to another: the names added or
// of another version, and the names gone.
type kindDiff struct{ changed, removed []string }

// maxDiffs bounds the diffs a kind keeps: one from each kind its nodes'
// streams held before it, which are few (most streams held the last).
const maxDiffs = 8

// diffFrom is what changes from old to k, computed once for each old and
// kept with k (by a weak pointer, so that no kind keeps its predecessors
// alive). Two kinds over the same one (a node's clusters after a change
// that left the mesh's as they were) differ only in their own resources,
// which are all it compares.
func (k *kind) diffFrom(old *kind) *kindDiff {
	key := weak.Make(old)
	k.diffMu.Lock()
	defer k.diffMu.Unlock()
	if d := k.diffs[key]; d != nil {
		return d
	}
	var d *kindDiff
	if k.under != nil && k.under == old.under {
		d = diffOwn(k, old)
	} else {
		d = diffVersions(k.allVersions(), old.allVersions())
	}
	if k.diffs == nil || len(k.diffs) >= maxDiffs {
		k.diffs = make(map[weak.Pointer[kind]]*kindDiff, 1)
	}
	k.diffs[key] = d
	return d
}

// diffVersions is what changes from the versions old to those of now.
func diffVersions(now, old map[string]string) *kindDiff {
	d := &kindDiff{}
	for name, version := range now {
		if prev, ok := old[name]; !ok || prev != version {
			d.changed = append(d.changed, name)
		}
	}
	for name := range old {
		if _, ok := now[name]; !ok {
			d.removed = append(d.removed, name)
		}
	}
	return d
}

// diffOwn is what changes from old to k, two kinds over the same one: of
// the names either has of its own, those k has with another version
// than old's or old lacks, and those old has and k lacks.
func diffOwn(k, old *kind) *kindDiff {
	d := &kindDiff{}
	for name := range k.versions {
		version, _ := k.versionOf(name)
		if prev, ok := old.versionOf(name); !ok || prev != version {
			d.changed = append(d.changed, name)
		}
	}
	for name := range old.versions {
		if _, own := k.versions[name]; own {
			continue // compared above
		}
		if version, ok := k.versionOf(name); !ok {
			d.removed = append(d.removed, name)
		} else if prev, _ := old.versionOf(name); prev != version {
			d.changed = append(d.changed, name)
		}
	}
	return d
}

// deltaResponse is one answer to a delta stream: go-control-plane's
// DeltaResponse, with resources sent as the builder encoded them and
// versioned as it versioned them (go-control-plane's own hashes each
// resource it sends, once per stream). It names the resources of kind to
// send and makes their messages only when its stream sends it: a publish
// answers every node's streams at once, and 100 nodes' first answers at
// 10,000 endpoints, made whole, held 180 MB of messages while they waited
// for their streams.
type deltaResponse struct {
	req     *cachev3.DeltaRequest
	typeURL string
	version string
	budget  *answerBudget
	kind    *kind
	names   []string // of kind's resources to send
	removed []string
	// returned is what the stream holds once answered; state, the map the
	// server keeps as the stream's state (held).
	returned, state map[string]string
}

var _ cachev3.DeltaResponse = (*deltaResponse)(nil)

// add lists k's resource name in the response.
func (r *deltaResponse) add(name string, k *kind) {
	r.kind = k // every name the response lists is of the same kind
	r.names = append(r.names, name)
}

// encodingOf is a twin's encoding (kind): its unknown fields, as they are.
func encodingOf(twin proto.Message) []byte {
	return twin.ProtoReflect().GetUnknown()
}

// GetDeltaDiscoveryResponse is the response to send; the server sets its
// nonce, so each call makes a new one.
func (r *deltaResponse) GetDeltaDiscoveryResponse() (*discovery.DeltaDiscoveryResponse, error) {
	held, size := int64(0), r.size()
	large := size > MaxPooledAnswer
	if large {
		held = r.budget.hold(size) // before making it: see LargeAnswersBudget
	}
	resources := make([]*discovery.Resource, len(r.names))
	for i, name := range r.names {
		version, _ := r.kind.versionOf(name)
		resources[i] = &discovery.Resource{
			Name:     name,
			Version:  version,
			Resource: &anypb.Any{TypeUrl: r.typeURL, Value: encodingOf(r.kind.twin(name))},
		}
	}
	out := &discovery.DeltaDiscoveryResponse{
		TypeUrl:           r.typeURL,
		SystemVersionInfo: r.version,
		Resources:         resources,
		RemovedResources:  r.removed,
	}
	if large {
		r.budget.made(out, held) // the codec gives it back once the stream wrote it
	}
	return out, nil
}

// size is about what the response takes encoded: its resources'
// encodings, names and versions.
func (r *deltaResponse) size() int64 {
	n := int64(0)
	for _, name := range r.names {
		version, _ := r.kind.versionOf(name)
		n += int64(len(encodingOf(r.kind.twin(name))) + 2*len(name) + len(version) + len(r.typeURL) + 16)
	}
	return n
}

func (r *deltaResponse) GetDeltaRequest() *discovery.DeltaDiscoveryRequest { return r.req }
func (r *deltaResponse) GetSystemVersion() (string, error)                 { return r.version, nil }
func (r *deltaResponse) GetResponseVersion() string                        { return r.version }
func (r *deltaResponse) GetNextVersionMap() map[string]string              { return r.state }
func (r *deltaResponse) GetReturnedResources() map[string]string           { return r.state }
func (r *deltaResponse) GetContext() context.Context                       { return context.Background() }
