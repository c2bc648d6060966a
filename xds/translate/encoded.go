package translate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/servemesh/servemesh/wire"
)

// Encoded is a resource held as its encoding, with its name and version:
// Resource is a twin, a message whose unknown fields are the resource's
// encoding, which protobuf marshals verbatim (so sending it is a copy)
// and Decode reads back. A route table translated for ten thousand
// endpoints takes a tenth of the memory this way, and the public table is
// put together from its endpoints' encoded routes without building or
// encoding the whole of it again. The twin is an empty message (twin)
// whatever the resource's type: what reads it (gRPC, go-control-plane's
// caches, the delta cache) marshals it or takes its bytes, and the
// request's type URL names the type; a twin of the resource's own type
// was a zeroed Cluster of 576 bytes for each of 30,000 clusters.
type Encoded struct {
	Name, Version string
	Resource      proto.Message
}

// encode is m's Encoded form under name, versioned by its encoding.
func encode(name string, m proto.Message) (Encoded, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return Encoded{}, fmt.Errorf("encode %s %q: %w", proto.MessageName(m), name, err)
	}
	return encodedAs(name, b, hashBytes(b)), nil
}

// Encode is m held as its deterministic encoding, its twin (what
// Encoded.Resource is), for the resources the xDS server encodes itself
// (listeners, scopes).
func Encode(m proto.Message) (proto.Message, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(m), err)
	}
	return twin(b), nil
}

// encodedAs is the resource whose encoding is b, under name and version.
func encodedAs(name string, b []byte, version string) Encoded {
	return Encoded{Name: name, Version: version, Resource: twin(b)}
}

// twin is the message that marshals as b: an empty one whose unknown
// fields are b.
func twin(b []byte) proto.Message {
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(b)
	return m
}

// bytes is e's encoding.
func (e Encoded) bytes() []byte {
	return e.Resource.ProtoReflect().GetUnknown()
}

// hashBytes is a version made from b.
func hashBytes(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// Decode reads an Encoded resource back into into, a message of its type.
func Decode(e Encoded, into proto.Message) error {
	if err := proto.Unmarshal(e.bytes(), into); err != nil {
		return fmt.Errorf("decode %q: %w", e.Name, err)
	}
	return nil
}

// Field numbers the public table is put together with.
const (
	routeConfigurationVirtualHosts protowire.Number = 2 // RouteConfiguration.virtual_hosts
	virtualHostRoutes              protowire.Number = 3 // VirtualHost.routes
)

// encodeRoutes is routes encoded as VirtualHost.routes entries, ready to
// be joined into a virtual host's encoding (publicTable).
func encodeRoutes(routes []*route.Route) ([]byte, error) {
	var out []byte
	opts := proto.MarshalOptions{Deterministic: true}
	for _, r := range routes {
		b, err := opts.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode route %q: %w", r.GetName(), err)
		}
		out = protowire.AppendTag(out, virtualHostRoutes, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out, nil
}

// publicTable is the encoded public route configuration of key
// (publicRoutesConfig) of routes, each endpoint's routes encoded by
// encodeRoutes, in order: the virtual host's other fields, then the
// routes (protobuf reads fields in any order); version is its version.
func publicTable(key string, routes [][]byte, version string) (Encoded, error) {
	opts := proto.MarshalOptions{Deterministic: true}
	head, err := opts.Marshal(publicVirtualHost(nil))
	if err != nil {
		return Encoded{}, fmt.Errorf("encode the public virtual host: %w", err)
	}
	name := wire.PublicRouteName(key)
	rc, err := opts.Marshal(&route.RouteConfiguration{Name: name})
	if err != nil {
		return Encoded{}, fmt.Errorf("encode the public table: %w", err)
	}
	vhSize := len(head)
	for _, r := range routes {
		vhSize += len(r)
	}
	out := make([]byte, 0, len(rc)+protowire.SizeTag(routeConfigurationVirtualHosts)+protowire.SizeBytes(vhSize))
	out = append(out, rc...)
	out = protowire.AppendTag(out, routeConfigurationVirtualHosts, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(vhSize))
	out = append(out, head...)
	for _, r := range routes {
		out = append(out, r...)
	}
	return encodedAs(name, out, version), nil
}
