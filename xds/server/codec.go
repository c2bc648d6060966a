package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
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

// LargeAnswersBudget bounds the bytes of large answers (over
// MaxPooledAnswer) made and not yet written to their streams. Nodes that
// start together each get every cluster of the mesh at once: at 10,000
// endpoints, a hundred nodes' first answers held some 300 MB at the same
// time (their messages, then their encodings), and the controller's
// memory stayed at that peak long after. An answer waits for room before
// its message is made (its stream's other answers wait with it; other
// streams go on), at most LargeAnswerWait, then goes anyway, so a node
// that stops reading delays the others' answers, never stops them.
const (
	LargeAnswersBudget = 64 << 20
	LargeAnswerWait    = 10 * time.Second
)

// answers is the process's budget: one xDS server, one codec.
var answers = newAnswerBudget(LargeAnswersBudget, LargeAnswerWait)

// Codec is the xDS gRPC server's codec (grpc.ForceServerCodecV2): gRPC's
// protobuf codec, but for answers over MaxPooledAnswer.
func Codec() grpcencoding.CodecV2 { return newAnswerCodec(answers) }

func newAnswerCodec(budget *answerBudget) answerCodec {
	return answerCodec{CodecV2: grpcencoding.GetCodecV2("proto"), budget: budget}
}

type answerCodec struct {
	grpcencoding.CodecV2
	budget *answerBudget
}

func (c answerCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	held, made := c.budget.claim(m) // what its maker took (deltaResponse)
	size := proto.Size(m)
	if size <= MaxPooledAnswer && !made {
		return c.CodecV2.Marshal(v)
	}
	if !made {
		held = c.budget.hold(int64(size))
	}
	// The size was just computed (proto.Size), as gRPC's codec does.
	b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m)
	if err != nil {
		c.budget.release(held)
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(m), err)
	}
	// gRPC frees the buffer once its stream wrote it, or ended: then the
	// budget it held is given back (heldUntilFreed.Put).
	return mem.BufferSlice{mem.NewBuffer(&b, heldUntilFreed{c.budget, held})}, nil
}

// answerBudget is LargeAnswersBudget's semaphore, and the room each
// answer made took, until the codec encodes it.
type answerBudget struct {
	sem  *semaphore.Weighted
	size int64
	wait time.Duration

	mu    sync.Mutex
	taken map[proto.Message]int64

	// held is the bytes held now; waitedOut, the answers that went
	// without room after waiting b.wait (metrics.go serves both).
	held, waitedOut atomic.Int64
}

func newAnswerBudget(size int64, wait time.Duration) *answerBudget {
	return &answerBudget{sem: semaphore.NewWeighted(size), size: size, wait: wait, taken: map[proto.Message]int64{}}
}

// hold takes size bytes of the budget (all of it for a larger answer),
// waiting at most b.wait; it returns what it took: 0 if it waited that
// long.
func (b *answerBudget) hold(size int64) int64 {
	size = min(size, b.size)
	ctx, cancel := context.WithTimeout(context.Background(), b.wait)
	defer cancel()
	if b.sem.Acquire(ctx, size) != nil {
		b.waitedOut.Add(1)
		return 0
	}
	b.held.Add(size)
	return size
}

func (b *answerBudget) release(held int64) {
	if held > 0 {
		b.held.Add(-held)
		b.sem.Release(held)
	}
}

// made records that the answer m took held of the budget when it was
// made; the codec claims it when its stream sends m, at once: the stream
// sends what it made (go-control-plane's delta server makes an answer,
// then sends it).
func (b *answerBudget) made(m proto.Message, held int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.taken[m] = held
}

// claim is what m took when it was made, if made recorded it.
func (b *answerBudget) claim(m proto.Message) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	held, ok := b.taken[m]
	delete(b.taken, m)
	return held, ok
}

// heldUntilFreed is the mem.BufferPool of one large answer's buffer: gRPC
// puts the buffer back when it is done with it, which gives back the
// budget the answer held. The buffer itself is left to the collector.
type heldUntilFreed struct {
	budget *answerBudget
	held   int64
}

func (h heldUntilFreed) Get(length int) *[]byte {
	b := make([]byte, length)
	return &b
}

func (h heldUntilFreed) Put(*[]byte) { h.budget.release(h.held) }
