package server

import (
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// A large answer is encoded into a buffer of its own, not gRPC's pool's;
// a small one as gRPC's codec does. Both read back.
func TestCodecPoolsNoLargeAnswer(t *testing.T) {
	c := Codec()
	for _, size := range []int{100, MaxPooledAnswer + 10} {
		in := &discovery.DeltaDiscoveryResponse{SystemVersionInfo: strings.Repeat("x", size)}
		out, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		if large := size > MaxPooledAnswer; large {
			if len(out) != 1 {
				t.Fatalf("a %d-byte answer in %d buffers", size, len(out))
			}
			if _, own := out[0].(mem.SliceBuffer); !own {
				t.Fatalf("a %d-byte answer is in a %T, not a buffer of its own", size, out[0])
			}
		}
		var back discovery.DeltaDiscoveryResponse
		if err := c.Unmarshal(out, &back); err != nil || !proto.Equal(&back, in) {
			t.Fatalf("a %d-byte answer read back: %v", size, err)
		}
		out.Free()
	}
}
