package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
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
			if _, pooled := out[0].(mem.SliceBuffer); pooled {
				t.Fatalf("a %d-byte answer is in a %T, which gives nothing back when freed", size, out[0])
			}
		}
		var back discovery.DeltaDiscoveryResponse
		if err := c.Unmarshal(out, &back); err != nil || !proto.Equal(&back, in) {
			t.Fatalf("a %d-byte answer read back: %v", size, err)
		}
		out.Free()
	}
}

// Large answers encoded and not yet written hold at most the codec's
// budget: one more waits until gRPC frees one that was written, or until
// it waited its limit (a node that stops reading delays others' answers,
// never stops them).
func TestLargeAnswersWaitForRoom(t *testing.T) {
	answer := &discovery.DeltaDiscoveryResponse{SystemVersionInfo: strings.Repeat("x", MaxPooledAnswer+10)}
	size := int64(proto.Size(answer))
	c := newAnswerCodec(newAnswerBudget(3*size, time.Minute))
	encoded := make(chan mem.BufferSlice, 4)
	for range 4 {
		go func() {
			out, err := c.Marshal(answer)
			if err != nil {
				t.Error(err)
			}
			encoded <- out
		}()
	}
	var held []mem.BufferSlice
	for range 3 {
		held = append(held, <-encoded)
	}
	select {
	case <-encoded:
		t.Fatal("a fourth large answer was encoded while three filled the budget")
	case <-time.After(200 * time.Millisecond):
	}
	held[0].Free() // written: its room is given back
	select {
	case out := <-encoded:
		held = append(held[1:], out)
	case <-time.After(10 * time.Second):
		t.Fatal("the fourth answer still waits after one was freed")
	}
	for _, out := range held {
		out.Free()
	}

	// The wait is bounded: with the budget full, an answer goes after it.
	c = newAnswerCodec(newAnswerBudget(size, 50*time.Millisecond))
	first, err := c.Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	second, err := c.Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("an answer over the budget went after %v, before its wait", waited)
	}
	if got := c.budget.waitedOut.Load(); got != 1 {
		t.Errorf("%d answers counted as waited out, want 1", got)
	}
	second.Free() // held nothing: gives nothing back
	first.Free()
	if got := c.budget.held.Load(); got != 0 {
		t.Errorf("%d bytes counted as held once every answer was freed", got)
	}
	if !c.budget.sem.TryAcquire(size) || c.budget.sem.TryAcquire(1) {
		t.Fatal("the budget is not whole again once every answer was freed")
	}
}

// A large delta answer takes its room before its message is made (a
// hundred nodes' first answers, made at once, held their messages while
// they waited for room to be encoded); the codec encodes it with that
// room, without waiting again, and gives it back once it is freed.
func TestLargeDeltaAnswersTakeRoomBeforeTheyAreMade(t *testing.T) {
	versions := map[string]string{}
	for i := range 300 {
		versions[fmt.Sprintf("r%03d", i)] = strings.Repeat("v", 4000) // large enough: 300 of them pass MaxPooledAnswer
	}
	k := testKind(t, versions)
	budget := newAnswerBudget(2*MaxPooledAnswer, time.Minute)
	c := newDeltaCache(resource.RouteType)
	c.budget = budget
	resp := c.response(k, deltaWatch{})
	for name := range versions {
		resp.add(name, k)
	}
	if resp.size() <= MaxPooledAnswer {
		t.Fatalf("the answer is %d bytes, not a large one", resp.size())
	}
	msg, err := resp.GetDeltaDiscoveryResponse()
	if err != nil {
		t.Fatal(err)
	}
	if budget.sem.TryAcquire(1) {
		t.Fatal("a large answer was made without taking the whole budget it needs")
	}
	out, err := newAnswerCodec(budget).Marshal(msg) // would wait a minute to take room again
	if err != nil {
		t.Fatal(err)
	}
	var back discovery.DeltaDiscoveryResponse
	if err := Codec().Unmarshal(out, &back); err != nil || len(back.GetResources()) != len(versions) {
		t.Fatalf("read back %d resources (want %d): %v", len(back.GetResources()), len(versions), err)
	}
	out.Free()
	if !budget.sem.TryAcquire(2 * MaxPooledAnswer) {
		t.Fatal("the budget is not whole again once the answer was freed")
	}
}
