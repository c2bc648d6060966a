package picker

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// saturate fills every replica of testPicker's (3 × 2 in flight) and
// returns what it picked.
func saturate(t *testing.T, p *Picker) []choice {
	t.Helper()
	var out []choice
	for range 6 {
		out = append(out, pickNow(t, p, request{}))
	}
	return out
}

// waitFor queues req, which must wait.
func waitFor(t *testing.T, p *Picker, req request) *waiter {
	t.Helper()
	c, w := p.pick("llama", req)
	if w == nil {
		t.Fatalf("request %+v got %+v at once, want it to wait", req, c)
	}
	return w
}

// dispatched is the order in which the waiting ws are given a replica,
// one freed at a time, as tenant names.
func dispatched(t *testing.T, p *Picker, busy []choice, ws []*waiter) []string {
	t.Helper()
	var order []string
	for range ws {
		p.done(busy[0], time.Millisecond, http.StatusOK)
		busy = busy[1:]
		for _, w := range ws {
			select {
			case c := <-w.picked:
				if c.replica == nil {
					t.Fatalf("waiting request %+v got %+v, want a replica", w.req, c)
				}
				busy = append(busy, c)
				order = append(order, w.req.tenant)
			default:
			}
		}
	}
	return order
}

// TestWaitingTenantsTakeTurns: while every replica is saturated, requests
// of one priority are dispatched a tenant at a time, whatever the order
// they came in: a tenant that queued five before another's one gets no
// more turns than it.
func TestWaitingTenantsTakeTurns(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{TenantHeader: "x-tenant"})
	busy := saturate(t, p)
	var ws []*waiter
	for _, tenant := range []string{"big", "big", "big", "big", "big", "small", "other"} {
		ws = append(ws, waitFor(t, p, request{tenant: tenant}))
	}
	got := strings.Join(dispatched(t, p, busy, ws), " ")
	if want := "big small other big big big big"; got != want {
		t.Errorf("dispatched %q, want %q: each tenant in turn", got, want)
	}
}

// TestHigherPrioritiesGoFirst: a waiting request of a higher priority is
// dispatched before those of lower ones that came before it; a sheddable
// one never waits.
func TestHigherPrioritiesGoFirst(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	busy := saturate(t, p)
	low := waitFor(t, p, request{priority: 0, tenant: "low"})
	high := waitFor(t, p, request{priority: 5, tenant: "high"})
	if c, w := p.pick("llama", request{priority: -1}); w != nil || !c.shed || c.why != shedSaturated {
		t.Errorf("a sheddable request got %+v (waiting %v), want shed", c, w != nil)
	}
	if got := p.Waiting()["llama"]; got != 2 {
		t.Errorf("Waiting says %v wait, want 2 (what autoscaling on queue depth reads)", got)
	}
	if got := strings.Join(dispatched(t, p, busy, []*waiter{low, high}), " "); got != "high low" {
		t.Errorf("dispatched %q, want the higher priority first", got)
	}
}

// TestAFullQueueRefusesTheLowestFirst: with max_queued requests waiting, a
// request of a higher priority takes the place of the newest of the
// lowest, which is answered 429; one of the lowest is itself refused,
// unless another tenant holds more of the queue than its own.
func TestAFullQueueRefusesTheLowestFirst(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{MaxQueued: 3})
	saturate(t, p)
	first := waitFor(t, p, request{tenant: "a"})
	second := waitFor(t, p, request{tenant: "a"})
	third := waitFor(t, p, request{tenant: "a"})
	if c, w := p.pick("llama", request{tenant: "a"}); w != nil || c.why != shedQueueFull {
		t.Errorf("a fourth of the same priority and tenant got %+v, want refused: queue full", c)
	}
	waitFor(t, p, request{tenant: "b"}) // a holds 3, b none: a's newest makes room
	if c := <-third.picked; c.why != shedQueueFull {
		t.Errorf("the newest of the tenant holding the queue got %+v, want refused", c)
	}
	waitFor(t, p, request{priority: 1, tenant: "a"})
	if c := <-second.picked; c.why != shedQueueFull {
		t.Errorf("the newest of the lowest priority got %+v, want refused for a higher one", c)
	}
	if !first.queued {
		t.Error("the oldest request was refused too")
	}
}

// TestAWaitEnds: a request waits at most its timeout (then 429), and one
// whose stream ends leaves the queue.
func TestAWaitEnds(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	busy := saturate(t, p)
	w := waitFor(t, p, request{})
	if c := p.wait(context.Background(), w, 10*time.Millisecond); !c.shed || c.why != shedTimedOut {
		t.Errorf("a request that waited its timeout got %+v, want shed", c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w = waitFor(t, p, request{})
	if c := p.wait(ctx, w, time.Minute); c.replica != nil || c.shed {
		t.Errorf("a request whose stream ended got %+v, want none", c)
	}
	p.mu.Lock()
	n := p.queue("llama").len()
	p.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d requests still wait, want none", n)
	}
	p.done(busy[0], time.Millisecond, http.StatusOK)
	if c := pickNow(t, p, request{}); c.replica != busy[0].replica {
		t.Errorf("the freed replica went to %+v, want the next request", c)
	}
}

// TestRequestPriorityIsBoundedByItsRoute: a request may ask for less than
// its route allows, never more; without a limit it is at most critical
// (0); sheddable is below 0 whatever it asks.
func TestRequestPriorityIsBoundedByItsRoute(t *testing.T) {
	headers := func(kv ...string) *core.HeaderMap {
		h := &core.HeaderMap{}
		for i := 0; i < len(kv); i += 2 {
			h.Headers = append(h.Headers, &core.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return h
	}
	for _, c := range []struct {
		h    *core.HeaderMap
		want int
	}{
		{headers(), 0},
		{headers(meshspec.PriorityLimitHeader, "5"), 5},
		{headers(meshspec.PriorityLimitHeader, "5", meshspec.PriorityHeader, "2"), 2},
		{headers(meshspec.PriorityLimitHeader, "5", meshspec.PriorityHeader, "9"), 5},
		{headers(meshspec.PriorityHeader, "9"), 0},
		{headers(meshspec.PriorityHeader, "nine"), 0},
		{headers(meshspec.PriorityLimitHeader, "5", meshspec.CriticalityHeader, "sheddable"), -1},
		{headers(meshspec.PriorityLimitHeader, "-3"), -3},
		{headers(meshspec.PriorityHeader, "-99999"), -meshspec.MaxPriority},
	} {
		if got := requestPriority(c.h); got != c.want {
			t.Errorf("headers %v: priority %d, want %d", c.h, got, c.want)
		}
	}
}

// TestAWaitingRequestExtendsEnvoysTimeout: through the ext_proc stream, a
// request that must wait is first answered with a longer message timeout
// (its queue timeout and a second), then with its replica once one frees.
func TestAWaitingRequestExtendsEnvoysTimeout(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{QueueTimeoutS: 4})
	busy := saturate(t, p)
	client, ctx := pickerClient(t, p)
	stream, err := client.Process(metadata.AppendToOutgoingContext(ctx, wire.BackendHeader, "llama"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{
		Headers: &core.HeaderMap{}, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetOverrideMessageTimeout().AsDuration(); got != 5*time.Second || resp.GetRequestHeaders() != nil {
		t.Fatalf("first answer %v, want only a message timeout of 5 s", resp)
	}
	p.done(busy[0], time.Millisecond, http.StatusOK)
	if resp, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	picked := pickedOf(resp)
	if picked != busy[0].replica.addr || resp.GetRequestHeaders() == nil {
		t.Errorf("answer once a replica freed: %v, want %s", resp, busy[0].replica.addr)
	}
}

// TestEarliestDeadlineFirst: among waiting requests of one priority, those
// that state a time to first token go first, the earliest deadline first,
// whatever their tenants' turns and the order they came in; a higher
// priority still goes before them.
func TestEarliestDeadlineFirst(t *testing.T) {
	p, now := testPicker(t, &meshspec.LoadAware{TenantHeader: "x-tenant"})
	busy := saturate(t, p)
	at := func(ms int) time.Time { return now.Add(time.Duration(ms) * time.Millisecond) }
	ws := []*waiter{
		waitFor(t, p, request{tenant: "none"}),
		waitFor(t, p, request{tenant: "loose", deadline: at(5000)}),
		waitFor(t, p, request{tenant: "tight", deadline: at(300)}),
		waitFor(t, p, request{tenant: "urgent", priority: 5}),
		waitFor(t, p, request{tenant: "tighter", deadline: at(200)}),
	}
	got := strings.Join(dispatched(t, p, busy, ws), " ")
	if want := "urgent tighter tight loose none"; got != want {
		t.Errorf("dispatched %q, want %q", got, want)
	}
}

// TestLateRequestsAreRefused: with load_aware.refuse_late, a request whose
// deadline falls before its replicas' typical time to first byte is
// refused at once, and one that waits past that point is refused then;
// without it, both are served late.
func TestLateRequestsAreRefused(t *testing.T) {
	for _, refuse := range []bool{true, false} {
		p, now := testPicker(t, &meshspec.LoadAware{RefuseLate: refuse})
		for _, r := range p.replicas {
			r.TTFB = 100 * time.Millisecond
		}
		busy := saturate(t, p)
		c, w := p.pick("llama", request{deadline: now.Add(50 * time.Millisecond)})
		if refuse != (w == nil && c.shed && c.why == shedLate) {
			t.Errorf("refuse_late %t: a request due in 50 ms, replicas taking 100: %+v (waiting %t)", refuse, c, w != nil)
		}
		if w != nil {
			p.mu.Lock()
			p.queue("llama").remove(w)
			p.mu.Unlock()
		}
		waiting := waitFor(t, p, request{deadline: now.Add(400 * time.Millisecond)})
		*now = now.Add(350 * time.Millisecond) // 50 ms left: less than a replica takes
		p.done(busy[0], 100*time.Millisecond, http.StatusOK)
		select {
		case c := <-waiting.picked:
			if refuse != (c.shed && c.why == shedLate) {
				t.Errorf("refuse_late %t: a request that waited past its point of no return got %+v", refuse, c)
			}
		default:
			t.Errorf("refuse_late %t: a replica freed and the waiting request got nothing", refuse)
		}
	}
}

// TestRequestDeadline: the objective a request states, within bounds,
// counts from now; anything else states none.
func TestRequestDeadline(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	for v, want := range map[string]time.Duration{"250": 250 * time.Millisecond, "0": 0, "-5": 0, "600001": 0, "soon": 0, "": 0} {
		h := &core.HeaderMap{Headers: []*core.HeaderValue{{Key: wire.TTFTObjectiveHeader, RawValue: []byte(v)}}}
		got := requestDeadline(h, now)
		if (want == 0) != got.IsZero() || want > 0 && got.Sub(now) != want {
			t.Errorf("%s %q: deadline %v after now, want %v", wire.TTFTObjectiveHeader, v, got.Sub(now), want)
		}
	}
}
