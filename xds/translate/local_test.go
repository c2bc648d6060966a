package translate

import (
	"bytes"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestShallowCopyHasEveryField: a cluster with every one of its fields set
// (one member of each oneof) is copied whole, so a field the translator
// sets one day is not lost from nodes' views.
func TestShallowCopyHasEveryField(t *testing.T) {
	c := &cluster.Cluster{}
	m := c.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && m.WhichOneof(o) != nil {
			continue
		}
		setSomething(m, fd)
	}
	if n := countSet(m); n < 40 {
		t.Fatalf("set %d fields: the test did not reach the message's fields", n)
	}
	if got := shallowCopy(c); !proto.Equal(got, c) {
		t.Fatalf("the copy lost fields: %d of %d set", countSet(got.ProtoReflect()), countSet(m))
	}
}

// setSomething sets fd in m to a value other than its default.
func setSomething(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		l.Append(l.NewElement())
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		mp.Set(protoreflect.ValueOfString("k").MapKey(), mp.NewValue())
	case fd.Message() != nil:
		m.Set(fd, m.NewField(fd))
	case fd.Kind() == protoreflect.BoolKind:
		m.Set(fd, protoreflect.ValueOfBool(true))
	case fd.Kind() == protoreflect.EnumKind:
		m.Set(fd, protoreflect.ValueOfEnum(1))
	case fd.Kind() == protoreflect.StringKind:
		m.Set(fd, protoreflect.ValueOfString("x"))
	case fd.Kind() == protoreflect.BytesKind:
		m.Set(fd, protoreflect.ValueOfBytes([]byte{1}))
	case fd.Kind() == protoreflect.DoubleKind:
		m.Set(fd, protoreflect.ValueOfFloat64(1))
	case fd.Kind() == protoreflect.FloatKind:
		m.Set(fd, protoreflect.ValueOfFloat32(1))
	default: // the integer kinds
		v := m.NewField(fd)
		switch v.Interface().(type) {
		case int32:
			m.Set(fd, protoreflect.ValueOfInt32(1))
		case int64:
			m.Set(fd, protoreflect.ValueOfInt64(1))
		case uint32:
			m.Set(fd, protoreflect.ValueOfUint32(1))
		case uint64:
			m.Set(fd, protoreflect.ValueOfUint64(1))
		}
	}
}

func countSet(m protoreflect.Message) int {
	n := 0
	m.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool { n++; return true })
	return n
}

// TestEDSServicePatch: the patch a node's view appends to its shared
// cluster's encoding is what proto.Marshal makes of a cluster naming
// that EDS service alone, for names of every length's varint.
func TestEDSServicePatch(t *testing.T) {
	for _, service := range []string{"b@n1", strings.Repeat("x", 127), strings.Repeat("y", 128), strings.Repeat("z", 20000)} {
		want, err := marshalDeterministic(&cluster.Cluster{EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{ServiceName: service}})
		if err != nil {
			t.Fatal(err)
		}
		if got := edsServicePatch(service); !bytes.Equal(got, want) {
			t.Errorf("service of %d bytes: patch\n got %x\nwant %x", len(service), got, want)
		}
	}
}
