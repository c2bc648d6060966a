package server

import (
	"fmt"

	grpcencoding "google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// MaxPooledAnswer is the largest answer whose encoding the xDS gRPC server
// encodes into gRPC's buffer pool. gRPC's protobuf codec pools every
// size, and a controller's first answers to a large mesh's nodes (tens of
// MB each: every cluster, the public route table) stayed pooled, some
// 380 MB of them at 10,000 endpoints, until two collections passed, which
// a controller at rest may not run for minutes. A larger answer is
// encoded into a buffer of its own, the collector's once sent.
const MaxPooledAnswer = 1 << 20

// Codec is the xDS gRPC server's codec (grpc.ForceServerCodecV2): gRPC's
// protobuf codec, but for answers over MaxPooledAnswer.
func Codec() grpcencoding.CodecV2 { return answerCodec{grpcencoding.GetCodecV2("proto")} }

type answerCodec struct{ grpcencoding.CodecV2 }

func (c answerCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok || proto.Size(m) <= MaxPooledAnswer {
		return c.CodecV2.Marshal(v)
	}
	// The size was just computed (proto.Size), as gRPC's codec does.
	b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(m), err)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}
